"""Plain-text rendering of tapes for terminals, logs and test failure messages.

A step's gist is its own (:meth:`tapekit.core.Step.present`): :func:`step_summary` is what this
module prints and what the Studio's step lists show.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tapekit.core import Action, ControlStep, Observation, Step, StepPresentation, Tape
from tapekit.llm.base import LLMCall

logger = logging.getLogger(__name__)


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


_FAILED_CLASSES: set[type[Step]] = set()


def presentation(step: Step) -> StepPresentation:
    """``step.present()``; if the step class's own ``present`` raises, the default presentation
    (the error is logged, once per class): a tool that shows a tape never fails on one step."""
    try:
        return step.present()
    except Exception:
        if type(step) not in _FAILED_CLASSES:
            _FAILED_CLASSES.add(type(step))
            logger.warning("%s.present() failed; shown by default", type(step).__name__, exc_info=True)
        return Step.present(step)


def shorten(text: str, width: int) -> str:
    """``text`` on one line (white space folded), cut to ``width`` characters with ``…``."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def step_summary(step: Step, width: int = 100) -> str:
    """The step's one-line gist (its presentation's summary), cut to ``width``."""
    return shorten(presentation(step).summary, width)


def render_step(step: Step, width: int = 100) -> str:
    """One line: author (``agent.node`` or ``environment``), kind and content."""
    return f"{step_author(step):<28} {step_category(step):<11} {step.kind:<18} {step_summary(step, width)}"


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
