"""The form filler's foundation: bundled forms, schema checks, tape vocabulary, environment,
the E.1 prompted generator, and the 19 simulated user behaviours."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from examples.form_filler.behaviors import BEHAVIOR_NAMES, BEHAVIORS, applicable_behaviors, behavior
from examples.form_filler.environment import FormFillerEnvironment
from examples.form_filler.make_forms import form_set_json, make_form_set
from examples.form_filler.schema import (
    DATA_DIR,
    FunctionSchema,
    ParameterSchema,
    ParametersSchema,
    check_call,
    check_form_set,
    check_function_schema,
    load_form_set,
)
from examples.form_filler.state import form_state
from examples.form_filler.steps import (
    ACTIONS,
    THOUGHTS,
    CallFunctionAction,
    DialogueEnded,
    ExitAction,
    FunctionCandidates,
    FunctionResult,
    FunctionSchemaObservation,
    InspectFunctionAction,
    PromptUserForTextMessageAction,
    RequestFunctionCallConfirmationThought,
    RequestFunctionParametersThought,
    ResolveFunctionAction,
    UpdateFunctionParametersThought,
)
from examples.form_filler.users import BehaviorNotApplicable, SimulatedUser, make_intent, respond
from tapekit import Agent, Node, SetNextNode, Step, StopStep, Tape, main_loop
from tapekit.dialog import UserStep
from tapekit.environment import ExternalObservationNeeded

FORMS = load_form_set()
SHOP = FORMS.company("ShopCorp")
COUPON = SHOP.form("CreateDigitalCoupon")

# --------------------------------------------------------------------------- data


def test_bundled_set_is_valid_and_complete() -> None:
    assert [c.name for c in FORMS.train] == ["FlyCorp", "BigBankCorp", "CoffeeCorp"]
    assert [c.name for c in FORMS.test] == ["DriveCorp", "LuxuryCorp", "ShopCorp"]
    assert check_form_set(FORMS, forms_per_company=10, all_kinds=True) == []
    kinds = {p.slot_kind for c in FORMS.train for f in c.forms for p in f.parameters.properties.values()}
    assert kinds == {"categorical", "date", "email", "string"}
    some_default = [
        p for c in FORMS.test for f in c.forms for p in f.parameters.properties.values() if p.default
    ]
    assert some_default, "some optional slots carry defaults"


def test_bundled_files_are_what_the_generator_writes() -> None:
    texts = form_set_json(make_form_set())
    for split in ("train", "test"):
        assert (DATA_DIR / f"{split}.json").read_text(encoding="utf-8") == texts[split], (
            f"data/{split}.json is stale: run python examples/form_filler/make_forms.py"
        )


def test_schema_checks_name_each_problem() -> None:
    bad = FunctionSchema(
        name="bad form",
        description="Has: a colon",
        parameters=ParametersSchema(
            properties={
                "kind": ParameterSchema(description="a choice", enum=["a", "a"]),
                "when": ParameterSchema(description="a day", format="date", default="tomorrow"),
                "who": ParameterSchema(description="an email", format="email", default="x@y.example"),
            },
            required=["kind", "who", "ghost"],
        ),
        return_value={"type": "string"},
    )
    problems = "\n".join(check_function_schema(bad))
    for expected in [
        "name must be an identifier",
        "description contains a colon",
        "bad form.ghost: listed as required but not a parameter",
        "bad form.kind: enum needs two or more distinct values",
        "bad form.when: default 'tomorrow' is not a date",
        "bad form.who: a required parameter has no default",
        "return_value must be a JSON schema of type object",
    ]:
        assert expected in problems


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"discount_type": 3}, "discount_type: must be a string"),
        ({"discount_type": "half_price"}, "discount_type: 'half_price' is not one of the allowed values"),
        ({"expiry_date": "2025-02-30"}, "expiry_date: '2025-02-30' is not a valid date"),
        ({"expiry_date": "30/01/2025"}, "expiry_date: '30/01/2025' is not a date in the format YYYY-MM-DD"),
        ({"manager_email": "jo@"}, "manager_email: 'jo@' is not a valid email address"),
        ({"colour": "red"}, "colour: no such parameter in CreateDigitalCoupon"),
        ({}, "coupon_code: required but missing"),
    ],
)
def test_check_call_cases(arguments: dict[str, Any], expected: str) -> None:
    assert any(expected in p for p in check_call(COUPON, arguments)), check_call(COUPON, arguments)


def _valid_arguments() -> dict[str, str]:
    return {n: v for n, v in make_intent(SHOP, COUPON.name).values.items() if COUPON.is_required(n)}


def test_check_call_accepts_required_values_only() -> None:
    assert check_call(COUPON, _valid_arguments()) == []


# --------------------------------------------------------------------------- vocabulary and environment


def test_vocabulary_covers_appendix_e2_and_round_trips() -> None:
    names = {c.__name__ for c in [*THOUGHTS, *ACTIONS]}
    for expected in [
        "AnswerFromFunctionSchemaThought",
        "NoAnswerInFunctionSchemaThought",
        "RefuseInexistentFunctionThought",
        "RefuseInvalidFunctionParameterValueThought",
        "RefuseSkippingParameterThought",
        "GatherValuesThought",
        "VerifyValuesThought",
        "UpdateFunctionParametersThought",
        "RequestFunctionThought",
        "RequestFunctionParametersThought",
        "RequestFunctionCallConfirmationThought",
        "RequestExitConfirmationThought",
        "ResolveFunctionAction",
        "InspectFunctionAction",
        "PromptUserForTextMessageAction",
        "CallFunctionAction",
        "ExitAction",
    ]:
        assert expected in names
    env = FormFillerEnvironment(SHOP)
    tape = env.react(Tape(steps=[InspectFunctionAction(function=COUPON.name)]))
    again: Tape[Any, Any] = Tape.model_validate_json(tape.model_dump_json())
    assert again.steps[1] == tape.steps[1] and again.steps[1].function_schema == COUPON


def test_resolve_and_inspect() -> None:
    env = FormFillerEnvironment(SHOP)
    tape = env.react(Tape(steps=[ResolveFunctionAction(query="I want a coupon for my online store")]))
    candidates = tape.steps[-1]
    assert isinstance(candidates, FunctionCandidates)
    assert candidates.candidates[0].name == COUPON.name and len(candidates.candidates) == 10
    missing = env.react(Tape(steps=[InspectFunctionAction(function="BookFlight")]))
    assert isinstance(missing.steps[-1], FunctionSchemaObservation)
    assert "ShopCorp has no form 'BookFlight'" in (missing.steps[-1].error or "")


def _selected(env: FormFillerEnvironment) -> Tape[Any, Any]:
    return env.react(
        Tape(
            steps=[
                PromptUserForTextMessageAction(prompt="Hi"),
                UserStep(content="coupon"),
                InspectFunctionAction(function=COUPON.name),
            ]
        )
    )


def test_call_function_uses_the_filled_slots_and_validates_them() -> None:
    env = FormFillerEnvironment(SHOP)
    tape = _selected(env)
    partial = tape.append(UpdateFunctionParametersThought(function=COUPON.name, assign={"coupon_code": "X1"}))
    result = env.react(partial.append(CallFunctionAction(function=COUPON.name))).steps[-1]
    assert isinstance(result, FunctionResult) and result.result is None
    assert "required but missing" in (result.error or "") and "discount_type" in (result.error or "")

    bad = partial.append(
        UpdateFunctionParametersThought(function=COUPON.name, assign={"discount_type": "half"})
    )
    result = env.react(bad.append(CallFunctionAction(function=COUPON.name))).steps[-1]
    assert "discount_type: 'half' is not one of the allowed values" in (result.error or "")

    wrong_form = env.react(tape.append(CallFunctionAction(function="RequestGiftWrapping", arguments={})))
    assert "the dialogue is about CreateDigitalCoupon" in (wrong_form.steps[-1].error or "")

    full = tape.append(UpdateFunctionParametersThought(function=COUPON.name, assign=_valid_arguments()))
    done = env.react(full.append(CallFunctionAction(function=COUPON.name)))
    result = done.steps[-1]
    assert isinstance(result, FunctionResult) and result.error is None
    assert result.result is not None and result.result["request_id"].startswith("REQ-")
    assert result.arguments["urgency"] == "standard"  # an untouched default is submitted
    assert form_state(done).submitted and form_state(done).ended


def test_user_message_waits_for_a_person_or_goes_to_the_user_hook() -> None:
    prompt: Tape[Any, Any] = Tape(steps=[PromptUserForTextMessageAction(prompt="Hi, how can I help you?")])
    with pytest.raises(ExternalObservationNeeded):
        FormFillerEnvironment(SHOP).react(prompt)
    user = SimulatedUser(make_intent(SHOP, COUPON.name), behavior("UserInitMessageShort"))
    answered = FormFillerEnvironment(SHOP, user=user).react(prompt)
    assert isinstance(answered.steps[-1], UserStep)
    assert answered.steps[-1].content == "I need to create a discount coupon for a seller's online store."
    ended = FormFillerEnvironment(SHOP).react(Tape(steps=[ExitAction(text="Bye")]))
    assert isinstance(ended.steps[-1], DialogueEnded) and form_state(ended).ended


# --------------------------------------------------------------------------- simulated users


def _mid_dialogue() -> Tape[Any, Any]:
    """The assistant has the coupon form, filled coupon_code, and asks for discount_type."""
    return _selected(FormFillerEnvironment(SHOP)).extend(
        [
            UpdateFunctionParametersThought(function=COUPON.name, assign={"coupon_code": "SPRING10"}),
            RequestFunctionParametersThought(function=COUPON.name, parameters=["discount_type"]),
            PromptUserForTextMessageAction(prompt="Which kind of discount would you like?"),
        ]
    )


START: Tape[Any, Any] = Tape(steps=[PromptUserForTextMessageAction(prompt="Hi, how can I help you?")])
INTENT = make_intent(SHOP, COUPON.name, seed=1)  # discount_type: percentage


def _turn(name: str) -> UserStep:
    b = behavior(name)
    return respond(b, START if b.stage == "start" else _mid_dialogue(), INTENT, seed=3)


def test_all_19_behaviours_registered_with_the_papers_names() -> None:
    assert BEHAVIOR_NAMES == [
        "UserInitMessageAmazing", "UserInitMessageShort", "UserInitMessageAsk", "UserBadInitMessage",
        "UserHappyPath", "UserMultislotInstruct", "UserMultislotFuture", "UserChangesSlot",
        "UserAdjectiveOrPosition", "UserSkipsOptional", "UserAsksAboutDocs", "UserAsksAboutFilledParameters",
        "UserAsksForHelp", "UserCorrectValueInvalidValue", "UserInvalidValue", "UserChangesTopic",
        "UserSkipsUnskipable", "UserIncorrectDate", "UserIncorrectWeb",
    ]  # fmt: skip
    assert all(b.description.strip() for b in BEHAVIORS.values())
    with pytest.raises(KeyError, match="UserHappyPath"):
        behavior("UserHappy")


@pytest.mark.parametrize("name", BEHAVIOR_NAMES)
def test_behaviour_is_deterministic_and_labels_its_step(name: str) -> None:
    first, second = _turn(name), _turn(name)
    assert first.content == second.content and first.metadata.other == second.metadata.other
    assert first.metadata.agent == name and first.metadata.other["facts"]["behavior"] == name
    assert "facts" not in json.dumps(first.llm_dict())  # the agent never sees the ground truth


def _facts(name: str) -> dict[str, Any]:
    return dict(_turn(name).metadata.other["facts"])


def test_start_behaviours() -> None:
    amazing = _facts("UserInitMessageAmazing")
    assert len(amazing["values"]) == 2 and all(COUPON.is_required(n) for n in amazing["values"])
    assert all(v in _turn("UserInitMessageAmazing").content for v in amazing["values"].values())
    assert "create a discount coupon" in _turn("UserInitMessageShort").content
    assert _facts("UserInitMessageAsk")["asks_capabilities"] is True
    assert _facts("UserBadInitMessage")["impossible"] is True
    for name in [
        "UserInitMessageAmazing",
        "UserInitMessageShort",
        "UserInitMessageAsk",
        "UserBadInitMessage",
    ]:
        with pytest.raises(BehaviorNotApplicable):
            respond(behavior(name), _mid_dialogue(), INTENT)  # only before a form is selected


def test_answering_behaviours_give_valid_values_for_the_asked_slot() -> None:
    assert _facts("UserHappyPath")["values"] == {"discount_type": "percentage"}
    multi = _facts("UserMultislotInstruct")["values"]
    assert next(iter(multi)) == "discount_type" and len(multi) == 3
    future = _facts("UserMultislotFuture")
    assert "discount_type" not in future["values"] and future["not_answered"] == "discount_type"
    for facts in (multi, future["values"]):
        assert check_call(COUPON, {**_valid_arguments(), **facts}) == []
    position = _facts("UserAdjectiveOrPosition")
    assert position == {**position, "values": {"discount_type": "percentage"}, "position": 1}
    assert (
        "first" in _turn("UserAdjectiveOrPosition").content
        and "percentage" not in _turn("UserAdjectiveOrPosition").content
    )


def test_changing_skipping_and_asking_behaviours() -> None:
    changed = _facts("UserChangesSlot")
    assert changed["changed"] == ["coupon_code"] and changed["values"]["coupon_code"] != "SPRING10"
    skip = _facts("UserSkipsOptional")["skip"]
    assert len(skip) == 1 and not COUPON.is_required(skip[0])
    assert _facts("UserSkipsUnskipable")["skip_required"] == ["discount_type"]
    assert _facts("UserAsksAboutDocs")["question_about"] == "discount_type"
    filled = _facts("UserAsksAboutFilledParameters")
    assert filled["filled"] == {"coupon_code": "SPRING10"} and "discount_type" in filled["missing"]
    assert _facts("UserAsksForHelp")["options"] == ["percentage", "fixed_amount", "free_shipping"]
    assert _facts("UserChangesTopic")["off_topic"] is True


def test_invalid_value_behaviours_give_values_the_schema_rejects() -> None:
    for name, kind in [
        ("UserInvalidValue", "categorical"),
        ("UserCorrectValueInvalidValue", "categorical"),
        ("UserIncorrectDate", "date"),
        ("UserIncorrectWeb", "email"),
    ]:
        facts = _facts(name)
        ((slot, value),) = facts["invalid"].items()
        assert COUPON.parameter(slot).slot_kind == kind
        assert check_call(COUPON, {slot: value}) and any(slot in p for p in check_call(COUPON, {slot: value}))
        assert value in _turn(name).content
    assert _facts("UserCorrectValueInvalidValue")["values"] == {"discount_type": "percentage"}


def test_confirmation_and_applicability() -> None:
    tape = _mid_dialogue().extend(
        [
            UserStep(content="ok"),
            RequestFunctionCallConfirmationThought(function=COUPON.name),
            PromptUserForTextMessageAction(prompt="Shall I submit?"),
        ]
    )
    assert respond(behavior("UserHappyPath"), tape, INTENT).metadata.other["facts"]["confirms"] is True
    state = form_state(_mid_dialogue())
    assert state.requested == "discount_type" and state.filled == {"coupon_code": "SPRING10"}
    names = [b.name for b in applicable_behaviors(state, INTENT)]
    assert len(names) == 15 and "UserChangesSlot" in names and "UserInitMessageShort" not in names
    nothing_filled = form_state(_selected(FormFillerEnvironment(SHOP)))
    assert "UserChangesSlot" not in [b.name for b in applicable_behaviors(nothing_filled, INTENT)]


# --------------------------------------------------------------------------- the E.1 generator

_YAML_SCHEMA = """Here is the schema.
```yaml
name: {name}
description: "Use this form to order tests at TestCorp. Processed by the Lab team: within 2 days."
parameters:
  type: object
  properties:
    test_kind:
      type: string
      description: The kind of test; blood for blood samples, urine otherwise
      enum: [blood, urine]
    sample_date:
      type: string
      format: date
      description: The day of sampling
  required: [{required}]
return_value:
  type: object
  properties:
    order_id: {{type: string}}
```"""


def test_prompted_generator_runs_the_three_steps_and_retries_bad_answers() -> None:
    from examples.form_filler.generate import GenerationError, generate_company, parse_function_schema
    from tapekit import FunctionLLM, Prompt

    seen: list[str] = []

    def answer(prompt: Prompt) -> str:
        text = prompt.messages[-1]["content"]
        seen.append(text)
        if text.startswith("Describe the company"):
            assert "`Quest Diagnostics`" in text and "`TestCorp`" in text
            return "TestCorp runs medical laboratories."
        if "List 2 REQUEST_FORMS" in text:
            assert "TestCorp runs medical laboratories." in text
            if sum("List 2" in s for s in seen) == 1:
                return "Sure! Here are the forms."  # not JSON: asked again
            return '```json\n[{"name": "OrderTest", "description": "order a test"},' + (
                ' {"name": "CancelTest", "description": "cancel a test"}]\n```'
            )
        name = "OrderTest" if '"OrderTest"' in text else "CancelTest"
        if name == "CancelTest" and sum('"CancelTest"' in s for s in seen) == 1:
            return _YAML_SCHEMA.format(name=name, required="test_kind, sample_date")  # no optional slot
        return _YAML_SCHEMA.format(name=name, required="test_kind")

    company = generate_company(FunctionLLM(fn=answer), "Quest Diagnostics", "TestCorp", n_forms=2)
    assert company.name == "TestCorp" and [f.name for f in company.forms] == ["OrderTest", "CancelTest"]
    assert len(seen) == 6  # 1 description + 2 form lists + 3 schemas
    order = company.forms[0]
    assert ":" not in order.description and order.parameter("sample_date").slot_kind == "date"
    assert check_function_schema(order) == []

    with pytest.raises(GenerationError, match="no optional parameter"):
        parse_function_schema(_YAML_SCHEMA.format(name="X", required="test_kind, sample_date"))
    with pytest.raises(
        GenerationError, match=r"step 2: no usable answer in 2 attempts; last problem: .*not JSON"
    ):
        generate_company(FunctionLLM(fn=lambda p: "no json here"), "A", "B", n_forms=2, max_attempts=2)


# --------------------------------------------------------------------------- the loop, end to end


class _RulePolicy(Node):
    """A test-only assistant without an LLM: find the form from the user's words, ask for each
    required slot in turn (taking the user's whole answer as its value), confirm, submit."""

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Iterator[Step]:
        state, last = form_state(tape), tape.steps[-1]
        yield SetNextNode(next_node=self.name)  # the one node runs again after each observation
        if isinstance(last, FunctionResult | DialogueEnded):
            yield StopStep(reason="dialogue over")
        elif isinstance(last, FunctionCandidates):
            yield InspectFunctionAction(function=last.candidates[0].name)
        elif state.schema is None:
            yield ResolveFunctionAction(query=last.content if isinstance(last, UserStep) else "")
        else:
            form = state.schema.name
            asked = form_state(tape.steps[:-1])  # what the assistant asked before the user answered
            if isinstance(last, UserStep) and asked.confirmation_requested:
                yield CallFunctionAction(function=form)
                return
            if isinstance(last, UserStep) and asked.requested:
                update = UpdateFunctionParametersThought(
                    function=form, assign={asked.requested: last.content}
                )
                yield update
                state = form_state(tape.append(update))
            missing = state.missing_required()
            if missing:
                yield RequestFunctionParametersThought(function=form, parameters=[missing[0]])
                yield PromptUserForTextMessageAction(prompt=f"What is the {missing[0]}?")
            else:
                yield RequestFunctionCallConfirmationThought(function=form)
                yield PromptUserForTextMessageAction(prompt="Shall I submit the request?")


def test_happy_path_dialogue_runs_in_the_main_loop_to_a_submission() -> None:
    intent = make_intent(SHOP, "RequestReturnLabel", seed=2)
    user = SimulatedUser(intent, behavior("UserHappyPath"))
    agent = Agent.create(name="assistant", nodes=[_RulePolicy()])
    start: Tape[Any, Any] = Tape(steps=[UserStep(content="I want a prepaid label to return a parcel")])
    final = main_loop(agent, start, FormFillerEnvironment(SHOP, user=user), max_loops=30).get_final_tape()
    state = form_state(final)
    assert state.submitted and state.schema is not None and state.schema.name == "RequestReturnLabel"
    result = next(s for s in final.steps if isinstance(s, FunctionResult))
    required = {n: intent.values[n] for n in intent.form.parameters.required}
    assert {k: result.arguments[k] for k in required} == required
    users = [s for s in final.steps if isinstance(s, UserStep)][1:]
    assert users and all(s.metadata.agent == "UserHappyPath" for s in users)
    assert users[-1].metadata.other["facts"]["confirms"] is True
