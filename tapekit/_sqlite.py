"""How tapekit opens SQLite files: one place for the settings that let several threads and
processes share a file (WAL journal, a generous busy timeout, autocommit)."""

from __future__ import annotations

import sqlite3


def connect(path: str) -> sqlite3.Connection:
    """A connection to ``path`` that waits for other writers instead of failing at once."""
    db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=30000")
    return db
