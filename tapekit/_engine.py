"""The engine: who moves next on a tape, and the one agent ⇄ environment alternation.

:func:`next_move` reads from a tape alone who moves next: the environment (actions wait for an
answer) or the active agent (finishing a node run the tape was cut inside, running a pending
fork, or running its next node). The main loop, the agent's turn, ``reuse`` and the Studio all
ask it.

:func:`alternate` is the loop itself, used by :func:`~tapekit.orchestrator.amain_loop` for a
session and by :mod:`tapekit.forks` for each branch of a fork, so both record failures the
same way: an agent's failure is the ``metadata.error`` its turn wrote, an environment's is
``"<Type>: <message> (in environment <name>)"``. Where a session stops to wait on the outside
world (:class:`~tapekit.environment.ExternalObservationNeeded`, or actions with no environment
to answer them), a branch, which cannot wait, fails with the same text.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from tapekit._runs import pending_fork
from tapekit.core import Action, Observation, Tape
from tapekit.environment import Environment, ExternalObservationNeeded, unanswered_actions
from tapekit.events import MainLoopEvent
from tapekit.views import TapeViewStack

if TYPE_CHECKING:
    from tapekit.agent import Agent, Node

__all__ = ["Move", "alternate", "next_move", "no_environment"]

logger = logging.getLogger(__name__)


class Move:
    """Who moves next on a tape (see :func:`next_move`).

    ``actor`` is ``"environment"`` when actions at the tape's end wait for an answer and no
    node run is open, else ``"agent"``. The agent that moves is the active one (on top of the
    view stack): it finishes its interrupted node run (``finishing``), runs the fork pending in
    view ``fork_at``, or runs the node its view selects.
    """

    __slots__ = ("_waiting", "branch_len", "stack", "tape")

    def __init__(self, tape: Tape[Any, Any], stack: TapeViewStack, branch_len: int = 0) -> None:
        self.tape = tape
        self.stack = stack
        self.branch_len = branch_len
        self._waiting: list[Action] | None = None

    @property
    def waiting(self) -> list[Action]:
        """The actions at the tape's end with no observation yet (computed once, on demand)."""
        if self._waiting is None:
            self._waiting = unanswered_actions(self.tape)
        return self._waiting

    @property
    def actor(self) -> Literal["agent", "environment"]:
        """Whose move it is: an open node run is finished first, then waiting actions answered."""
        return "environment" if not self.stack.top.run_open and self.waiting else "agent"

    @property
    def agent_name(self) -> str:
        """The full name of the active agent (the top of the view stack)."""
        return self.stack.top.agent_name

    @property
    def fork_at(self) -> int | None:
        """The view whose fork is still running (at or above ``branch_len``), if any: its
        branches move before anything else in the agent's turn."""
        return pending_fork(self.stack, self.branch_len)

    @property
    def finishing(self) -> bool:
        """Whether the active agent finishes a node run the tape was cut inside (no fork pending)."""
        top = self.stack.top
        return top.run_open and top.last_node is not None and self.fork_at is None

    def runner(self, root: Agent) -> tuple[Agent, Node]:
        """The member of ``root``'s team that moves, and the node it runs: its interrupted one
        when finishing, else the one its view selects (``SetNextNode``, the next in order, or
        the first)."""
        top = self.stack.top
        agent = root.find_agent(top.agent_name)
        if self.finishing:
            assert top.last_node is not None
            return agent, agent.find_node(top.last_node)
        return agent, agent.select_node(top)

    def describe(self) -> str:
        """Who moves next, in words (as the Studio shows it)."""
        top = self.stack.top
        if top.run_open:
            return f"{top.agent_name} (finishing its interrupted {top.last_node} run)"
        if self.waiting:
            return f"the environment (answering {', '.join(a.kind for a in self.waiting)})"
        return top.agent_name


def next_move(tape: Tape[Any, Any], root_name: str, branch_len: int = 0) -> Move:
    """Who moves next on ``tape`` for the team whose root agent is ``root_name``.

    ``branch_len`` > 0 reads the tape as one fork branch does (only forks at or above that
    view depth are the branch's own to run). Costs the new steps' share of the memoised view
    stack; the waiting actions are only looked for when asked.
    """
    return Move(tape, TapeViewStack.compute(tape, root_name), branch_len)


def no_environment(actions: list[Action]) -> ExternalObservationNeeded:
    """What waits when actions are made and there is no environment to answer them."""
    kinds = ", ".join(sorted({a.kind for a in actions}))
    return ExternalObservationNeeded(
        actions[-1],
        f"nothing answers the actions ({kinds}): the agent runs without an environment "
        "(pass one to main_loop/amain_loop, or to arun for the actions of fork branches)",
    )


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
        agent._check_root()
    root = agent.name
    loops = 0
    while max_loops is None or loops < max_loops:
        loops += 1
        move = next_move(tape, root, branch_len)
        if move.actor == "agent":
            final = None
            async for event in agent._arun(tape, environment, branch_len):
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
            if not branch_len:
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
