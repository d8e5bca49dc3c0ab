"""The SQL that SQLite and PostgreSQL share: one schema, one set of queries, one commit.

Statements are written with ``?`` placeholders; the PostgreSQL backend turns them into
``%s`` (none of the statements contains a literal ``?`` or ``%``). A backend supplies the
connections, ``_fetch`` (a read) and ``_transaction`` (several ``executemany`` in one commit).
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any

from tapekit.llm.base import LLMCall
from tapekit.store._prompts import resolve_rows
from tapekit.store._writer import QueuedTapeStore
from tapekit.store._writes import CallWrite, EffectWrite, TagWrite, TapeRows, Write, call_from_row
from tapekit.store.base import TapeFilter, TapeInfo, Totals

# the kinds of tapekit's Call, Respond and Fork steps: the steps that change a tape's view stack,
# indexed apart (steps_stack) so that the stack of a long stored tape is rebuilt without reading
# its other steps (see StoreBackend._select_step_positions); the term is written once, here, as
# SQLite uses a partial index only for a query that repeats its WHERE term
STACK_KIND_NAMES = frozenset({"call", "respond", "fork"})
STACK_KINDS = "kind IN ('call', 'fork', 'respond')"

# DOUBLE PRECISION is REAL in SQLite; the first three tables are the original SQLite schema
SCHEMA = [
    """CREATE TABLE IF NOT EXISTS tapes (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    author TEXT,
    author_tape_id TEXT,
    n_added_steps INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    result TEXT,
    context TEXT,
    n_steps INTEGER NOT NULL DEFAULT 0,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    other TEXT,
    steps_digest TEXT
)""",
    "CREATE INDEX IF NOT EXISTS tapes_parent ON tapes(parent_id)",
    "CREATE INDEX IF NOT EXISTS tapes_created ON tapes(created)",
    "CREATE INDEX IF NOT EXISTS tapes_author ON tapes(author)",
    """CREATE TABLE IF NOT EXISTS steps (
    tape_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    step_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent TEXT NOT NULL,
    node TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (tape_id, idx)
)""",
    "CREATE INDEX IF NOT EXISTS steps_prompt ON steps(prompt_id)",
    "CREATE INDEX IF NOT EXISTS steps_agent ON steps(agent, tape_id)",
    f"CREATE INDEX IF NOT EXISTS steps_stack ON steps(tape_id, idx) WHERE {STACK_KINDS}",
    """CREATE TABLE IF NOT EXISTS llm_calls (
    prompt_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    output TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    latency_s DOUBLE PRECISION NOT NULL,
    timestamp DOUBLE PRECISION NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS tape_tags (
    tape_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (tape_id, tag)
)""",
    "CREATE INDEX IF NOT EXISTS tape_tags_tag ON tape_tags(tag, tape_id)",
    # the parts of LLM calls' prompts, each stored once (see _prompts.py): a message node (prev:
    # the node before it, NULL for the first message) or a tools list / response schema
    # the journal of tool calls that must not run twice (see tapekit/effects.py)
    """CREATE TABLE IF NOT EXISTS tool_effects (
    key TEXT PRIMARY KEY,
    tape_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    state TEXT NOT NULL,
    result TEXT,
    error TEXT,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS tool_effects_tape ON tool_effects(tape_id)",
    """CREATE TABLE IF NOT EXISTS prompt_parts (
    hash TEXT PRIMARY KEY,
    prev TEXT,
    body TEXT NOT NULL
)""",
]

# token ids of LLM calls (tapekit/store/_tokens.py), added to older files when they are opened
TOKEN_COLUMNS = {"token_meta": "TEXT", "token_data": "BLOB"}  # BLOB is BYTEA in PostgreSQL
# a tape's metadata.other (JSON, NULL when empty) and the digest of its stored steps (see
# steps_digest in _writes.py; NULL in rows written before: the store hashes those steps once),
# added to older files when they are opened
TAPE_EXTRA_COLUMNS = {"other": "TEXT", "steps_digest": "TEXT"}
# every column added after a table was first made, by table: (name, SQL type)
ADDED_COLUMNS = {"llm_calls": TOKEN_COLUMNS, "tapes": TAPE_EXTRA_COLUMNS}


def _required_columns() -> dict[str, frozenset[str]]:
    """The columns each table of ``SCHEMA`` has had since it was first made: what a table of
    that name must have for the database to be a tapekit store (the ``ADDED_COLUMNS`` are added
    when an older one is opened)."""
    out: dict[str, frozenset[str]] = {}
    for statement in SCHEMA:
        found = re.match(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)$", statement, re.DOTALL)
        if found is None:
            continue
        table, body = found.groups()
        names = {line.split()[0] for line in body.splitlines() if line.strip()} - {"PRIMARY"}
        out[table] = frozenset(names - set(ADDED_COLUMNS.get(table, {})))
    return out


#: by table: the columns a table of that name must have (else it is another application's)
REQUIRED_COLUMNS = _required_columns()


def foreign_tables(columns: Mapping[str, Iterable[str]]) -> str | None:
    """Why a database whose tables have ``columns`` (by table name) is not a tapekit store: the
    tables of tapekit's names that lack columns tapekit's always had (None: every table of a
    tapekit name is tapekit's; tables of other names do not matter)."""
    lacking = []
    for table, required in REQUIRED_COLUMNS.items():
        if table in columns:
            missing = sorted(required - set(columns[table]))
            if missing:
                lacking.append(
                    f"its table {table!r} lacks the column{'s' * (len(missing) > 1)} {', '.join(missing)}"
                )
    return "; ".join(lacking) or None


TAPE_COLUMNS = (
    "id, parent_id, author, author_tape_id, n_added_steps, error, result, context, other, n_steps, "
    "created, updated, steps_digest"
)
_TAPE_UPDATE = (
    "parent_id=excluded.parent_id, author=excluded.author, author_tape_id=excluded.author_tape_id, "
    "n_added_steps=excluded.n_added_steps, error=excluded.error, result=excluded.result, "
    "context=excluded.context, other=excluded.other, n_steps=excluded.n_steps, updated=excluded.updated, "
    "steps_digest=excluded.steps_digest"
)
UPSERT_TAPE = (
    f"INSERT INTO tapes ({TAPE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) "
    f"ON CONFLICT(id) DO UPDATE SET {_TAPE_UPDATE}"
)
IMPORT_TAPE = UPSERT_TAPE + ", created=excluded.created"
INSERT_STEP = (
    "INSERT INTO steps (tape_id, idx, step_id, kind, agent, node, prompt_id, data) "
    "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING"
)
UPSERT_CALL = (
    "INSERT INTO llm_calls (prompt_id, model, prompt, output, prompt_tokens, output_tokens, cost, "
    "latency_s, timestamp, token_meta, token_data) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT(prompt_id) DO UPDATE SET "
    "model=excluded.model, prompt=excluded.prompt, output=excluded.output, "
    "prompt_tokens=excluded.prompt_tokens, output_tokens=excluded.output_tokens, cost=excluded.cost, "
    "latency_s=excluded.latency_s, timestamp=excluded.timestamp, token_meta=excluded.token_meta, "
    "token_data=excluded.token_data"
)
INSERT_PART = "INSERT INTO prompt_parts (hash, prev, body) VALUES (?,?,?) ON CONFLICT DO NOTHING"
# the parts named and every node before them (UNION, not UNION ALL: a node shared by several
# chains is walked once)
_SELECT_PARTS = (
    "WITH RECURSIVE chain(hash, prev) AS (SELECT hash, prev FROM prompt_parts WHERE hash IN ({}) "
    "UNION SELECT p.hash, p.prev FROM prompt_parts p JOIN chain c ON p.hash = c.prev) "
    "SELECT p.hash, p.prev, p.body FROM chain c JOIN prompt_parts p ON p.hash = c.hash"
)
EFFECT_COLUMNS = "key, tape_id, tool, arguments, state, result, error, created, updated"
UPSERT_EFFECT = (
    f"INSERT INTO tool_effects ({EFFECT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT(key) DO UPDATE SET state=excluded.state, result=excluded.result, "
    "error=excluded.error, updated=excluded.updated"
)
ADD_TAG = "INSERT INTO tape_tags (tape_id, tag) VALUES (?,?) ON CONFLICT DO NOTHING"
REMOVE_TAG = "DELETE FROM tape_tags WHERE tape_id = ? AND tag = ?"

_INFO_COLUMNS = (
    "t.id, t.parent_id, t.author, t.author_tape_id, t.n_steps, t.n_added_steps, t.error, t.result, "
    "t.created, t.updated, t.other"
)
_CALL_COLUMNS = (
    "prompt_id, model, prompt, output, prompt_tokens, output_tokens, cost, latency_s, timestamp, "
    "token_meta, token_data"
)
_CHUNK = 500  # ids per IN (...) list
_FIRST, _FIRST_TWO = itemgetter(0), itemgetter(0, 1)  # sort keys of call and step rows


def _where(f: TapeFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = ["1=1"]
    args: list[Any] = []
    if f.author is not None:
        clauses.append("t.author = ?")
        args.append(f.author)
    if f.agent is not None:
        clauses.append("EXISTS (SELECT 1 FROM steps s WHERE s.agent = ? AND s.tape_id = t.id)")
        args.append(f.agent)
    if f.has_error is not None:
        clauses.append("t.error IS NOT NULL" if f.has_error else "t.error IS NULL")
    if f.tag is not None:
        clauses.append("EXISTS (SELECT 1 FROM tape_tags g WHERE g.tag = ? AND g.tape_id = t.id)")
        args.append(f.tag)
    if f.since is not None:
        clauses.append("t.created >= ?")
        args.append(float(f.since))
    if f.until is not None:
        clauses.append("t.created < ?")
        args.append(float(f.until))
    if f.parent_id is not None:
        clauses.append("t.parent_id = ?")
        args.append(f.parent_id)
    return " AND ".join(clauses), args


class SQLTapeStore(QueuedTapeStore):
    """A :class:`~tapekit.store.TapeStore` on an SQL database with the shared schema (SQLite, PostgreSQL)."""

    #: how this dialect writes "no limit" when only an offset is given
    _no_limit = "LIMIT -1"

    @abstractmethod
    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a read query (``?`` placeholders) on the reading connection."""

    @abstractmethod
    def _transaction(self, conn: Any, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """Run each ``(sql, rows)`` as an ``executemany``, all in one transaction."""

    # ------------------------------------------------------------------ writes

    def _commit(self, conn: Any, writes: list[Write]) -> None:
        calls: list[tuple[Any, ...]] = []
        parts: dict[str, tuple[Any, ...]] = {}
        steps: list[tuple[Any, ...]] = []
        # a session saved after every step queues many writes of one tape: only the last one's
        # metadata is written (with the first one's creation time), the steps of all of them
        tapes: dict[str, tuple[TapeRows, float]] = {}
        imports: dict[str, TapeRows] = {}
        tag_ops: list[tuple[str, list[tuple[Any, ...]]]] = []

        def tag(sql: str, rows: list[tuple[Any, ...]]) -> None:
            if tag_ops and tag_ops[-1][0] == sql:
                tag_ops[-1][1].extend(rows)
            else:
                tag_ops.append((sql, rows))

        effects: dict[str, tuple[Any, ...]] = {}
        for w in writes:
            if isinstance(w, EffectWrite):
                first = effects.get(w.key)
                effects[w.key] = w.row if first is None else (*w.row[:7], first[7], w.row[8])
            elif isinstance(w, CallWrite):
                calls.append(w.row)
                for part in w.parts:
                    parts[part[0]] = part
            elif isinstance(w, TagWrite):
                tag(REMOVE_TAG if w.remove else ADD_TAG, [(w.tape_id, t) for t in w.tags])
            elif isinstance(w, TapeRows):
                steps.extend(w.steps)
                if w.exact_created:
                    imports[w.tape_id] = w
                else:
                    first = tapes.get(w.tape_id)
                    tapes[w.tape_id] = (w, w.created if first is None else first[1])
                if w.tags:
                    tag(ADD_TAG, [(w.tape_id, t) for t in w.tags])
        # rows in key order, so that concurrent transactions lock shared rows in the same order
        # and cannot deadlock
        calls.sort(key=_FIRST)
        steps.sort(key=_FIRST_TWO)
        statements = [
            (INSERT_PART, [parts[h] for h in sorted(parts)]),
            (UPSERT_CALL, calls),
            (
                UPSERT_TAPE,
                [(*w.tape, created, w.updated, w.digest) for _, (w, created) in sorted(tapes.items())],
            ),
            (IMPORT_TAPE, [(*w.tape, w.created, w.updated, w.digest) for _, w in sorted(imports.items())]),
            (INSERT_STEP, steps),
            (UPSERT_EFFECT, [effects[k] for k in sorted(effects)]),
        ]
        self._transaction(conn, [(sql, rows) for sql, rows in [*statements, *tag_ops] if rows])

    def _salvage(self, conn: Any, writes: list[Write]) -> None:
        """Store the prompt parts of ``writes``, which failed: the encoder counts them as
        stored, and later prompts refer to them. If even that fails, the encoder forgets what
        it handed out, so that later prompts bring all their parts."""
        parts = {p[0]: p for w in writes if isinstance(w, CallWrite) for p in w.parts}
        if not parts:
            return
        try:
            self._transaction(conn, [(INSERT_PART, [parts[h] for h in sorted(parts)])])
        except Exception:
            self._prompts.forget()

    # ------------------------------------------------------------------ reads

    def _stored_length(self, tape_id: str) -> int | None:
        rows = self._fetch("SELECT n_steps FROM tapes WHERE id = ?", (tape_id,))
        return int(rows[0][0]) if rows else None

    def _select_effects(self, key: str | None, tape_id: str | None) -> list[tuple[Any, ...]]:
        sql, args = f"SELECT {EFFECT_COLUMNS} FROM tool_effects", []
        if key is not None:
            sql += " WHERE key = ?"
            args.append(key)
        elif tape_id is not None:
            sql += " WHERE tape_id = ?"
            args.append(tape_id)
        return self._fetch(sql + " ORDER BY created, key", args)

    def _stored_state(self, tape_id: str) -> tuple[int, str | None] | None:
        rows = self._fetch("SELECT n_steps, steps_digest FROM tapes WHERE id = ?", (tape_id,))
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def _select_infos(
        self, where: TapeFilter, limit: int | None, offset: int, ids: Sequence[str] | None = None
    ) -> list[TapeInfo]:
        sql, args = _where(where)
        if ids is None:
            return self._infos(sql, args, limit, offset)
        return self._infos_in("id", ids, sql, args, limit, offset)

    def _select_children(self, parent_ids: Sequence[str]) -> list[TapeInfo]:
        return self._infos_in("parent_id", parent_ids, "1=1", [], None, 0)

    def _infos_in(
        self, column: str, values: Sequence[str], sql: str, args: list[Any], limit: int | None, offset: int
    ) -> list[TapeInfo]:
        """Infos matching ``sql`` whose ``column`` is one of ``values`` (in chunks)."""
        out: list[TapeInfo] = []
        for i in range(0, len(values), _CHUNK):
            chunk = list(values[i : i + _CHUNK])
            where = f"{sql} AND t.{column} IN ({','.join('?' * len(chunk))})"
            out.extend(self._infos(where, [*args, *chunk], None, 0))
        if len(values) > _CHUNK:
            out.sort(key=lambda t: (-t.created, t.id))
        return out[offset : None if limit is None else offset + limit]

    def _infos(self, sql: str, args: list[Any], limit: int | None, offset: int) -> list[TapeInfo]:
        rows = self._fetch(
            f"SELECT {_INFO_COLUMNS} FROM tapes t WHERE {sql} ORDER BY t.created DESC, t.id"
            + self._limit(limit, offset),
            args,
        )
        tags: dict[str, list[str]] = {r[0]: [] for r in rows}
        keys = list(tags)
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            for tape_id, tag in self._fetch(
                f"SELECT tape_id, tag FROM tape_tags WHERE tape_id IN ({','.join('?' * len(chunk))}) "
                "ORDER BY tag",
                chunk,
            ):
                tags[tape_id].append(tag)
        return [
            TapeInfo(
                id=r[0],
                parent_id=r[1],
                author=r[2],
                author_tape_id=r[3],
                n_steps=r[4],
                n_added_steps=r[5],
                error=r[6],
                result=json.loads(r[7]) if r[7] else None,
                other=json.loads(r[10]) if r[10] else {},
                tags=tags[r[0]],
                created=r[8],
                updated=r[9],
            )
            for r in rows
        ]

    def _limit(self, limit: int | None, offset: int) -> str:
        if limit is None and not offset:
            return ""
        return (f" LIMIT {limit}" if limit is not None else f" {self._no_limit}") + (
            f" OFFSET {offset}" if offset else ""
        )

    def _select_ids(self, where: TapeFilter, limit: int | None, offset: int) -> list[str]:
        sql, args = _where(where)
        rows = self._fetch(
            f"SELECT t.id FROM tapes t WHERE {sql} ORDER BY t.created DESC, t.id"
            + self._limit(limit, offset),
            args,
        )
        return [r[0] for r in rows]

    def _select_count(self, where: TapeFilter) -> int:
        sql, args = _where(where)
        return int(self._fetch(f"SELECT COUNT(*) FROM tapes t WHERE {sql}", args)[0][0])

    def _select_context(self, tape_id: str) -> str | None:
        rows = self._fetch("SELECT context FROM tapes WHERE id = ?", (tape_id,))
        return rows[0][0] if rows else None

    def _select_steps(self, tape_id: str, start: int, stop: int) -> list[str]:
        rows = self._fetch(
            "SELECT data FROM steps WHERE tape_id = ? AND idx >= ? AND idx < ? ORDER BY idx",
            (tape_id, start, stop),
        )
        return [r[0] for r in rows]

    def _select_step_positions(self, tape_id: str, stop: int, kinds: frozenset[str]) -> list[int] | None:
        # tapekit's own kinds are found in the partial index steps_stack; others (subclasses of
        # Call, Respond or Fork declared elsewhere) by a scan of the tape's steps
        rows = self._fetch(
            f"SELECT idx FROM steps WHERE tape_id = ? AND {STACK_KINDS} AND idx < ? ORDER BY idx",
            (tape_id, stop),
        )
        found = [r[0] for r in rows]
        others = sorted(kinds - STACK_KIND_NAMES)
        if others:
            marks = ", ".join("?" * len(others))
            rows = self._fetch(
                f"SELECT idx FROM steps WHERE tape_id = ? AND kind IN ({marks}) AND idx < ?",
                (tape_id, *others, stop),
            )
            found = sorted([*found, *(r[0] for r in rows)])
        return found

    def _select_llm_calls(self, prompt_ids: Sequence[str] | None) -> Iterator[LLMCall]:
        parts: dict[str, tuple[str | None, str]] = {}  # prompt parts read so far: hash -> (prev, body)
        if prompt_ids is None:
            rows = self._fetch(f"SELECT {_CALL_COLUMNS} FROM llm_calls ORDER BY timestamp, prompt_id")
            for i in range(0, len(rows), _CHUNK):
                yield from self._calls_of(rows[i : i + _CHUNK], parts)
            return
        for i in range(0, len(prompt_ids), _CHUNK):
            chunk = list(prompt_ids[i : i + _CHUNK])
            rows = self._fetch(
                f"SELECT {_CALL_COLUMNS} FROM llm_calls WHERE prompt_id IN ({','.join('?' * len(chunk))}) "
                "ORDER BY timestamp, prompt_id",
                chunk,
            )
            yield from self._calls_of(rows, parts)

    def _calls_of(
        self, rows: list[tuple[Any, ...]], parts: dict[str, tuple[str | None, str]]
    ) -> Iterator[LLMCall]:
        """The calls of ``rows``, their prompt parts read into ``parts`` first."""
        resolve_rows([(r[2], r[9]) for r in rows], self._select_parts, parts)
        for row in rows:
            yield call_from_row(row, parts)

    def _select_parts(self, hashes: Sequence[str]) -> list[tuple[Any, ...]]:
        """The ``prompt_parts`` rows of ``hashes`` and of every node before them."""
        out: list[tuple[Any, ...]] = []
        for i in range(0, len(hashes), _CHUNK):
            chunk = list(hashes[i : i + _CHUNK])
            out.extend(self._fetch(_SELECT_PARTS.format(",".join("?" * len(chunk))), chunk))
        return out

    def _select_llm_call_ids(self, model: str | None) -> list[str]:
        sql, args = "SELECT prompt_id FROM llm_calls", []
        if model is not None:
            sql += " WHERE model = ?"
            args.append(model)
        return [r[0] for r in self._fetch(sql + " ORDER BY timestamp, prompt_id", args)]

    def _select_prompt_ids(self, tape_id: str) -> list[str]:
        rows = self._fetch(
            "SELECT DISTINCT prompt_id FROM steps WHERE tape_id = ? AND prompt_id != '' ORDER BY prompt_id",
            (tape_id,),
        )
        return [r[0] for r in rows]

    def _select_totals(self, by: str, tape_id: str | None) -> Totals:
        group = {"tape": "s.tape_id", "agent": "s.agent", "node": "s.agent || '.' || s.node"}[by]
        sql = (
            "SELECT d.g, COUNT(*), SUM(c.prompt_tokens), SUM(c.output_tokens), SUM(c.cost) "
            f"FROM (SELECT DISTINCT {group} AS g, s.prompt_id FROM steps s WHERE s.prompt_id != ''"
            + (" AND s.tape_id = ?" if tape_id else "")
            + ") d JOIN llm_calls c ON c.prompt_id = d.prompt_id GROUP BY d.g ORDER BY d.g"
        )
        out = Totals()
        for g, n, pt, ot, cost in self._fetch(sql, [tape_id] if tape_id else []):
            out[g] = {
                "calls": int(n),
                "prompt_tokens": int(pt or 0),
                "output_tokens": int(ot or 0),
                "cost": float(cost or 0.0),
            }
        return out
