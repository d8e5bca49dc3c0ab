"""Where tapes and LLM calls live: SQLite by default (one file, WAL, batched writes)."""

from tapekit.store.sqlite import SQLiteStore, Totals

__all__ = ["SQLiteStore", "Totals"]
