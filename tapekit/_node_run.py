"""One node run's LLM call, and finishing a node run that a tape was cut in the middle of.

Helpers of :meth:`tapekit.agent.Agent.arun`'s turn loop, kept apart so the agent module holds
the loop itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tapekit._runs import attributed, closes_branch, content_diff, ends_turn, tape_of
from tapekit.core import Prompt, Step, Tape
from tapekit.errors import AgentError
from tapekit.events import AgentEvent
from tapekit.llm.base import LLMCall, LLMEvent, LLMStream
from tapekit.views import TapeViewStack

if TYPE_CHECKING:
    from tapekit.agent import Agent, Node

__all__ = ["Called", "Finished", "call_llm", "finish_open_run"]


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
