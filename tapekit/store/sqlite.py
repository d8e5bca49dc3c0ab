"""The embedded store: tapes, their steps and tags, and the LLM calls behind them in one SQLite
file.

Writes are queued and a background thread commits them in batches (WAL mode), so agents never
wait on the disk and a batch of thousands of tapes does not turn into thousands of commits.
Reads first flush the queue, so a reader in the same process always sees its own writes.
Several processes may write the same file: SQLite serialises them and ``busy_timeout`` waits.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tapekit._sqlite import connect
from tapekit.store._sql import ADDED_COLUMNS, SCHEMA, SQLTapeStore, foreign_tables
from tapekit.store.base import Totals as Totals

# pages of 16 KiB for new files (SQLite's default is 4 KiB): committing batches of steps and LLM
# calls takes the writer about a fifth less CPU time; files made with another page size keep it
PAGE_SIZE = 16384
WAL_CHECKPOINT_BYTES = 16 * 2**20  # size of the WAL after which a commit checkpoints it
# the file header's application_id of the stores this version creates ("tape"); files made
# before keep 0, which is accepted too
APPLICATION_ID = 0x74617065


def refuse_foreign(path: str) -> None:
    """Raise ``ValueError`` naming ``path`` when it is an existing file that is not a tapekit
    store: not an SQLite database, a database another application marked as its own
    (``application_id``), or one with a table of a tapekit name that lacks tapekit's columns
    (another application's ``tapes`` table, say). The file is only read, on a read-only
    connection, so a refused file is left as it was (its journal mode, schema and header);
    a new or empty file passes."""
    file = Path(path)
    if not file.is_file() or file.stat().st_size == 0:
        return
    try:
        db = sqlite3.connect(f"{file.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as e:
        raise ValueError(f"cannot open the SQLite store {path}: {e}") from e
    try:
        application = db.execute("PRAGMA application_id").fetchone()[0]
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {
            t: [row[0] for row in db.execute("SELECT name FROM pragma_table_info(?)", (t,))] for t in tables
        }
    except sqlite3.Error as e:
        raise ValueError(f"cannot open the SQLite store {path}: {e}") from e
    finally:
        db.close()
    why = (
        f"its application_id is {application:#x}, another application's"
        if application not in (0, APPLICATION_ID)
        else foreign_tables(columns)
    )
    if why is not None:
        raise ValueError(
            f"{path} is not a tapekit store: {why} (another application's database?). open_store "
            "needs a tapekit store or a new file; nothing in this one was changed"
        )


class SQLiteStore(SQLTapeStore):
    """Tapes, steps, tags and LLM calls in one SQLite file: nothing to install or run, and
    several processes on one machine may share the file (``":memory:"`` is not supported: the
    writer thread needs its own connection to the same database)."""

    def __init__(
        self, path: str | Path = "tapekit.db", batch_size: int = 512, flush_interval_s: float = 0.05
    ):
        super().__init__(batch_size, flush_interval_s)
        self.path = str(path)
        if self.path == ":memory:" or not self.path:
            raise ValueError("SQLiteStore needs a file path; use a temporary file for throwaway stores")
        if Path(self.path).is_dir():
            raise ValueError(f"SQLiteStore needs a file path; {self.path} is a directory")
        self.location = self.path
        refuse_foreign(self.path)  # before anything writes to the file (WAL, tables)
        try:
            db = self._connect()
        except sqlite3.Error as e:
            raise ValueError(f"cannot open the SQLite store {self.path}: {e}") from e
        try:
            db.execute("BEGIN IMMEDIATE")  # waits (busy_timeout) for another process creating it
            new = db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None
            for statement in SCHEMA:
                db.execute(statement)
            if new:
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            # files written before token ids (llm_calls) or metadata.other (tapes) were kept
            for table, columns in ADDED_COLUMNS.items():
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                for name, kind in columns.items():
                    if name not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            db.execute("COMMIT")
        finally:
            db.close()
        self._read = self._connect()
        self._read_lock = threading.Lock()
        self._start_writer()

    @property
    def address(self) -> str:
        """The file's path: what another process passes to ``open_store``."""
        return self.path

    def _connect(self) -> sqlite3.Connection:
        # switching a new file to WAL answers "database is locked" at once, without waiting,
        # while another process does the same: several processes opening one new file retry
        deadline = time.monotonic() + 30
        while True:
            try:
                db = connect(self.path, PAGE_SIZE)
                db.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; commits need no fsync each
                return db
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _writer_connect(self) -> sqlite3.Connection:
        conn = self._connect()
        # checkpoint the WAL every ~16 MB rather than SQLite's default of 1000 pages (~4 MB with
        # 4 KiB pages): each checkpoint syncs the file, and at thousands of steps per second
        # (with token ids) the default made the writer wait on the disk several times a second
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_BYTES // page_size}")
        return conn

    def _writer_close(self, conn: sqlite3.Connection) -> None:
        conn.close()

    def _close_readers(self) -> None:
        with self._read_lock:
            self._read.close()

    def _transaction(
        self, conn: sqlite3.Connection, statements: list[tuple[str, list[tuple[Any, ...]]]]
    ) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, rows in statements:
                conn.executemany(sql, rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return self._read.execute(sql, tuple(args)).fetchall()
