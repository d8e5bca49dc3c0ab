"""The form filler's tape vocabulary (appendix E.2): its thoughts, actions and observations.

Thoughts plan the assistant's next message; actions ask the environment for something. In the
paper an action carries its ``result``; in tapekit a result is an observation the environment
appends after the action: :class:`FunctionCandidates` after :class:`ResolveFunctionAction`,
:class:`FunctionSchemaObservation` after :class:`InspectFunctionAction`,
:class:`FunctionResult` after :class:`CallFunctionAction`, a
:class:`~tapekit.dialog.UserStep` (the user's message) after
:class:`PromptUserForTextMessageAction`, and :class:`DialogueEnded` after :class:`ExitAction`.
Field names follow the paper (``function``, ``parameters``, ``assign``, ``skip`` ...), so the
JSON the agents write is the paper's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from examples.form_filler.schema import FunctionSchema
from tapekit import Action, Observation, Thought

__all__ = [
    "ACTIONS",
    "THOUGHTS",
    "AnswerFromFunctionSchemaThought",
    "CallFunctionAction",
    "DialogueEnded",
    "ExitAction",
    "FunctionCandidate",
    "FunctionCandidates",
    "FunctionResult",
    "FunctionSchemaObservation",
    "FunctionThought",
    "GatherValuesThought",
    "InspectFunctionAction",
    "NoAnswerInFunctionSchemaThought",
    "ParameterCheck",
    "PromptUserForTextMessageAction",
    "RefuseInexistentFunctionThought",
    "RefuseInvalidFunctionParameterValueThought",
    "RefuseSkippingParameterThought",
    "RefuseToEngageThought",
    "RequestExitConfirmationThought",
    "RequestFunctionCallConfirmationThought",
    "RequestFunctionParametersThought",
    "RequestFunctionThought",
    "ResolveFunctionAction",
    "UpdateFunctionParametersThought",
    "VerifyValuesThought",
]


# --------------------------------------------------------------------------- thoughts


class FunctionThought(Thought):
    """A thought about one form, ``function`` (the base of the thoughts that name a form)."""

    function: str


class AnswerFromFunctionSchemaThought(FunctionThought):
    """Plans to answer the user's question from the form's documentation."""

    kind: Literal["answer_from_function_schema"] = "answer_from_function_schema"


class NoAnswerInFunctionSchemaThought(FunctionThought):
    """Plans to tell the user that the form's documentation does not answer their question."""

    kind: Literal["no_answer_in_function_schema"] = "no_answer_in_function_schema"


class RefuseInexistentFunctionThought(Thought):
    """The user's ask could not be resolved to any form."""

    kind: Literal["refuse_inexistent_function"] = "refuse_inexistent_function"


class RefuseInvalidFunctionParameterValueThought(FunctionThought):
    """Plans to tell the user that ``parameter_value`` is not valid for ``parameter``."""

    kind: Literal["refuse_invalid_function_parameter_value"] = "refuse_invalid_function_parameter_value"
    parameter: str
    parameter_value: Any


class RefuseSkippingParameterThought(FunctionThought):
    """Plans to tell the user that the required ``parameter`` cannot be skipped."""

    kind: Literal["refuse_skipping_parameter"] = "refuse_skipping_parameter"
    parameter: str


class RefuseToEngageThought(Thought):
    """Plans to decline a request that has nothing to do with filling forms (section 5.3)."""

    kind: Literal["refuse_to_engage"] = "refuse_to_engage"


class GatherValuesThought(FunctionThought):
    """The raw parameter values found in the user's last message (the teacher's first node)."""

    kind: Literal["gather_values"] = "gather_values"
    parameters: dict[str, Any] = Field(default_factory=dict)


class ParameterCheck(BaseModel):
    """One gathered value and whether it is valid (``explanation`` says why when it is not)."""

    model_config = ConfigDict(extra="forbid")

    value: Any
    status: Literal["valid", "invalid"]
    explanation: str = ""


class VerifyValuesThought(FunctionThought):
    """The validity of each gathered value (the teacher's second node)."""

    kind: Literal["verify_values"] = "verify_values"
    parameters: dict[str, ParameterCheck] = Field(default_factory=dict)


class UpdateFunctionParametersThought(FunctionThought):
    """Sets parameters to NEW values (``assign``) and skips NEW optional ones (``skip``), from
    the user's last message only; the form's state is the fold of these thoughts."""

    kind: Literal["update_function_parameters"] = "update_function_parameters"
    assign: dict[str, Any] = Field(default_factory=dict)
    skip: list[str] = Field(default_factory=list)


class RequestFunctionThought(Thought):
    """Plans to ask the user to pick one of ``functions``."""

    kind: Literal["request_function"] = "request_function"
    functions: list[str] = Field(default_factory=list)


class RequestFunctionParametersThought(FunctionThought):
    """Plans to ask the user for one parameter (``parameters`` holds exactly one name)."""

    kind: Literal["request_function_parameters"] = "request_function_parameters"
    parameters: list[str] = Field(min_length=1, max_length=1)


class RequestFunctionCallConfirmationThought(FunctionThought):
    """Plans to ask the user to confirm the submission; only once every parameter is filled or
    skipped."""

    kind: Literal["request_function_call_confirmation"] = "request_function_call_confirmation"


class RequestExitConfirmationThought(Thought):
    """Plans to ask the user to confirm that they want to leave without submitting."""

    kind: Literal["request_exit_confirmation"] = "request_exit_confirmation"


# --------------------------------------------------------------------------- actions


class ResolveFunctionAction(Action):
    """Asks which forms fit ``query`` (by default the user's last message)."""

    kind: Literal["resolve_function"] = "resolve_function"
    query: str = ""


class InspectFunctionAction(Action):
    """Asks for the schema of form ``function``; selects the form for the rest of the dialogue."""

    kind: Literal["inspect_function"] = "inspect_function"
    function: str


class PromptUserForTextMessageAction(Action):
    """The assistant's message to the user; the user's answer comes back as a ``UserStep``."""

    kind: Literal["prompt_user_for_text_message"] = "prompt_user_for_text_message"
    prompt: str


class CallFunctionAction(Action):
    """Submits form ``function``. Without ``arguments``, the values are those the tape's
    :class:`UpdateFunctionParametersThought` steps filled (the paper's way)."""

    kind: Literal["call_function"] = "call_function"
    function: str
    arguments: dict[str, Any] | None = None


class ExitAction(Action):
    """Ends the dialogue without submitting; ``text`` tells the user so."""

    kind: Literal["exit"] = "exit"
    text: str = ""


# --------------------------------------------------------------------------- observations


class FunctionCandidate(BaseModel):
    """A form offered for a query: its name and description."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str


class FunctionCandidates(Observation):
    """The forms that may fit ``query`` (the result of :class:`ResolveFunctionAction`)."""

    kind: Literal["function_candidates"] = "function_candidates"
    query: str = ""
    candidates: list[FunctionCandidate] = Field(default_factory=list)


class FunctionSchemaObservation(Observation):
    """The schema of ``function``, or ``error`` when there is no such form."""

    kind: Literal["function_schema"] = "function_schema"
    function: str
    function_schema: FunctionSchema | None = None
    error: str | None = None


class FunctionResult(Observation):
    """What submitting ``function`` returned, or ``error`` listing every problem with the call
    (unknown form, unknown or missing parameters, invalid values)."""

    kind: Literal["function_result"] = "function_result"
    function: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: str | None = None


class DialogueEnded(Observation):
    """The dialogue is over (after :class:`ExitAction`); nothing follows."""

    kind: Literal["dialogue_ended"] = "dialogue_ended"
    reason: str = "exit"


THOUGHTS: list[type[Thought]] = [
    AnswerFromFunctionSchemaThought,
    NoAnswerInFunctionSchemaThought,
    RefuseInexistentFunctionThought,
    RefuseInvalidFunctionParameterValueThought,
    RefuseSkippingParameterThought,
    RefuseToEngageThought,
    GatherValuesThought,
    VerifyValuesThought,
    UpdateFunctionParametersThought,
    RequestFunctionThought,
    RequestFunctionParametersThought,
    RequestFunctionCallConfirmationThought,
    RequestExitConfirmationThought,
]
"""Every form-filler thought (appendix E.2, plus RefuseToEngageThought from section 5.3)."""

ACTIONS: list[type[Action]] = [
    ResolveFunctionAction,
    InspectFunctionAction,
    PromptUserForTextMessageAction,
    CallFunctionAction,
    ExitAction,
]
"""Every form-filler action (appendix E.2)."""
