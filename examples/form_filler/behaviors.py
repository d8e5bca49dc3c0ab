"""The 19 simulated user behaviours of appendix E.3, as deterministic programs.

Each class carries the paper's name and behaviour; :data:`BEHAVIORS` lists them in the paper's
order and :func:`applicable_behaviors` / :func:`sample_behavior` choose among those that can act
in a dialogue's state (the dialogue tree samples a user after every assistant message). A
behaviour that answers "the agent's question" answers the slot the assistant asked for in its
last turn (its RequestFunctionParametersThought), or else the first slot still to fill.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable

from examples.form_filler.schema import ParameterSchema
from examples.form_filler.state import FormState
from examples.form_filler.users import (
    BehaviorNotApplicable,
    UserBehavior,
    UserIntent,
    UserTurn,
    label,
    purpose_of,
)

__all__ = ["BEHAVIORS", "BEHAVIOR_NAMES", "applicable_behaviors", "behavior", "sample_behavior"]

_ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth"]
_BAD_CHOICES = ["platinum", "ultra", "turbo", "purple", "maximum", "deluxe_plus"]
_BAD_DATES = ["2025-02-30", "31/13/2025", "the 32nd of May", "2025-13-05"]
_BAD_EMAILS = ["alex.morgan@", "alex.morgan(at)mail", "alex morgan@mail.example", "alex.morgan.example"]
_IMPOSSIBLE = [
    "Can you book me a table for two on the Moon tonight?",
    "Please transfer my holidays to my cat.",
    "I want you to make it stop raining in my city.",
]
_OFF_TOPIC = [
    "By the way, what will the weather be like tomorrow?",
    "Do you know a good recipe for lasagne?",
    "Who won the football match last night?",
]


def _pick(state: FormState, intent: UserIntent, keep: Callable[[str, ParameterSchema, bool], bool]) -> str:
    """The slot to act on: the one the assistant asked for if it qualifies, else the first
    unfilled qualifying slot; ``BehaviorNotApplicable`` if none qualifies."""
    form = intent.form
    names = [n for n in state.unfilled() if keep(n, form.parameter(n), form.is_required(n))]
    if not names:
        raise BehaviorNotApplicable("no slot fits this behaviour")
    return state.requested if state.requested in names else names[0]


def _any(name: str, parameter: ParameterSchema, required: bool) -> bool:
    return True


def _kind(kind: str) -> Callable[[str, ParameterSchema, bool], bool]:
    return lambda name, parameter, required: parameter.slot_kind == kind


def _say(name: str, value: str) -> str:
    return f"the {label(name)} is {value}"


def _values(intent: UserIntent, names: list[str]) -> dict[str, str]:
    return {n: intent.values[n] for n in names}


class UserInitMessageAmazing(UserBehavior):
    """At the begining of the conversation, the user should request a specific intent and
    provide values for some of the parameters in that request."""

    name = "UserInitMessageAmazing"
    description = __doc__ or ""
    stage = "start"

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        pool = intent.form.parameters.required
        pool = pool if len(pool) >= 2 else list(intent.form.parameters.properties)
        names = sorted(rng.sample(pool, 2), key=list(intent.values).index)
        values = _values(intent, names)
        said = " and ".join(_say(n, v) for n, v in values.items())
        return UserTurn(f"Hi, I'd like to {purpose_of(intent.form)}; {said}.", {"values": values})


class UserInitMessageShort(UserBehavior):
    """At the beginning of the conversation, the user should request a specific intent in a
    short message."""

    name = "UserInitMessageShort"
    description = __doc__ or ""
    stage = "start"

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        return UserTurn(f"I need to {purpose_of(intent.form)}.")


class UserInitMessageAsk(UserBehavior):
    """At the beginning of the conversation, the user should ask the agent what it can do."""

    name = "UserInitMessageAsk"
    description = __doc__ or ""
    stage = "start"

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        text = rng.choice(["Hi! What can you help me with?", "What kind of requests can you handle?"])
        return UserTurn(text, {"asks_capabilities": True})


class UserBadInitMessage(UserBehavior):
    """At the beginning of the conversation, the user should ask to do something impossible."""

    name = "UserBadInitMessage"
    description = __doc__ or ""
    stage = "start"

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        return UserTurn(rng.choice(_IMPOSSIBLE), {"impossible": True})


class UserHappyPath(UserBehavior):
    """The user correctly answers the agent question."""

    name = "UserHappyPath"
    description = __doc__ or ""
    stage = "any"

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        if not state.form_selected:
            return UserTurn(f"I want to {purpose_of(intent.form)}.")
        if state.confirmation_requested or not state.unfilled():
            return UserTurn("Yes, that's all correct, please submit it.", {"confirms": True})
        name = _pick(state, intent, _any)
        return UserTurn(f"{intent.values[name]}", {"values": _values(intent, [name])})


class UserMultislotInstruct(UserBehavior):
    """The user replies to the agent question and provides values for additional parameters
    in the request."""

    name = "UserMultislotInstruct"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        first = _pick(state, intent, _any)
        others = [n for n in state.unfilled() if n != first][:2]
        if not others:
            raise BehaviorNotApplicable("only one slot is left")
        values = _values(intent, [first, *others])
        extra = " and ".join(_say(n, values[n]) for n in others)
        return UserTurn(f"{values[first]}. Also, {extra}.", {"values": values})


class UserMultislotFuture(UserBehavior):
    """The user provides values for additional parameters in the request."""

    name = "UserMultislotFuture"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        asked = _pick(state, intent, _any)
        others = [n for n in state.unfilled() if n != asked][:2]
        if not others:
            raise BehaviorNotApplicable("no slot besides the asked one is left")
        values = _values(intent, others)
        said = " and ".join(_say(n, v) for n, v in values.items())
        return UserTurn(f"Before that, {said}.", {"values": values, "not_answered": asked})


def _other_value(parameter: ParameterSchema, current: str, rng: random.Random) -> str:
    kind = parameter.slot_kind
    if kind == "categorical":
        assert parameter.enum is not None
        return rng.choice([v for v in parameter.enum if v != current])
    if kind == "date":
        try:
            return (datetime.date.fromisoformat(current) + datetime.timedelta(days=7)).isoformat()
        except ValueError:
            return "2025-09-15"
    if kind == "email":
        return "jo.lee@" + current.split("@", 1)[-1] if "@" in current else "jo.lee@example.com"
    others = [e for e in parameter.examples or [] if e != current]
    return others[0] if others else f"{current} (revised)"


class UserChangesSlot(UserBehavior):
    """The user changes the value to a previously set request parameter."""

    name = "UserChangesSlot"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        filled = [n for n in state.filled if n in intent.form.parameters.properties]
        if not filled:
            raise BehaviorNotApplicable("no slot is filled yet")
        name = filled[-1]
        new = _other_value(intent.form.parameter(name), str(state.filled[name]), rng)
        return UserTurn(
            f"Actually, please change the {label(name)} to {new}.", {"values": {name: new}, "changed": [name]}
        )


class UserAdjectiveOrPosition(UserBehavior):
    """For categorical parameters, the user answers the agent but instead of giving the choice
    name, uses an adjective or a positional number that defines its choice."""

    name = "UserAdjectiveOrPosition"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, _kind("categorical"))
        enum = intent.form.parameter(name).enum or []
        index = enum.index(intent.values[name])
        words = "the last one" if index == len(enum) - 1 and index > 1 else f"the {_ORDINALS[index]} option"
        text = f"I'll take {words}." if name == state.requested else f"For the {label(name)}, {words}."
        return UserTurn(text, {"values": {name: enum[index]}, "position": index + 1})


class UserSkipsOptional(UserBehavior):
    """For optional parameters, the user asks to skip it."""

    name = "UserSkipsOptional"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, lambda n, p, required: not required)
        return UserTurn(f"I'd rather skip the {label(name)}.", {"skip": [name]})


class UserAsksAboutDocs(UserBehavior):
    """The user does not answer the agent, and instead asks a question that can be answered
    based on the request documentation."""

    name = "UserAsksAboutDocs"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        categorical = intent.form.names_of_kind("categorical")
        if not categorical:
            raise BehaviorNotApplicable("the form has no categorical slot to ask about")
        name = state.requested if state.requested in categorical else categorical[0]
        return UserTurn(
            f"Before I answer, what is the difference between the {label(name)} options?",
            {"question_about": name, "answerable": True},
        )


class UserAsksAboutFilledParameters(UserBehavior):
    """The user does not answer the agent, and instead asks a question about the parameters
    filled, or still missing."""

    name = "UserAsksAboutFilledParameters"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        text = rng.choice(
            ["What have I filled in so far, and what is still missing?", "Which fields are still empty?"]
        )
        return UserTurn(text, {"filled": dict(state.filled), "missing": state.unfilled()})


class UserAsksForHelp(UserBehavior):
    """For categorical parameters, the user ask the agent for help in choosing a value based on
    its problem."""

    name = "UserAsksForHelp"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, _kind("categorical"))
        return UserTurn(
            f"I'm not sure which {label(name)} fits my situation. Can you help me choose?",
            {"help_with": name, "options": intent.form.parameter(name).enum},
        )


def _bad_choice(parameter: ParameterSchema, rng: random.Random) -> str:
    return rng.choice([c for c in _BAD_CHOICES if c not in (parameter.enum or [])])


class UserCorrectValueInvalidValue(UserBehavior):
    """The user answers the agent correctly, but also gives an invalid value for a categorical
    parameter not yet filled."""

    name = "UserCorrectValueInvalidValue"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        first = _pick(state, intent, _any)
        cats = [
            n for n in state.unfilled() if n != first and intent.form.parameter(n).slot_kind == "categorical"
        ]
        if not cats:
            raise BehaviorNotApplicable("no other categorical slot is unfilled")
        bad = _bad_choice(intent.form.parameter(cats[0]), rng)
        text = f"{intent.values[first]}. Also, {_say(cats[0], bad)}."
        return UserTurn(text, {"values": _values(intent, [first]), "invalid": {cats[0]: bad}})


class UserInvalidValue(UserBehavior):
    """For categorical parameters, the user gives an impossible choice."""

    name = "UserInvalidValue"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, _kind("categorical"))
        bad = _bad_choice(intent.form.parameter(name), rng)
        text = f"{bad}, please." if name == state.requested else f"Please set {_say(name, bad)}."
        return UserTurn(text, {"invalid": {name: bad}})


class UserChangesTopic(UserBehavior):
    """The user does not answer the agent's question and change the topic of conversation
    instead."""

    name = "UserChangesTopic"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        return UserTurn(rng.choice(_OFF_TOPIC), {"off_topic": True})


class UserSkipsUnskipable(UserBehavior):
    """For required parameters, the user asks to skip it."""

    name = "UserSkipsUnskipable"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, lambda n, p, required: required)
        return UserTurn(f"Can we skip the {label(name)}? I'd rather not give it.", {"skip_required": [name]})


class UserIncorrectDate(UserBehavior):
    """For date/time parameters, the user gives an invalid date."""

    name = "UserIncorrectDate"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, _kind("date"))
        bad = rng.choice(_BAD_DATES)
        text = f"{bad}" if name == state.requested else f"Oh, and {_say(name, bad)}."
        return UserTurn(text, {"invalid": {name: bad}})


class UserIncorrectWeb(UserBehavior):
    """For technical parameters such as url/email, the user gives a invalid value."""

    name = "UserIncorrectWeb"
    description = __doc__ or ""

    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        name = _pick(state, intent, _kind("email"))
        bad = rng.choice(_BAD_EMAILS)
        text = f"It's {bad}" if name == state.requested else f"By the way, {_say(name, bad)}."
        return UserTurn(text, {"invalid": {name: bad}})


BEHAVIORS: dict[str, UserBehavior] = {
    b.name: b
    for b in [
        UserInitMessageAmazing(),
        UserInitMessageShort(),
        UserInitMessageAsk(),
        UserBadInitMessage(),
        UserHappyPath(),
        UserMultislotInstruct(),
        UserMultislotFuture(),
        UserChangesSlot(),
        UserAdjectiveOrPosition(),
        UserSkipsOptional(),
        UserAsksAboutDocs(),
        UserAsksAboutFilledParameters(),
        UserAsksForHelp(),
        UserCorrectValueInvalidValue(),
        UserInvalidValue(),
        UserChangesTopic(),
        UserSkipsUnskipable(),
        UserIncorrectDate(),
        UserIncorrectWeb(),
    ]
}
"""The 19 behaviours of appendix E.3 by the paper's names, in the paper's order."""

BEHAVIOR_NAMES: list[str] = list(BEHAVIORS)


def behavior(name: str) -> UserBehavior:
    """The behaviour called ``name``; ``KeyError`` listing the 19 names if none."""
    try:
        return BEHAVIORS[name]
    except KeyError:
        raise KeyError(f"no user behaviour {name!r}; the behaviours are: {', '.join(BEHAVIORS)}") from None


def applicable_behaviors(state: FormState, intent: UserIntent) -> list[UserBehavior]:
    """The behaviours that can act in ``state``, in the paper's order."""
    return [b for b in BEHAVIORS.values() if b.applies(state, intent)]


def sample_behavior(state: FormState, intent: UserIntent, rng: random.Random) -> UserBehavior:
    """One applicable behaviour, uniformly (``BehaviorNotApplicable`` if none can act)."""
    options = applicable_behaviors(state, intent)
    if not options:
        raise BehaviorNotApplicable("no user behaviour can act in this state (is the dialogue over?)")
    return rng.choice(options)
