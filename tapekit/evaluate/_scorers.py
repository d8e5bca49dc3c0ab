"""Ready-made scorers for tasks whose answer is the agent's last message to the user.

A scorer is a function ``(final tape, task) -> Score``. These two compare the text of the last
:class:`~tapekit.dialog.AssistantStep` on the tape with ``str(task.expected)``:

- :func:`exact_answer`: equal after stripping surrounding whitespace (case kept);
- :func:`contains_answer`: the expected text occurs in the answer, ignoring case.

A tape without an assistant message fails both, with feedback saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tapekit.evaluate._report import Score

if TYPE_CHECKING:
    from tapekit.core import Tape
    from tapekit.evaluate import Task


def final_answer(tape: Tape[Any, Any]) -> str | None:
    """The text of the last assistant message on ``tape`` (``None`` when there is none)."""
    from tapekit.dialog import AssistantStep

    for step in reversed(tape.steps):
        if isinstance(step, AssistantStep):
            return step.content
    return None


def _expected(task: Task) -> str:
    if task.expected is None:
        raise ValueError(f"task {task.id!r} has no `expected` answer to compare with")
    return str(task.expected)


def exact_answer(tape: Tape[Any, Any], task: Task) -> Score:
    """Pass when the last assistant message equals ``task.expected`` (whitespace stripped)."""
    answer, expected = final_answer(tape), _expected(task)
    if answer is None:
        return Score(value=0.0, passed=False, feedback="the agent gave no answer")
    ok = answer.strip() == expected.strip()
    feedback = "" if ok else f"expected {expected!r}, got {answer[:200]!r}"
    return Score(value=float(ok), passed=ok, feedback=feedback)


def contains_answer(tape: Tape[Any, Any], task: Task) -> Score:
    """Pass when ``task.expected`` occurs in the last assistant message, ignoring case."""
    answer, expected = final_answer(tape), _expected(task)
    if answer is None:
        return Score(value=0.0, passed=False, feedback="the agent gave no answer")
    ok = expected.strip().lower() in answer.lower()
    return Score(value=float(ok), passed=ok, feedback="" if ok else f"{expected!r} not in {answer[:200]!r}")
