"""What a batch reports: one :class:`BatchResult` per input tape, live :class:`BatchStats`, and
the ids and tags under which a batch stores its tapes."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from tapekit.core import Tape


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What became of one input tape.

    ``index`` is its position in the input, ``start_id`` the input tape's id and ``tape_id``
    the id it is stored under (:func:`batch_tape_id`; the same whether or not there is a store).
    ``tape`` is the final tape (its ``metadata.id`` is ``tape_id`` and its ``parent_id`` the
    start id, as stored) and ``error`` its ``metadata.error``. ``skipped``: it was already
    done in the store and was not run; ``resumed``: it was continued from its stored steps.
    ``external``: the loop stopped on an action that waits on the outside world. The counters
    are this run's LLM calls and tokens for the tape (0 when skipped).
    """

    index: int
    start_id: str
    tape_id: str
    tape: Tape[Any, Any]
    error: str | None = None
    skipped: bool = False
    resumed: bool = False
    external: bool = False
    llm_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        """True when the tape finished without an error."""
        return self.error is None


@dataclass
class BatchStats:
    """Live counters of a running batch, for progress displays: pass one as ``stats=``.

    ``finished`` counts every tape that has a result (``failed`` and ``skipped`` included);
    the token counters cover the LLM calls made by this run.
    """

    total: int = 0
    finished: int = 0
    failed: int = 0
    skipped: int = 0
    resumed: int = 0
    running: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the batch started."""
        return time.monotonic() - self.started_at

    @property
    def llm_calls_per_s(self) -> float:
        """LLM calls completed per second so far."""
        return self.llm_calls / max(self.elapsed_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        """Prompt plus output tokens per second so far."""
        return (self.prompt_tokens + self.output_tokens) / max(self.elapsed_s, 1e-9)

    def _count(self, result: BatchResult) -> None:
        self.finished += 1
        self.failed += result.error is not None
        self.skipped += result.skipped
        self.resumed += result.resumed


def batch_tape_id(name: str, start_id: str) -> str:
    """The id under which batch ``name`` stores the run of the tape whose id is ``start_id``.

    It depends on the batch name, so two batches over the same tapes (two agents compared on
    one task set, say) keep separate results in one store.
    """
    return hashlib.sha256(f"tapekit-batch\0{name}\0{start_id}".encode()).hexdigest()[:32]


def batch_tags(name: str) -> tuple[str, str, str]:
    """The store tags of batch ``name``: every tape it started, the finished ones, the failed ones."""
    return f"batch:{name}", f"batch:{name}:done", f"batch:{name}:failed"
