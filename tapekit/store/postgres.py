"""The shared store: tapes, steps, tags and LLM calls in a PostgreSQL database, for many
processes on many machines writing at once.

Same design as the SQLite store: writes are queued and a writer thread with its own connection
commits them in batches; reads use a second connection. Every write is an ``INSERT ... ON
CONFLICT``, rows are written in key order, and a tape's rows belong to that tape only, so
concurrent saves of different tapes never conflict (a deadlock or serialization failure, which
only overlapping writes can cause, is retried). The schema is created on first use.

psycopg 3 is imported when a store is opened, not when this module is: install the
``postgres`` extra (``pip install 'tapekit[postgres]'``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from tapekit.store._sql import SCHEMA, SQLTapeStore

__all__ = ["PostgresStore"]

_RETRIES = 8


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
        self._create_schema()
        self._start_writer()

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s))
            )
        except self._psycopg.Error as e:
            raise ConnectionError(f"cannot connect to PostgreSQL at {self.location}: {e}") from e

    def _create_schema(self) -> None:
        with self._read_lock, self._read.transaction():
            # one creator at a time: CREATE ... IF NOT EXISTS races between sessions
            self._read.execute("SELECT pg_advisory_xact_lock(7316206)")
            for statement in SCHEMA:
                self._read.execute(statement)

    def _writer_connect(self) -> Any:
        return self._connect()

    def _writer_close(self, conn: Any) -> None:
        conn.close()

    def _close_readers(self) -> None:
        with self._read_lock:
            self._read.close()

    def _transaction(self, conn: Any, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        errors = self._psycopg.errors
        for attempt in range(_RETRIES):
            try:
                with conn.transaction(), conn.cursor() as cur:
                    for sql, rows in statements:
                        cur.executemany(sql.replace("?", "%s"), rows)
                return
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == _RETRIES - 1:
                    raise
                time.sleep(0.01 * 2**attempt)

    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return self._read.execute(sql.replace("?", "%s"), tuple(args)).fetchall()
