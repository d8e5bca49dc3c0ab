"""A persistent cache in front of any LLM: the same prompt with the same settings is answered
from disk. Useful for re-running evaluations, for resuming interrupted node runs exactly, and
for tests that should not pay for a model twice. A plain wrapper: no global switch."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import PrivateAttr

from tapekit._sqlite import connect
from tapekit.core import LLMOutput, Prompt
from tapekit.llm.base import LLMEvent
from tapekit.llm.wrapper import WrapperLLM


class CachedLLM(WrapperLLM):
    """Answers from ``path`` (an SQLite file; it may be the store's file) when the exact prompt
    was seen with the same model settings, otherwise asks ``llm`` and remembers the answer.

    The key covers the prompt's messages, tools and response schema and every setting of the
    wrapped LLM except secrets, so changing the temperature or the model misses the cache.
    ``hits`` and ``misses`` count what happened.
    """

    path: str = "tapekit.db"
    _hits: int = PrivateAttr(0)
    _misses: int = PrivateAttr(0)
    _db: sqlite3.Connection | None = PrivateAttr(None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def hits(self) -> int:
        """Calls answered from the cache."""
        return self._hits

    @property
    def misses(self) -> int:
        """Calls passed on to the wrapped LLM."""
        return self._misses

    def _conn(self) -> sqlite3.Connection:
        with self._lock:
            if self._db is None:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                db = connect(self.path)
                db.execute(
                    "CREATE TABLE IF NOT EXISTS llm_cache (key TEXT PRIMARY KEY, output TEXT NOT NULL, "
                    "prompt_tokens INTEGER, output_tokens INTEGER)"
                )
                self._db = db
            return self._db

    def key(self, prompt: Prompt) -> str:
        """The cache key of ``prompt`` for the wrapped LLM's current settings."""
        settings = self.llm.model_dump(mode="python", exclude={"api_key"})
        text = json.dumps(
            [type(self.llm).__name__, settings, prompt.content_key()], sort_keys=True, default=repr
        )
        return hashlib.sha256(text.encode()).hexdigest()

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        key = self.key(prompt)
        db = self._conn()
        with self._lock:
            row = db.execute(
                "SELECT output, prompt_tokens, output_tokens FROM llm_cache WHERE key = ?", (key,)
            ).fetchone()
        if row is not None:
            self._hits += 1
            output = LLMOutput.model_validate_json(row[0])
            yield LLMEvent(output=output, prompt_tokens=row[1], output_tokens=row[2])
            return
        self._misses += 1
        final: LLMEvent | None = None
        async for event in self.llm.astream(prompt):
            if event.output is not None:
                final = event
            yield event
        assert final is not None and final.output is not None
        with self._lock:
            db.execute(
                "INSERT OR REPLACE INTO llm_cache VALUES (?, ?, ?, ?)",
                (key, final.output.model_dump_json(), final.prompt_tokens, final.output_tokens),
            )
