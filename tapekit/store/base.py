"""The tape store interface, :class:`TapeStore`: what every backend offers and what a backend
implements.

A store keeps tapes (their steps, metadata and tags) and the LLM calls behind the steps. Every
public method (saving, reading, listing, tags, totals, JSONL) is written once, here, over a
small set of protected backend methods; a backend (:class:`~tapekit.store.SQLiteStore`,
:class:`~tapekit.store.PostgresStore`, :class:`~tapekit.store.MemoryStore`, or your own)
subclasses :class:`TapeStore` and implements those. The class docstring lists them with the
rules they follow (ordering, atomicity, thread safety); :mod:`tapekit.testing.store_conformance`
checks a backend against them.

Saves are serialised and checked on the caller's thread (``_writes.py``, ``_text.py``), so a
backend receives plain rows. The SQL backends queue them for a writer thread (``_writer.py``,
the shared SQL in ``_sql.py``); JSONL import and export is ``_jsonl.py``.
"""

from __future__ import annotations

import json
import time
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import BaseModel, Field

from tapekit.core import Step, Tape, TapeMetadata
from tapekit.effects import ToolEffect
from tapekit.errors import TapekitError
from tapekit.llm.base import LLMCall
from tapekit.store._prompts import PromptEncoder
from tapekit.store._text import check_text
from tapekit.store._writes import (
    EffectWrite,
    KnownSteps,
    TagWrite,
    TapeWrite,
    Write,
    WriteGroup,
    call_write,
    chain_digest,
    serialised,
    steps_digest,
)
from tapekit.store._writes import check_id as _check_id
from tapekit.store._writes import check_tags as _check_tags

if TYPE_CHECKING:
    from tapekit.events import MainLoopEvent

_KNOWN_TAPES = 64  # tapes whose hashed step objects a store keeps (see TapeStore._known)


class StoreWriteError(TapekitError, RuntimeError):
    """Queued writes the database refused (each named); the store's other writes were committed
    and the store keeps working. Raised once, by the next ``flush`` or read."""


class Totals(dict[str, dict[str, float]]):
    """Token and cost totals by group: ``{group: {"calls", "prompt_tokens", "output_tokens",
    "cost"}}``."""


class TapeNotFoundError(TapekitError, KeyError):
    """No tape with that id is stored (a ``KeyError``, so ``except KeyError`` keeps working)."""

    def __init__(self, tape_id: str, where: str = "the store") -> None:
        super().__init__(tape_id)
        self.tape_id = tape_id
        self.where = where

    def __str__(self) -> str:
        return f"no tape {self.tape_id!r} in {self.where}"


class TapeInfo(BaseModel):
    """A stored tape's metadata, tags and size, without its steps: what lists and pickers show.

    ``created`` is when the tape was first saved and ``updated`` when it last changed (unix
    seconds); ``n_steps`` how many steps are stored; ``other`` the tape's ``metadata.other``.
    :attr:`metadata` is the tape's whole :class:`~tapekit.core.TapeMetadata`.
    """

    id: str
    parent_id: str | None = None
    author: str | None = None
    author_tape_id: str | None = None
    n_steps: int = 0
    n_added_steps: int = 0
    error: str | None = None
    result: Any = None
    other: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    created: float = 0.0
    updated: float = 0.0

    @property
    def metadata(self) -> TapeMetadata:
        """The stored tape's :class:`~tapekit.core.TapeMetadata` (every field, ``other``
        included), as ``store.get_tape(id).metadata`` would give it, without loading steps."""
        return self.to_metadata()

    def to_metadata(self) -> TapeMetadata:
        """The stored tape's :class:`~tapekit.core.TapeMetadata` (a new object each call)."""
        return TapeMetadata(
            id=self.id,
            parent_id=self.parent_id,
            author=self.author,
            author_tape_id=self.author_tape_id,
            n_added_steps=self.n_added_steps,
            error=self.error,
            result=self.result,
            other=self.other,
        )


@dataclass(frozen=True)
class TapeFilter:
    """Which tapes :meth:`TapeStore.list_tapes`, :meth:`~TapeStore.list_tape_infos` and
    :meth:`~TapeStore.count_tapes` select: every field given must hold; a field left ``None``
    does not filter, so ``TapeFilter()`` matches every tape.

    - ``author``: the tape's ``metadata.author`` is this.
    - ``agent``: at least one step was made by this agent (its full name, e.g.
      ``analyst/search_agent``).
    - ``has_error``: failed (``True``: ``metadata.error`` is set) or clean (``False``) tapes.
    - ``tag``: the tape has this tag.
    - ``since``, ``until``: ``since <= created < until`` (unix seconds).
    - ``parent_id``: direct continuations of this tape.
    """

    author: str | None = None
    agent: str | None = None
    has_error: bool | None = None
    tag: str | None = None
    since: float | None = None
    until: float | None = None
    parent_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("author", "agent", "tag", "parent_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string or None, not {type(value).__name__}")
        if self.has_error is not None and not isinstance(self.has_error, bool):
            raise TypeError(f"has_error must be True, False or None, not {self.has_error!r}")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise TypeError(f"{name} must be unix seconds (a number) or None, not {value!r}")


_FILTER_FIELDS = tuple(TapeFilter.__dataclass_fields__)


def _filter(where: TapeFilter | None, keywords: dict[str, Any], method: str) -> TapeFilter:
    """``where`` (default: every tape); the filter keywords of older versions still work, with a
    ``DeprecationWarning``."""
    if not keywords:
        if where is None:
            return TapeFilter()
        if not isinstance(where, TapeFilter):
            raise TypeError(
                f"{method}: where must be a TapeFilter or None, not {type(where).__name__} "
                f"(write {method}(TapeFilter(author=...)))"
            )
        return where
    unknown = sorted(set(keywords) - set(_FILTER_FIELDS))
    if unknown:
        raise TypeError(f"{method}() got unexpected keyword arguments {unknown}")
    if where is not None:
        raise TypeError(f"{method}: pass the filter as where=TapeFilter(...) only, not also as keywords")
    shown = ", ".join(f"{k}=..." for k in keywords)
    warnings.warn(
        f"{method}({shown}) is deprecated: pass where=TapeFilter({shown})",
        DeprecationWarning,
        stacklevel=3,
    )
    return TapeFilter(**keywords)


def _load_steps(texts: list[str]) -> list[Any]:
    # one parse of a JSON array is ~3x faster than one parse per step
    return json.loads(f"[{','.join(texts)}]") if texts else []


def _check_page(limit: int | None, offset: int) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, not {offset!r}")


def _check_slice(start: int, stop: int | None) -> None:
    for name, value in (("start", start), ("stop", stop)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an integer or None, not {value!r}")


class TapeStore(ABC):
    """Tapes, their steps and tags, and the LLM calls behind the steps: the interface every
    store implements, and the type to accept wherever a store is passed (``store: TapeStore |
    None``).

    Use :func:`tapekit.store.open_store` to open SQLite or PostgreSQL from a path or URL, or
    :class:`~tapekit.store.MemoryStore` for tests and short scripts. ``close()`` (or leaving a
    ``with`` block) commits what is queued and releases the store; ``flush()`` waits until
    every save made so far is committed. Every read first waits for this store's own saves, so
    a reader always sees them.

    **Implementing a backend.** Subclass ``TapeStore``, call ``super().__init__()``, set
    ``location`` (a path or URL without password, for messages) and implement:

    Writing. Saves are checked and serialised on the caller's thread before a backend sees them:

    - ``_submit(write)``: take one write, a :class:`~tapekit.store._writes.TapeRows` (a tape's
      new steps, its metadata and tags to add), ``CallWrite`` (an LLM call to upsert),
      ``TagWrite`` (tags to add or remove) or ``WriteGroup`` (several, all or none), and
      commit it now or queue it. Writes take effect in the order submitted. A step already
      stored at ``(tape_id, idx)`` is never overwritten; a tape's row and an LLM call are
      upserted, and a tape keeps the ``created`` time of its first write unless the write is
      an import (``exact_created``).
    - ``flush()``: return once everything submitted is committed and readable; raise
      :class:`StoreWriteError` for queued writes that failed since the last report.
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
      ``_select_count(where)``: the tapes matching a :class:`TapeFilter`, newest first (by
      ``created``, then id).
    - ``_select_children(parent_ids)``: infos of the tapes whose parent is one of these.
    - ``_select_context(tape_id)``, ``_select_steps(tape_id, start, stop)``: the stored JSON
      of a tape's context and of its steps ``start <= idx < stop``.
    - ``_select_llm_calls(prompt_ids)``, ``_select_llm_call_ids(model)``,
      ``_select_prompt_ids(tape_id)``, ``_select_totals(by, tape_id)``: LLM calls and totals.

    Transactions: a ``TapeRows`` (a tape's steps, metadata and tags) is atomic, and so is a
    ``WriteGroup`` (one JSONL import); a backend may commit many writes in one transaction.

    Thread safety: one store object may be shared by the threads of a process, so every
    method must be safe to call from several threads at once (the SQL backends lock their
    reading connection and give their writer thread its own; :class:`MemoryStore` holds one
    lock). Two stores on one database (two processes) are the backend's business: SQLite and
    PostgreSQL support it, a :class:`MemoryStore` is one process's.

    :mod:`tapekit.testing.store_conformance` is the suite a backend must pass: run it on yours.
    """

    #: where the data lives, for messages (a path, a DSN without password, ``"memory"``)
    location: str = "the store"

    def __init__(self) -> None:
        # per tape saved by this object (queued saves included): (steps, their stored digest,
        # the digest of the tape given at that length, which differs only when its steps are
        # the stored ones serialised otherwise; see _check_extends)
        self._saved: dict[str, tuple[int, str, str]] = {}
        # the step objects of the tapes saved last, hashed (see steps_digest), newest last
        self._known_steps: OrderedDict[str, KnownSteps] = OrderedDict()
        self._closed = False
        self._prompts = PromptEncoder()  # LLM calls' prompts as shared parts (see _prompts.py)

    # ------------------------------------------------------------------ backend: writing

    @abstractmethod
    def _submit(self, write: Write | WriteGroup) -> None:
        """Commit ``write`` now or queue it (see the class docstring)."""

    @abstractmethod
    def flush(self) -> None:
        """Wait until everything saved so far is committed (and readable by other stores on
        the same database); raise :class:`StoreWriteError` for writes the database refused."""

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
        self._closed = True
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def _saved_state(self, tape_id: str) -> tuple[int, str, str]:
        """``(start, stored, given)``: how many steps of ``tape_id`` are saved (by this object,
        queued ones included, else as committed; 0 for none), their digest as stored, and the
        digest of those steps as last given to this object (the same, but where the stored JSON
        of the same steps differs from theirs now)."""
        saved = self._saved.get(tape_id)
        if saved is not None:
            return saved
        state = self._stored_state(tape_id)
        if state is None:
            return 0, "", ""
        n, digest = state
        if digest is None and n:  # kept by no backend, or a row from before digests
            self.flush()
            digest = chain_digest("", self._select_steps(tape_id, 0, n))
        return n, digest or "", digest or ""

    def _check_extends(self, tape_id: str, steps: Sequence[Step]) -> tuple[int, str, str]:
        """:meth:`_saved_state`, once ``steps`` is checked to begin with the saved steps (its
        third item is then the digest of ``steps[:start]``): a ``ValueError`` names the tape
        and the first step that differs otherwise. Hashes only the steps not hashed before (see
        :func:`steps_digest`)."""
        start, stored, given = self._saved_state(tape_id)
        self._refuse_shorter(tape_id, start, len(steps))
        if not start:
            return 0, stored, given
        mine = steps_digest(steps, start, f"tape {tape_id!r}", known=self._known(tape_id))
        self._refuse_other(tape_id, steps, start, (stored, given), mine)
        return start, stored, mine

    @staticmethod
    def _refuse_shorter(tape_id: str, start: int, n: int) -> None:
        if n < start:
            raise ValueError(
                f"tape {tape_id} has {start} stored steps; the tape given has only {n} "
                "(save a different tape under its own id)"
            )

    def _refuse_other(
        self, tape_id: str, steps: Sequence[Step], start: int, saved: tuple[str, str], mine: str
    ) -> None:
        """Raise ``ValueError`` unless ``steps[:start]``, whose digest is ``mine``, are the
        ``start`` saved steps, whose digests are ``saved`` (as stored, as given): by digest, or
        else step by step against the stored JSON (which names the first step that differs)."""
        if mine in saved:
            return
        index = self._first_difference(tape_id, steps, start)
        if index is None:
            return  # the stored steps, serialised otherwise now (e.g. a set's order): the same tape
        known = self._known_steps.get(tape_id)
        if known is not None:  # forget what the refused tape's fold added past the saved steps
            del known.steps[start:], known.digests[start:]
        differs = (
            f"its step {index} differs from the stored step {index}"
            if index >= 0
            else "its steps differ from the stored ones"
        )
        raise ValueError(
            f"tape {tape_id} has {start} stored steps and the tape given does not begin with them: "
            f"{differs} (saving under a stored id must extend the stored tape; save a different "
            "tape under its own id, e.g. tape.with_new_steps(...), which points at the original)"
        )

    def _known(self, tape_id: str) -> KnownSteps:
        """The steps of ``tape_id`` this store hashed (kept for the 64 tapes saved last)."""
        known = self._known_steps.get(tape_id)
        if known is None:
            known = self._known_steps[tape_id] = KnownSteps()
            if len(self._known_steps) > _KNOWN_TAPES:
                self._known_steps.popitem(last=False)
        else:
            self._known_steps.move_to_end(tape_id)
        return known

    def _first_difference(self, tape_id: str, steps: Sequence[Step], n: int) -> int | None:
        """The first of the ``n`` stored steps of ``tape_id`` that ``steps`` does not hold,
        compared as JSON and else as the step class reads the stored JSON (None: they are the
        same steps; -1: the stored steps could not be read to tell which)."""
        try:
            self.flush()
            stored = self._select_steps(tape_id, 0, n)
        except Exception:
            return -1
        if len(stored) != n:
            return -1
        for i, data in enumerate(stored):
            step = steps[i]
            if data == step.model_dump_json():
                continue
            try:
                same = json.loads(data) == json.loads(step.model_dump_json()) or (
                    type(step).model_validate_json(data) == step
                )
            except Exception:
                same = False
            if not same:
                return i
        return None

    def save_tape(self, tape: Tape[Any, Any], tape_id: str | None = None, *, tags: Iterable[str] = ()) -> str:
        """Save ``tape`` under ``tape_id`` (default: its own id) with ``tags`` added (a save
        never removes tags) and return that id.

        Saving again under the same id, once the tape has grown, writes only the new steps and
        the metadata: that is how a running session is persisted step by step. Steps already
        stored are never rewritten; saving a tape that does not begin with the stored steps
        under the same id (fewer steps, or other steps: another tape, a step changed, a step
        with another id) raises ``ValueError`` naming the tape and the first step that differs
        (save it under its own id instead). Saving the stored tape again changes only its
        metadata. The check costs the digest of the new steps (see :func:`steps_digest`)."""
        if not isinstance(tape, Tape):
            raise TypeError(f"save_tape needs a Tape, not {type(tape).__name__}")
        tape_id = _check_id(tape_id if tape_id is not None else tape.metadata.id)
        checked_tags = _check_tags(tags)
        self._check_open()
        steps = tape.steps
        start, stored, given = self._saved_state(tape_id)
        self._refuse_shorter(tape_id, start, len(steps))
        now = time.time()
        # indexing, not slicing: a slice of a step sequence is a new sequence with its own buffer
        new_steps = list(steps) if start == 0 else [steps[i] for i in range(start, len(steps))]
        write = TapeWrite(
            tape_id,
            tape.metadata,
            tape.context,
            new_steps,
            start,
            len(tape),
            checked_tags,
            now,
            now,
        )
        rows = serialised(write)
        datas = [row[7] for row in rows.steps]
        # the digest of the whole tape given, memoised on its step buffer for its next save; the
        # fold passes on the way the digest of the steps before the new ones, which are checked
        where, known = f"tape {tape_id!r}", self._known(tape_id)
        at_start: list[str] = []
        full = steps_digest(steps, len(steps), where, datas, start, known, at_start)
        mine = stored
        if start:
            if start == len(steps):
                mine = full
            else:
                mine = at_start[0] if at_start else steps_digest(steps, start, where, known=known)
            self._refuse_other(tape_id, steps, start, (stored, given), mine)
        rows.digest = full if mine == stored else chain_digest(stored, datas)
        self._submit(rows)
        self._saved[tape_id] = (len(tape), rows.digest, full)
        return tape_id

    def save_llm_call(self, call: LLMCall) -> None:
        """Save a completed LLM call, keyed by its prompt id (a later save of the same id
        replaces it)."""
        if not isinstance(call, LLMCall):
            raise TypeError(f"save_llm_call needs an LLMCall, not {type(call).__name__}")
        write = call_write(call, self._prompts)
        try:
            self._check_open()
            self._submit(write)
        except BaseException:
            self._prompts.forget()  # its parts were not queued: later prompts must bring them
            raise

    # ------------------------------------------------------------------ the tool-effect journal

    def _select_effects(self, key: str | None, tape_id: str | None) -> list[tuple[Any, ...]]:
        """The journal rows (see :class:`~tapekit.store._writes.EffectWrite`) of ``key``, else
        of ``tape_id``, else all, oldest first. A backend that keeps no journal leaves this as
        is, and ``once`` tools refuse to run in sessions stored there."""
        raise NotImplementedError(
            f"{type(self).__name__} keeps no journal of tool effects: a stored session cannot run "
            "tools with effect='once' in it (implement _select_effects and take EffectWrite)"
        )

    def _record_effect(
        self,
        key: str,
        tape_id: str,
        tool: str,
        arguments: dict[str, Any],
        state: str,
        result: Any = None,
        error: str | None = None,
    ) -> None:
        """Write a journal row and wait until it (and every save before it) is committed."""
        self._check_open()
        now = time.time()
        row = (
            key,
            tape_id,
            tool,
            json.dumps(arguments, ensure_ascii=False),
            state,
            None if result is None else json.dumps(result, ensure_ascii=False),
            error,
            now,
            now,
        )
        for value in row[:7]:
            if isinstance(value, str):
                check_text(value, f"the journal record of tool call {key!r}")
        self._submit(EffectWrite(key, row))
        self.flush()

    @staticmethod
    def _effect(row: Sequence[Any]) -> ToolEffect:
        key, tape_id, tool, arguments, state, result, error, created, updated = row
        return ToolEffect(
            key=key,
            tape_id=tape_id,
            tool=tool,
            arguments=json.loads(arguments),
            state=state,
            result=None if result is None else json.loads(result),
            error=error,
            created=created,
            updated=updated,
        )

    def tool_effect(self, key: str) -> ToolEffect | None:
        """The journal's record of the ``once`` tool call ``key`` (its ToolCall step's id), or
        None if it never started (see :mod:`tapekit.effects`)."""
        _check_id(key, "key")
        self.flush()
        rows = self._select_effects(key, None)
        return self._effect(rows[0]) if rows else None

    def tool_effects(self, tape_id: str | None = None, *, in_doubt: bool = False) -> list[ToolEffect]:
        """The journal's ``once`` tool calls (of ``tape_id``, else of every tape), oldest
        first; with ``in_doubt``, only those started with no outcome: what a person must
        resolve (:meth:`resolve_tool_effect`) before their sessions can go on."""
        if tape_id is not None:
            _check_id(tape_id)
        self.flush()
        effects = [self._effect(r) for r in self._select_effects(None, tape_id)]
        return [e for e in effects if e.in_doubt] if in_doubt else effects

    def resolve_tool_effect(
        self, key: str, *, result: Any = None, error: str | None = None, retry: bool = False
    ) -> ToolEffect:
        """Settle a ``once`` call left in doubt: it happened (``result``: what the tool would
        have returned), it failed (``error``), or it did not happen and may run again
        (``retry=True``). The next resume of its session goes on from that. Raises
        ``KeyError`` for a key the journal does not hold and ``ValueError`` for a call that
        already has an outcome or for more than one answer."""
        if sum([result is not None, error is not None, retry]) > 1:
            raise ValueError("resolve a tool call one way: result=, error= or retry=True")
        known = self.tool_effect(key)
        if known is None:
            raise KeyError(f"no tool call {key!r} in the journal of {self.location}")
        if not known.in_doubt:
            raise ValueError(f"tool call {key!r} is not in doubt: its state is {known.state!r}")
        if error is not None and (not isinstance(error, str) or not error):
            raise TypeError(f"error must be a non-empty string, not {error!r}")
        state = "retry" if retry else "failed" if error is not None else "done"
        self._record_effect(key, known.tape_id, known.tool, known.arguments, state, result, error)
        resolved = self.tool_effect(key)
        assert resolved is not None
        return resolved

    def add_tags(self, tape_id: str, tags: Iterable[str]) -> None:
        """Add ``tags`` to the stored tape ``tape_id`` (tags it has already are kept once)."""
        self._tag(tape_id, tags, remove=False)

    def remove_tags(self, tape_id: str, tags: Iterable[str]) -> None:
        """Remove ``tags`` from the stored tape ``tape_id`` (tags it lacks are ignored)."""
        self._tag(tape_id, tags, remove=True)

    def _tag(self, tape_id: str, tags: Iterable[str], remove: bool) -> None:
        _check_id(tape_id)
        checked = _check_tags(tags)
        self._check_open()
        if tape_id not in self._saved and self._stored_length(tape_id) is None:
            raise TapeNotFoundError(tape_id, self.location)
        if checked:
            self._submit(TagWrite(tape_id, checked, remove))

    # ------------------------------------------------------------------ reading tapes

    def get_tape(self, tape_id: str, tape_class: type[Tape[Any, Any]] = Tape) -> Tape[Any, Any]:
        """The stored tape ``tape_id`` as ``tape_class`` (:class:`TapeNotFoundError` if none)."""
        info = self.get_tape_info(tape_id)
        context = self._select_context(tape_id)
        steps = _load_steps(self._select_steps(tape_id, 0, info.n_steps))
        return tape_class.model_validate(
            {
                "metadata": info.to_metadata(),
                "context": json.loads(context) if context else None,
                "steps": steps,
            }
        )

    def get_steps(
        self, tape_id: str, start: int = 0, stop: int | None = None, tape_class: type[Tape[Any, Any]] = Tape
    ) -> list[Step]:
        """Steps ``start:stop`` of the stored tape ``tape_id`` (Python slice rules, negative
        indices included), without loading the rest: how a viewer pages a long tape."""
        steps = self.get_raw_steps(tape_id, start, stop)
        return list(tape_class.model_validate({"steps": steps}).steps) if steps else []

    def get_raw_steps(self, tape_id: str, start: int = 0, stop: int | None = None) -> list[Any]:
        """Steps ``start:stop`` of the stored tape ``tape_id`` as the JSON objects stored,
        not validated into step classes: for tools that show tapes whose step classes are not
        imported (the Studio). Slice rules as :meth:`get_steps`."""
        _check_slice(start, stop)
        info = self.get_tape_info(tape_id)
        window = range(info.n_steps)[slice(start, stop)]
        if not window:
            return []
        return _load_steps(self._select_steps(tape_id, window.start, window.stop))

    def get_raw_context(self, tape_id: str) -> Any:
        """The stored tape ``tape_id``'s context as the JSON value stored (None for none), not
        validated into its class."""
        self.get_tape_info(tape_id)
        context = self._select_context(tape_id)
        return json.loads(context) if context else None

    def get_tape_info(self, tape_id: str) -> TapeInfo:
        """Metadata, tags and size of the stored tape ``tape_id``, without its steps."""
        _check_id(tape_id)
        self.flush()
        infos = self._select_infos(TapeFilter(), None, 0, ids=[tape_id])
        if not infos:
            raise TapeNotFoundError(tape_id, self.location)
        return infos[0]

    def list_tapes(
        self, where: TapeFilter | None = None, *, limit: int | None = None, offset: int = 0, **filters: Any
    ) -> list[str]:
        """Ids of the stored tapes matching ``where`` (default: all), newest first, ``limit``
        of them after skipping ``offset``.

        The keyword filters of earlier versions (``list_tapes(tag="x")``) still work and warn:
        write ``list_tapes(TapeFilter(tag="x"))``."""
        selected = _filter(where, filters, "list_tapes")
        _check_page(limit, offset)
        self.flush()
        return self._select_ids(selected, limit, offset)

    def list_tape_infos(
        self, where: TapeFilter | None = None, *, limit: int | None = None, offset: int = 0, **filters: Any
    ) -> list[TapeInfo]:
        """Like :meth:`list_tapes`, but each tape's :class:`TapeInfo` (no steps are loaded)."""
        selected = _filter(where, filters, "list_tape_infos")
        _check_page(limit, offset)
        self.flush()
        return self._select_infos(selected, limit, offset)

    def count_tapes(self, where: TapeFilter | None = None, **filters: Any) -> int:
        """How many stored tapes match ``where`` (default: all)."""
        selected = _filter(where, filters, "count_tapes")
        self.flush()
        return self._select_count(selected)

    def ancestry(self, tape_id: str) -> list[TapeInfo]:
        """The tapes ``tape_id`` continues: its parent, the parent's parent, … (nearest first),
        stopping at the first parent id that is not stored."""
        info = self.get_tape_info(tape_id)
        chain: list[TapeInfo] = []
        seen = {tape_id}
        while info.parent_id is not None and info.parent_id not in seen:
            found = self._select_infos(TapeFilter(), None, 0, ids=[info.parent_id])
            if not found:
                break
            info = found[0]
            seen.add(info.id)
            chain.append(info)
        return chain

    def descendants(self, tape_id: str) -> list[TapeInfo]:
        """Every stored tape whose chain of parents reaches ``tape_id``, breadth-first
        (children, then grandchildren, …; each level newest first)."""
        self.get_tape_info(tape_id)
        out: list[TapeInfo] = []
        seen = {tape_id}
        level = [tape_id]
        while level:
            children = []
            for info in self._select_children(level):
                if info.id not in seen:
                    seen.add(info.id)
                    children.append(info)
            out.extend(children)
            level = [c.id for c in children]
        return out

    # ------------------------------------------------------------------ LLM calls and totals

    def get_llm_call(self, prompt_id: str) -> LLMCall | None:
        """The LLM call made with prompt ``prompt_id``, if it was stored."""
        _check_id(prompt_id, "prompt_id")
        self.flush()
        return next(iter(self._select_llm_calls([prompt_id])), None)

    def list_llm_calls(self, model: str | None = None) -> list[str]:
        """Prompt ids of the stored LLM calls, oldest first, optionally of one model."""
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a string or None, not {model!r}")
        self.flush()
        return self._select_llm_call_ids(model)

    def llm_call_for_step(self, step: Step) -> LLMCall | None:
        """The exact prompt and output behind ``step`` (None for steps made without an LLM)."""
        if not isinstance(step, Step):
            raise TypeError(f"llm_call_for_step needs a Step, not {type(step).__name__}")
        return self.get_llm_call(step.metadata.prompt_id) if step.metadata.prompt_id else None

    def totals(self, by: Literal["tape", "agent", "node"] = "agent", tape_id: str | None = None) -> Totals:
        """Calls, tokens and cost grouped by tape, agent or node (``agent.node``), optionally
        for one tape. Each LLM call counts once per group, however many steps it made and
        however many tapes hold those steps (a continued tape shares its parent's calls)."""
        if by not in ("tape", "agent", "node"):
            raise ValueError(f"totals by {by!r}: choose 'tape', 'agent' or 'node'")
        if tape_id is not None:
            _check_id(tape_id)
        self.flush()
        return self._select_totals(by, tape_id)

    # ------------------------------------------------------------------ recording a session

    def recorder(
        self, start: Tape[Any, Any], tape_id: str | None = None, *, tags: Iterable[str] = ()
    ) -> Callable[[MainLoopEvent], None]:
        """Deprecated: pass ``store=`` to ``main_loop``/``amain_loop`` instead, which persist the
        session through the same path (:class:`tapekit.recording.SessionRecorder`).

        A callback for main-loop events that persists the session under ``tape_id`` (default:
        the start tape's id) with ``tags`` while it runs: every step as soon as it is made,
        every LLM call when it completes, the tape's metadata after each turn."""
        from tapekit.recording import SessionRecorder

        warnings.warn(
            "store.recorder(start) is deprecated: use main_loop(agent, start, env, store=store)",
            DeprecationWarning,
            stacklevel=2,
        )
        session = SessionRecorder(self, start, tape_id, tags=tags)
        session.start()

        def record(event: MainLoopEvent) -> None:
            session.follow(event)
            if session.over_bound():
                self.flush()

        return record

    # ------------------------------------------------------------------ JSONL

    def export_jsonl(
        self, path: str | Path, tape_ids: Iterable[str] | None = None, *, llm_calls: bool = True
    ) -> int:
        """Write tapes (all, or ``tape_ids``) with their metadata and tags, and with
        ``llm_calls`` the LLM calls behind their steps (all stored calls when exporting all
        tapes), to ``path``: one JSON object per line. Returns how many tapes were written."""
        from tapekit.store._jsonl import ExportedTape, write_jsonl

        if isinstance(tape_ids, str):
            raise TypeError("tape_ids must be a list of ids, not a string")
        ids = None if tape_ids is None else [_check_id(t) for t in tape_ids]
        self.flush()
        if ids is None:
            ids = self._select_ids(TapeFilter(), None, 0)
            ids.reverse()  # oldest first: parents before their children
        prompt_ids: dict[str, None] = {}

        def tapes() -> Iterator[ExportedTape]:
            for tape_id in ids:
                infos = self._select_infos(TapeFilter(), None, 0, ids=[tape_id])
                if not infos:
                    raise TapeNotFoundError(tape_id, self.location)
                info = infos[0]
                if llm_calls and tape_ids is not None:
                    prompt_ids.update(dict.fromkeys(self._select_prompt_ids(tape_id)))
                yield ExportedTape(
                    info, self._select_context(tape_id), self._select_steps(tape_id, 0, info.n_steps)
                )

        def calls() -> Iterator[LLMCall]:  # runs after tapes(): the prompt ids are known then
            if llm_calls:
                yield from self._select_llm_calls(None if tape_ids is None else list(prompt_ids))

        return write_jsonl(path, tapes(), calls())

    def import_jsonl(self, path: str | Path) -> list[str]:
        """Store the tapes and LLM calls of a file written by :meth:`export_jsonl`, with their
        ids, metadata, tags and creation times; importing the same file again changes nothing.
        Returns the ids of the tapes in the file.

        The whole file is read and checked first and then committed in one transaction: a file
        with a bad line (not UTF-8, not JSON, not a valid tape) stores nothing, and the
        ``ValueError`` names the file and line."""
        from tapekit.store._jsonl import read_import

        self._check_open()
        found = read_import(path, self._check_extends, PromptEncoder())
        if found.writes:
            self._submit(WriteGroup(found.writes))
        self.flush()
        self._saved.update(found.saved)
        return found.tape_ids
