"""Simulated users: what a user wants (:class:`UserIntent`), how a behaviour writes its turn
(:class:`UserBehavior`), and the hook that puts that turn on the tape (:class:`SimulatedUser`).

Offline, every behaviour is a deterministic program: it reads the dialogue's state off the
tape (:func:`~examples.form_filler.state.form_state`), knows the user's form and the values it
means to give, and writes one message. The message goes on the tape as a
:class:`~tapekit.dialog.UserStep` whose metadata names the behaviour (``agent``) and holds its
ground truth (``other["facts"]``: the values given, the invalid ones, the skips asked for ...),
which the agent never sees (prompts leave metadata out) and evaluation reads.
The 19 behaviours of appendix E.3 are in ``behaviors.py``.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from examples.form_filler.schema import Company, FunctionSchema
from examples.form_filler.state import FormState, form_state
from tapekit import StepMetadata, Tape, UserStep

__all__ = [
    "BehaviorNotApplicable",
    "SimulatedUser",
    "UserBehavior",
    "UserIntent",
    "UserTurn",
    "make_intent",
    "purpose_of",
]

_PURPOSE = re.compile(r"Use this form to (.+?) at ")


class BehaviorNotApplicable(ValueError):
    """The behaviour cannot act in this state (e.g. no optional slot is left to skip)."""


@dataclass(frozen=True)
class UserIntent:
    """What the simulated user wants: ``form`` at ``company``, and the valid ``values`` it means
    to give for each of the form's slots."""

    company: Company
    form: FunctionSchema
    values: dict[str, str]


@dataclass(frozen=True)
class UserTurn:
    """A user's message and its ground truth (``facts``) for evaluation."""

    text: str
    facts: dict[str, Any] = field(default_factory=dict)


def purpose_of(form: FunctionSchema) -> str:
    """What the form is for, as a verb phrase ("book a test drive at a dealership")."""
    found = _PURPOSE.search(form.description)
    if found:
        return found.group(1)
    return "fill the " + re.sub(r"([a-z])([A-Z])", r"\1 \2", form.name).lower() + " form"


def make_intent(company: Company, form_name: str, seed: int = 0) -> UserIntent:
    """A user who wants ``form_name``, with a valid value for every slot chosen from ``seed``:
    a categorical value, the schema's examples, or a made-up value of the slot's kind."""
    form = company.form(form_name)
    rng = random.Random(f"{seed}:{company.name}:{form_name}")
    values: dict[str, str] = {}
    for name, parameter in form.parameters.properties.items():
        kind = parameter.slot_kind
        if kind == "categorical":
            assert parameter.enum is not None
            values[name] = rng.choice(parameter.enum)
        elif parameter.examples:
            values[name] = rng.choice(parameter.examples)
        elif kind == "date":
            values[name] = f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        elif kind == "email":
            values[name] = f"alex.morgan@{company.name.lower()}.example"
        elif name == "additional_notes":
            values[name] = rng.choice(["please call me before noon", "this is for the Lisbon team"])
        else:
            values[name] = f"my {name.replace('_', ' ')}"
    return UserIntent(company=company, form=form, values=values)


def label(parameter: str) -> str:
    """How a user names a slot ("booking_reference" -> "booking reference")."""
    return parameter.replace("_", " ")


class UserBehavior(ABC):
    """One simulated user behaviour of appendix E.3: ``name`` (the paper's), ``description``
    (what the user does), ``stage`` (``start``: before a form is selected; ``filling``: after;
    ``any``). :meth:`turn` writes the user's message for a state."""

    name: ClassVar[str]
    description: ClassVar[str]
    stage: ClassVar[Literal["start", "filling", "any"]] = "filling"

    def applies(self, state: FormState, intent: UserIntent) -> bool:
        """Whether this behaviour can act now: its stage matches and it has what it needs."""
        if state.ended:
            return False
        if self.stage == "start" and state.form_selected:
            return False
        if self.stage == "filling" and not state.form_selected:
            return False
        try:
            self.turn(state, intent, random.Random(0))
        except BehaviorNotApplicable:
            return False
        return True

    @abstractmethod
    def turn(self, state: FormState, intent: UserIntent, rng: random.Random) -> UserTurn:
        """The user's message in ``state``; :class:`BehaviorNotApplicable` when it cannot act."""

    def __repr__(self) -> str:
        return f"<{self.name}>"


class SimulatedUser:
    """A user hook for :class:`~examples.form_filler.environment.FormFillerEnvironment`: answers
    the assistant with one ``behavior``, deterministically from ``seed`` and the tape (a
    dialogue tree picks a behaviour per turn with ``behaviors.sample_behavior`` instead)."""

    def __init__(self, intent: UserIntent, behavior: UserBehavior, seed: int = 0) -> None:
        self.intent = intent
        self.behavior = behavior
        self.seed = seed

    def __call__(self, tape: Tape[Any, Any]) -> UserStep:
        """The user's next message on ``tape``, with the behaviour and its facts in metadata."""
        return respond(self.behavior, tape, self.intent, self.seed)


def respond(behavior: UserBehavior, tape: Tape[Any, Any], intent: UserIntent, seed: int = 0) -> UserStep:
    """``behavior``'s message on ``tape`` as a user step (``BehaviorNotApplicable`` if it cannot
    act there). The same tape, intent and seed always give the same message."""
    state = form_state(tape)
    if not behavior.applies(state, intent):
        raise BehaviorNotApplicable(
            f"{behavior.name} cannot act here (form selected: {state.form_selected}, "
            f"unfilled: {state.unfilled()}, ended: {state.ended})"
        )
    rng = random.Random(f"{seed}:{behavior.name}:{len(tape)}")
    turn = behavior.turn(state, intent, rng)
    facts = {"behavior": behavior.name, "intent": intent.form.name, **turn.facts}
    metadata = StepMetadata(agent=behavior.name, node="user_turn", other={"facts": facts})
    return UserStep(content=turn.text, metadata=metadata)
