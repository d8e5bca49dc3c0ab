"""Small pure helpers on node runs and tapes, shared by the turn loop, forks and reconstruction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tapekit._diff import diff_text
from tapekit.core import (
    Action,
    PartialStep,
    Respond,
    Step,
    StepMetadata,
    StepSequence,
    StopStep,
    Tape,
    new_id,
)
from tapekit.errors import AgentError
from tapekit.views import TapeViewStack


def tape_of(tape: Tape[Any, Any], ranges: tuple[tuple[int, int], ...]) -> Tape[Any, Any]:
    """The tape made of the steps in ``ranges`` (context and metadata kept). A single range
    from the start, the case outside forks, shares the step buffer instead of copying."""
    merged: list[tuple[int, int]] = []
    for a, b in ranges:
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        elif b > a:
            merged.append((a, b))
    if not merged:
        return tape.model_copy(update={"steps": StepSequence()})
    if len(merged) == 1 and merged[0][0] == 0:
        return tape.model_copy(update={"steps": tape.steps[: merged[0][1]]})
    items = tape.steps
    return tape.model_copy(update={"steps": StepSequence(items[i] for a, b in merged for i in range(a, b))})


def attributed(
    step: Step, agent: str, node: str, prompt_id: str, run_end: bool, fresh_id: bool = False
) -> Step:
    """A copy of ``step`` with its authorship set (the node's own object is never mutated)."""
    old = step.metadata
    meta = StepMetadata.model_construct(  # all values are already valid: skip re-validation
        id=new_id() if fresh_id else old.id,
        prompt_id=prompt_id,
        node=node,
        agent=agent,
        run_end=run_end,
        other=old.other,
    )
    return step.model_copy(update={"metadata": meta})


def content_diff(expected: list[Step], made: list[Step], labels: tuple[str, str]) -> str | None:
    """A diff of the two sequences' contents (metadata aside), or None if they are the same."""
    a = [{"step": s.llm_dict()} for s in expected]
    b = [{"step": s.llm_dict()} for s in made]
    return None if a == b else diff_text(a, b, labels)


def node_run_steps(tape: Tape[Any, Any], index: int) -> list[Step]:
    """The steps of the node run that starts at ``tape.steps[index]`` (same ``prompt_id``).

    Handy in ``make_llm_output``, which is given the index of a run's first step.
    """
    steps = tape.steps
    pid = steps[index].metadata.prompt_id
    run = []
    for i in range(index, len(steps)):
        if steps[i].metadata.prompt_id != pid:
            break
        run.append(steps[i])
    return run


def pending_fork(stack: TapeViewStack, start: int) -> int | None:
    """The index of the outermost view at or above ``start`` with a fork still running."""
    for i in range(start, len(stack)):
        if stack.views[i].fork is not None:
            return i
    return None


def with_last(items: Iterator[Step | PartialStep], where: str) -> Iterator[tuple[Any, bool]]:
    """Pairs (item, is_last_step): holds each step back until the next one shows up, so the
    last step of a run can be marked. Partial steps pass straight through."""
    pending: Step | None = None
    for item in items:
        if isinstance(item, PartialStep):
            yield item, False
            continue
        if not isinstance(item, Step):
            raise TypeError(f"{where} yielded {type(item).__name__}, not a Step or PartialStep")
        if pending is not None:
            yield pending, False
        pending = item
    if pending is None:
        raise AgentError(f"{where} produced no steps (a node run must add at least one step)")
    yield pending, True


def closes_branch(stack: TapeViewStack, branch_len: int) -> bool:
    """Whether a Respond by the active agent closes the fork branch being run (its subagent is
    the one on top)."""
    return branch_len > 0 and len(stack) == branch_len + 1


def ends_turn(step: Step, by_root: bool, closes_branch: bool = False) -> bool:
    """Whether ``step`` ends the agent's turn: an action, a stop, the root agent's Respond, or
    the Respond that closes the fork branch being run."""
    return isinstance(step, Action | StopStep) or ((by_root or closes_branch) and isinstance(step, Respond))
