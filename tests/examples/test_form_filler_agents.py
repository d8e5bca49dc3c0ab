"""The form filler's teacher and student agents, the oracle teacher LLM and dialogue trees."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples.form_filler.agents import make_student, make_teacher
from examples.form_filler.behaviors import BEHAVIOR_NAMES, behavior
from examples.form_filler.distill import for_student, reusable
from examples.form_filler.environment import FormFillerEnvironment
from examples.form_filler.oracle import Oracle, read_message
from examples.form_filler.render import parse_step_list, steps_json
from examples.form_filler.schema import check_value, load_form_set
from examples.form_filler.state import form_state
from examples.form_filler.steps import (
    ACTIONS,
    THOUGHTS,
    AnswerFromFunctionSchemaThought,
    CallFunctionAction,
    FunctionResult,
    GatherValuesThought,
    InspectFunctionAction,
    ParameterCheck,
    PromptUserForTextMessageAction,
    RefuseInexistentFunctionThought,
    RefuseInvalidFunctionParameterValueThought,
    RefuseSkippingParameterThought,
    RefuseToEngageThought,
    RequestFunctionParametersThought,
    RequestFunctionThought,
    ResolveFunctionAction,
    UpdateFunctionParametersThought,
    VerifyValuesThought,
)
from examples.form_filler.tree import GREETING, TreeSettings, grow_tree, root_tape
from examples.form_filler.users import make_intent, respond
from tapekit import FunctionLLM, StopStep, Tape, main_loop, open_store
from tapekit.structured import LLMOutputParsingFailure, StepParsingError

FORMS = load_form_set()
SHOP = FORMS.company("ShopCorp")
COUPON = SHOP.form("CreateDigitalCoupon")


def _teacher(error_rate: float = 0.0) -> Any:
    return make_teacher(FunctionLLM(model_name="oracle", fn=Oracle(error_rate), stream_chunks=False))


def _turn(agent: Any, tape: Tape[Any, Any], env: FormFillerEnvironment) -> Tape[Any, Any]:
    for event in main_loop(agent, tape, env):
        tape = event.tape if event.tape is not None else tape
    return tape


def _say(tape: Tape[Any, Any], name: str, intent: Any, env: FormFillerEnvironment) -> Tape[Any, Any]:
    user = respond(behavior(name), tape, intent)
    return _turn(_teacher(), tape.with_new_steps([user]), env)


def _since_user(tape: Tape[Any, Any]) -> list[Any]:
    steps = list(tape.steps)
    last = max(i for i, s in enumerate(steps) if s.kind == "user")
    return steps[last + 1 :]


def _kinds(steps: list[Any], cls: type) -> list[Any]:
    return [s for s in steps if isinstance(s, cls)]


# --------------------------------------------------------------------------- step JSON


def test_every_step_of_the_vocabulary_round_trips_through_the_agents_json() -> None:
    examples = [
        GatherValuesThought(function="F", parameters={"a": "x"}),
        VerifyValuesThought(
            function="F", parameters={"a": ParameterCheck(value="x", status="invalid", explanation="no")}
        ),
        UpdateFunctionParametersThought(function="F", assign={"a": "x"}, skip=["b"]),
        RequestFunctionThought(functions=["F", "G"]),
        ResolveFunctionAction(),
        CallFunctionAction(function="F"),
    ]
    classes = [*THOUGHTS, *ACTIONS]
    text = steps_json(examples)
    assert '"kind":"resolve_function"}' in text, "defaults are left out"
    assert [s.llm_dict() for s in parse_step_list(text, classes)] == [s.llm_dict() for s in examples]
    with pytest.raises(StepParsingError, match="allowed"):
        parse_step_list('[{"kind": "weather"}]', classes)
    with pytest.raises(StepParsingError, match="at least one"):
        parse_step_list("[]", classes)
    assert parse_step_list("[]", classes, allow_empty=True) == []
    with pytest.raises(StepParsingError, match="not JSON"):
        parse_step_list("[{", classes)


def test_oracle_reads_the_simulated_users_messages() -> None:
    asked = "discount_type"
    reading = read_message("I'll take the second option.", COUPON, asked)
    assert reading.values == {asked: COUPON.parameter(asked).enum[1]}  # type: ignore[index]
    reading = read_message("WELCOME5. Also, the urgency is turbo.", COUPON, "coupon_code")
    assert reading.values == {"coupon_code": "WELCOME5", "urgency": "turbo"}
    reading = read_message(
        "Before that, the expiry date is 2025-07-15 and the manager email is a@b.example.", COUPON, asked
    )
    assert reading.values == {"expiry_date": "2025-07-15", "manager_email": "a@b.example"}
    assert read_message("Can we skip the coupon code? I'd rather not give it.", COUPON, asked).skip == [
        "coupon_code"
    ]
    assert read_message("Yes, that's all correct, please submit it.", COUPON, None).confirm
    assert read_message("Who won the football match last night?", COUPON, asked).off_topic
    docs = read_message(
        "Before I answer, what is the difference between the discount type options?", COUPON, asked
    )
    assert (docs.question, docs.about) == ("docs", "discount_type")


# --------------------------------------------------------------------------- the teacher


def test_teacher_finds_the_form_then_asks_for_its_first_field() -> None:
    env = FormFillerEnvironment(SHOP)
    intent = make_intent(SHOP, "CreateDigitalCoupon", seed=1)
    tape = _say(root_tape("t", SHOP, 0), "UserInitMessageShort", intent, env)
    turn = _since_user(tape)
    nodes = [s.metadata.node for s in turn if s.metadata.agent == "teacher"]
    assert nodes[0] == "is_form_selected" and "intent_discovery" in nodes and nodes[-1] == "generate"
    assert {"gather_values", "verify_values", "update_and_plan", "plan_next"} <= set(nodes)
    assert _kinds(turn, ResolveFunctionAction)[0].query == intent_text(tape)
    assert [s.function for s in _kinds(turn, InspectFunctionAction)] == ["CreateDigitalCoupon"]
    first = next(iter(COUPON.parameters.properties))
    assert _kinds(turn, RequestFunctionParametersThought)[0].parameters == [first]
    message = turn[-1]
    assert isinstance(message, PromptUserForTextMessageAction)
    assert all(option in message.prompt for option in COUPON.parameter(first).enum or [])


def intent_text(tape: Tape[Any, Any]) -> str:
    return next(s.content for s in tape.steps if s.kind == "user")


@pytest.mark.parametrize("name", ["UserBadInitMessage", "UserInitMessageAsk"])
def test_teacher_offers_the_forms_when_the_ask_is_no_form(name: str) -> None:
    env = FormFillerEnvironment(SHOP)
    tape = _say(root_tape("t", SHOP, 0), name, make_intent(SHOP, "CreateDigitalCoupon"), env)
    turn = _since_user(tape)
    assert not form_state(tape.steps).form_selected
    assert sorted(_kinds(turn, RequestFunctionThought)[0].functions) == sorted(f.name for f in SHOP.forms)
    assert bool(_kinds(turn, RefuseInexistentFunctionThought)) == (name == "UserBadInitMessage")
    assert all(f.name in turn[-1].prompt for f in SHOP.forms)


def _filling(error_rate: float = 0.0) -> tuple[Tape[Any, Any], Any, FormFillerEnvironment]:
    env = FormFillerEnvironment(SHOP)
    intent = make_intent(SHOP, "CreateDigitalCoupon", seed=1)
    return _say(root_tape("t", SHOP, 0), "UserInitMessageShort", intent, env), intent, env


def test_teacher_refuses_invalid_values_and_unskippable_skips() -> None:
    tape, intent, env = _filling()
    for name in ["UserInvalidValue", "UserIncorrectDate", "UserIncorrectWeb", "UserSkipsUnskipable"]:
        after = _say(tape, name, intent, env)
        facts = next(s for s in reversed(after.steps) if s.kind == "user").metadata.other["facts"]
        turn = _since_user(after)
        if "invalid" in facts:
            ((slot, bad),) = facts["invalid"].items()
            refusals = _kinds(turn, RefuseInvalidFunctionParameterValueThought)
            assert [(r.parameter, r.parameter_value) for r in refusals] == [(slot, bad)]
            assert slot not in form_state(after.steps).filled
            assert f"'{bad}' is not a valid" in turn[-1].prompt
        else:
            assert [r.parameter for r in _kinds(turn, RefuseSkippingParameterThought)] == facts[
                "skip_required"
            ]
        assert isinstance(turn[-1], PromptUserForTextMessageAction)


def test_teacher_answers_questions_and_declines_small_talk() -> None:
    tape, intent, env = _filling()
    docs = _since_user(_say(tape, "UserAsksAboutDocs", intent, env))
    assert _kinds(docs, AnswerFromFunctionSchemaThought)
    assert COUPON.parameter("discount_type").description in docs[-1].prompt
    chat = _since_user(_say(tape, "UserChangesTopic", intent, env))
    assert _kinds(chat, RefuseToEngageThought) and "only help" in chat[-1].prompt


def test_teacher_fills_every_field_and_submits_a_valid_form() -> None:
    tape, intent, env = _filling()
    for _ in range(12):
        if form_state(tape.steps).ended:
            break
        tape = _say(tape, "UserHappyPath", intent, env)
    results = _kinds(list(tape.steps), FunctionResult)
    assert len(results) == 1 and results[0].error is None
    assert results[0].arguments == {**intent.values, **results[0].arguments}
    assert isinstance(tape.steps[-1], StopStep)
    assert _kinds(list(tape.steps), CallFunctionAction)[0].function == "CreateDigitalCoupon"


def test_oracle_slips_on_purpose_at_its_error_rate() -> None:
    tape, intent, env = _filling()
    user = respond(behavior("UserInvalidValue"), tape, intent)
    slipped = _turn(_teacher(error_rate=1.0), tape.with_new_steps([user]), env)
    ((slot, bad),) = user.metadata.other["facts"]["invalid"].items()
    assert form_state(slipped.steps).filled[slot] == bad, "the sloppy teacher accepts the invalid value"
    assert check_value(COUPON.parameter(slot), bad) is not None
    with pytest.raises(ValueError, match="error_rate"):
        Oracle(error_rate=2.0)


def test_teacher_training_text_reproduces_every_node_run() -> None:
    tape, intent, env = _filling()
    tape = _say(tape, "UserCorrectValueInvalidValue", intent, env)
    texts = _teacher().make_training_text(tape)
    assert len(texts) >= 10  # intent discovery twice, then five LLM nodes per turn


# --------------------------------------------------------------------------- the student


def test_student_parsing_failure_ends_the_turn() -> None:
    tape, intent, env = _filling()
    user = respond(behavior("UserHappyPath"), tape, intent)
    student = make_student(FunctionLLM(fn=lambda prompt: "not json at all"))
    after = _turn(student, tape.with_new_steps([user]), env)
    turn = _since_user(after)
    assert isinstance(turn[-2], LLMOutputParsingFailure) and isinstance(turn[-1], StopStep)
    assert turn[-2].raw == "not json at all"
    two_actions = '[{"kind":"call_function","function":"X"},{"kind":"exit"}]'
    bad = _turn(make_student(FunctionLLM(fn=lambda p: two_actions)), tape.with_new_steps([user]), env)
    assert "exactly one action" in _since_user(bad)[-2].error


# --------------------------------------------------------------------------- trees


def test_tree_covers_all_19_behaviours_and_every_tape_is_reusable_by_the_student(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "tree.db"))
    settings = TreeSettings(intents=6, beam_width=12, branching=3)
    tree = grow_tree(_teacher(), SHOP, settings, store=store, name="t")
    counts = tree.behavior_counts()
    assert sorted(counts) == sorted(BEHAVIOR_NAMES) and min(counts.values()) >= 1, counts
    assert not [b.error for b in tree.branches if b.error]
    levels = Counter(b.level for b in tree.branches)
    assert max(levels.values()) <= 12 and max(levels) <= 9
    assert all(b.start.steps[0].prompt == GREETING for b in tree.branches)
    assert len(tree.form_counts()) == 6
    student = make_student(FunctionLLM(fn=lambda prompt: "[]"))
    assert len(reusable([b.tape for b in tree.branches], student)) == len(tree.branches)
    adapted, calls = student.reuse(for_student(tree.branches[-1].tape))
    assert {c.prompt.messages[-1]["content"].split("\n")[0] for c in calls} & {"Find the form."}
    assert not any(isinstance(s, GatherValuesThought) for s in adapted.steps)

    again = grow_tree(_teacher(), SHOP, settings, store=store, name="t")
    assert all(b.skipped for b in again.branches), "a rerun takes every finished branch from the store"
    assert [b.tape.metadata.id for b in again.branches] == [b.tape.metadata.id for b in tree.branches]
    store.close()
