"""The loop: an agent's turns and an environment's reactions, alternating on one tape.

:func:`alternate` is used by :func:`~tapekit.orchestrator.amain_loop` for a session and, through
the agent's turn, for each branch of a fork (:mod:`tapekit._engine.forks`), so both record
failures the same way: an agent's failure is the ``metadata.error`` its turn wrote, an
environment's is ``"<Type>: <message> (in environment <name>)"``. Where a session stops to wait
on the outside world (:class:`~tapekit.environment.ExternalObservationNeeded`, or actions with
no environment to answer them), a branch, which cannot wait, fails with the same text; only a
branch's tool call in doubt (:class:`~tapekit.effects.InDoubtToolCall`) makes the session wait.

:func:`turn` is one agent turn with forks run by this loop (what ``Agent.arun`` streams).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from tapekit._engine.moves import next_move, no_environment
from tapekit._engine.turn import agent_turn, check_root
from tapekit.core import Observation, StopStep, Tape
from tapekit.effects import InDoubtToolCall
from tapekit.environment import Environment, ExternalObservationNeeded
from tapekit.events import AgentEvent, MainLoopEvent

if TYPE_CHECKING:
    from tapekit.agent import Agent


logger = logging.getLogger(__name__)


def turn(
    agent: Agent, tape: Tape[Any, Any], environment: Environment | None = None
) -> AsyncIterator[AgentEvent]:
    """``agent``'s turn on ``tape`` (see :func:`~tapekit._engine.turn.agent_turn`), the
    branches of its forks run by :func:`alternate`; raises ``AgentError`` for a subagent."""
    check_root(agent)
    return agent_turn(agent, tape, environment, 0, alternate)


def _failure(e: Exception, environment: Environment | None) -> str:
    """How an environment's failure is written on the tape."""
    where = f" (in environment {environment.name})" if environment is not None else ""
    return f"{type(e).__name__}: {e}{where}"


async def alternate(
    agent: Agent,
    tape: Tape[Any, Any],
    environment: Environment | None,
    max_loops: int | None = None,
    branch_len: int = 0,
) -> AsyncIterator[MainLoopEvent]:
    """Alternate ``agent``'s turns and ``environment``'s reactions on ``tape``.

    ``branch_len`` is the stop condition. 0 runs a session: it stops when the agent is done
    (no action waits), fails, an action waits on the outside world (an ``external`` event), or
    after ``max_loops`` rounds. ``n`` > 0 runs the fork branch whose subagent's view is view
    ``n`` of the stack: it stops when that subagent responds (the stack is back to ``n``
    views); a branch that stops otherwise, or would wait on the outside world, fails.

    Every failure ends the loop with the failed tape (``metadata.error`` set) as its last
    tape event: the agent's own error after its turn (``agent_tape``), an environment's as
    ``"<Type>: <message> (in environment <name>)"`` (``env_tape``).
    """
    if not branch_len:
        check_root(agent)
        if tape.steps and isinstance(tape.steps[-1], StopStep):
            return  # a stopped session (resumed after its last write, say) has nothing left to do
    root = agent.name
    loops = 0
    while max_loops is None or loops < max_loops:
        loops += 1
        move = next_move(tape, root, branch_len)
        if move.actor == "agent":
            final = None
            async for event in agent_turn(agent, tape, environment, branch_len, alternate):
                yield MainLoopEvent(agent_event=event)
                if event.final_tape is not None:
                    final = event.final_tape
            assert final is not None
            tape = final
            yield MainLoopEvent(agent_tape=tape)
            if tape.metadata.error:
                return
            move = next_move(tape, root, branch_len)
            if branch_len and len(move.stack) <= branch_len:
                return  # the branch's subagent responded
            if not move.waiting:
                if branch_len:
                    error = "the branch stopped before its subagent responded"
                    yield MainLoopEvent(agent_tape=tape.with_metadata(error=error))
                return
        try:
            if environment is None:
                raise no_environment(move.waiting)
            new = await environment.areact(tape)
        except ExternalObservationNeeded as e:
            if not branch_len or isinstance(e, InDoubtToolCall):  # a branch may wait on a call in doubt
                yield MainLoopEvent(external=e)
                return
            error = f"{_failure(e, environment)}; a fork branch cannot wait on the outside world"
            yield MainLoopEvent(env_tape=tape.with_metadata(error=error))
            return
        except Exception as e:
            assert environment is not None
            logger.warning("environment %s failed: %s: %s", environment.name, type(e).__name__, e)
            logger.debug("traceback of the environment failure", exc_info=True)
            yield MainLoopEvent(env_tape=tape.with_metadata(error=_failure(e, environment)))
            return
        for step in new.steps[len(tape) :]:
            if isinstance(step, Observation):
                yield MainLoopEvent(observation=step)
        tape = new
        yield MainLoopEvent(env_tape=tape)
