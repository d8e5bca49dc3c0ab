"""The agent's turn: node runs until one makes an action (or a stop, or the root's Respond).

:func:`agent_turn` asks :func:`~tapekit._engine.moves.next_move` who moves, finishes a node run
the tape was cut inside (:func:`finish_open_run`), runs pending forks
(:func:`~tapekit._engine.forks.run_fork`), and otherwise runs the selected node: its prompt, the
LLM call (:func:`call_llm`), its steps, attributed and marked. A failure is written on the
returned tape (``metadata.error``), never raised. The agent itself (:mod:`tapekit.agent`) only
says what it *is*: nodes, LLMs, subagents and lookups.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tapekit._engine.forks import BranchLoop, ForkOutcome, run_fork
from tapekit._engine.moves import next_move
from tapekit._engine.runs import attributed, closes_branch, content_diff, ends_turn, tape_of, with_last
from tapekit.core import Call, Fork, PartialStep, Prompt, Respond, Step, Tape, TapeMetadata, new_id
from tapekit.errors import AgentError
from tapekit.events import AgentEvent
from tapekit.llm.base import LLMCall, LLMEvent, LLMStream
from tapekit.views import TapeViewStack

if TYPE_CHECKING:
    from tapekit.agent import Agent, Node
    from tapekit.environment import Environment


logger = logging.getLogger("tapekit.agent")  # the agent's failures log where they always did


def check_root(agent: Agent) -> None:
    """Raise :class:`AgentError` unless ``agent`` is a root agent (only a team's root runs)."""
    if agent.manager is not None:
        raise AgentError(
            f"run the root agent {agent.root.name!r}, not its subagent {agent.full_name!r} "
            "(or run a .clone() of the subagent on its own)"
        )


@dataclass(slots=True)
class Finished:
    """Where finishing an interrupted node run left the tape, and whether that ends the turn."""

    tape: Tape[Any, Any]
    stop: bool = False


@dataclass(slots=True)
class Called:
    """The output stream of an LLM call, for ``generate_steps`` (empty when no LLM was called)."""

    stream: LLMStream = field(default_factory=LLMStream)


async def call_llm(agent: Agent, node: Node, prompt: Prompt, called: Called) -> AsyncIterator[AgentEvent]:
    """Stream ``prompt`` through the node's LLM: its chunks, then the completed call; the
    output stream for ``generate_steps`` is left in ``called``."""
    llm = agent.llm_for(node)
    events: list[LLMEvent] = []
    t0 = time.perf_counter()
    async for event in llm.astream(prompt):
        events.append(event)
        if event.chunk:
            yield AgentEvent(chunk=event.chunk)
    called.stream = stream = LLMStream(events, prompt)
    last = events[-1]
    prompt_tokens, output_tokens = last.prompt_tokens or 0, last.output_tokens or 0
    call = LLMCall.model_construct(  # every value is already of its field's type: skip validation
        prompt=prompt,
        output=stream.get_output(),
        model=llm.model_name,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cost=llm.cost(prompt_tokens, output_tokens),
        latency_s=time.perf_counter() - t0,
        tokens=last.tokens,
    )
    yield AgentEvent(llm_call=call)


async def finish_open_run(
    root: Agent, tape: Tape[Any, Any], stack: TapeViewStack, branch_len: int, finished: Finished
) -> AsyncIterator[AgentEvent]:
    """Finish a node run that the tape was cut in the middle of: re-make its prompt from the
    run's start, get the LLM output again (a cache or replay gives the recorded one), and
    append the steps the run had not yet added. The tape and whether that ends the turn are
    left in ``finished``."""
    top = stack.top
    agent = root.find_agent(top.agent_name)
    assert top.last_node is not None
    node = agent.find_node(top.last_node)
    start = top.run_start
    run_tape = tape_of(tape, top.visible(start))
    closing = closes_branch(stack, branch_len)
    existing = list(tape.steps[start:])
    prompt_id = existing[0].metadata.prompt_id
    prompt = node.make_prompt(agent, run_tape)
    called = Called()
    if prompt is not None:
        prompt = prompt.model_copy(update={"id": prompt_id})
        async for event in call_llm(agent, node, prompt, called):
            yield event
    made = [s for s in node.generate_steps(agent, run_tape, called.stream) if isinstance(s, Step)]
    mismatch = content_diff(existing, made[: len(existing)], ("on the tape", "made now"))
    if mismatch is not None:
        raise AgentError(
            f"cannot finish the interrupted run of {agent.full_name}.{node.name}: run again, "
            "it makes different steps (use the recorded LLM output, e.g. a cache or replay)\n" + mismatch
        )
    rest = made[len(existing) :]
    for i, step in enumerate(rest):
        step = attributed(step, agent.full_name, node.name, prompt_id, i == len(rest) - 1)
        tape = tape.model_copy(update={"steps": tape.steps.appended([step])})
        yield AgentEvent(step=step)
    finished.tape = tape
    finished.stop = any(ends_turn(s, agent is root, closing) for s in made)


def _final(
    agent: Agent, start: Tape[Any, Any], tape: Tape[Any, Any], error: str | None = None
) -> Tape[Any, Any]:
    """The turn's tape: ``tape`` with metadata saying who added how many steps (and any error)."""
    meta = TapeMetadata(
        parent_id=start.metadata.id,
        author=agent.name,
        n_added_steps=len(tape) - len(start),
        error=error,
    )
    return tape.model_copy(update={"metadata": meta})


async def agent_turn(
    root: Agent,
    start: Tape[Any, Any],
    environment: Environment | None,
    branch_len: int,
    loop: BranchLoop,
) -> AsyncIterator[AgentEvent]:
    """``root``'s team's turn on ``start``; the last event carries the tape (``final_tape``).

    ``branch_len`` > 0 runs one fork branch: the turn also ends when the branch's subagent
    responds (the view stack is back to ``branch_len`` views), and only forks made inside the
    branch are this turn's to run. ``loop`` runs each branch of a fork (the engine's
    :func:`~tapekit._engine.loop.alternate`, passed in so this module does not import it)."""
    tape = start
    seq = tape.steps  # the steps made so far, ahead of `tape` within a node run
    where = ""
    try:
        move = next_move(tape, root.name, branch_len)
        if move.finishing:
            top = move.stack.top
            where = f"finishing the interrupted run of {top.agent_name}.{top.last_node}"
            finished = Finished(tape)
            async for event in finish_open_run(root, tape, move.stack, branch_len, finished):
                yield event
            tape = finished.tape
            if finished.stop:
                yield AgentEvent(final_tape=_final(root, start, tape))
                return
        iterations = 0
        while True:
            move = next_move(tape, root.name, branch_len)
            if move.fork_at is not None:
                where = f"the fork of {move.stack.views[move.fork_at].agent_name}"
                joined = ForkOutcome()
                async for event in run_fork(root, tape, move.stack, move.fork_at, environment, joined, loop):
                    yield event
                assert joined.tape is not None
                tape = joined.tape
                if joined.error is not None:
                    raise AgentError(joined.error)
                if joined.external is not None:
                    break  # a branch waits on a call in doubt at the tape's end: the loop asks again
                continue
            if iterations >= root.max_iterations:
                raise AgentError(
                    f"agent {root.name!r} ran {root.max_iterations} node runs (max_iterations) "
                    "without making an action"
                )
            iterations += 1
            agent, node = move.runner(root)
            where = f"node {agent.full_name}.{node.name}"
            closing = closes_branch(move.stack, branch_len)
            seq, stop = tape.steps, False
            async for event in _node_run(agent, node, tape, where):
                if event.step is not None:
                    seq = seq.appended([event.step])
                    stop = stop or ends_turn(event.step, agent is root, closing)
                yield event
            tape = tape.model_copy(update={"steps": seq})
            if stop:
                break
    except Exception as e:  # recorded on the tape; CancelledError is not an Exception
        if len(seq) > len(tape):
            tape = tape.model_copy(update={"steps": seq})
        message = f"{type(e).__name__}: {e}" + (f" (in {where})" if where else "")
        logger.warning("agent %s failed: %s", root.name, message)
        logger.debug("traceback of the failure of agent %s", root.name, exc_info=True)
        yield AgentEvent(final_tape=_final(root, start, tape, error=message))
        return
    yield AgentEvent(final_tape=_final(root, start, tape))


async def _node_run(agent: Agent, node: Node, tape: Tape[Any, Any], where: str) -> AsyncIterator[AgentEvent]:
    """One run of ``node``: its prompt, the LLM call, then its steps, attributed to the run
    (the last one marked ``run_end``) and streamed as events with the partial steps."""
    prompt = node.make_prompt(agent, tape)
    called = Called()
    if prompt is not None:
        async for event in call_llm(agent, node, prompt, called):
            yield event
    prompt_id = prompt.id if prompt is not None else new_id()
    for step, is_last in with_last(node.generate_steps(agent, tape, called.stream), where):
        if isinstance(step, PartialStep):
            yield AgentEvent(partial_step=step)
            continue
        if isinstance(step, Call | Respond | Fork) and not is_last:
            raise AgentError(
                f"{where} made a {step.kind} that is not the last step of its node run; "
                "put SetNextNode and other steps before it"
            )
        yield AgentEvent(step=attributed(step, agent.full_name, node.name, prompt_id, is_last))
