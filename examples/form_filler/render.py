"""What the form filler's agents read and write: steps as compact JSON, and prompt sections.

Every LLM-backed node of the teacher and the student writes a JSON list of steps of the
``steps.py`` vocabulary (:func:`steps_json` writes one, :func:`parse_step_list` reads one back;
the two are exact inverses, which is what ``make_llm_output`` and ``reuse`` need). A step is an
object with its ``kind`` and the fields that differ from their defaults::

    [{"kind": "update_function_parameters", "function": "BookTestDrive", "assign": {"car_model": "city"}},
     {"kind": "request_function_parameters", "function": "BookTestDrive", "parameters": ["dealership"]},
     {"kind": "prompt_user_for_text_message", "prompt": "I've set the car model to city. ..."}]

:class:`TurnContext` gathers what any node may show of a tape (the forms offered, the selected
form, the filled and skipped slots, what the assistant asked last, the dialogue, the user's last
message, the thoughts of the current turn) as strings for prompt templates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from examples.form_filler.schema import FunctionSchema
from examples.form_filler.state import form_state
from examples.form_filler.steps import (
    FunctionCandidates,
    PromptUserForTextMessageAction,
    RequestExitConfirmationThought,
    RequestFunctionCallConfirmationThought,
    RequestFunctionParametersThought,
)
from tapekit import Observation, SetNextNode, Step, StepParsingError, Tape, UserStep

__all__ = [
    "TurnContext",
    "compact_form",
    "last_user_index",
    "parse_step_list",
    "step_json",
    "steps_json",
    "turn_context",
]


def step_json(step: Step) -> dict[str, Any]:
    """The step as the agents write it: ``kind`` first, then every field not at its default."""
    fields = step.model_dump(mode="json", exclude={"metadata", "kind"}, exclude_defaults=True)
    return {"kind": step.kind, **fields}


def steps_json(steps: Sequence[Step], function: str = "") -> str:
    """The JSON list an LLM writes for ``steps`` (routing steps left out; ``function`` fields
    equal to ``function``, the selected form, left out too)."""
    chosen = [step_json(s) for s in steps if not isinstance(s, SetNextNode)]
    if function:
        chosen = [{k: v for k, v in c.items() if not (k == "function" and v == function)} for c in chosen]
    return json.dumps(chosen, ensure_ascii=False, separators=(",", ":"))


def parse_step_list(
    text: str, step_classes: Sequence[type[Step]], allow_empty: bool = False, function: str = ""
) -> list[Step]:
    """The steps in ``text``, a JSON list of step objects of ``step_classes``;
    :class:`~tapekit.structured.StepParsingError` says what is wrong (an empty list only with
    ``allow_empty``). ``function``: the selected form, the value of a ``function`` field left
    out (the dialogue is about one form)."""
    by_kind = {cls.model_fields["kind"].default: cls for cls in step_classes}
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        raise StepParsingError(f"the output is not JSON: {e}") from e
    if not isinstance(data, list):
        raise StepParsingError(f"expected a JSON list of steps, got {type(data).__name__}")
    if not data and not allow_empty:
        raise StepParsingError("expected at least one step")
    steps: list[Step] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise StepParsingError(f"step {i} is not an object")
        cls = by_kind.get(item.get("kind"))  # type: ignore[arg-type]
        if cls is None:
            raise StepParsingError(f"step {i} has kind {item.get('kind')!r}; allowed: {', '.join(by_kind)}")
        fields = {k: v for k, v in item.items() if k != "metadata"}
        if function and "function" in cls.model_fields and "function" not in fields:
            fields["function"] = function
        try:
            steps.append(cls.model_validate(fields))
        except Exception as e:  # pydantic's ValidationError, or a validator failing otherwise
            raise StepParsingError(f"step {i} ({cls.__name__}) is invalid: {e}") from e
    return steps


def last_user_index(tape: Tape[Any, Any]) -> int:
    """The index of the tape's last user message (-1 if none)."""
    for i in range(len(tape.steps) - 1, -1, -1):
        if isinstance(tape.steps[i], UserStep):
            return i
    return -1


def compact_form(schema: FunctionSchema) -> str:
    """One line per slot: ``name* [a|b|c] (default x): description`` (``*`` required);
    descriptions only for categorical slots (the others' names say enough)."""
    lines = [f"form {schema.name}"]
    for name, parameter in schema.parameters.properties.items():
        text = name + ("*" if schema.is_required(name) else "")
        kind = parameter.slot_kind
        if kind == "categorical":
            text += " [" + "|".join(parameter.enum or []) + "]"
        elif kind != "string":
            text += f" ({kind})"
        if parameter.default is not None:
            text += f" default={parameter.default}"
        if kind == "categorical":
            text += f": {parameter.description}"
        lines.append(text)
    return "\n".join(lines)


@dataclass(frozen=True)
class TurnContext:
    """Prompt sections for a tape, as strings (the keys of :meth:`sections`)."""

    forms: str
    form_names: str
    form: str
    form_compact: str
    form_name: str
    filled: str
    skipped: str
    asked: str
    dialogue: str
    last_user: str
    thoughts: str

    def sections(self) -> dict[str, str]:
        """Every section by name, for ``template.format(**sections)``."""
        return dict(self.__dict__)


def _asked(steps: Sequence[Step]) -> str:
    """What the assistant's last message asked for, from its planning thoughts."""
    for step in reversed(steps):
        if isinstance(step, UserStep):
            return "nothing"
        if isinstance(step, RequestFunctionParametersThought):
            return f"the value of {step.parameters[0]}"
        if isinstance(step, RequestFunctionCallConfirmationThought):
            return "confirmation to submit"
        if isinstance(step, RequestExitConfirmationThought):
            return "confirmation to exit"
    return "nothing"


def _dialogue(steps: Sequence[Step]) -> str:
    lines = []
    for step in steps:
        if isinstance(step, UserStep):
            lines.append(f"user: {step.content}")
        elif isinstance(step, PromptUserForTextMessageAction):
            lines.append(f"assistant: {step.prompt}")
    return "\n".join(lines)


def turn_context(tape: Tape[Any, Any]) -> TurnContext:
    """The prompt sections for the next node run on ``tape``."""
    steps = list(tape.steps)
    user_at = last_user_index(tape)
    before = steps[:user_at] if user_at >= 0 else steps
    current = steps[user_at + 1 :] if user_at >= 0 else []
    state = form_state(steps)
    schema = state.schema
    offered = [s for s in current if isinstance(s, FunctionCandidates)]
    forms = (
        json.dumps([c.model_dump() for c in offered[-1].candidates], ensure_ascii=False)
        if offered
        else "not looked up yet"
    )
    thoughts = [s for s in current if not isinstance(s, SetNextNode | Observation)]
    return TurnContext(
        forms=forms,
        form_names=", ".join(c.name for c in offered[-1].candidates) if offered else "not looked up yet",
        form=json.dumps(schema.json_schema(), ensure_ascii=False) if schema else "none selected",
        form_compact=compact_form(schema) if schema else "none selected",
        form_name=schema.name if schema else "",
        filled=json.dumps(state.filled, ensure_ascii=False),
        skipped=json.dumps(state.skipped),
        asked=_asked(before),
        dialogue=_dialogue(steps),
        last_user=steps[user_at].content if user_at >= 0 else "",  # type: ignore[attr-defined]
        thoughts=steps_json(thoughts) if thoughts else "[]",
    )
