"""The form filler's environment: one company's forms, and a user to talk to.

It answers the assistant's actions with observations: the candidate forms for a query, a form's
schema, the result of submitting a form (after checking the call against the schema: unknown
parameters, missing required ones, values of the wrong kind or outside the allowed ones each
give an error naming the parameter), and the end of the dialogue after an exit. A message to
the user goes to the ``user`` hook (a simulated user, see ``users.py``), whose answer is added as
a :class:`~tapekit.dialog.UserStep`; without a hook the session stops with
:class:`~tapekit.environment.ExternalObservationNeeded`, waiting for a person.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from examples.form_filler.schema import Company, FunctionSchema, check_call
from examples.form_filler.state import form_state
from examples.form_filler.steps import (
    CallFunctionAction,
    DialogueEnded,
    ExitAction,
    FunctionCandidate,
    FunctionCandidates,
    FunctionResult,
    FunctionSchemaObservation,
    InspectFunctionAction,
    PromptUserForTextMessageAction,
    ResolveFunctionAction,
)
from tapekit import (
    Action,
    Environment,
    ExternalObservationNeeded,
    Observation,
    Tape,
    UnknownActionError,
    UserStep,
    unanswered_actions,
)

__all__ = ["FormFillerEnvironment", "UserHook"]

UserHook = Callable[[Tape[Any, Any]], UserStep]
"""A user: given the tape ending with the assistant's message, the user's answer."""

_WORD = re.compile(r"[a-z]+")


def _words(text: str) -> set[str]:
    split = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower()
    return {w for w in _WORD.findall(split) if len(w) > 2}


class FormFillerEnvironment(Environment):
    """Answers form-filler actions over ``company``'s forms; ``user`` answers the assistant's
    messages (``None``: a person answers, the session waits)."""

    def __init__(
        self, company: Company, user: UserHook | None = None, name: str = "form_environment"
    ) -> None:
        self.company = company
        self.forms: dict[str, FunctionSchema] = {f.name: f for f in company.forms}
        self.user = user
        self.name = name

    def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """The tape with an observation for each unanswered action, in order (later actions see
        the observations of earlier ones)."""
        for action in unanswered_actions(tape):
            tape = tape.with_new_steps([self.answer(action, tape)], author=self.name)
        return tape

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """Async :meth:`react` (the work is quick and local, so it runs inline)."""
        return self.react(tape)

    def answer(self, action: Action, tape: Tape[Any, Any]) -> Observation:
        """The observation that answers ``action`` on ``tape``."""
        if isinstance(action, ResolveFunctionAction):
            return self.resolve(action.query)
        if isinstance(action, InspectFunctionAction):
            return self.inspect(action.function)
        if isinstance(action, CallFunctionAction):
            return self.call(action, tape)
        if isinstance(action, ExitAction):
            return DialogueEnded(reason="exit")
        if isinstance(action, PromptUserForTextMessageAction):
            if self.user is None:
                raise ExternalObservationNeeded(action, "the assistant's message waits for the user")
            reply = self.user(tape)
            if not isinstance(reply, UserStep):
                raise TypeError(f"the user hook returned {type(reply).__name__}, not a UserStep")
            return reply
        raise UnknownActionError(
            f"{self.name} cannot answer {action.kind!r} ({type(action).__name__}); it answers "
            "ResolveFunctionAction, InspectFunctionAction, CallFunctionAction, "
            "PromptUserForTextMessageAction and ExitAction"
        )

    def resolve(self, query: str) -> FunctionCandidates:
        """Every form, those sharing the most words with ``query`` first (ties in company order)."""
        wanted = _words(query)
        ranked = sorted(
            enumerate(self.forms.values()),
            key=lambda item: (-len(wanted & _words(f"{item[1].name} {item[1].description}")), item[0]),
        )
        return FunctionCandidates(
            query=query,
            candidates=[FunctionCandidate(name=f.name, description=f.description) for _, f in ranked],
        )

    def inspect(self, function: str) -> FunctionSchemaObservation:
        """The schema of ``function``, or an error listing the company's forms."""
        schema = self.forms.get(function)
        if schema is None:
            return FunctionSchemaObservation(function=function, error=self._unknown(function))
        return FunctionSchemaObservation(function=function, function_schema=schema)

    def call(self, action: CallFunctionAction, tape: Tape[Any, Any]) -> FunctionResult:
        """Submit the form: the action's arguments, or else the values filled on the tape,
        checked against the schema; the result is a request id derived from the values."""
        state = form_state(tape)
        arguments = dict(action.arguments) if action.arguments is not None else dict(state.filled)
        result = FunctionResult(function=action.function, arguments=arguments)
        schema = self.forms.get(action.function)
        if schema is None:
            result.error = self._unknown(action.function)
            return result
        if state.schema is not None and state.schema.name != action.function:
            result.error = f"the dialogue is about {state.schema.name}; {action.function} was never selected"
            return result
        problems = check_call(schema, arguments)
        if problems:
            result.error = f"cannot submit {action.function}: " + "; ".join(problems)
            return result
        for name, parameter in schema.parameters.properties.items():
            if name not in arguments and parameter.default is not None:
                arguments[name] = parameter.default
        digest = hashlib.sha1(json.dumps([action.function, arguments], sort_keys=True).encode()).hexdigest()
        result.arguments = arguments
        result.result = {"request_id": f"REQ-{digest[:8].upper()}", "status": "submitted"}
        return result

    def _unknown(self, function: str) -> str:
        return f"{self.company.name} has no form {function!r}; its forms are: {', '.join(self.forms)}"
