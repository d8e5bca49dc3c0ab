"""Plain-text rendering of tapes for terminals, logs and test failure messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tapekit.core import Action, Call, ControlStep, Observation, Respond, Step, Tape
from tapekit.llm.base import LLMCall

__all__ = ["render_step", "render_tape", "step_author", "step_category"]


def step_category(step: Step) -> str:
    """``thought``, ``action``, ``observation`` or ``control``: how tools colour a step."""
    if isinstance(step, ControlStep):
        return "control"
    if isinstance(step, Action):
        return "action"
    if isinstance(step, Observation):
        return "observation"
    return "thought"


def step_author(step: Step) -> str:
    """``agent.node`` for steps an agent made, ``environment`` for the others."""
    meta = step.metadata
    return f"{meta.agent}.{meta.node}" if meta.agent else "environment"


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_step(step: Step, width: int = 100) -> str:
    """One line: author (``agent.node`` or ``environment``), kind and content."""
    if isinstance(step, Call):
        body = f"calls {step.agent_name}: {step.content}"
    elif isinstance(step, Respond):
        body = f"responds: {step.content}"
    else:
        fields = step.llm_dict()
        fields.pop("kind", None)
        body = _short(fields.popitem()[1] if len(fields) == 1 else fields, width)
    return f"{step_author(step):<28} {step_category(step):<11} {step.kind:<18} {_short(body, width)}"


def render_tape(
    tape: Tape[Any, Any], width: int = 100, llm_calls: Mapping[str, LLMCall] | None = None
) -> str:
    """The whole tape, one numbered line per step, then its error if it has one.

    With ``llm_calls`` (by prompt id), the first step of each node run also shows the tokens of
    the LLM call behind it.
    """
    lines = []
    seen: set[str] = set()
    for i, step in enumerate(tape.steps):
        line = f"[{i:>3}] {render_step(step, width)}"
        pid = step.metadata.prompt_id
        call = llm_calls.get(pid) if llm_calls and pid and pid not in seen else None
        if call is not None:
            seen.add(pid)
            line += f"  [{call.prompt_tokens} prompt + {call.output_tokens} output tokens]"
        lines.append(line)
    if tape.metadata.error:
        lines.append(f"error: {tape.metadata.error}")
    return "\n".join(lines)
