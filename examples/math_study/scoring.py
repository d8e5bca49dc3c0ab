"""Strict and lenient scorers for the math tapes, and the evaluation tasks of the problems.

- strict: the agent's final answer is written exactly as ``Answer: <integer>`` and the integer
  is the expected one;
- lenient: the expected number appears (as a whole number) anywhere in what the agent wrote:
  its plan, its calculator calls or its final line, whatever the format (in the final line only
  when the question itself holds that number);
- steps (:func:`step_credit`, a reward for RL, not a measure): partial credit for the
  calculator calls that follow the problem's own operations, in order, plus the strict answer.

Reported side by side, a gain in format alone never passes for learning.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tapekit import AssistantThought, Tape, ToolCall, UserStep
from tapekit.evaluate import EvalReport, Score, Task, evaluate

from .agents import MathAnswer, MathPlan, calculator_environment, start_tape
from .problems import Problem

__all__ = [
    "MAX_LOOPS",
    "SCORERS",
    "evaluate_agent",
    "lenient",
    "pass_at_1_text",
    "step_credit",
    "strict",
    "tasks_for",
]

MAX_LOOPS = 8  # agent/environment rounds per problem: 3 calculator calls need 4


def _answer(tape: Tape[Any, Any]) -> MathAnswer | None:
    return next((s for s in reversed(tape.steps) if isinstance(s, MathAnswer)), None)


def strict(tape: Tape[Any, Any], task: Task) -> Score:
    """Pass when the final answer is ``Answer: <expected>`` exactly."""
    answer = _answer(tape)
    if answer is None:
        return Score(value=0.0, passed=False, feedback=tape.metadata.error or "no final answer")
    passed = answer.well_formed and answer.text == str(task.expected)
    feedback = None if passed else f"answered {answer.text!r}, expected {task.expected}"
    return Score(value=float(passed), passed=passed, feedback=feedback)


def _written(tape: Tape[Any, Any]) -> str:
    parts = []
    for step in tape.steps:
        if isinstance(step, MathAnswer | MathPlan):
            parts.append(step.text)
        elif isinstance(step, AssistantThought):
            parts.append(step.content)
        elif isinstance(step, ToolCall):
            parts.append(str(step.arguments))
    return "\n".join(parts)


def _has_number(text: str, number: str) -> bool:
    return re.search(rf"(?<![\d.]){re.escape(number)}(?![\d.])", text) is not None


def lenient(tape: Tape[Any, Any], task: Task) -> Score:
    """Pass when the expected number appears anywhere in the agent's own writing; when the
    question itself holds that number, only in the final answer (copying a number out of the
    question is not solving it)."""
    expected = str(task.expected)
    question = next((str(s.content) for s in tape.steps if isinstance(s, UserStep)), "")
    if _has_number(question, expected):
        answer = _answer(tape)
        found = answer is not None and _has_number(answer.text, expected)
        why = "number in the question; not in the final answer"
    else:
        found = _has_number(_written(tape), expected)
        why = "number not written"
    return Score(value=float(found), passed=found, feedback=None if found else why)


SCORERS = {"strict": strict, "lenient": lenient}


def _calls(tape: Tape[Any, Any]) -> list[str]:
    return [
        str(s.arguments.get("expression", "")).replace(" ", "") for s in tape.steps if isinstance(s, ToolCall)
    ]


def step_credit(problems: list[Problem]) -> Any:
    """A scorer for ``problems`` (matched by task id): the share of the problem's operations
    that the agent's calculator calls carry out correctly and in order (``12+7``, then ``19*3``;
    counting stops at the first wrong call), and the strict answer as one more part. A dense
    RL reward: a three-operation problem whose first two calls are right earns 0.5, not 0."""
    by_id = {p.id: p for p in problems}

    def steps(tape: Tape[Any, Any], task: Task) -> Score:
        problem = by_id.get(task.id)
        if problem is None:
            raise KeyError(f"step_credit: no problem with id {task.id!r}")
        expected = [f"{left}{op}{right}" for left, op, right, _ in problem.steps()]
        right = 0
        for call, want in zip(_calls(tape), expected, strict=False):
            if call != want:
                break
            right += 1
        passed = strict(tape, task).passed
        value = (right + float(passed)) / (len(expected) + 1)
        return Score(value=value, passed=passed, feedback=f"{right}/{len(expected)} calls right")

    return steps


def tasks_for(problems: list[Problem], grade: Callable[[Problem], str] | None = None) -> list[Task]:
    """Evaluation tasks: the start tape, the level as category (or ``grade(problem)``, e.g.
    :func:`~examples.math_study.problems.difficulty`) and the answer as expected."""
    return [
        Task(id=p.id, start=start_tape(p), category=grade(p) if grade else p.category, expected=p.answer)
        for p in problems
    ]


def evaluate_agent(agent: Any, tasks: list[Task], store: Any, name: str, max_concurrency: int) -> EvalReport:
    """Strict and lenient scores of ``agent`` on ``tasks`` (one greedy attempt per problem)."""
    return evaluate(
        agent,
        calculator_environment(),
        tasks,
        SCORERS,
        k=1,
        name=name,
        store=store,
        max_loops=MAX_LOOPS,
        max_concurrency=max_concurrency,
    )


def pass_at_1_text(report: EvalReport) -> str:
    """``n=45 exact=0.62 exact_95ci=[0.47,0.76] lenient=0.67 lenient_95ci=[0.53,0.80]``: pass@1
    of both scorers with their 95 % bootstrap intervals (problems resampled), so that a figure
    on a few dozen problems is read as the range it is."""
    parts = [f"n={report.n_tasks}"]
    for name, scorer in (("exact", "strict"), ("lenient", "lenient")):
        e = report.pass_at_1(scorer)
        parts.append(f"{name}={e.value:.2f} {name}_95ci=[{e.low:.2f},{e.high:.2f}]")
    return " ".join(parts)
