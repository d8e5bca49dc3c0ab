"""Where tapes and LLM calls live: SQLite by default (one file, WAL, batched writes), PostgreSQL
for many processes on many machines, memory for tests and short scripts. All three implement
:class:`TapeStore`, the interface to type a store parameter with and to subclass for another
backend (:mod:`tapekit.testing.store_conformance` checks one); :func:`open_store` picks SQLite
or PostgreSQL from a path or a ``postgresql://`` URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapekit.store.base import StoreWriteError, TapeFilter, TapeInfo, TapeNotFoundError, TapeStore, Totals
from tapekit.store.memory import MemoryStore
from tapekit.store.postgres import PostgresStore
from tapekit.store.sqlite import SQLiteStore

__all__ = [
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "StoreWriteError",
    "TapeFilter",
    "TapeInfo",
    "TapeNotFoundError",
    "TapeStore",
    "Totals",
    "open_store",
]


def open_store(url_or_path: str | Path, **options: Any) -> TapeStore:
    """The store at ``url_or_path``: a ``postgresql://`` or ``postgres://`` URL opens a
    :class:`PostgresStore`, anything else is the path of an SQLite file (:class:`SQLiteStore`).
    ``options`` go to the store (``batch_size``, ``flush_interval_s``)."""
    if isinstance(url_or_path, str) and url_or_path.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url_or_path, **options)
    if not isinstance(url_or_path, str | Path):
        raise TypeError(f"open_store needs a path or a postgresql:// URL, not {type(url_or_path).__name__}")
    return SQLiteStore(url_or_path, **options)
