"""The state of a form-filling dialogue, read off its tape.

Nothing but the tape holds state: the selected form is the first schema the environment
returned, the filled slots are the fold of the :class:`UpdateFunctionParametersThought` steps
for that form, and what the assistant just asked for is in the thoughts since the last user
message. Users, the environment and (later) the GREADTH checks all read it from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from examples.form_filler.schema import FunctionSchema
from examples.form_filler.steps import (
    AnswerFromFunctionSchemaThought,
    DialogueEnded,
    FunctionResult,
    FunctionSchemaObservation,
    PromptUserForTextMessageAction,
    RequestExitConfirmationThought,
    RequestFunctionCallConfirmationThought,
    RequestFunctionParametersThought,
    RequestFunctionThought,
    UpdateFunctionParametersThought,
)
from tapekit import Step, UserStep

__all__ = ["FormState", "form_state"]


@dataclass
class FormState:
    """Where a dialogue stands: the selected form (``schema``), its ``filled`` values and
    ``skipped`` slots, what the assistant asked in its last turn (``requested`` parameter,
    ``confirmation_requested``, ``exit_confirmation_requested``, ``functions_offered``), its
    last message, how many messages each side wrote, and whether the dialogue is over."""

    schema: FunctionSchema | None = None
    filled: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    requested: str | None = None
    confirmation_requested: bool = False
    exit_confirmation_requested: bool = False
    question_answered: bool = False
    functions_offered: list[str] = field(default_factory=list)
    last_agent_message: str = ""
    n_agent_messages: int = 0
    n_user_messages: int = 0
    submitted: bool = False
    ended: bool = False

    @property
    def form_selected(self) -> bool:
        """Whether the assistant has imported a form's schema yet."""
        return self.schema is not None

    def unfilled(self) -> list[str]:
        """The form's parameters neither filled nor skipped, in schema order."""
        if self.schema is None:
            return []
        done = set(self.filled) | set(self.skipped)
        return [n for n in self.schema.parameters.properties if n not in done]

    def missing_required(self) -> list[str]:
        """The required parameters not filled yet."""
        if self.schema is None:
            return []
        return [n for n in self.schema.parameters.required if n not in self.filled]


def form_state(steps: Iterable[Step]) -> FormState:
    """The state after ``steps`` (a tape, or any sequence of its steps)."""
    state = FormState()
    for step in steps:
        if isinstance(step, UserStep):
            state.n_user_messages += 1
            state.requested = None
            state.confirmation_requested = state.exit_confirmation_requested = False
            state.question_answered = False
            state.functions_offered = []
        elif isinstance(step, FunctionSchemaObservation):
            if state.schema is None and step.function_schema is not None:
                state.schema = step.function_schema
        elif isinstance(step, UpdateFunctionParametersThought):
            if state.schema is not None and step.function == state.schema.name:
                for name, value in step.assign.items():
                    state.filled[name] = value
                    if name in state.skipped:
                        state.skipped.remove(name)
                for name in step.skip:
                    state.filled.pop(name, None)
                    if name not in state.skipped:
                        state.skipped.append(name)
        elif isinstance(step, RequestFunctionParametersThought):
            state.requested = step.parameters[0]
        elif isinstance(step, RequestFunctionCallConfirmationThought):
            state.confirmation_requested = True
        elif isinstance(step, RequestExitConfirmationThought):
            state.exit_confirmation_requested = True
        elif isinstance(step, AnswerFromFunctionSchemaThought):
            state.question_answered = True
        elif isinstance(step, RequestFunctionThought):
            state.functions_offered = list(step.functions)
        elif isinstance(step, PromptUserForTextMessageAction):
            state.n_agent_messages += 1
            state.last_agent_message = step.prompt
        elif isinstance(step, FunctionResult):
            if step.error is None:
                state.submitted = state.ended = True
        elif isinstance(step, DialogueEnded):
            state.ended = True
    return state
