"""The shared store: tapes, steps, tags and LLM calls in a PostgreSQL database, for many
processes on many machines writing at once.

Same design as the SQLite store: writes are queued and a writer thread with its own connection
commits them in batches; reads use a second connection. Every write is an ``INSERT ... ON
CONFLICT``, rows are written in key order, and a tape's rows belong to that tape only, so
concurrent saves of different tapes never conflict (a deadlock or serialization failure, which
only overlapping writes can cause, is retried). A connection the server drops is reopened and
the batch written again (the upserts are idempotent). The schema is created on first use.

psycopg 3 is imported when a store is opened, not when this module is: install the
``postgres`` extra (``pip install 'tapekit[postgres]'``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from tapekit.store._sql import ADDED_COLUMNS, REQUIRED_COLUMNS, SCHEMA, SQLTapeStore, foreign_tables

_CREATED = re.compile(r"IF NOT EXISTS (\w+)")  # the table or index a SCHEMA statement makes
_RETRIES = 10  # about 10 s of backoff in all


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as e:
        raise ImportError(
            "PostgresStore needs psycopg 3: install the postgres extra (pip install 'tapekit[postgres]')"
        ) from e
    return psycopg


def _redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", re.sub(r"(password=)\S+", r"\1***", dsn))


class PostgresStore(SQLTapeStore):
    """Tapes, steps, tags and LLM calls in a PostgreSQL database given by ``dsn`` (a
    ``postgresql://`` URL or a libpq ``key=value`` string): the store for several processes
    or machines. The tables are created on first use."""

    _no_limit = "LIMIT ALL"

    def __init__(
        self,
        dsn: str,
        batch_size: int = 512,
        flush_interval_s: float = 0.05,
        connect_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(batch_size, flush_interval_s)
        if not isinstance(dsn, str) or not dsn:
            raise TypeError(f"PostgresStore needs a DSN string, not {dsn!r}")
        self.dsn = dsn
        self.location = _redact(dsn)
        self.connect_timeout_s = connect_timeout_s
        self._psycopg = _psycopg()
        self._read = self._connect()
        self._read_lock = threading.Lock()
        try:
            self._create_schema()
        except BaseException:
            self._read.close()
            raise
        self._start_writer()

    @property
    def address(self) -> str:
        """The DSN (with its password): what another process passes to ``open_store``."""
        return self.dsn

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s))
            )
        except self._psycopg.Error as e:
            raise ConnectionError(f"cannot connect to PostgreSQL at {self.location}: {e}") from e

    def _create_schema(self) -> None:
        with self._read_lock:
            why = foreign_tables(self._columns(list(REQUIRED_COLUMNS)))
            if why is not None:  # checked before any DDL: a refused database is left as it was
                raise ValueError(
                    f"the PostgreSQL database {self.location} is not a tapekit store: {why} (another "
                    "application's tables?). Use a database or schema of its own; nothing was changed"
                )
            missing_columns = self._missing_schema()
            if missing_columns == []:  # everything exists: no DDL, whose locks deadlock live writers
                return
            with self._read.transaction():
                # one creator at a time: CREATE ... IF NOT EXISTS races between sessions
                self._read.execute("SELECT pg_advisory_xact_lock(7316206)")
                for statement in SCHEMA:
                    self._read.execute(statement)
                # databases made before token ids (llm_calls) or metadata.other (tapes) were kept
                for table, name in self._missing_columns():
                    kind = ADDED_COLUMNS[table][name]
                    pg_kind = "BYTEA" if kind == "BLOB" else kind
                    self._read.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {pg_kind}")

    def _missing_schema(self) -> list[tuple[str, str]] | None:
        """The added columns (``(table, column)``) the tables lack, or None when a table or
        index is missing.

        Checked before any DDL: ``CREATE INDEX IF NOT EXISTS`` and ``ALTER TABLE ... IF NOT
        EXISTS`` take table locks even when there is nothing to do, and a second process opening
        the store while another one writes then deadlocks with its writer.
        """
        names = [m.group(1) for m in (_CREATED.search(statement) for statement in SCHEMA) if m]
        row = self._read.execute(
            "SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest(%s::text[]) AS n", [names]
        ).fetchone()
        if not row or not row[0]:
            return None
        return self._missing_columns()

    def _columns(self, tables: list[str]) -> dict[str, list[str]]:
        """The columns of those of ``tables`` that exist (in the current schema), by table."""
        rows = self._read.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ANY(%s::text[])",
            [tables],
        ).fetchall()
        out: dict[str, list[str]] = {}
        for table, column in rows:
            out.setdefault(table, []).append(column)
        return out

    def _missing_columns(self) -> list[tuple[str, str]]:
        """The columns of ``ADDED_COLUMNS`` that the tables lack, as ``(table, column)``."""
        have = self._columns(list(ADDED_COLUMNS))
        return [
            (table, name)
            for table, columns in ADDED_COLUMNS.items()
            for name in columns
            if name not in have.get(table, ())
        ]

    def _writer_connect(self) -> _Conn:
        return _Conn(self._connect())

    def _writer_close(self, holder: _Conn) -> None:
        holder.conn.close()

    def _close_readers(self) -> None:
        with self._read_lock:
            self._read.close()

    def _transaction(self, holder: _Conn, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        psycopg = self._psycopg
        for attempt in range(_RETRIES):
            last = attempt == _RETRIES - 1
            try:
                if holder.conn.closed:
                    holder.conn = self._connect()
                with holder.conn.transaction(), holder.conn.cursor() as cur:
                    for sql, rows in statements:
                        cur.executemany(sql.replace("?", "%s"), rows)
                return
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if last:
                    raise
            except (psycopg.OperationalError, ConnectionError):
                # the server dropped the connection (restart, failover, idle timeout): every write
                # is an idempotent upsert, so writing the batch again on a new connection is safe
                if last or not (holder.conn.closed or holder.conn.broken):
                    raise
            time.sleep(min(0.02 * 2**attempt, 5.0))

    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            if self._read.closed and not self._closed:
                self._read = self._connect()
            try:
                return self._read.execute(sql.replace("?", "%s"), tuple(args)).fetchall()
            except self._psycopg.OperationalError:
                if not self._read.broken:
                    raise
            self._read = self._connect()  # dropped by the server: reads are safe to repeat
            return self._read.execute(sql.replace("?", "%s"), tuple(args)).fetchall()


class _Conn:
    """The writer thread's connection, replaced when the server drops it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
