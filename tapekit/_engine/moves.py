"""The move rule: who moves next on a tape, read from the tape alone.

:func:`next_move` answers: the environment (actions wait for an answer) or the active agent
(finishing a node run the tape was cut inside, running a pending fork, or running its next
node). The loop, the agent's turn, ``reuse`` and the Studio all ask it; it is written once, here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from tapekit._engine.runs import pending_fork
from tapekit.core import Action, Tape
from tapekit.environment import ExternalObservationNeeded, unanswered_actions
from tapekit.views import TapeViewStack

if TYPE_CHECKING:
    from tapekit.agent import Agent, Node


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
