"""Persisting a running session: the one path from the main loop to a store.

``main_loop(..., store=store)`` (and the batch runner, and the Studio) hand every main-loop
event to a :class:`SessionRecorder`. It keeps the tape so far and turns each event into the
store's queued writes: a step as soon as it is made, an LLM call when it completes, the tape's
metadata after each turn, and the final tape (with its end tags) when the loop ends. The store's
background writer commits them in batches; when its queue holds more than ``max_pending``
writes, the loop waits for the writer to catch up (backpressure), so a fast agent cannot grow
the queue without bound.

What is stored: the session under ``tape_id`` (by default the start tape's id), continuing the
start tape: ``parent_id`` is the start's parent when stored under the start's own id, otherwise
the start tape itself, and ``n_added_steps`` counts the steps after the start's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tapekit.core import Tape
from tapekit.events import MainLoopEvent

if TYPE_CHECKING:
    from tapekit.store.base import TapeStore


DEFAULT_MAX_PENDING = 10_000

_FROM_START = object()  # parent_id default: derived from the start tape (see SessionRecorder)


def stored_form(tape: Tape[Any, Any], tape_id: str, parent_id: str | None, base_len: int) -> Tape[Any, Any]:
    """``tape`` as a recorded session stores it: under ``tape_id``, continuing ``parent_id``,
    with ``n_added_steps`` counted from ``base_len`` steps (the start tape's length)."""
    update = {"id": tape_id, "parent_id": parent_id, "n_added_steps": max(0, len(tape) - base_len)}
    return tape.model_copy(update={"metadata": tape.metadata.model_copy(update=update)})


class SessionRecorder:
    """Writes one running session to a store as its main-loop events arrive.

    - ``store``: where to write (``None``: only keep the tape so far, write nothing).
    - ``tape_id``: where the session is stored (default: the start tape's id); ``parent_id``
      defaults as the module docstring says; ``tags`` go on with the first write.
    - ``hold_last``: write each step only when the next one arrives, and the last one with the
      final tape and its end tags in one write; a stored tape without its end tags then always
      lacks a step, so resuming it never starts a new turn on a finished session (the batch
      runner's guarantee). Without it every step is queued as soon as it is made.
    - ``done_tags`` / ``failed_tags``: added with the final write of a session that ended
      without / with ``metadata.error``.
    - ``base_len``: the start tape's length, when ``start`` is a stored, partly run session.
    - ``max_pending``: the bound on the store's queued writes (see the module docstring).
    - ``write_start``: store the start tape before anything runs (default); without it the
      session is first written with its first new step, so a run that adds nothing stores
      nothing.
    """

    __slots__ = (
        "base_len",
        "done_tags",
        "failed_tags",
        "hold_last",
        "max_pending",
        "parent_id",
        "saved",
        "start_len",
        "store",
        "tags",
        "tape",
        "tape_id",
        "write_start",
    )

    def __init__(
        self,
        store: TapeStore | None,
        start: Tape[Any, Any],
        tape_id: str | None = None,
        *,
        parent_id: Any = _FROM_START,
        tags: Iterable[str] = (),
        hold_last: bool = False,
        done_tags: Iterable[str] = (),
        failed_tags: Iterable[str] = (),
        base_len: int | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        write_start: bool = True,
    ) -> None:
        self.store: TapeStore | None = store
        self.tape = start
        self.tape_id = tape_id if tape_id is not None else start.metadata.id
        if parent_id is _FROM_START:
            own = self.tape_id == start.metadata.id
            parent_id = start.metadata.parent_id if own else start.metadata.id
        self.parent_id: str | None = parent_id
        self.tags = tuple(tags)
        self.hold_last = hold_last
        self.done_tags = tuple(done_tags)
        self.failed_tags = tuple(failed_tags)
        self.base_len = len(start) if base_len is None else base_len
        self.max_pending = max_pending
        self.write_start = write_start
        self.start_len = len(start)
        self.saved = -1  # steps written so far (-1: nothing written by this recorder yet)

    # ------------------------------------------------------------------ the loop's side

    def start(self) -> None:
        """The first write: the start tape with ``tags`` (unless ``write_start`` is off)."""
        if self.write_start:
            self._save(self.tape)

    async def astart(self) -> None:
        """:meth:`start` off the event loop (the store may read how much of the tape it holds)."""
        if self.store is not None and self.write_start:
            await asyncio.to_thread(self.start)

    def follow(self, event: MainLoopEvent) -> None:
        """Follow one main-loop event: keep the tape so far and queue what it adds."""
        agent_event = event.agent_event
        if agent_event is not None:
            if agent_event.step is not None:
                steps = self.tape.steps.appended([agent_event.step])
                self.tape = self.tape.model_copy(update={"steps": steps})
                self._write(len(self.tape) - self.hold_last)
            elif agent_event.llm_call is not None and self.store is not None:
                self.store.save_llm_call(agent_event.llm_call)
        elif event.tape is not None:
            self.tape = event.tape
            if self.hold_last:
                self._write(len(self.tape) - 1)
            else:
                self._save(self.tape)

    def over_bound(self) -> bool:
        """Whether the store's queue holds more than ``max_pending`` writes."""
        return self.store is not None and self.store.pending_writes() > self.max_pending

    async def record(self, event: MainLoopEvent) -> None:
        """:meth:`follow` the event, then wait for the store's writer if its queue is over the
        bound (backpressure)."""
        self.follow(event)
        if self.store is not None and self.over_bound():
            await asyncio.to_thread(self.store.flush)

    def finish(self, tape: Tape[Any, Any] | None = None) -> Tape[Any, Any]:
        """Write the final tape (default: the tape so far) whole, with the end tags, and return
        it as stored. If that write fails, the steps already written are stored with the final
        metadata and the end tags instead, and the error is raised."""
        final = stored_form(
            tape if tape is not None else self.tape, self.tape_id, self.parent_id, self.base_len
        )
        self.tape = final
        if self.store is None:
            return final
        tags = self.failed_tags if final.metadata.error else self.done_tags
        try:
            self._save(final, tags)
        except Exception:
            if 0 <= self.saved < len(final):
                with contextlib.suppress(Exception):
                    self._save(final.model_copy(update={"steps": final.steps[: self.saved]}), tags)
            raise
        return final

    def write_all(self) -> None:
        """Write every step made so far (a cancelled session stays resumable from them)."""
        self._write(len(self.tape))

    # ------------------------------------------------------------------ writes

    def _write(self, n: int) -> None:
        if self.store is not None and n > self.saved:
            self._save(self.tape.model_copy(update={"steps": self.tape.steps[:n]}))

    def _save(self, tape: Tape[Any, Any], tags: Iterable[str] = ()) -> None:
        if self.store is None:
            return
        if self.saved < 0 and not self.write_start and len(tape) <= self.start_len:
            return  # a session written lazily that has added nothing yet stores nothing
        if self.saved < 0:  # the first write carries the session's tags
            tags = (*self.tags, *tags)
        self.store.save_tape(
            stored_form(tape, self.tape_id, self.parent_id, self.base_len), self.tape_id, tags=tags
        )
        self.saved = len(tape)
