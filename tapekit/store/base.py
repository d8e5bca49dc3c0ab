"""The tape store interface: what every backend offers, and the logic they share.

A store keeps tapes (their steps, metadata and tags) and the LLM calls behind the steps. Writes
are queued and a background thread with its own connection commits them in batches, so agents
never wait on the database and a batch of thousands of tapes does not turn into thousands of
commits. Reads first wait for this store's own queued writes, so a reader always sees them.

:class:`TapeStore` holds everything that does not depend on the database (argument checking,
ancestry walks, the deprecated session recorder); the writer thread is ``_writer.py``, the
records it commits (built and checked on the caller's thread) ``_writes.py``, JSONL import and
export ``_jsonl.py``. A backend implements the ``_select_*`` queries and ``_commit`` (see
``tapekit/store/_sql.py``).
"""

from __future__ import annotations

import json
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tapekit.core import Step, Tape, TapeMetadata
from tapekit.errors import TapekitError
from tapekit.llm.base import LLMCall
from tapekit.store import _jsonl
from tapekit.store._writer import QueuedWriter, StoreWriteError
from tapekit.store._writes import (
    TagWrite,
    TapeWrite,
    Write,
    call_write,
    serialised,
)
from tapekit.store._writes import check_id as _check_id
from tapekit.store._writes import check_tags as _check_tags

__all__ = ["StoreWriteError", "TapeFilter", "TapeInfo", "TapeNotFoundError", "TapeStore", "Totals"]


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

    def to_metadata(self) -> TapeMetadata:
        """The stored tape's :class:`~tapekit.core.TapeMetadata` (every field, ``other`` included)."""
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
    """Which tapes a list or count selects; every field left ``None`` matches all tapes.

    ``agent`` selects tapes with at least one step made by that agent (its full name, e.g.
    ``analyst/search_agent``); ``since``/``until`` bound ``created`` (``since <= created <
    until``, unix seconds).
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


def _load_steps(texts: list[str]) -> list[Any]:
    # one parse of a JSON array is ~3x faster than one parse per step
    return json.loads(f"[{','.join(texts)}]") if texts else []


class TapeStore(QueuedWriter, ABC):
    """Tapes, their steps and tags, and the LLM calls behind the steps, in a database.

    Use :func:`tapekit.store.open_store` to pick the backend from a path or URL. Every write
    (``save_tape``, ``save_llm_call``, tag changes) is queued and committed by a background
    thread within ``flush_interval_s``; ``flush`` waits for it, ``close`` (or leaving a ``with``
    block) commits what is queued and stops the thread.
    """

    def __init__(self, batch_size: int = 512, flush_interval_s: float = 0.05) -> None:
        super().__init__(batch_size, flush_interval_s)
        self._known_lengths: dict[str, int] = {}

    # ------------------------------------------------------------------ backend primitives

    @abstractmethod
    def _writer_connect(self) -> Any:
        """A connection for the writer thread (used only by that thread)."""

    @abstractmethod
    def _writer_close(self, conn: Any) -> None:
        """Close the writer thread's connection."""

    @abstractmethod
    def _commit(self, conn: Any, writes: list[Write]) -> None:
        """Commit ``writes`` (in order) in one transaction on the writer's connection."""

    @abstractmethod
    def _close_readers(self) -> None:
        """Close the connections used for reading."""

    @abstractmethod
    def _stored_length(self, tape_id: str) -> int | None:
        """The committed number of steps of ``tape_id`` (None: not stored); never flushes."""

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
    def _count(self, where: TapeFilter) -> int:
        """How many tapes match ``where``."""

    @abstractmethod
    def _select_context(self, tape_id: str) -> str | None:
        """The stored context JSON of ``tape_id``."""

    @abstractmethod
    def _select_steps(self, tape_id: str, start: int, stop: int) -> list[str]:
        """The stored JSON of steps ``start <= idx < stop`` of ``tape_id``, in order."""

    @abstractmethod
    def _select_llm_calls(self, prompt_ids: Sequence[str] | None) -> Iterator[LLMCall]:
        """Stored LLM calls with these prompt ids (all of them, oldest first, for None)."""

    @abstractmethod
    def _select_llm_call_ids(self, model: str | None) -> list[str]:
        """Prompt ids of stored LLM calls, oldest first, optionally of one model."""

    @abstractmethod
    def _select_prompt_ids(self, tape_id: str) -> list[str]:
        """The distinct non-empty prompt ids of the steps of ``tape_id``."""

    @abstractmethod
    def _select_totals(self, by: str, tape_id: str | None) -> Totals:
        """Totals grouped by ``by`` (checked: tape, agent or node)."""

    # ------------------------------------------------------------------ writing

    def save_tape(self, tape: Tape[Any, Any], tape_id: str | None = None, *, tags: Iterable[str] = ()) -> str:
        """Save ``tape`` under ``tape_id`` (default: its own id) with ``tags`` added (a save
        never removes tags) and return that id.

        Saving again under the same id, once the tape has grown, writes only the new steps and
        the metadata: that is how a running session is persisted step by step. Steps already
        stored are never rewritten; saving a tape that does not extend the stored one under the
        same id is an error (save it under its own id instead).
        """
        if not isinstance(tape, Tape):
            raise TypeError(f"save_tape needs a Tape, not {type(tape).__name__}")
        tape_id = _check_id(tape_id if tape_id is not None else tape.metadata.id)
        checked_tags = _check_tags(tags)
        self._check_open()
        start = self._known_lengths.get(tape_id)
        if start is None:  # not written by this store: what other writers committed is all there is
            start = self._stored_length(tape_id) or 0
        if len(tape) < start:
            raise ValueError(
                f"tape {tape_id} has {start} stored steps; the tape given has only {len(tape)} "
                "(save a different tape under its own id)"
            )
        now = time.time()
        steps = tape.steps
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
        self._put(serialised(write))
        self._known_lengths[tape_id] = len(tape)
        return tape_id

    def save_llm_call(self, call: LLMCall) -> None:
        """Queue a completed LLM call for writing, keyed by its prompt id."""
        if not isinstance(call, LLMCall):
            raise TypeError(f"save_llm_call needs an LLMCall, not {type(call).__name__}")
        self._put(call_write(call))

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
        if tape_id not in self._known_lengths and self._stored_length(tape_id) is None:
            raise TapeNotFoundError(tape_id, self.location)
        if checked:
            self._put(TagWrite(tape_id, checked, remove))

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
        for name, value in (("start", start), ("stop", stop)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an integer or None, not {value!r}")
        info = self.get_tape_info(tape_id)
        window = range(info.n_steps)[slice(start, stop)]
        if not window:
            return []
        steps = _load_steps(self._select_steps(tape_id, window.start, window.stop))
        return list(tape_class.model_validate({"steps": steps}).steps)

    def get_tape_info(self, tape_id: str) -> TapeInfo:
        """Metadata, tags and size of the stored tape ``tape_id``, without its steps."""
        _check_id(tape_id)
        self.flush()
        infos = self._select_infos(TapeFilter(), None, 0, ids=[tape_id])
        if not infos:
            raise TapeNotFoundError(tape_id, self.location)
        return infos[0]

    def list_tapes(
        self,
        author: str | None = None,
        has_error: bool | None = None,
        *,
        agent: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        until: float | None = None,
        parent_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[str]:
        """Ids of the stored tapes matching every filter given, newest first (see
        :class:`TapeFilter`), ``limit`` of them after skipping ``offset``."""
        where = TapeFilter(author, agent, has_error, tag, since, until, parent_id)
        self._check_page(limit, offset)
        self.flush()
        return self._select_ids(where, limit, offset)

    def list_tape_infos(
        self,
        author: str | None = None,
        has_error: bool | None = None,
        *,
        agent: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        until: float | None = None,
        parent_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TapeInfo]:
        """Like :meth:`list_tapes`, but each tape's :class:`TapeInfo` (no steps are loaded)."""
        where = TapeFilter(author, agent, has_error, tag, since, until, parent_id)
        self._check_page(limit, offset)
        self.flush()
        return self._select_infos(where, limit, offset)

    def count_tapes(
        self,
        author: str | None = None,
        has_error: bool | None = None,
        *,
        agent: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        until: float | None = None,
        parent_id: str | None = None,
    ) -> int:
        """How many stored tapes match every filter given (the filters of :meth:`list_tapes`)."""
        where = TapeFilter(author, agent, has_error, tag, since, until, parent_id)
        self.flush()
        return self._count(where)

    @staticmethod
    def _check_page(limit: int | None, offset: int) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative integer, not {offset!r}")

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
    ) -> Callable[[Any], None]:
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

        def record(event: Any) -> None:
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
        return _jsonl.export_jsonl(self, path, tape_ids, llm_calls)

    def import_jsonl(self, path: str | Path) -> list[str]:
        """Store the tapes and LLM calls of a file written by :meth:`export_jsonl`, with their
        ids, metadata, tags and creation times; importing the same file again changes nothing.
        Returns the ids of the tapes in the file.

        The whole file is read and checked first and then committed in one transaction: a file
        with a bad line (not UTF-8, not JSON, not a valid tape) stores nothing, and the
        ``ValueError`` names the file and line."""
        return _jsonl.import_jsonl(self, path)
