"""What a running agent and the main loop report: events, and the streams that carry them.

An agent turn streams :class:`AgentEvent`; the main loop wraps those and adds the environment's
side as :class:`MainLoopEvent`. Both event kinds answer the same shortcuts (``event.step``,
``event.llm_call``, ``event.tape`` …), and the four streams (agent and main loop, sync and async)
share one implementation of :meth:`get_final_tape` and :meth:`get_steps`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tapekit._sync import iterate_sync, run_sync
from tapekit.core import Observation, PartialStep, Step, Tape
from tapekit.errors import AgentError
from tapekit.llm.base import LLMCall

if TYPE_CHECKING:
    from tapekit.environment import ExternalObservationNeeded


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One thing that happened while the agent ran; exactly one field is set.

    ``chunk``: LLM text as it streams; ``llm_call``: a completed LLM call (prompt and output);
    ``partial_step``: a step being formed; ``step``: a step just added to the tape;
    ``final_tape``: the agent's resulting tape (last event; ``metadata.error`` set on failure).
    """

    chunk: str | None = None
    llm_call: LLMCall | None = None
    partial_step: PartialStep | None = None
    step: Step | None = None
    final_tape: Tape[Any, Any] | None = None

    @property
    def tape(self) -> Tape[Any, Any] | None:
        """The tape this event carries: the final tape, on the last event."""
        return self.final_tape


@dataclass(frozen=True, slots=True)
class MainLoopEvent:
    """One event of the main loop; exactly one field is set.

    ``agent_event``: an event from inside the agent's turn; ``agent_tape``: the tape after the
    agent's turn; ``observation``: one observation the environment added; ``env_tape``: the tape
    after the environment's turn; ``external``: the loop stopped because an action waits on
    the outside world (the last tape is resumable once you append the observation).

    The shortcuts ``step``, ``llm_call``, ``chunk`` and ``partial_step`` reach into
    ``agent_event``, so ``if event.step is not None`` needs no check of ``agent_event`` first.
    """

    agent_event: AgentEvent | None = None
    agent_tape: Tape[Any, Any] | None = None
    observation: Observation | None = None
    env_tape: Tape[Any, Any] | None = None
    external: ExternalObservationNeeded | None = None

    @property
    def tape(self) -> Tape[Any, Any] | None:
        """The new tape if this event carries one (after either side's turn)."""
        return self.agent_tape if self.agent_tape is not None else self.env_tape

    @property
    def step(self) -> Step | None:
        """The step an agent just added (None unless this is such an agent event)."""
        return self.agent_event.step if self.agent_event is not None else None

    @property
    def llm_call(self) -> LLMCall | None:
        """The LLM call just completed (None unless this is such an agent event)."""
        return self.agent_event.llm_call if self.agent_event is not None else None

    @property
    def chunk(self) -> str | None:
        """LLM text as it streams (None unless this is such an agent event)."""
        return self.agent_event.chunk if self.agent_event is not None else None

    @property
    def partial_step(self) -> PartialStep | None:
        """A step being formed (None unless this is such an agent event)."""
        return self.agent_event.partial_step if self.agent_event is not None else None


E = TypeVar("E", bound=AgentEvent | MainLoopEvent)


class _Stream(Generic[E]):
    """What the four streams share: the events, the start tape, and how a run ends."""

    def __init__(self, events: AsyncIterator[E], start: Tape[Any, Any], needs_final: bool) -> None:
        self._events = events
        self._start = start
        self._needs_final = needs_final  # an agent turn always ends with its tape; a loop may not

    def _result(self, last: Tape[Any, Any] | None) -> Tape[Any, Any]:
        if last is not None:
            return last
        if self._needs_final:
            raise AgentError("the agent stream ended without a final tape")
        return self._start  # the loop ran no turn (max_loops=0): the tape is the start tape

    def _added(self, final: Tape[Any, Any]) -> list[Step]:
        return list(final.steps[len(self._start) :]) if len(final) >= len(self._start) else []

    async def _afinal(self) -> Tape[Any, Any]:
        last = None
        async for event in self._events:
            if event.tape is not None:
                last = event.tape
        return self._result(last)


class AsyncEventStream(_Stream[E]):
    """An async stream of events: ``async for`` them, or await :meth:`get_final_tape`."""

    def __aiter__(self) -> AsyncIterator[E]:
        return self._events

    async def get_final_tape(self) -> Tape[Any, Any]:
        """Run to the end and return the last tape."""
        return await self._afinal()

    async def get_steps(self) -> list[Step]:
        """Run to the end and return the steps added to the start tape."""
        return self._added(await self._afinal())


class EventStream(_Stream[E]):
    """A sync stream of events: iterate them, or call :meth:`get_final_tape`.

    Runs the same async code as its async twin, on a private event loop.
    """

    def __init__(self, events: AsyncIterator[E], start: Tape[Any, Any], needs_final: bool) -> None:
        super().__init__(events, start, needs_final)
        self._iter: Iterator[E] | None = None

    def __iter__(self) -> Iterator[E]:
        if self._iter is None:
            self._iter = iterate_sync(self._events)
        return self._iter

    def get_final_tape(self) -> Tape[Any, Any]:
        """Run to the end (or the rest of the way, if iterated already) and return the last tape."""
        if self._iter is None:  # one event loop run for the whole stream: the fast path
            return run_sync(self._afinal())
        last = None
        for event in self._iter:
            if event.tape is not None:
                last = event.tape
        return self._result(last)

    def get_steps(self) -> list[Step]:
        """Run to the end and return the steps added to the start tape."""
        return self._added(self.get_final_tape())


class AsyncAgentStream(AsyncEventStream[AgentEvent]):
    """The events of one ``agent.arun``: ``async for`` them, or await :meth:`get_final_tape`."""

    def __init__(self, events: AsyncIterator[AgentEvent], start: Tape[Any, Any]) -> None:
        super().__init__(events, start, needs_final=True)


class AgentStream(EventStream[AgentEvent]):
    """The events of one ``agent.run`` (sync): iterate them, or call :meth:`get_final_tape`."""

    def __init__(self, events: AsyncIterator[AgentEvent], start: Tape[Any, Any]) -> None:
        super().__init__(events, start, needs_final=True)


class AsyncMainLoopStream(AsyncEventStream[MainLoopEvent]):
    """Events of :func:`~tapekit.orchestrator.amain_loop`; ``async for`` them or await
    :meth:`get_final_tape`."""

    def __init__(self, events: AsyncIterator[MainLoopEvent], start: Tape[Any, Any]) -> None:
        super().__init__(events, start, needs_final=False)


class MainLoopStream(EventStream[MainLoopEvent]):
    """Events of :func:`~tapekit.orchestrator.main_loop` (sync); iterate them or call
    :meth:`get_final_tape`."""

    def __init__(self, events: AsyncIterator[MainLoopEvent], start: Tape[Any, Any]) -> None:
        super().__init__(events, start, needs_final=False)
