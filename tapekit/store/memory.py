"""The in-process store: tapes, steps, tags and LLM calls in this process's memory, for tests and
short scripts.

A :class:`MemoryStore` behaves as the database stores do (it passes the same conformance suite,
:mod:`tapekit.testing.store_conformance`): a save is checked and serialised on the caller's
thread, so the store keeps the tape as it was when saved and refuses text SQLite or PostgreSQL
would refuse, and reads rebuild new objects from the stored JSON. It commits every save at once,
under one lock, so there is no writer thread, ``flush`` has nothing to wait for and
``pending_writes`` is always 0. What it holds is gone when the process ends (export it with
``export_jsonl`` to keep it), and no other process can open it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tapekit.llm.base import LLMCall
from tapekit.store._writes import (
    CallWrite,
    EffectWrite,
    TagWrite,
    TapeRows,
    Write,
    WriteGroup,
    call_from_row,
    flat,
)
from tapekit.store.base import TapeFilter, TapeInfo, TapeStore, Totals


@dataclass(slots=True)
class _StoredTape:
    """One tape: its row (see :class:`~tapekit.store._writes.TapeRows`), times, tags, steps."""

    row: tuple[Any, ...]
    created: float
    updated: float
    tags: set[str] = field(default_factory=set)
    steps: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # idx -> step row
    agents: set[str] = field(default_factory=set)  # the agents of its steps (the agent filter)
    digest: str | None = None  # of its steps (TapeRows.digest)

    @property
    def parent_id(self) -> str | None:
        return self.row[1]  # type: ignore[no-any-return]

    def info(self) -> TapeInfo:
        tape_id, parent_id, author, author_tape_id, n_added, error, result, _, other, n_steps = self.row
        return TapeInfo(
            id=tape_id,
            parent_id=parent_id,
            author=author,
            author_tape_id=author_tape_id,
            n_steps=n_steps,
            n_added_steps=n_added,
            error=error,
            result=json.loads(result) if result else None,
            other=json.loads(other) if other else {},
            tags=sorted(self.tags),
            created=self.created,
            updated=self.updated,
        )

    def matches(self, f: TapeFilter) -> bool:
        row = self.row
        return (
            (f.author is None or row[2] == f.author)
            and (f.agent is None or f.agent in self.agents)
            and (f.has_error is None or (row[5] is not None) == f.has_error)
            and (f.tag is None or f.tag in self.tags)
            and (f.since is None or self.created >= f.since)
            and (f.until is None or self.created < f.until)
            and (f.parent_id is None or row[1] == f.parent_id)
        )


def _newest_first(tapes: Iterable[_StoredTape]) -> list[_StoredTape]:
    return sorted(tapes, key=lambda t: (-t.created, t.row[0]))


def _page(items: list[Any], limit: int | None, offset: int) -> list[Any]:
    return items[offset : None if limit is None else offset + limit]


class MemoryStore(TapeStore):
    """Tapes, steps, tags and LLM calls in this process's memory: nothing to open, nothing
    left behind. For tests and short scripts; the same interface, checks and results as
    :class:`~tapekit.store.SQLiteStore` (the conformance suite runs on both).

    Every save is committed when it returns (``pending_writes()`` is always 0); one store may
    be shared by threads (one lock guards it). No other process can open it (``address`` is
    None), so the Ray batch backend refuses it.
    """

    location = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._tapes: dict[str, _StoredTape] = {}
        self._calls: dict[str, tuple[Any, ...]] = {}  # prompt id -> row (see CallWrite)
        self._parts: dict[str, tuple[str | None, str]] = {}  # prompt parts: hash -> (prev, body)
        self._effects: dict[str, tuple[Any, ...]] = {}  # tool-effect journal: key -> row (EffectWrite)

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._tapes)} tapes, {len(self._calls)} LLM calls)"

    # ------------------------------------------------------------------ writing

    def _submit(self, write: Write | WriteGroup) -> None:
        """Apply ``write`` now (a group as a whole, under the lock)."""
        self._check_open()
        with self._lock:
            for w in flat([write]):
                self._apply(w)

    def _apply(self, w: Write) -> None:
        if isinstance(w, CallWrite):
            for h, prev, body in w.parts:
                self._parts.setdefault(h, (prev, body))
            self._calls[w.prompt_id] = w.row
        elif isinstance(w, TagWrite):
            stored = self._tapes.get(w.tape_id)
            if stored is not None:
                if w.remove:
                    stored.tags.difference_update(w.tags)
                else:
                    stored.tags.update(w.tags)
        elif isinstance(w, TapeRows):
            stored = self._tapes.get(w.tape_id)
            if stored is None:
                stored = self._tapes[w.tape_id] = _StoredTape(w.tape, w.created, w.updated)
            else:
                stored.row, stored.updated = w.tape, w.updated
                if w.exact_created:
                    stored.created = w.created
            for step in w.steps:
                if step[1] not in stored.steps:  # a stored step is never rewritten
                    stored.steps[step[1]] = step
                    stored.agents.add(step[4])
            stored.tags.update(w.tags)
            stored.digest = w.digest
        elif isinstance(w, EffectWrite):
            known = self._effects.get(w.key)
            self._effects[w.key] = w.row if known is None else (*w.row[:7], known[7], w.row[8])
        else:  # pragma: no cover - the writes are a closed set
            raise TypeError(f"unknown write {type(w).__name__}")

    def flush(self) -> None:
        """Nothing to wait for (every save is committed when it returns); raises
        ``RuntimeError`` on a closed store."""
        self._check_open()

    def _close(self) -> None:
        """Drop what the store holds (nothing is queued)."""
        with self._lock:
            self._tapes.clear()
            self._calls.clear()
            self._effects.clear()

    # ------------------------------------------------------------------ reading

    def _stored_length(self, tape_id: str) -> int | None:
        with self._lock:
            stored = self._tapes.get(tape_id)
            return None if stored is None else int(stored.row[9])

    def _select_effects(self, key: str | None, tape_id: str | None) -> list[tuple[Any, ...]]:
        with self._lock:
            rows = [self._effects[key]] if key is not None and key in self._effects else []
            if key is None:
                rows = [r for r in self._effects.values() if tape_id is None or r[1] == tape_id]
        return sorted(rows, key=lambda r: (r[7], r[0]))

    def _stored_state(self, tape_id: str) -> tuple[int, str | None] | None:
        with self._lock:
            stored = self._tapes.get(tape_id)
            return None if stored is None else (int(stored.row[9]), stored.digest)

    def _matching(self, where: TapeFilter, ids: Sequence[str] | None = None) -> list[_StoredTape]:
        with self._lock:
            if ids is None:
                candidates: Iterable[_StoredTape] = self._tapes.values()
            else:
                candidates = [t for t in (self._tapes.get(i) for i in dict.fromkeys(ids)) if t is not None]
            return _newest_first(t for t in candidates if t.matches(where))

    def _select_infos(
        self, where: TapeFilter, limit: int | None, offset: int, ids: Sequence[str] | None = None
    ) -> list[TapeInfo]:
        with self._lock:
            return [t.info() for t in _page(self._matching(where, ids), limit, offset)]

    def _select_children(self, parent_ids: Sequence[str]) -> list[TapeInfo]:
        parents = set(parent_ids)
        with self._lock:
            return [
                t.info() for t in _newest_first(t for t in self._tapes.values() if t.parent_id in parents)
            ]

    def _select_ids(self, where: TapeFilter, limit: int | None, offset: int) -> list[str]:
        return [t.row[0] for t in _page(self._matching(where), limit, offset)]

    def _select_count(self, where: TapeFilter) -> int:
        with self._lock:
            return sum(1 for t in self._tapes.values() if t.matches(where))

    def _select_context(self, tape_id: str) -> str | None:
        with self._lock:
            stored = self._tapes.get(tape_id)
            return None if stored is None else stored.row[7]  # type: ignore[no-any-return]

    def _select_steps(self, tape_id: str, start: int, stop: int) -> list[str]:
        with self._lock:
            stored = self._tapes.get(tape_id)
            if stored is None:
                return []
            steps = stored.steps
            return [steps[i][7] for i in range(start, stop) if i in steps]

    def _select_step_positions(self, tape_id: str, stop: int, kinds: frozenset[str]) -> list[int] | None:
        with self._lock:
            stored = self._tapes.get(tape_id)
            rows = [] if stored is None else list(stored.steps.values())
        return sorted(row[1] for row in rows if row[1] < stop and row[3] in kinds)

    def _select_llm_calls(self, prompt_ids: Sequence[str] | None) -> Iterator[LLMCall]:
        with self._lock:
            if prompt_ids is None:
                rows = list(self._calls.values())
            else:
                rows = [self._calls[p] for p in dict.fromkeys(prompt_ids) if p in self._calls]
        rows.sort(key=lambda r: (r[8], r[0]))
        return (call_from_row(row, self._parts) for row in rows)

    def _select_llm_call_ids(self, model: str | None) -> list[str]:
        with self._lock:
            rows = [r for r in self._calls.values() if model is None or r[1] == model]
        return [r[0] for r in sorted(rows, key=lambda r: (r[8], r[0]))]

    def _select_prompt_ids(self, tape_id: str) -> list[str]:
        with self._lock:
            stored = self._tapes.get(tape_id)
            steps = list(stored.steps.values()) if stored is not None else []
        return sorted({s[6] for s in steps if s[6]})

    def _select_totals(self, by: str, tape_id: str | None) -> Totals:
        with self._lock:
            if tape_id is None:
                tapes = list(self._tapes.values())
            else:
                tapes = [self._tapes[tape_id]] if tape_id in self._tapes else []
            # (group, prompt id) pairs: each call counts once per group, as the SQL does
            pairs: set[tuple[str, str]] = set()
            for stored in tapes:
                for _, _, _, _, agent, node, prompt_id, _ in stored.steps.values():
                    if prompt_id:
                        group = {"tape": stored.row[0], "agent": agent, "node": f"{agent}.{node}"}[by]
                        pairs.add((group, prompt_id))
            calls = {pid: self._calls[pid] for _, pid in pairs if pid in self._calls}
        out = Totals()
        for group, prompt_id in sorted(pairs):
            row = calls.get(prompt_id)
            if row is None:
                continue
            total = out.setdefault(group, {"calls": 0, "prompt_tokens": 0, "output_tokens": 0, "cost": 0.0})
            total["calls"] += 1
            total["prompt_tokens"] += row[4]
            total["output_tokens"] += row[5]
            total["cost"] += row[6]
        return out
