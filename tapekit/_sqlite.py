"""How tapekit opens SQLite files: one place for the settings that let several threads and
processes share a file (WAL journal, a generous busy timeout, autocommit)."""

from __future__ import annotations

import sqlite3


def connect(path: str, page_size: int | None = None) -> sqlite3.Connection:
    """A connection to ``path`` that waits for other writers instead of failing at once.

    ``page_size`` (a power of two from 512 to 65,536) applies to a file this call creates; an
    existing file keeps its own (SQLite reads it from the file)."""
    db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
    if page_size is not None:
        if page_size not in {2**k for k in range(9, 17)}:
            db.close()
            raise ValueError(f"page_size must be a power of two from 512 to 65536, not {page_size!r}")
        db.execute(f"PRAGMA page_size={page_size}")  # before WAL mode, which writes the header
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=30000")
    return db
