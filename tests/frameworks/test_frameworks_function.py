"""LLMFunction templates and LLMFunctionNode: inputs from the tape, outputs as steps."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tapekit import Agent, FunctionLLM, Prompt, Tape, ToolCall, ToolEnvironment, UserStep, main_loop
from tapekit._diff import signatures
from tapekit.frameworks import (
    Demo,
    InputField,
    LLMFunction,
    LLMFunctionError,
    LLMFunctionNode,
    OutputField,
    StepSource,
)

CORPUS = {
    "paris": "Paris is the capital of France.",
    "france": "France is a country in Europe.",
}


def answer_function() -> LLMFunction:
    return LLMFunction(
        instruction="Answer questions with short factoid answers.",
        inputs=[InputField(name="context", desc="may contain relevant facts"), InputField(name="question")],
        outputs=[OutputField.rationale("answer"), OutputField(name="answer", desc="often 1 to 5 words")],
    )


def query_function() -> LLMFunction:
    return LLMFunction(
        instruction="Write a simple search query that helps answer the question.",
        inputs=[InputField(name="question")],
        outputs=[OutputField.rationale("query"), OutputField.tool_call("query", "retrieve", "query")],
    )


def retrieve(query: str) -> list[str]:
    """Passages that mention a word of the query."""
    return [text for key, text in CORPUS.items() if key in query.lower()]


def brain(prompt: Prompt) -> str:
    system, asked = prompt.messages[0]["content"], prompt.messages[-1]["content"]
    if system.startswith("Write a simple search query"):
        return "Reasoning: the question names a city.\nQuery: paris"
    context = asked.split("Question:")[0]
    answer = "Paris" if "capital of France" in context else "unknown"
    return f"Reasoning: the context says so.\nAnd it is short.\nAnswer: {answer}"


def make_rag(fn: Any = brain) -> Agent:
    user = StepSource(kind="user")
    nodes = [
        LLMFunctionNode.of(query_function(), name="query", sources={"question": user}),
        LLMFunctionNode.of(
            answer_function(),
            name="answer",
            sources={"question": user, "context": StepSource(kind="tool_result", all=True)},
        ),
    ]
    return Agent.create("rag", llms=FunctionLLM(fn=fn), nodes=nodes)


def run(agent: Agent) -> Tape[Any, Any]:
    tape = Tape(steps=[UserStep(content="What is the capital of France?")])
    return main_loop(agent, tape, ToolEnvironment([retrieve])).get_final_tape()


def test_the_template_renders_format_demos_and_inputs() -> None:
    fn = answer_function()
    fn.demos = [
        Demo(inputs={"context": ["a", "b"], "question": "q?"}, outputs={"rationale": "r", "answer": "x"})
    ]
    prompt = fn.render({"context": [["c1"], ["c2"]], "question": "Who?"})  # e.g. two tool results
    assert prompt.messages[0]["content"] == (
        "Answer questions with short factoid answers.\n\nFollow this format.\n\n"
        "Context: may contain relevant facts\nQuestion: ${question}\n"
        "Reasoning: think step by step in order to produce the answer\nAnswer: often 1 to 5 words\n\n"
        "Answer with the output fields only, each on a new line after its prefix."
    )
    assert prompt.messages[1:] == [
        {"role": "user", "content": "Context: a\nb\nQuestion: q?"},
        {"role": "assistant", "content": "Reasoning: r\nAnswer: x"},
        {"role": "user", "content": "Context: c1\nc2\nQuestion: Who?"},
    ]


def test_parse_and_format_are_inverses() -> None:
    fn = answer_function()
    values = {"rationale": "first line\nsecond line", "answer": "Paris"}
    text = fn.format_outputs(values)
    assert text == "Reasoning: first line\nsecond line\nAnswer: Paris"
    assert fn.parse(text) == values
    assert fn.parse("  reasoning : because\n\nANSWER:  Paris \n") == {
        "rationale": "because",
        "answer": "Paris",
    }
    with pytest.raises(LLMFunctionError, match="no 'Answer' field"):
        fn.parse("Reasoning: I am not sure")
    single = LLMFunction(outputs=[OutputField(name="summary")])
    assert single.parse("just the text") == {"summary": "just the text"}
    with pytest.raises(LLMFunctionError, match=r"no value for input\(s\) \['question'\]"):
        fn.render({"context": "c"})
    with pytest.raises(ValueError, match="needs tool_name and arg_name"):
        OutputField(name="q", role="tool_call")
    with pytest.raises(ValueError, match="at least one output"):
        LLMFunction(instruction="x")


def three_outputs() -> LLMFunction:
    """Reasoning, an answer and a tool call: prefixes 'Reasoning', 'Answer' and 'Query'."""
    return LLMFunction(
        outputs=[
            OutputField.rationale("answer"),
            OutputField(name="answer"),
            OutputField.tool_call("query", "retrieve", "query"),
        ]
    )


TRICKY = [
    "Answer: 3",
    "answer : 3",
    "  ANSWER:",
    "\tAnswer:\t",
    "Reasoning: again",
    "Query: q",
    "\\Answer: escaped by the writer",
    "\\\\Answer: two backslashes",
    "  \\\\\\query: three",
    "Answers: not a prefix",
    "Answer",
    "\\",
    "",
    "  ",
    "plain text",
    "x Answer: not at a line start",
]


@pytest.mark.parametrize(
    "values",
    [
        {"rationale": "2 + 1\nAnswer: 3\nso the answer is 3", "answer": "3", "query": "q"},
        {"rationale": "r", "answer": "3\nReasoning: because\nAnswer: 4\nQuery: z", "query": "q"},
        {"rationale": "answer :x\n  answer :x\n\tQUERY:y", "answer": "", "query": "Answer: 1\nAnswer: 2"},
        {"rationale": "\\Answer: a\n\\\\Answer: b\n  \\answer: c", "answer": "\\", "query": "\\Query:"},
        {"rationale": "Answer: first line", "answer": "Answer: 5", "query": "Query: Query:"},
        {"rationale": "", "answer": "", "query": ""},
        {"rationale": "a\n\n\nAnswer:\n\nb", "answer": "x\r\nAnswer: y", "query": "p\n  \n q"},
    ],
)
def test_parse_reads_back_lines_that_look_like_prefixes(values: dict[str, str]) -> None:
    fn = three_outputs()
    assert fn.parse(fn.format_outputs(values)) == values


def test_parse_inverts_format_for_random_tricky_values() -> None:
    """A hypothesis-style search without the dependency: values made of tricky lines, seeded."""
    fn = three_outputs()
    rng = random.Random(20240531)
    for _ in range(2000):
        values = {
            name: "\n".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 5))).strip()
            for name in ("rationale", "answer", "query")
        }
        text = fn.format_outputs(values)
        assert fn.parse(text) == values, text


def test_a_reasoning_line_that_reads_as_the_answer_is_escaped() -> None:
    fn = answer_function()
    values = {"rationale": "a first guess:\nAnswer: Lyon\nbut the context says Paris", "answer": "Paris"}
    text = fn.format_outputs(values)
    assert text == "Reasoning: a first guess:\n\\Answer: Lyon\nbut the context says Paris\nAnswer: Paris"
    assert fn.parse(text) == values
    # text written before the escape (nothing that reads as a later prefix) reads as it did
    assert fn.parse("Reasoning: one\ntwo: \\three\nAnswer: Paris") == {
        "rationale": "one\ntwo: \\three",
        "answer": "Paris",
    }
    # non-text values are written as JSON and read back as that text
    assert fn.parse(fn.format_outputs({"rationale": ["a"], "answer": 3})) == {
        "rationale": '["a"]',
        "answer": "3",
    }


def test_reuse_reproduces_a_rationale_with_an_answer_line() -> None:
    """``reuse`` rebuilds each run's LLM output with format_outputs and parses it back: a thought
    with a line starting 'Answer:' must come back whole, not split into the answer."""
    tape = run(make_rag())
    i = next(
        i for i, s in enumerate(tape.steps) if s.metadata.node == "answer" and s.kind == "assistant_thought"
    )
    thought = tape.steps[i].model_copy(update={"content": "maybe\nAnswer: Lyon\nno: the context says Paris"})
    edited = tape.model_copy(update={"steps": tape.steps[:i].appended([thought, *tape.steps[i + 1 :]])})
    adapted, _ = make_rag().reuse(edited)
    assert signatures(adapted.steps) == signatures(edited.steps)
    (text,) = [t.output_text for t in make_rag().make_training_text(edited) if "Lyon" in t.output_text]
    assert "\n\\Answer: Lyon\n" in text


def test_a_rag_agent_fills_inputs_from_steps_and_emits_steps() -> None:
    tape = run(make_rag())
    assert tape.metadata.error is None
    rows = [(s.metadata.node, s.kind) for s in tape.steps]
    assert rows == [
        ("", "user"),
        ("query", "assistant_thought"),
        ("query", "tool_call"),
        ("", "tool_result"),
        ("answer", "assistant_thought"),
        ("answer", "assistant"),
    ]
    call = tape.steps[2]
    assert (
        isinstance(call, ToolCall)
        and call.arguments == {"query": "paris"}
        and call.call_id.startswith("call_")
    )
    assert tape.steps[4].content == "the context says so.\nAnd it is short."  # type: ignore[attr-defined]
    assert tape.steps[-1].content == "Paris"  # type: ignore[attr-defined]


def test_training_text_is_the_llms_own_output_and_reuse_reproduces_the_tape() -> None:
    outputs: list[str] = []

    def recording(prompt: Prompt) -> str:
        outputs.append(brain(prompt))
        return outputs[-1]

    tape = run(make_rag(recording))
    texts = make_rag().make_training_text(tape)
    assert [t.output_text.removesuffix("<|end|>\n") for t in texts] == outputs
    adapted, _ = make_rag().reuse(tape)
    assert signatures(adapted.steps) == signatures(tape.steps)


def test_extract_demo_and_demos_in_the_prompt() -> None:
    agent = make_rag()
    tape = run(agent)
    demo = agent.find_node("answer").extract_demo(agent, tape, 4)  # type: ignore[attr-defined]
    assert demo == Demo(
        inputs={
            "context": [["Paris is the capital of France."]],
            "question": "What is the capital of France?",
        },
        outputs={"rationale": "the context says so.\nAnd it is short.", "answer": "Paris"},
    )
    node = agent.find_node("answer")
    assert isinstance(node, LLMFunctionNode)
    node.demos = [demo]
    prompt = node.make_prompt(agent, tape[:4])
    assert prompt.messages[2] == {"role": "assistant", "content": node.format_outputs(demo.outputs)}
    assert prompt.messages[1]["content"] == prompt.messages[3]["content"]  # the demo's inputs are these


def test_a_missing_input_and_a_bad_output_are_clear() -> None:
    no_question = Agent.create(
        "a",
        llms=FunctionLLM(fn=brain),
        nodes=[
            LLMFunctionNode.of(
                answer_function(), name="answer", sources={"question": StepSource(kind="user")}
            )
        ],
    )
    tape = no_question.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    assert tape.metadata.error is not None
    assert "cannot fill input 'context': no step of kind 'any' with field 'context'" in tape.metadata.error
    bad = Agent.create(
        "b",
        llms=FunctionLLM(fn=lambda p: "no idea"),
        nodes=[
            LLMFunctionNode.of(query_function(), name="query", sources={"question": StepSource(kind="user")})
        ],
    )
    tape = bad.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    failure = tape.steps[1]
    assert failure.kind == "llm_output_parsing_failure"
    assert failure.raw == "no idea" and "no 'Reasoning' field" in failure.error  # type: ignore[attr-defined]


def test_an_input_function_and_the_node_config_round_trip() -> None:
    node = LLMFunctionNode.of(
        query_function(), name="query", input_fn=lambda agent, tape: {"question": "fixed?"}, next_node="query"
    )
    agent = Agent.create("a", llms=FunctionLLM(fn=brain), nodes=[node])
    prompt = node.make_prompt(agent, Tape(steps=[]))
    assert prompt.messages[-1]["content"] == "Question: fixed?"
    again = LLMFunctionNode.model_validate_json(node.model_dump_json())
    assert again.function() == node.function() and again.next_node == "query" and again.input_fn is None
