"""MonoAgent / MonoNode: one prompt made of the tape and the step schemas, parsed into steps."""

from __future__ import annotations

import json
from typing import Any, Literal

from tapekit import (
    Action,
    ExternalObservationNeeded,
    FunctionLLM,
    LLMOutputParsingFailure,
    Observation,
    Prompt,
    Tape,
    Thought,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    UserStep,
    main_loop,
)
from tapekit._diff import signatures
from tapekit.frameworks import Demo, MonoAgent, MonoNode, estimate_tokens, token_counter
from tests.conftest import needs_local_model


class PlanThought(Thought):
    """A numbered plan for answering the question."""

    kind: Literal["mono_test_plan"] = "mono_test_plan"
    plan: list[str]


class FinalAnswer(Action):
    """The short final answer to the user's question."""

    kind: Literal["mono_test_answer"] = "mono_test_answer"
    answer: str


STEPS = [PlanThought, ToolCall, FinalAnswer]


def out(*steps: dict[str, Any]) -> str:
    return json.dumps({"steps": list(steps)})


def brain(prompt: Prompt) -> str:
    """Plans, calls the calculator once, then answers with its result."""
    instruction = prompt.messages[-1]["content"]
    if instruction.startswith("Plan"):
        return out({"kind": "mono_test_plan", "plan": ["compute", "answer"]})
    results = [m for m in prompt.messages if m["role"] == "user" and '"tool_result"' in m["content"]]
    if not results:
        return out({"kind": "tool_call", "name": "calc", "arguments": {"expr": "6*7"}, "call_id": "c1"})
    value = json.loads(results[-1]["content"])["content"]
    return out({"kind": "mono_test_answer", "answer": str(value)})


def calc(expr: str) -> int:
    """Evaluate a product like 6*7."""
    a, b = expr.split("*")
    return int(a) * int(b)


def make_agent(fn: Any = brain, **kwargs: Any) -> MonoAgent:
    return MonoAgent.create(
        "qa",
        llms=FunctionLLM(fn=fn),
        nodes=[
            MonoNode(name="plan", instruction="Plan how to answer."),
            MonoNode(name="act", instruction="Act on the plan.", next_node="act"),
        ],
        system="You answer questions.",
        step_classes=STEPS,
        **kwargs,
    )


def give_answer(action: FinalAnswer) -> Observation:
    raise ExternalObservationNeeded(action)  # the answer goes to the user: the session waits


def run(agent: MonoAgent) -> Tape[Any, Any]:
    tape = Tape(steps=[UserStep(content="What is 6 times 7?")])
    env = ToolEnvironment([calc], handlers={FinalAnswer: give_answer})
    return main_loop(agent, tape, env).get_final_tape()


def test_a_mono_agent_plans_acts_and_answers() -> None:
    tape = run(make_agent())
    assert tape.metadata.error is None
    rows = [(s.metadata.node, s.kind) for s in tape.steps]
    assert rows == [
        ("", "user"),
        ("plan", "mono_test_plan"),
        ("act", "set_next_node"),
        ("act", "tool_call"),
        ("", "tool_result"),
        ("act", "set_next_node"),
        ("act", "mono_test_answer"),
    ]
    assert tape.steps[-1].answer == "42"  # type: ignore[attr-defined]


def test_the_prompt_is_system_schemas_demos_tape_and_instruction() -> None:
    agent = make_agent()
    tape = run(agent)
    node = agent.find_node("act")
    node.demos = [Demo.chat("What is 2 times 3?", out({"kind": "mono_test_answer", "answer": "6"}))]
    prompt = node.make_prompt(agent, tape[:5])
    system = prompt.messages[0]["content"]
    assert system.startswith("You answer questions.\n")
    assert "- mono_test_plan: A numbered plan for answering the question." in system
    assert "- tool_call: A request to run tool" in system
    assert json.dumps(prompt.response_schema) in system  # the schema the output is constrained to
    assert prompt.response_schema is not None
    assert prompt.response_schema["properties"]["steps"]["items"]["anyOf"][0]["properties"]["kind"] == {
        "const": "mono_test_plan"
    }
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "assistant", "user", "user"]
    assert prompt.messages[1]["content"] == "What is 2 times 3?"  # the demo comes before the tape
    assert prompt.messages[3]["content"] == "What is 6 times 7?"
    # the agent's own earlier runs read exactly as the JSON it wrote (SetNextNode left out)
    assert json.loads(prompt.messages[5]["content"]) == {"steps": [tape.steps[3].llm_dict()]}
    assert json.loads(prompt.messages[6]["content"])["kind"] == "tool_result"
    assert prompt.messages[-1]["content"] == "Act on the plan."
    unconstrained = node.model_copy(update={"constrained": False}).make_prompt(agent, tape[:5])
    assert unconstrained.response_schema is None


def test_nodes_share_the_prompt_but_for_the_instruction() -> None:
    agent = make_agent()
    tape = run(agent)
    plan = agent.find_node("plan").make_prompt(agent, tape[:1])
    act = agent.find_node("act").make_prompt(agent, tape[:1])
    assert plan.messages[:-1] == act.messages[:-1]
    assert (plan.messages[-1]["content"], act.messages[-1]["content"]) == (
        "Plan how to answer.",
        "Act on the plan.",
    )


def test_reuse_and_training_text_round_trip() -> None:
    recorded: list[str] = []

    def recording(prompt: Prompt) -> str:
        recorded.append(brain(prompt))
        return recorded[-1]

    tape = run(make_agent(recording))
    adapted, calls = make_agent().reuse(tape)
    assert signatures(adapted.steps) == signatures(tape.steps)
    assert [json.loads(c.output.content or "") for c in calls] == [json.loads(r) for r in recorded]
    texts = make_agent().make_training_text(tape)
    assert [t.output_text.removesuffix("<|end|>\n") for t in texts] == recorded


def test_a_bad_output_is_a_parsing_failure_then_a_retry() -> None:
    answers = iter(["not json", out({"kind": "mono_test_answer", "answer": "ok"})])
    agent = MonoAgent.create(
        "a",
        llms=FunctionLLM(fn=lambda p: next(answers)),
        nodes=[MonoNode(name="answer", instruction="Answer.")],
        step_classes=[FinalAnswer],
    )
    tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    assert [s.kind for s in tape.steps] == [
        "user",
        "set_next_node",
        "llm_output_parsing_failure",
        "mono_test_answer",
    ]
    assert isinstance(tape.steps[2], LLMOutputParsingFailure) and tape.steps[2].raw == "not json"


def _long_tape(n: int) -> Tape[Any, Any]:
    steps: list[Any] = [UserStep(content="Summarise the pages.")]
    for i in range(n):
        steps.append(ToolResult(call_id=f"c{i}", name="page", content=f"page {i} " + "word " * 50))
    return Tape(steps=steps)


class WordLLM(FunctionLLM):
    """A FunctionLLM with a tokenizer: one token per word."""

    def count_tokens(self, text: str) -> int:
        """Words in ``text``."""
        return len(text.split())


def test_old_observations_are_trimmed_to_the_budget_deterministically() -> None:
    node = MonoNode(name="n", instruction="Go.", step_classes=[FinalAnswer])
    agent = MonoAgent.create("a", llms=FunctionLLM(fn=lambda p: ""), nodes=[node])
    tape = _long_tape(6)
    whole = node.make_prompt(agent, tape).messages
    sizes = [estimate_tokens(m["content"]) for m in whole]
    note = json.dumps(
        {"kind": "tool_result", "note": f"trimmed to fit the prompt budget: {sizes[2]} tokens left out"}
    )
    # a budget with room for the two newest pages whole and the four older ones as notes
    budget = sum(sizes) - 4 * (sizes[2] - estimate_tokens(note))
    agent.nodes[0].max_prompt_tokens = budget
    prompt = agent.nodes[0].make_prompt(agent, tape)
    body = prompt.messages[1:-1]
    assert body[0]["content"] == "Summarise the pages."  # the user's message is never trimmed
    assert [i for i, m in enumerate(body[1:]) if "trimmed to fit" in m["content"]] == [0, 1, 2, 3]
    assert body[1]["content"] == note
    assert body[5:] == whole[6:8]  # the two newest pages are kept whole
    assert sum(estimate_tokens(m["content"]) for m in prompt.messages) == budget
    assert agent.nodes[0].make_prompt(agent, tape).messages == prompt.messages  # same tape, same prompt
    # one token less trims one page more
    agent.nodes[0].max_prompt_tokens = budget - 1
    fewer = agent.nodes[0].make_prompt(agent, tape).messages
    assert [i for i, m in enumerate(fewer[2:-1]) if "trimmed to fit" in m["content"]] == [0, 1, 2, 3, 4]
    # a budget too small to fit anything still keeps the newest observation and the user's message
    agent.nodes[0].max_prompt_tokens = 10
    tiny = agent.nodes[0].make_prompt(agent, tape).messages
    assert tiny[1]["content"] == "Summarise the pages." and tiny[-2] == whole[-2]
    assert all("trimmed to fit" in m["content"] for m in tiny[2:-2])


def test_the_backends_tokenizer_counts_when_it_has_one() -> None:
    assert token_counter(FunctionLLM(fn=lambda p: "")) is estimate_tokens
    words = WordLLM(fn=lambda p: "")
    assert token_counter(words)("a b c") == 3
    node = MonoNode(name="n", instruction="Go.", step_classes=[FinalAnswer], max_prompt_tokens=400)
    agent = MonoAgent.create("a", llms=words, nodes=[node])
    prompt = agent.nodes[0].make_prompt(agent, _long_tape(6))
    kept = [m for m in prompt.messages if "page " in m["content"]]
    assert sum(words.count_tokens(m["content"]) for m in prompt.messages) <= 400
    assert 1 <= len(kept) < 6  # counted in words, a different cut than chars/4 would make


def test_the_node_config_round_trips_through_json_by_step_kind() -> None:
    node = make_agent().find_node("act")
    data = json.loads(node.model_dump_json())
    assert data["step_classes"] == ["mono_test_plan", "tool_call", "mono_test_answer"]
    again = MonoNode.model_validate_json(node.model_dump_json())
    assert again.step_classes == STEPS and again == node


def test_extract_demo_gives_the_user_turn_and_the_json_written() -> None:
    agent = make_agent()
    tape = run(agent)
    demo = agent.find_node("plan").extract_demo(agent, tape, 1)  # type: ignore[attr-defined]
    assert demo == Demo.chat(
        "What is 6 times 7?", out({"kind": "mono_test_plan", "plan": ["compute", "answer"]})
    )


@needs_local_model
def test_the_embedded_model_writes_schema_constrained_steps() -> None:
    """On llama.cpp the response schema constrains decoding: the output always parses into the
    declared classes, its tokenizer counts the budget, and training text rebuilds the output."""
    from tapekit.llm.llamacpp import LlamaCppLLM

    llm = LlamaCppLLM(parameters={"temperature": 0.0, "max_tokens": 96})
    node = MonoNode(name="answer", instruction="Answer now.", max_steps=1, max_prompt_tokens=2000)
    agent = MonoAgent.create(
        "a", llms=llm, nodes=[node], system="Answer in a few words.", step_classes=[FinalAnswer]
    )
    assert token_counter(llm) == llm.count_tokens
    tape = agent.run(Tape(steps=[UserStep(content="What is the capital of France?")])).get_final_tape()
    assert tape.metadata.error is None
    made = tape.steps[1:]
    assert len(made) == 1 and isinstance(made[0], FinalAnswer), made
    (text,) = agent.make_training_text(tape)
    assert json.loads(text.output_text.split("<|im_end|>")[0]) == {"steps": [made[0].llm_dict()]}
