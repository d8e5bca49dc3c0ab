"""The data trace of a run (``trace_data``): each process appends a hash of every sample it
trained on and, at the end, a hash of its weights, so a test can check that data-parallel ranks
saw disjoint samples and ended equal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def sample_hash(ids: Sequence[int]) -> str:
    """A short content hash of one sample's token ids (what the data trace records)."""
    return hashlib.sha256(json.dumps(list(map(int, ids))).encode()).hexdigest()[:16]


def weights_hash(model: Any) -> str:
    """A hash of every trainable parameter's values (equal across data-parallel ranks)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().round(6).tobytes())
    return digest.hexdigest()[:16]


class Trace:
    """Appends JSON lines to ``output_dir/trace-rank<R>.jsonl`` (one file per process)."""

    def __init__(self, output_dir: str, rank: int) -> None:
        self.path = Path(output_dir) / f"trace-rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        """Add one record."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
