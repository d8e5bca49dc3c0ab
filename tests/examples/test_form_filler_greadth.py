"""GREADTH evaluation of the form filler: agent turns, the programmatic rules (each violation on
a hand-built tape), the LLM judge (scripted), and the report (intervals, behaviours, costs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from examples.form_filler.behaviors import behavior
from examples.form_filler.costs import PAPER_PRICES
from examples.form_filler.environment import FormFillerEnvironment
from examples.form_filler.greadth import GreadthReport, greadth_report, label_turns
from examples.form_filler.greadth_rules import CRITERIA, agent_turns
from examples.form_filler.judge import CRITERION_QUESTIONS, GreadthJudge, JudgeOutputError, parse_yes_no
from examples.form_filler.schema import load_form_set
from examples.form_filler.steps import (
    AnswerFromFunctionSchemaThought,
    CallFunctionAction,
    ExitAction,
    InspectFunctionAction,
    PromptUserForTextMessageAction,
    RefuseInvalidFunctionParameterValueThought,
    RefuseToEngageThought,
    RequestFunctionCallConfirmationThought,
    RequestFunctionParametersThought,
    ResolveFunctionAction,
    UpdateFunctionParametersThought,
)
from examples.form_filler.users import make_intent, respond
from tapekit import FunctionLLM, LLMOutputParsingFailure, Prompt, Step, Tape
from tapekit.core import LLMOutput, StepMetadata
from tapekit.llm.base import LLMCall

SHOP = load_form_set().company("ShopCorp")
COUPON = "CreateDigitalCoupon"
INTENT = make_intent(SHOP, COUPON, seed=1)  # discount_type: percentage
ENV = FormFillerEnvironment(SHOP)
ALL_TRUE = dict.fromkeys(CRITERIA, True)
ALL_FALSE = dict.fromkeys(CRITERIA, False)


def _user(name: str, tape: Tape[Any, Any], seed: int = 3) -> Tape[Any, Any]:
    return tape.append(respond(behavior(name), tape, INTENT, seed=seed))


def _act(tape: Tape[Any, Any], *steps: Step) -> Tape[Any, Any]:
    """The agent's steps, each action answered by the environment (no user hook: a message ends)."""
    for step in steps:
        tape = tape.append(step)
        if isinstance(step, ResolveFunctionAction | InspectFunctionAction | CallFunctionAction | ExitAction):
            tape = ENV.react(tape)
    return tape


def _opening() -> Tape[Any, Any]:
    return Tape(steps=[PromptUserForTextMessageAction(prompt="Hi, how can I help you?")])


def _asked_discount() -> Tape[Any, Any]:
    """A short opening, the coupon form imported, then discount_type asked for."""
    tape = _user("UserInitMessageShort", _opening())
    return _act(
        tape,
        ResolveFunctionAction(query=tape.steps[-1].content),
        InspectFunctionAction(function=COUPON),
        RequestFunctionParametersThought(function=COUPON, parameters=["discount_type"]),
        PromptUserForTextMessageAction(
            prompt="Which discount type: percentage, fixed_amount or free_shipping?"
        ),
    )


def _last(tape: Tape[Any, Any]) -> Any:
    (labels,) = label_turns([tape], last_only=True)
    return labels


def _ask(slot: str, said: str = "") -> list[Step]:
    """Ask for ``slot``, after saying ``said`` (what the turn changed)."""
    return [
        RequestFunctionParametersThought(function=COUPON, parameters=[slot]),
        PromptUserForTextMessageAction(prompt=f"{said}What is the {slot}?"),
    ]


SET_PERCENTAGE = "I set the discount type to percentage. "


def _rules(labels: Any) -> dict[str, bool]:
    return {f.rule: f.passed for f in labels.findings}


# --------------------------------------------------------------------------- turns and a good turn


def test_turns_are_the_steps_between_user_messages() -> None:
    tape = _act(_user("UserHappyPath", _asked_discount()), *_ask("coupon_code"))
    turns = agent_turns(tape)
    assert [(t.user_at, t.end) for t in turns] == [(1, 8), (8, len(tape))]
    assert [t.behavior for t in turns] == ["UserInitMessageShort", "UserHappyPath"]
    assert turns[1].message == "What is the coupon_code?"
    assert isinstance(turns[1].ending, PromptUserForTextMessageAction)
    assert agent_turns(tape, last_only=True) == turns[1:]
    unanswered = agent_turns(_user("UserHappyPath", _asked_discount()))
    assert [(t.user_at, t.end) for t in unanswered] == [(1, 8)]  # the last message has no answer yet


def test_good_turn_passes_every_rule() -> None:
    tape = _user("UserHappyPath", _asked_discount())
    tape = _act(
        tape, UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "percentage"})
    )
    labels = _last(_act(tape, *_ask("coupon_code", SET_PERCENTAGE)))
    assert labels.valid and labels.greadth and labels.labels == ALL_TRUE
    assert _rules(labels) == {
        "required_not_skipped": True,
        "values_filled": True,
        "unfounded_values": True,
        "follows_plan": True,
        "moves_forward": True,
        "requests_known_slot": True,
        "requests_open_slot": True,
        "acknowledges_changes": True,
    }
    assert labels.rules == {**dict.fromkeys(CRITERIA, True), "responsive": None}
    assert labels.source("accurate") == "rule" and labels.source("responsive") == "default"


def test_transparency_needs_each_change_named() -> None:
    tape = _user("UserHappyPath", _asked_discount())
    tape = _act(
        tape, UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "percentage"})
    )
    silent = _last(_act(tape, *_ask("coupon_code")))
    assert silent.labels == {**ALL_TRUE, "transparent": False}
    assert silent.failed_rules()[0].detail == "the message does not mention: discount_type"
    by_value = _last(_act(tape, *_ask("coupon_code", "Percentage it is. ")))
    assert by_value.labels == ALL_TRUE


def test_first_turn_imports_the_users_form_or_not() -> None:
    right = _last(_asked_discount())
    assert right.labels == ALL_TRUE and _rules(right)["intent"] is True
    tape = _user("UserInitMessageShort", _opening())
    wrong = _last(_act(tape, InspectFunctionAction(function="RequestGiftWrapping"), *_ask("gift_message")))
    assert _rules(wrong)["intent"] is False and wrong.labels == {**ALL_TRUE, "accurate": False}
    assert (
        "imported RequestGiftWrapping; the user wants CreateDigitalCoupon" in wrong.failed_rules()[0].detail
    )
    asks = _user("UserInitMessageAsk", _opening())
    eager = _last(_act(asks, InspectFunctionAction(function=COUPON), *_ask("discount_type")))
    assert _rules(eager)["intent"] is False and not eager.greadth


# --------------------------------------------------------------------------- each violation


def test_invalid_value_accepted_is_an_invalid_continuation() -> None:
    tape = _user("UserInvalidValue", _asked_discount())
    bad = tape.steps[-1].metadata.other["facts"]["invalid"]["discount_type"]
    update = UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": bad})
    labels = _last(_act(tape, update, *_ask("coupon_code")))
    assert not labels.valid and labels.labels == ALL_FALSE and not labels.greadth
    fatal = [f for f in labels.findings if f.fatal]
    assert [f.rule for f in fatal] == ["invalid_value_filled"] and "not one of the allowed values" in fatal[
        0
    ].detail
    assert labels.source("grounded") == "invalid"


def test_invalid_value_must_be_refused() -> None:
    tape = _user("UserInvalidValue", _asked_discount())
    bad = tape.steps[-1].metadata.other["facts"]["invalid"]["discount_type"]
    ignored = _last(_act(tape, *_ask("discount_type")))
    assert _rules(ignored)["refuses_invalid"] is False
    assert ignored.labels == {**ALL_TRUE, "disciplined": False, "responsive": False}
    refuse = RefuseInvalidFunctionParameterValueThought(
        function=COUPON, parameter="discount_type", parameter_value=bad
    )
    refused = _last(_act(tape, refuse, *_ask("discount_type")))
    assert refused.labels == ALL_TRUE and refused.rules["responsive"] is True


def test_required_slot_skipped() -> None:
    tape = _user("UserSkipsUnskipable", _asked_discount())
    skip = UpdateFunctionParametersThought(function=COUPON, skip=["discount_type"])
    labels = _last(_act(tape, skip, *_ask("coupon_code", "I skipped the discount type. ")))
    assert (
        _rules(labels)["required_not_skipped"] is False and _rules(labels)["refuses_required_skip"] is False
    )
    assert labels.labels == {**ALL_TRUE, "accurate": False, "disciplined": False, "responsive": False}
    assert labels.valid  # wrong, but a valid continuation


def test_submission_with_missing_values_is_an_invalid_continuation() -> None:
    tape = _user("UserHappyPath", _asked_discount())
    update = UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "percentage"})
    labels = _last(_act(tape, update, CallFunctionAction(function=COUPON)))
    assert not labels.valid and labels.labels == ALL_FALSE
    assert [f.rule for f in labels.findings if f.fatal] == ["failed_submission"]
    assert "coupon_code: required but missing" in labels.failed_rules()[0].detail
    assert _rules(labels)["submits_after_confirmation"] is False  # and it was not confirmed either
    retried = _last(
        _act(tape, update, CallFunctionAction(function=COUPON), CallFunctionAction(function=COUPON))
    )
    assert [f.rule for f in retried.findings if f.fatal] == ["failed_submission"]  # once, not per retry


def test_unparsable_output_and_agent_error_zero_every_criterion() -> None:
    tape = _user("UserHappyPath", _asked_discount())
    failed = _act(tape, LLMOutputParsingFailure(error="the output is not JSON", raw="Sure! Here you go"))
    labels = _last(failed)
    assert labels.labels == ALL_FALSE and {f.rule for f in labels.findings if f.fatal} == {
        "unparsable",
        "no_ending",
    }
    crashed = tape.model_copy(
        update={"metadata": tape.metadata.model_copy(update={"error": "AgentError: boom"})}
    )
    (turn,) = label_turns([crashed], last_only=True)  # the error, no step: still a turn, all zero
    assert turn.labels == ALL_FALSE and {f.rule for f in turn.findings if f.fatal} == {
        "agent_error",
        "no_ending",
    }


def test_asking_for_a_filled_slot_or_one_the_form_lacks() -> None:
    tape = _user("UserHappyPath", _asked_discount())
    update = UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "percentage"})
    again = _last(_act(tape, update, *_ask("discount_type")))
    assert _rules(again)["requests_open_slot"] is False and again.labels == {**ALL_TRUE, "helpful": False}
    ghost = _last(_act(tape, update, *_ask("colour", SET_PERCENTAGE)))
    assert _rules(ghost)["requests_known_slot"] is False
    assert ghost.labels == {**ALL_TRUE, "grounded": False, "helpful": False}


def test_question_must_be_answered() -> None:
    tape = _user("UserAsksAboutDocs", _asked_discount())
    ignored = _last(_act(tape, *_ask("discount_type")))
    assert _rules(ignored)["answers_question"] is False
    assert ignored.labels == {**ALL_TRUE, "responsive": False, "helpful": False}
    answer = AnswerFromFunctionSchemaThought(function=COUPON)
    assert _last(_act(tape, answer, *_ask("discount_type"))).labels == ALL_TRUE


def test_values_the_user_gave_and_did_not_give() -> None:
    tape = _user("UserMultislotInstruct", _asked_discount())
    given = tape.steps[-1].metadata.other["facts"]["values"]
    assert len(given) == 3
    partial = UpdateFunctionParametersThought(
        function=COUPON, assign={"discount_type": given["discount_type"]}
    )
    labels = _last(_act(tape, partial, *_ask("coupon_code", f"Noted: {given['discount_type']}. ")))
    assert _rules(labels)["values_filled"] is False and labels.labels == {**ALL_TRUE, "accurate": False}
    happy = _user("UserHappyPath", _asked_discount())
    made_up = {"discount_type": "percentage", "coupon_code": "FREE100"}
    invented = _last(
        _act(happy, UpdateFunctionParametersThought(function=COUPON, assign=made_up), *_ask("expiry_date"))
    )
    assert _rules(invented)["unfounded_values"] is False
    assert "coupon_code" in next(f.detail for f in invented.findings if f.rule == "unfounded_values")


def test_off_topic_submission_exit_and_plan_rules() -> None:
    topic = _user("UserChangesTopic", _asked_discount())
    assert _last(_act(topic, *_ask("discount_type"))).labels == {
        **ALL_TRUE,
        "responsive": False,
        "disciplined": False,
    }
    assert _last(_act(topic, RefuseToEngageThought(), *_ask("discount_type"))).labels == ALL_TRUE
    fill = UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "percentage"})
    happy = _act(_user("UserHappyPath", _asked_discount()), fill)
    silent = _last(_act(happy, PromptUserForTextMessageAction(prompt="OK.")))
    assert _rules(silent)["moves_forward"] is False and silent.labels["helpful"] is False
    exit_ = _last(_act(happy, ExitAction(text="Bye")))
    assert _rules(exit_)["exits_after_confirmation"] is False
    planned = _last(
        _act(happy, RequestFunctionCallConfirmationThought(function=COUPON), ExitAction(text="Bye"))
    )
    assert _rules(planned)["follows_plan"] is False and _rules(planned)["confirms_when_complete"] is False
    assert planned.labels == {**ALL_TRUE, "disciplined": False, "helpful": False}


def test_confirmed_submission_passes_and_unconfirmed_fails() -> None:
    tape = _user("UserHappyPath", _asked_discount())
    fill = UpdateFunctionParametersThought(function=COUPON, assign=dict(INTENT.values))
    tape = _act(
        tape,
        fill,
        RequestFunctionCallConfirmationThought(function=COUPON),
        PromptUserForTextMessageAction(prompt="Shall I submit it?"),
    )
    confirm = _user("UserHappyPath", tape)
    assert confirm.steps[-1].metadata.other["facts"]["confirms"] is True
    done = _last(_act(confirm, CallFunctionAction(function=COUPON)))
    assert done.valid and done.labels == ALL_TRUE and done.ending == "call_function"
    assert _rules(done)["submits_after_confirmation"] and _rules(done)["submits_when_confirmed"]
    stalled = _last(_act(confirm, *_ask("coupon_code")))
    assert (
        _rules(stalled)["submits_when_confirmed"] is False and _rules(stalled)["requests_open_slot"] is False
    )


# --------------------------------------------------------------------------- the happy-path main loop


def _happy_path_tape() -> Tape[Any, Any]:
    from examples.form_filler.users import SimulatedUser
    from tapekit import Agent, main_loop
    from tapekit.dialog import UserStep
    from tests.examples.test_form_filler import _RulePolicy

    user = SimulatedUser(make_intent(SHOP, "RequestReturnLabel", seed=2), behavior("UserHappyPath"))
    agent = Agent.create(name="assistant", nodes=[_RulePolicy()])
    start: Tape[Any, Any] = Tape(steps=[UserStep(content="I want a prepaid label to return a parcel")])
    return main_loop(agent, start, FormFillerEnvironment(SHOP, user=user), max_loops=30).get_final_tape()


def test_happy_path_dialogue_labels() -> None:
    labels = label_turns([_happy_path_tape()])
    assert [t.behavior for t in labels] == ["(unlabelled)"] + ["UserHappyPath"] * 5
    assert [t.ending for t in labels] == ["prompt_user_for_text_message"] * 5 + ["call_function"]
    assert [t.greadth for t in labels] == [True, False, False, False, False, True]
    # the test assistant fills each answer and asks for the next slot without a word about the
    # value it set ("What is the order_number?"): not transparent
    for turn in labels[1:5]:
        assert turn.labels["transparent"] is False and "acknowledges_changes" in {
            f.rule for f in turn.failed_rules()
        }
    assert [t.labels for t in labels[1:4]] == [{**ALL_TRUE, "transparent": False}] * 3
    # and it asks to confirm while urgency (default) and additional_notes (optional) were never
    # asked for or skipped: not helpful
    failed = {f.rule: f.detail for f in labels[4].failed_rules()}
    assert failed.keys() == {"confirms_when_complete", "acknowledges_changes"}
    assert failed["confirms_when_complete"].endswith("urgency, additional_notes")
    assert failed["acknowledges_changes"] == "the message does not mention: delivery_date"
    assert labels[4].labels == {**ALL_TRUE, "helpful": False, "transparent": False}
    assert labels[0].rules["accurate"] is True and "intent" not in _rules(labels[0])  # no facts: not judged
    assert _rules(labels[5]) == {
        "required_not_skipped": True,
        "submits_after_confirmation": True,
        "submits_when_confirmed": True,
    }


# --------------------------------------------------------------------------- the judge


def _criterion(prompt: Prompt) -> str:
    text = prompt.messages[-1]["content"]
    return next(c for c, q in CRITERION_QUESTIONS.items() if q in text)


def test_parse_yes_no_is_strict() -> None:
    assert parse_yes_no(" Yes. ") is True and parse_yes_no("no") is False
    for bad in ["yes, it is", "Maybe", "", "y"]:
        with pytest.raises(JudgeOutputError, match="exactly 'yes' or 'no'"):
            parse_yes_no(bad)


def test_judge_prompt_shows_the_turn_but_not_the_ground_truth() -> None:
    tape = _user("UserInvalidValue", _asked_discount())
    (turn,) = agent_turns(_act(tape, *_ask("discount_type")), last_only=True)
    prompt = GreadthJudge(FunctionLLM(fn=lambda p: "yes")).prompt(turn, "responsive")
    text = prompt.messages[0]["content"]
    assert "User: " + tape.steps[-1].content in text and "Assistant: Which discount type" in text
    assert '"enum": [' in text and "What is the discount_type?" in text and "RESPONSIVE" in text
    assert (
        "UserInvalidValue" not in text
        and "facts" not in text
        and "invalid" not in text.split("RESPONSIVE")[0]
    )


def test_judge_labels_agreement_and_unparsable_answers() -> None:
    good = _act(_user("UserHappyPath", _asked_discount()), *_ask("coupon_code"))  # values_filled fails
    bad = _act(
        _user("UserInvalidValue", _asked_discount()),
        UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "purple"}),
        *_ask("coupon_code"),
    )
    asked: list[str] = []

    def answer(prompt: Prompt) -> str:
        criterion = _criterion(prompt)
        asked.append(criterion)
        return {"transparent": "no", "grounded": "Maybe?", "accurate": "Yes."}.get(criterion, "yes")

    judge = FunctionLLM(fn=answer, model_name="judge-1")
    report = greadth_report({"agent": [good, bad]}, judge=judge, last_only=True, n_bootstrap=0)
    assert report.judge_model == "judge-1"
    assert sorted(asked) == sorted(CRITERIA)  # one prompt per criterion, none for the invalid turn
    first, invalid = report.turns["agent"]
    assert invalid.judge == {} and invalid.labels == ALL_FALSE
    assert first.judge["grounded"].answer is None and "Maybe?" in (first.judge["grounded"].error or "")
    assert first.labels == {**ALL_TRUE, "accurate": False, "transparent": False}
    assert first.source("transparent") == "judge" and first.source("accurate") == "rule+judge"
    assert first.source("grounded") == "rule"  # the unparsable answer leaves the rule's label
    agreement = report.agreement("agent")
    assert agreement["accurate"].model_dump() == {
        "n": 1,
        "agree": 0,
        "rule_yes_judge_no": 0,
        "rule_no_judge_yes": 1,
    }
    assert agreement["helpful"].rate == 1.0 and agreement["transparent"].n == 0
    assert report.judge_unparsable("agent")["grounded"] == 1
    text = report.to_text()
    assert "LLM judge (judge-1) vs rules" in text


def test_judge_llm_error_propagates_and_questions_are_checked() -> None:
    def broken(prompt: Prompt) -> str:
        raise RuntimeError("judge server down")

    tape = _act(_user("UserHappyPath", _asked_discount()), *_ask("coupon_code"))
    with pytest.raises(RuntimeError, match="judge server down"):
        greadth_report({"agent": [tape]}, judge=FunctionLLM(fn=broken))
    with pytest.raises(ValueError, match="no prompt for criteria"):
        GreadthJudge(FunctionLLM(fn=lambda p: "yes"), questions={"grounded": "?"})
    with pytest.raises(TypeError, match="judge must be a tapekit LLM"):
        greadth_report({"agent": [tape]}, judge="gpt-4o")


# --------------------------------------------------------------------------- the report


def _with_calls(
    tape: Tape[Any, Any], model: str, prompt_tokens: int, output_tokens: int
) -> tuple[Tape[Any, Any], dict[str, LLMCall]]:
    """``tape`` with a prompt id and an LLM call for each update and message after the opening."""
    calls: dict[str, LLMCall] = {}
    steps = list(tape.steps)
    for i, step in enumerate(steps):
        if step.kind in {"update_function_parameters", "prompt_user_for_text_message"} and i > 1:
            pid = f"p{i}"
            steps[i] = step.model_copy(update={"metadata": StepMetadata(prompt_id=pid)})
            calls[pid] = LLMCall(
                prompt=Prompt(id=pid, messages=[]),
                output=LLMOutput(content=""),
                model=model,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
            )
    return Tape(steps=steps), calls


def test_report_tables_costs_and_json(tmp_path: Path) -> None:
    good = _act(
        _user("UserHappyPath", _asked_discount()),
        UpdateFunctionParametersThought(function=COUPON, assign={"discount_type": "percentage"}),
        *_ask("coupon_code", SET_PERCENTAGE),
    )
    wrong = _act(_user("UserInvalidValue", _asked_discount()), *_ask("coupon_code"))
    good, good_calls = _with_calls(good, "big", 1000, 100)
    wrong, wrong_calls = _with_calls(wrong, "big", 3000, 300)
    calls = good_calls | wrong_calls
    report = greadth_report(
        {"teacher": [good, wrong], "student": [good]},
        prices={"Llama-3.1-405B-Instruct": PAPER_PRICES["Llama-3.1-405B-Instruct"], "small": (0.1, 0.2)},
        llm_calls=calls,
        priced_as={"teacher": "Llama-3.1-405B-Instruct", "student": "small"},
        last_only=True,
        n_bootstrap=200,
    )
    teacher = report.score("teacher")
    assert teacher.value == 0.5 and teacher.low == 0.0 and teacher.high == 1.0
    assert (
        report.score("teacher", "responsive").value == 0.5
        and report.score("teacher", "grounded").value == 1.0
    )
    assert report.score("teacher", "greadth", "UserInvalidValue").value == 0.0
    assert report.behaviors() == ["UserHappyPath", "UserInvalidValue"]
    costs = report.costs("teacher")
    # good's last turn made two calls (its update and its message): 2 x (1000 + 100) tokens;
    # wrong's made one (its message): 3000 + 300; both at the 405B price, $1.79 per 1M tokens
    assert costs["prompt_tokens_per_turn"] == (2000 + 3000) / 2 and costs["completion_tokens_per_turn"] == 250
    assert costs["llm_calls_per_turn"] == 1.5
    assert costs["cost_per_million_turns"] == pytest.approx((2200 + 3300) / 2 * 1.79)
    assert report.costs("student")["cost_per_million_turns"] == pytest.approx(2000 * 0.1 + 200 * 0.2)
    with pytest.raises(ValueError, match="no price for model 'big'"):
        greadth_report({"student": [good]}, prices={"small": (0.1, 0.2)}, llm_calls=calls)
    with pytest.raises(ValueError, match="which is not in prices"):
        greadth_report({"student": [good]}, prices={"small": (0.1, 0.2)}, priced_as={"student": "big"})
    text = report.to_text()
    for expected in [
        "GREADTH per agent turn",
        "UserInvalidValue",
        "ALL BEHAVIORS",
        "$ per 1M turns",
        "4,922.50",
    ]:
        assert expected in text
    loaded = GreadthReport.load(report.save(tmp_path / "greadth.json"))
    assert loaded.turns == report.turns and loaded.score("teacher") == teacher
    summary = json.loads(report.to_json())["summary"]
    assert summary["teacher"]["scores"]["greadth"]["value"] == 0.5
    assert summary["teacher"]["sources"]["transparent"] == {
        "rule": 1,  # good changed a slot and said so
        "judge": 0,
        "rule+judge": 0,
        "default": 1,  # wrong changed nothing
        "invalid": 0,
    }
    unmeasured = greadth_report({"student": [good]}, n_bootstrap=0)
    assert unmeasured.costs("student")["cost_per_turn"] is None and "not measured" in unmeasured.to_text()


def test_greadth_bootstraps_with_ten_thousand_resamples_by_default() -> None:
    import inspect

    from examples.form_filler.greadth import GreadthReport, greadth_report

    assert inspect.signature(greadth_report).parameters["n_bootstrap"].default == 10_000
    assert GreadthReport().n_bootstrap == 10_000
