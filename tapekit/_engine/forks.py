"""Running a :class:`~tapekit.core.Fork`: its branches concurrently, joined in branch order.

A fork made by a node starts one subagent call per branch. Each branch runs on its own tape
(the tape as it was at the fork, the branch's Call, then the branch's own steps) through the
main loop's own engine (:func:`tapekit._engine.loop.alternate`, handed in by the turn): agent
turns, and environment reactions to the branch's actions, until the branch's subagent
responds. A branch fails the way a session does, with the same error text. The joined steps
reach the caller in branch order (see :func:`run_fork`), so a tape cut anywhere inside a fork
is a resume point.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tapekit._engine.runs import attributed, tape_of
from tapekit.core import Tape
from tapekit.effects import InDoubtToolCall
from tapekit.events import AgentEvent, MainLoopEvent
from tapekit.views import TapeViewStack

if TYPE_CHECKING:
    from tapekit.agent import Agent
    from tapekit.environment import Environment


class BranchLoop(Protocol):
    """The loop a branch runs in: :func:`tapekit._engine.loop.alternate`'s signature."""

    def __call__(
        self,
        agent: Agent,
        tape: Tape[Any, Any],
        environment: Environment | None,
        max_loops: int | None = None,
        branch_len: int = 0,
    ) -> AsyncIterator[MainLoopEvent]: ...


@dataclass(slots=True)
class ForkOutcome:
    """How a fork (or one of its branches) ended: the tape it left, and its error if it failed,
    or the tool call in doubt it stopped on (:mod:`tapekit.effects`). Filled in by
    :func:`run_fork` when its event stream ends."""

    tape: Tape[Any, Any] | None = None
    error: str | None = None
    external: InDoubtToolCall | None = None  # the branch stopped on a tool call in doubt


@dataclass(frozen=True, slots=True)
class _Message:
    """What a branch task sends to the join: an event, or (``end`` set) how the branch ended."""

    branch: int
    event: AgentEvent | None = None
    end: ForkOutcome | None = None


async def run_fork(
    agent: Agent,
    tape: Tape[Any, Any],
    stack: TapeViewStack,
    at: int,
    environment: Environment | None,
    outcome: ForkOutcome,
    loop: BranchLoop,
) -> AsyncIterator[AgentEvent]:
    """Run the branches of the fork pending in view ``at`` of ``stack`` concurrently and join
    them; stream their events, and leave the joined tape (or the first failed branch's error)
    in ``outcome``.

    Steps reach the caller in branch order: the first unfinished branch streams live, later
    ones are held back until the branches before them are done, so the tape (and the store
    writing it) always shows whole branches followed by at most one partial one. A tape cut
    inside the fork therefore resumes here: finished branches are kept, the partial one is
    finished from its own view, the missing ones start. A branch that stops on a tool call in
    doubt (:class:`~tapekit.effects.InDoubtToolCall`) ends the fork there, without error, once
    the branches before it are done: the joined tape ends with that call, and the session
    waits on it as it would on a call of its own.
    """
    view = stack.views[at]
    fork = view.fork
    assert fork is not None
    forker, node_name = fork.metadata.agent, fork.metadata.node
    base = tape_of(tape, view.fork_visible)
    runs: list[tuple[int, Tape[Any, Any], int]] = []  # (branch, its tape, steps already on `tape`)
    first_new = view.fork_done
    if len(stack) > at + 1:  # the tape ends inside branch `fork_done`: finish it
        partial = tape_of(tape, stack.views[at + 1].visible(len(tape)))
        runs.append((view.fork_done, partial, len(partial)))
        first_new += 1
    for k in range(first_new, len(fork.branches)):
        call = attributed(fork.call(k), forker, node_name, "", False)
        runs.append((k, base.model_copy(update={"steps": base.steps.appended([call])}), len(base)))

    queue: asyncio.Queue[_Message] = asyncio.Queue()

    async def pump(k: int, branch: Tape[Any, Any], known: int) -> None:
        end = ForkOutcome(branch)
        try:
            async for event in _run_branch(agent, branch, known, at + 1, environment, end, loop):
                await queue.put(_Message(k, event=event))
        except Exception as e:  # reported with the branch; CancelledError passes through
            end = ForkOutcome(branch, f"{type(e).__name__}: {e}")
        await queue.put(_Message(k, end=end))

    tasks = [asyncio.create_task(pump(k, b, known)) for k, b, known in runs]
    order = [k for k, _, _ in runs]
    held: dict[int, list[AgentEvent]] = {k: [] for k in order}
    ended: dict[int, ForkOutcome] = {}
    head = 0
    seq = tape.steps
    try:
        while head < len(order):
            message = await queue.get()
            k = message.branch
            if message.end is not None:
                ended[k] = message.end
            else:
                event = message.event
                assert event is not None
                if event.step is not None and k != order[head]:
                    held[k].append(event)
                else:
                    if event.step is not None:
                        seq = seq.appended([event.step])
                    yield event
                continue
            while head < len(order) and order[head] in ended:
                end = ended[order[head]]
                if end.error is not None:
                    name = fork.branches[order[head]].agent_name
                    outcome.tape = tape.model_copy(update={"steps": seq})
                    outcome.error = f"branch {order[head]} ({name}) of the fork failed: {end.error}"
                    return
                if end.external is not None:  # the tape is cut at its call in doubt: it waits
                    outcome.tape = tape.model_copy(update={"steps": seq})
                    outcome.external = end.external
                    return
                head += 1
                if head < len(order):
                    for event in held.pop(order[head]):
                        assert event.step is not None
                        seq = seq.appended([event.step])
                        yield event
        outcome.tape = tape.model_copy(update={"steps": seq})
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_branch(
    agent: Agent,
    tape: Tape[Any, Any],
    known: int,
    branch_len: int,
    environment: Environment | None,
    end: ForkOutcome,
    loop: BranchLoop,
) -> AsyncIterator[AgentEvent]:
    """One fork branch, run by the engine's loop (``loop``) until the
    branch's subagent responds: its steps as agent events (those past ``known`` are new to
    the caller, the environment's included), and how the branch ended left in ``end``."""
    for step in tape.steps[known:]:
        yield AgentEvent(step=step)
    async for event in loop(agent, tape, environment, branch_len=branch_len):
        if isinstance(event.external, InDoubtToolCall):
            end.external = event.external
        if event.agent_event is not None:
            if event.agent_event.final_tape is None:  # the turn's tape comes as agent_tape
                yield event.agent_event
        elif event.tape is not None:
            if event.env_tape is not None:
                for step in event.env_tape.steps[len(tape) :]:
                    yield AgentEvent(step=step)
            tape = event.tape
    end.tape, end.error = tape, tape.metadata.error
