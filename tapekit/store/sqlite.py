"""The embedded store: tapes, their steps and the LLM calls behind them in one SQLite file.

Writes are queued and a background thread commits them in batches (WAL mode), so agents never
wait on the disk and a batch of thousands of tapes does not turn into thousands of commits.
Reads first flush the queue, so a reader in the same process always sees its own writes.
Several processes may write the same file: SQLite serialises them and ``busy_timeout`` waits.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from tapekit._sqlite import connect
from tapekit.core import Step, Tape, TapeMetadata
from tapekit.llm.base import LLMCall

__all__ = ["SQLiteStore", "Totals"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS tapes (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    author TEXT,
    author_tape_id TEXT,
    n_added_steps INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    result TEXT,
    context TEXT,
    n_steps INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tapes_parent ON tapes(parent_id);
CREATE TABLE IF NOT EXISTS steps (
    tape_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    step_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent TEXT NOT NULL,
    node TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (tape_id, idx)
);
CREATE INDEX IF NOT EXISTS steps_prompt ON steps(prompt_id);
CREATE TABLE IF NOT EXISTS llm_calls (
    prompt_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    output TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost REAL NOT NULL,
    latency_s REAL NOT NULL,
    timestamp REAL NOT NULL
);
"""

_STOP = object()


class Totals(dict[str, dict[str, float]]):
    """Token and cost totals by group: ``{group: {"calls", "prompt_tokens", "output_tokens",
    "cost"}}``."""


class SQLiteStore:
    """Tapes, steps and LLM calls in one SQLite file (``":memory:"`` is not supported: the
    writer thread needs its own connection to the same database)."""

    def __init__(
        self, path: str | Path = "tapekit.db", batch_size: int = 512, flush_interval_s: float = 0.05
    ):
        self.path = str(path)
        if self.path == ":memory:":
            raise ValueError("SQLiteStore needs a file path; use a temporary file for throwaway stores")
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        with self._connect() as db:
            db.executescript(SCHEMA)
        self._read = self._connect()
        self._read_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._known_lengths: dict[str, int] = {}
        self._writer = threading.Thread(target=self._write_loop, name="tapekit-sqlite-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        db = connect(self.path)
        db.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; commits need no fsync each
        return db

    # ------------------------------------------------------------------ writing

    def save_llm_call(self, call: LLMCall) -> None:
        """Queue a completed LLM call for writing, keyed by its prompt id."""
        self._put(("call", call))

    def save_tape(self, tape: Tape[Any, Any], tape_id: str | None = None) -> str:
        """Save ``tape`` under ``tape_id`` (default: its own id) and return that id.

        Saving again under the same id, once the tape has grown, writes only the new steps and
        the metadata: that is how a running session is persisted step by step. Steps already
        stored are never rewritten; saving a tape that does not extend the stored one under
        the same id is an error (save it under its own id instead).
        """
        tape_id = tape_id or tape.metadata.id
        start = self._known_lengths.get(tape_id)
        if start is None:
            start = self._stored_length(tape_id)
        if len(tape) < start:
            raise ValueError(f"tape {tape_id} has {start} stored steps; the tape given has only {len(tape)}")
        self._known_lengths[tape_id] = len(tape)
        self._put(("tape", tape_id, tape.metadata, tape.context, list(tape.steps[start:]), start, len(tape)))
        return tape_id

    def _put(self, item: Any) -> None:
        if self._error is not None:
            raise RuntimeError(f"the store's writer failed: {self._error!r}") from self._error
        self._queue.put(item)

    def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        done = threading.Event()
        self._put(("flush", done))
        while not done.wait(0.1):
            if not self._writer.is_alive():
                break
        if self._error is not None:
            raise RuntimeError(f"the store's writer failed: {self._error!r}") from self._error

    def close(self) -> None:
        """Commit what is queued and stop the writer."""
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join()
        self._read.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_loop(self) -> None:
        db = self._connect()
        try:
            while True:
                item = self._queue.get()
                batch = [item]
                deadline = time.monotonic() + self.flush_interval_s
                while item is not _STOP and len(batch) < self.batch_size:
                    try:
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    batch.append(item)
                self._commit(db, [b for b in batch if b is not _STOP and b[0] != "flush"])
                for b in batch:
                    if b is not _STOP and b[0] == "flush":
                        b[1].set()
                if any(b is _STOP for b in batch):
                    return
        except BaseException as e:  # surfaced on the next write or flush
            self._error = e
        finally:
            db.close()

    def _commit(self, db: sqlite3.Connection, items: list[Any]) -> None:
        if not items:
            return
        now = time.time()
        calls, step_rows, tape_rows = [], [], []
        for item in items:
            if item[0] == "call":
                c: LLMCall = item[1]
                calls.append(
                    (
                        c.prompt.id,
                        c.model,
                        c.prompt.model_dump_json(),
                        c.output.model_dump_json(),
                        c.prompt_tokens,
                        c.output_tokens,
                        c.cost,
                        c.latency_s,
                        c.timestamp,
                    )
                )
            else:
                _, tape_id, meta, context, steps, start, n_steps = item
                for i, step in enumerate(steps, start):
                    m = step.metadata
                    step_rows.append(
                        (tape_id, i, m.id, step.kind, m.agent, m.node, m.prompt_id, step.model_dump_json())
                    )
                ctx = json.dumps(
                    context.model_dump(mode="json") if hasattr(context, "model_dump") else context
                )
                tape_rows.append(
                    (
                        tape_id,
                        meta.parent_id,
                        meta.author,
                        meta.author_tape_id,
                        meta.n_added_steps,
                        meta.error,
                        json.dumps(meta.result, default=str),
                        ctx,
                        n_steps,
                        now,
                        now,
                    )
                )
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO llm_calls VALUES (?,?,?,?,?,?,?,?,?)", calls)
            db.executemany("INSERT OR IGNORE INTO steps VALUES (?,?,?,?,?,?,?,?)", step_rows)
            db.executemany(
                "INSERT INTO tapes VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
                "parent_id=excluded.parent_id, author=excluded.author, "
                "author_tape_id=excluded.author_tape_id, "
                "n_added_steps=excluded.n_added_steps, error=excluded.error, result=excluded.result, "
                "context=excluded.context, n_steps=excluded.n_steps, updated=excluded.updated",
                tape_rows,
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ reading

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        self.flush()
        with self._read_lock:
            return self._read.execute(sql, tuple(args)).fetchall()

    def _stored_length(self, tape_id: str) -> int:
        rows = self._query("SELECT n_steps FROM tapes WHERE id = ?", (tape_id,))
        return int(rows[0][0]) if rows else 0

    def get_tape(self, tape_id: str, tape_class: type[Tape[Any, Any]] = Tape) -> Tape[Any, Any]:
        """The stored tape ``tape_id`` (``KeyError`` if there is none), as ``tape_class``."""
        rows = self._query(
            "SELECT parent_id, author, author_tape_id, n_added_steps, error, result, context, n_steps "
            "FROM tapes WHERE id = ?",
            (tape_id,),
        )
        if not rows:
            raise KeyError(f"no tape {tape_id!r} in {self.path}")
        parent_id, author, author_tape_id, n_added, error, result, context, n_steps = rows[0]
        steps = [
            json.loads(r[0])
            for r in self._query(
                "SELECT data FROM steps WHERE tape_id = ? AND idx < ? ORDER BY idx", (tape_id, n_steps)
            )
        ]
        meta = TapeMetadata(
            id=tape_id,
            parent_id=parent_id,
            author=author,
            author_tape_id=author_tape_id,
            n_added_steps=n_added,
            error=error,
            result=json.loads(result) if result else None,
        )
        return tape_class.model_validate(
            {
                "metadata": meta.model_dump(),
                "context": json.loads(context) if context else None,
                "steps": steps,
            }
        )

    def list_tapes(self, author: str | None = None, has_error: bool | None = None) -> list[str]:
        """Ids of stored tapes, newest first, optionally by author or by whether they failed."""
        sql, args = "SELECT id FROM tapes WHERE 1=1", []
        if author is not None:
            sql += " AND author = ?"
            args.append(author)
        if has_error is not None:
            sql += " AND error IS NOT NULL" if has_error else " AND error IS NULL"
        return [r[0] for r in self._query(sql + " ORDER BY created DESC, id", args)]

    def get_llm_call(self, prompt_id: str) -> LLMCall | None:
        """The LLM call made with prompt ``prompt_id``, if it was stored."""
        rows = self._query(
            "SELECT model, prompt, output, prompt_tokens, output_tokens, cost, latency_s, timestamp "
            "FROM llm_calls WHERE prompt_id = ?",
            (prompt_id,),
        )
        if not rows:
            return None
        model, prompt, output, pt, ot, cost, latency, ts = rows[0]
        return LLMCall.model_validate(
            {
                "prompt": json.loads(prompt),
                "output": json.loads(output),
                "model": model,
                "prompt_tokens": pt,
                "output_tokens": ot,
                "cost": cost,
                "latency_s": latency,
                "timestamp": ts,
            }
        )

    def list_llm_calls(self, model: str | None = None) -> list[str]:
        """Prompt ids of the stored LLM calls, oldest first, optionally of one model."""
        sql, args = "SELECT prompt_id FROM llm_calls", []
        if model is not None:
            sql += " WHERE model = ?"
            args.append(model)
        return [r[0] for r in self._query(sql + " ORDER BY timestamp, prompt_id", args)]

    def llm_call_for_step(self, step: Step) -> LLMCall | None:
        """The exact prompt and output behind ``step`` (None for steps made without an LLM)."""
        return self.get_llm_call(step.metadata.prompt_id) if step.metadata.prompt_id else None

    def totals(self, by: Literal["tape", "agent", "node"] = "agent", tape_id: str | None = None) -> Totals:
        """Calls, tokens and cost grouped by tape, agent or node (``agent.node``), optionally
        for one tape. Each LLM call counts once per group, however many steps it made."""
        group: dict[str, str] = {"tape": "s.tape_id", "agent": "s.agent", "node": "s.agent || '.' || s.node"}
        if by not in group:
            raise ValueError(f"totals by {by!r}: choose 'tape', 'agent' or 'node'")
        sql = (
            f"SELECT {group[by]} AS g, COUNT(*), SUM(c.prompt_tokens), SUM(c.output_tokens), SUM(c.cost) "
            "FROM "
            "(SELECT DISTINCT tape_id, agent, node, prompt_id FROM steps WHERE prompt_id != ''"
            + (" AND tape_id = ?" if tape_id else "")
            + ") AS s JOIN llm_calls AS c ON c.prompt_id = s.prompt_id GROUP BY g ORDER BY g"
        )
        out = Totals()
        for g, n, pt, ot, cost in self._query(sql, [tape_id] if tape_id else []):
            out[g] = {"calls": n, "prompt_tokens": pt or 0, "output_tokens": ot or 0, "cost": cost or 0.0}
        return out

    def recorder(self, start: Tape[Any, Any], tape_id: str | None = None) -> Callable[[Any], None]:
        """A callback for main-loop events that persists the session under ``tape_id``
        (default: the start tape's id) while it runs: every step as soon as it is made, every
        LLM call when it completes, the tape's metadata after each turn. A crash loses at most
        what the writer had not committed yet (``flush_interval_s``)."""
        key = tape_id or start.metadata.id
        state = {"tape": start}
        self.save_tape(start, key)

        def record(event: Any) -> None:
            agent_event = event.agent_event
            if agent_event is not None and agent_event.llm_call is not None:
                self.save_llm_call(agent_event.llm_call)
            if agent_event is not None and agent_event.step is not None:
                tape = state["tape"]
                state["tape"] = tape.model_copy(update={"steps": tape.steps.appended([agent_event.step])})
                self.save_tape(state["tape"], key)
            if event.tape is not None:
                state["tape"] = event.tape
                self.save_tape(event.tape, key)

        return record
