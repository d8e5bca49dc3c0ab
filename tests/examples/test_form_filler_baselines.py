"""The form-filling study's fairer baselines and cost accounting (issue 44): the student's output
grammar (what the zero-shot student is held to), the few-shot demos (training companies only),
the passes decided by a rule against those passed by default, the cost ratio's two factors, and
the teacher's tokens counted by a tokenizer. Fast: no student is trained here (the one command
with every arm is tests/examples/test_form_filler_run.py's tiny-budget test)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from examples.form_filler import run
from examples.form_filler.agents import (
    INTENT_STEPS,
    RESPOND_STEPS,
    TEXT_CHARACTERS,
    FormNode,
    make_student,
    make_teacher,
    output_schema,
)
from examples.form_filler.costs import PAPER_PRICES
from examples.form_filler.distill import demos_by_node, few_shot_demos, for_student, reusable
from examples.form_filler.greadth import GreadthReport, TurnLabels
from examples.form_filler.greadth_rules import CRITERIA
from examples.form_filler.oracle import (
    ESTIMATED,
    OracleLLM,
    count_output_tokens,
    count_prompt_tokens,
    smollm2_counter,
)
from examples.form_filler.schema import load_form_set
from examples.form_filler.tree import TreeSettings, grow_tree
from tapekit import FunctionLLM, Prompt
from tapekit.store import SQLiteStore
from tests.conftest import needs_local_model

jsonschema = pytest.importorskip("jsonschema")

FORMS = load_form_set()
SPLITS = run.make_splits(FORMS, 2)
STUDENT = make_student(FunctionLLM(fn=lambda prompt: "[]"))


def _training_tapes() -> list[Any]:
    """Teacher tapes of two training companies (one bundled, one made up), prepared for the student."""
    teacher = make_teacher(OracleLLM())
    tapes = []
    for company in (SPLITS.train[0], SPLITS.made_up[0]):
        tree = grow_tree(teacher, company, TreeSettings(intents=4, beam_width=6))
        tapes += [b.tape for b in tree.branches if b.error is None]
    return reusable(tapes, STUDENT)


TAPES = _training_tapes()


# ----------------------------------------------------------------------------- output grammar


def test_the_output_grammar_admits_every_answer_the_student_is_trained_on() -> None:
    """Every (prompt, output) pair of the training tapes, with the grammar in the prompt: the
    teacher's answer (the tuned student's target) is valid under the prompt's schema."""
    constrained = make_student(FunctionLLM(fn=lambda prompt: "[]"), constrain=True)
    validators: dict[str, Any] = {}
    n = 0
    for tape in TAPES:
        _, calls = constrained.reuse(tape)
        for call in calls:
            schema = call.prompt.response_schema
            assert schema is not None
            key = json.dumps(schema, sort_keys=True)
            if key not in validators:  # three schemas: building a validator is the slow part
                jsonschema.Draft202012Validator.check_schema(schema)
                validators[key] = jsonschema.Draft202012Validator(schema)
            validators[key].validate(json.loads(call.output.content or ""))
            n += 1
    assert n > 100 and len(validators) == 2  # intent discovery, and respond with a form selected
    _, plain = STUDENT.reuse(TAPES[0])
    assert all(c.prompt.response_schema is None for c in plain), "only the grammar arm is constrained"


def _valid(schema: dict[str, Any], value: Any) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def test_the_output_grammar_refuses_what_the_node_would_not_parse() -> None:
    schema = output_schema(RESPOND_STEPS, form_selected=True)
    ask = {"kind": "prompt_user_for_text_message", "prompt": "Which date?"}
    plan = {"kind": "request_function_parameters", "parameters": ["date"]}
    assert _valid(schema, [ask]) and _valid(schema, [plan, ask])
    assert _valid(schema, [{"kind": "update_function_parameters", "assign": {"a": "b"}}, plan, ask])
    assert not _valid(schema, []), "a turn-ending node writes an action"
    assert not _valid(schema, [plan]), "no action"
    assert not _valid(schema, [ask, plan]), "the action comes last"
    assert not _valid(schema, [ask, ask]), "exactly one action"
    assert not _valid(schema, [plan] * 5 + [ask]), "at most MAX_THOUGHTS thoughts"
    assert not _valid(schema, [{"kind": "gather_values", "parameters": {}}, ask]), "the teacher's note"
    assert not _valid(schema, [{**ask, "extra": 1}]), "no other fields"
    assert not _valid(schema, [{**ask, "prompt": "x" * (TEXT_CHARACTERS + 1)}]), "bounded text"
    assert not _valid(schema, [{"kind": "update_function_parameters", "assign": {"a": 3}}, ask])
    assert not _valid(schema, [{**plan, "parameters": ["a", "b"]}, ask]), "one slot per request"
    # before a form is selected the function must be named
    intent = output_schema(INTENT_STEPS)
    assert _valid(intent, [{"kind": "inspect_function", "function": "OrderLocker"}])
    assert not _valid(intent, [{"kind": "inspect_function"}])
    assert _valid(intent, [{"kind": "resolve_function"}])
    with pytest.raises(ValueError, match="needs at least one action"):
        output_schema(RESPOND_STEPS[:3])


def test_the_output_grammar_compiles_for_both_decoders() -> None:
    """llama.cpp (its converter falls back to any JSON in silence, so it is called directly) and
    llguidance (transformers) both take the schemas."""
    schemas = [output_schema(RESPOND_STEPS, form_selected=s) for s in (False, True)]
    schemas.append(output_schema(INTENT_STEPS))
    llguidance = pytest.importorskip("llguidance")
    from tapekit.llm._grammar import JSON_LAYOUT

    for schema in schemas:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_LAYOUT)
        assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    for schema in schemas:
        assert llama_grammar.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)


def test_a_constrained_node_puts_the_grammar_in_its_prompt() -> None:
    agent = make_student(FunctionLLM(fn=lambda prompt: "[]"), constrain=True)
    tape = TAPES[0]
    _, calls = agent.reuse(tape)
    node = next(n for n in agent.nodes if n.name == "respond")
    assert isinstance(node, FormNode) and node.constrain
    respond = [c for c in calls if c.prompt.messages[-1]["content"].startswith("form ")]
    assert respond and all(
        c.prompt.response_schema == output_schema(RESPOND_STEPS, form_selected=True) for c in respond
    )


# ----------------------------------------------------------------------------- few-shot demos


def test_few_shot_demos_come_from_the_training_tapes_only_and_are_fixed() -> None:
    demos = few_shot_demos(TAPES, 2)
    assert [d.node for d in demos] == ["intent_discovery"] * 2 + ["respond"] * 2
    assert len({d.tape_id for d in demos if d.node == "respond"}) == 2, "each from another tape"
    train_ids = {t.metadata.id for t in TAPES}
    assert {d.tape_id for d in demos} <= train_ids
    # the forms the demos show are training forms, never a val, test or fresh one
    train_forms = {f.name for c in SPLITS.train for f in c.forms}
    held_out = {f.name for s in ("val", "test", "fresh") for c in SPLITS.companies(s) for f in c.forms}
    shown = set()
    for demo in demos:
        for word in demo.prompt.replace(",", " ").split() + demo.output.replace('"', " ").split():
            if word in train_forms or word in held_out:
                shown.add(word)
    assert shown and shown <= train_forms and not shown & held_out
    # every demo is a real training pair: its answer parses as the student's own
    for demo in demos:
        assert json.loads(demo.output)
    # the same demos whatever the order of the tapes; k bounds them; 0 gives none
    shuffled = list(TAPES)
    random.Random(1).shuffle(shuffled)
    assert few_shot_demos(shuffled, 2) == demos
    assert [d.node for d in few_shot_demos(TAPES, 3)].count("respond") == 3
    assert few_shot_demos(TAPES, 0) == []
    with pytest.raises(ValueError):
        few_shot_demos(TAPES, -1)
    # the intent demos show both situations: forms not looked up yet, and forms offered
    intent = [d for d in demos if d.node == "intent_discovery"]
    assert {json.loads(d.output)[0]["kind"] for d in intent} == {"resolve_function", "inspect_function"}


def test_the_few_shot_prompt_shows_k_demos_before_the_task() -> None:
    demos = few_shot_demos(TAPES, 2)
    agent = make_student(FunctionLLM(fn=lambda prompt: "[]"), demos=demos_by_node(demos))
    _, calls = agent.reuse(for_student(TAPES[1]))
    respond = [d for d in demos if d.node == "respond"]
    for call in calls:
        messages = call.prompt.messages
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        node_demos = respond if messages[-1]["content"].startswith("form ") else demos[:2]
        assert [(m["content"]) for m in messages[1:5]] == [
            x for d in node_demos for x in (d.prompt, d.output)
        ]
        assert call.prompt.response_schema is None
    with pytest.raises(ValueError, match="unknown student nodes"):
        make_student(FunctionLLM(fn=lambda prompt: "[]"), demos={"gather_values": []})


def test_baseline_flags() -> None:
    settings = run.parse_args([])
    assert (settings.baselines, settings.shots) == (True, 2)
    settings = run.parse_args(["--no-baselines", "--shots", "4", "--split", "fresh"])
    assert (settings.baselines, settings.shots, settings.split) == (False, 4, "fresh")
    assert settings.scored_tree() == settings.fresh_tree
    with pytest.raises(SystemExit):
        run.parse_args(["--shots", "-1"])


# ----------------------------------------------------------------------------- rule vs default


def _turn(i: int, rules: dict[str, bool | None], valid: bool = True, cost: float = 0.0) -> TurnLabels:
    labels = {c: valid and rules.get(c) is not False for c in CRITERIA}
    return TurnLabels(
        tape_id=f"t{i}",
        turn=0,
        user_index=1,
        end_index=2,
        behavior="b",
        user_message=f"m{i}",
        valid=valid,
        rules={c: rules.get(c) for c in CRITERIA},
        labels=labels,
        greadth=all(labels.values()),
        llm_calls=1,
        prompt_tokens=100,
        completion_tokens=20,
        cost=cost,
    )


def test_passes_by_rule_and_by_default_add_up() -> None:
    decided = dict.fromkeys(CRITERIA, True)
    turns = [
        _turn(0, decided),  # every criterion passed by a rule
        _turn(1, {"accurate": True}),  # accurate by a rule, the other five by default
        _turn(2, {"accurate": False}),  # accurate failed, the rest by default
        _turn(3, {}, valid=False),  # invalid: fails everything
    ]
    report = GreadthReport(turns={"s": turns})
    sources = report.pass_sources("s")
    assert sources["accurate"] == {
        "rule": 2,
        "judge": 0,
        "rule+judge": 0,
        "default": 0,
        "passed": 2,
        "failed": 2,
    }
    assert sources["helpful"] == {
        "rule": 1,
        "judge": 0,
        "rule+judge": 0,
        "default": 2,
        "passed": 3,
        "failed": 1,
    }
    assert sources["greadth"] == {"passed": 2, "all_decided": 1, "some_default": 1, "failed": 2}
    for criterion in CRITERIA:
        c = sources[criterion]
        assert c["rule"] + c["judge"] + c["rule+judge"] + c["default"] == c["passed"]
        assert c["passed"] == round(report.score("s", criterion).value * len(turns))
    assert report.summary()["s"]["pass_sources"] == sources
    text = report.to_text()
    assert "What decided each pass" in text and "1 / 2" in text and "2 (1)" in text


# ----------------------------------------------------------------------------- cost ratios


def test_cost_ratios_keep_the_token_and_price_factors_apart() -> None:
    big, small = PAPER_PRICES["Llama-3.1-405B-Instruct"], PAPER_PRICES["Llama-3.1-8B-Instruct"]
    teacher = [_turn(i, {}) for i in range(4)]  # 4 passing turns of 120 tokens
    for t in teacher:
        t.prompt_tokens, t.completion_tokens = 1000, 200
        t.cost = big.cost(1000, 200)
    student = [_turn(i, {} if i < 2 else {"accurate": False}) for i in range(4)]  # 2 pass
    for t in student:
        t.cost = small.cost(100, 20)
    report = GreadthReport(
        turns={"teacher": teacher, "student": student},
        prices={"Llama-3.1-405B-Instruct": big, "Llama-3.1-8B-Instruct": small},
        priced_as={"teacher": "Llama-3.1-405B-Instruct", "student": "Llama-3.1-8B-Instruct"},
        tokens_measured=True,
    )
    ratios = report.cost_ratios("teacher", "student")
    per_turn, passing = ratios["per_turn"], ratios["per_passing_turn"]
    assert per_turn["token_ratio"] == pytest.approx(10.0)
    assert per_turn["price_ratio"] == pytest.approx(1.79 / 0.055)
    assert per_turn["cost_ratio"] == pytest.approx(10.0 * 1.79 / 0.055)
    # per passing turn the student's cost is spread over half as many turns: the ratio halves
    assert passing["token_ratio"] == pytest.approx(5.0)
    assert passing["cost_ratio"] == pytest.approx(per_turn["cost_ratio"] / 2)
    assert passing["price_ratio"] == per_turn["price_ratio"]
    assert ratios["list_price_ratios"] == {
        "prompt": pytest.approx(32.545, 1e-3),
        "completion": pytest.approx(32.545, 1e-3),
    }
    assert ratios["passing_turns"] == {"teacher": 4, "student": 2}
    for t in student:
        t.greadth = False
    assert report.cost_ratios("teacher", "student")["per_passing_turn"] is None
    unmeasured = GreadthReport(turns={"teacher": teacher, "student": student})
    assert unmeasured.cost_ratios("teacher", "student")["per_turn"] is None


# ----------------------------------------------------------------------------- teacher tokens


def test_without_a_tokenizer_the_teacher_estimates_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import tapekit.llm

    class Broken:
        def __init__(self, **kwargs: Any) -> None:
            raise ImportError("no llama_cpp here")

    monkeypatch.setattr(tapekit.llm, "LlamaCppLLM", Broken)
    counter, how = smollm2_counter()
    assert counter is None and how.startswith(ESTIMATED) and "no llama_cpp here" in how
    prompt = Prompt(messages=[{"role": "user", "content": "x" * 40}])
    assert count_prompt_tokens(None, prompt) == 10 and count_output_tokens(None, "y" * 8) == 2


@needs_local_model
def test_the_teacher_s_tokens_are_counted_by_the_smollm2_tokenizer(tmp_path: Path) -> None:
    """The teacher's stored calls carry the SmolLM2 tokenizer's counts (its chat template on the
    prompt, the end-of-turn token on the answer: as the student's llama.cpp calls count theirs)."""
    counter, how = smollm2_counter()
    assert counter is not None and how.startswith("counted by the SmolLM2")
    teacher = make_teacher(OracleLLM(counter=counter))
    with SQLiteStore(tmp_path / "t.db") as store:
        grow_tree(teacher, SPLITS.made_up[0], TreeSettings(intents=1, beam_width=1), store=store)
        store.flush()
        calls = [store.get_llm_call(i) for i in store.list_llm_calls()]
    assert len(calls) >= 5
    for call in calls:
        assert call is not None
        rendered = counter.render_prompt(call.prompt)[0]
        assert (
            call.prompt_tokens == counter.count_tokens(rendered) == count_prompt_tokens(counter, call.prompt)
        )
        assert call.output_tokens == counter.count_tokens(call.output.content) + 1
    # SmolLM2's tokenizer makes fewer tokens of these prompts than 4 characters each would
    assert sum(c.prompt_tokens for c in calls if c) != sum(
        count_prompt_tokens(None, c.prompt) for c in calls if c
    )
