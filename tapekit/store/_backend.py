"""The backend contract of :class:`~tapekit.store.TapeStore`: the protected methods a backend
implements, the rules they keep, and the store's life cycle.

Every public method of a store is written once, in the parts ``TapeStore`` combines (saving,
reading, LLM calls, the tool-effect journal), over the methods declared here; a backend
(:class:`~tapekit.store.SQLiteStore`, :class:`~tapekit.store.PostgresStore`,
:class:`~tapekit.store.MemoryStore`, or your own) subclasses ``TapeStore`` and implements them.
:mod:`tapekit.testing.store_conformance` checks a backend against them.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Self

from tapekit.llm.base import LLMCall
from tapekit.sequence import StoredItems
from tapekit.store._types import TapeFilter, TapeInfo, Totals
from tapekit.store._writes import Write, WriteGroup


class StoreBackend(ABC):
    """What a backend implements, and the life cycle every store shares.

    A backend subclasses :class:`~tapekit.store.TapeStore`, calls ``super().__init__()``, sets
    ``location`` (a path or URL without password, for messages) and implements:

    Writing. Saves are checked and serialised on the caller's thread before a backend sees them:

    - ``_submit(write)``: take one write, a :class:`~tapekit.store._writes.TapeRows` (a tape's
      new steps, its metadata and tags to add), ``CallWrite`` (an LLM call to upsert),
      ``TagWrite`` (tags to add or remove) or ``WriteGroup`` (several, all or none), and
      commit it now or queue it. Writes take effect in the order submitted. A step already
      stored at ``(tape_id, idx)`` is never overwritten; a tape's row and an LLM call are
      upserted, and a tape keeps the ``created`` time of its first write unless the write is
      an import (``exact_created``).
    - ``flush()``: return once everything submitted is committed and readable; raise
      :class:`~tapekit.store.StoreWriteError` for queued writes that failed since the last
      report.
    - ``_close()``: commit what is queued and release connections (called once, by ``close``).
    - ``pending_writes()``: how many writes are queued and not committed (default 0: a backend
      that commits in ``_submit``).
    - ``address`` (optional): how another process opens this store with ``open_store``.

    Reading. The public methods check their arguments and call ``flush()`` first:

    - ``_stored_length(tape_id)``: the committed number of steps (None: no such tape).
    - ``_stored_state(tape_id)`` (optional): that number and the ``digest`` of the last
      ``TapeRows`` written for the tape (keep it with the tape); the default returns no digest,
      and the store then hashes the stored steps once per tape to check that saves extend them.
    - ``_select_infos(where, limit, offset, ids)``, ``_select_ids(where, limit, offset)``,
      ``_select_count(where)``: the tapes matching a :class:`~tapekit.store.TapeFilter`, newest
      first (by ``created``, then id).
    - ``_select_children(parent_ids)``: infos of the tapes whose parent is one of these.
    - ``_select_context(tape_id)``, ``_select_steps(tape_id, start, stop)``: the stored JSON
      of a tape's context and of its steps ``start <= idx < stop`` (a read tape fetches its
      steps in blocks, as they are read, until the store closes); ``_select_step_positions``
      (optional) the indices of a tape's steps of some kinds.
    - ``_select_llm_calls(prompt_ids)``, ``_select_llm_call_ids(model)``,
      ``_select_prompt_ids(tape_id)``, ``_select_totals(by, tape_id)``: LLM calls and totals.

    The tool-effect journal (optional): ``_select_effects`` and taking an ``EffectWrite`` (see
    ``_journal.py``); a backend without them refuses ``once`` tools in its sessions.

    Transactions: a ``TapeRows`` (a tape's steps, metadata and tags) is atomic, and so is a
    ``WriteGroup`` (one JSONL import); a backend may commit many writes in one transaction.

    Thread safety: one store object may be shared by the threads of a process, so every
    method must be safe to call from several threads at once (the SQL backends lock their
    reading connection and give their writer thread its own; ``MemoryStore`` holds one
    lock). Two stores on one database (two processes) are the backend's business: SQLite and
    PostgreSQL support it, a ``MemoryStore`` is one process's.
    """

    #: where the data lives, for messages (a path, a DSN without password, ``"memory"``)
    location: str = "the store"

    def __init__(self) -> None:
        self._closed = False
        # the steps of the tapes get_tape returned that are still unread (see StoredItems)
        self._lazy_reads: weakref.WeakSet[StoredItems] = weakref.WeakSet()

    # ------------------------------------------------------------------ backend: writing

    @abstractmethod
    def _submit(self, write: Write | WriteGroup) -> None:
        """Commit ``write`` now or queue it (see the class docstring)."""

    @abstractmethod
    def flush(self) -> None:
        """Wait until everything saved so far is committed (and readable by other stores on
        the same database); raise :class:`~tapekit.store.StoreWriteError` for writes the
        database refused."""

    @abstractmethod
    def _close(self) -> None:
        """Commit what is queued and release the backend's connections."""

    def pending_writes(self) -> int:
        """How many saves are queued and not committed yet (what a recorded session bounds,
        waiting for the store when there are too many); 0 for a store that commits at once."""
        return 0

    @property
    def address(self) -> str | None:
        """What another process passes to :func:`~tapekit.store.open_store` to open this
        store (an SQLite path, a PostgreSQL URL); None when no other process can (a
        :class:`~tapekit.store.MemoryStore`)."""
        return None

    # ------------------------------------------------------------------ backend: reading

    @abstractmethod
    def _stored_length(self, tape_id: str) -> int | None:
        """The committed number of steps of ``tape_id`` (None: not stored); never flushes."""

    def _stored_state(self, tape_id: str) -> tuple[int, str | None] | None:
        """The committed number of steps of ``tape_id`` and their digest (``TapeRows.digest``
        of the last write; None where the backend keeps none, or a row written before digests
        were kept: the store then hashes the stored steps once). None: not stored. Never
        flushes. The default keeps no digest."""
        n = self._stored_length(tape_id)
        return None if n is None else (n, None)

    @abstractmethod
    def _select_infos(
        self, where: TapeFilter, limit: int | None, offset: int, ids: Sequence[str] | None = None
    ) -> list[TapeInfo]:
        """TapeInfos matching ``where`` (and, if given, with one of ``ids``), newest first."""

    @abstractmethod
    def _select_children(self, parent_ids: Sequence[str]) -> list[TapeInfo]:
        """TapeInfos of the tapes whose parent is one of ``parent_ids``, newest first."""

    @abstractmethod
    def _select_ids(self, where: TapeFilter, limit: int | None, offset: int) -> list[str]:
        """Ids of the tapes matching ``where``, newest first."""

    @abstractmethod
    def _select_count(self, where: TapeFilter) -> int:
        """How many tapes match ``where``."""

    @abstractmethod
    def _select_context(self, tape_id: str) -> str | None:
        """The stored context JSON of ``tape_id`` (None: not stored)."""

    @abstractmethod
    def _select_steps(self, tape_id: str, start: int, stop: int) -> list[str]:
        """The stored JSON of steps ``start <= idx < stop`` of ``tape_id``, in order."""

    def _select_step_positions(self, tape_id: str, stop: int, kinds: frozenset[str]) -> list[int] | None:
        """The indices ``idx < stop`` of the steps of ``tape_id`` whose kind is one of ``kinds``,
        sorted, without reading the steps' JSON: how the view stack of a long stored tape is
        rebuilt from the few steps that call, respond or fork. The default (None) says the
        backend cannot; the tape's view then reads every step."""
        return None

    @abstractmethod
    def _select_llm_calls(self, prompt_ids: Sequence[str] | None) -> Iterator[LLMCall]:
        """Stored LLM calls with these prompt ids (all of them for None), oldest first (by
        timestamp, then prompt id)."""

    @abstractmethod
    def _select_llm_call_ids(self, model: str | None) -> list[str]:
        """Prompt ids of stored LLM calls, oldest first, optionally of one model."""

    @abstractmethod
    def _select_prompt_ids(self, tape_id: str) -> list[str]:
        """The distinct non-empty prompt ids of the steps of ``tape_id``, sorted."""

    @abstractmethod
    def _select_totals(self, by: str, tape_id: str | None) -> Totals:
        """Totals grouped by ``by`` (checked: tape, agent or node), groups sorted."""

    # ------------------------------------------------------------------ life cycle

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} on {self.location} is closed")

    def close(self) -> None:
        """Commit what is queued and release the store (closing twice is harmless); any later
        call raises ``RuntimeError``."""
        if self._closed:
            return
        try:  # the tapes read from this store fetch the steps they have not read yet
            for items in list(self._lazy_reads):
                items.detach()
        finally:
            self._closed = True
            self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
