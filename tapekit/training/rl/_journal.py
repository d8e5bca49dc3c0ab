"""The journal of an RL run: each step's token-exact training rows, small enough to commit, from
which a run whose checkpoints are gone (a new machine) is rebuilt without one rollout.

A checkpoint holds the weights and the optimiser (gigabytes for a full fine-tune) and lives on
the machine that wrote it. The journal holds what the weights were *computed from*: after step
``k``'s update, ``journal/step-<k>.json.gz`` records

- ``rows``: the step's samples exactly as the update read them (token ids, loss mask, sampling
  log-probs, reward, group columns),
- ``record``: the step's log line (:meth:`~tapekit.training.rl.RLStepRecord.to_log`) and the
  run's ``seconds`` at that step,
- ``sampler``, ``torch_rng``, ``python_rng``: the task sampler's and the RNGs' states after the
  step (what a checkpoint stores beside the weights),
- ``weights``: a digest of the trainable weights after the update.

An entry is written atomically (temporary file, then ``rename``) before the step's checkpoint,
so a kill leaves every completed step either in the checkpoint or in the journal, or both.

Replay: from the newest checkpoint (or the initial model when there is none), every later entry
is applied in order: the same update on the same rows (no rollout, no environment), then the
entry's sampler and RNG states. Because a step's update is a deterministic function of the
weights, the optimiser state and the rows (on one device type, with the same thread count and
library versions), the replayed weights equal the journaled digest bit for bit; a mismatch stops
the replay with :class:`~tapekit.training.TrainingError` rather than continue from weights that
are not the run's. About a quarter to half of a CPU step is its update, so a run rebuilt from
its journal costs that share of its steps.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

JOURNAL = "journal"


@dataclass
class JournalEntry:
    """One step of the journal (``step``: steps done after it; see the module docstring). The
    fields are in the order they are written, the rows last."""

    step: int
    weights: str
    attempt: int
    refused: int
    seconds: float
    record: dict[str, Any]
    sampler: dict[str, Any]
    torch_rng: list[int]
    python_rng: list[Any]
    rows: list[dict[str, Any]]

    def restore_rng(self) -> None:
        """Put back the torch and Python RNG states recorded after this step."""
        import torch

        from tapekit.training.rl._checkpoint import restore_rng

        restore_rng(
            {"torch_rng": torch.tensor(self.torch_rng, dtype=torch.uint8), "python_rng": self.python_rng}
        )


def weights_digest(model: Any) -> str:
    """SHA-256 (first 16 hex digits) of the trainable parameters' bytes, in parameter order."""
    import torch

    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()[:16]


def _path(out: Path, step: int) -> Path:
    return out / JOURNAL / f"step-{step:06d}.json.gz"


def write_entry(out: str | Path, entry: JournalEntry) -> Path:
    """Write ``entry`` atomically as ``out/journal/step-<entry.step>.json.gz``."""
    path = _path(Path(out), entry.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {f.name: getattr(entry, f.name) for f in fields(entry)}
    data["rows"] = [_plain(row) for row in entry.rows]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as raw:
        # mtime=0: the same entry gives the same bytes (a committed journal diffs cleanly)
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(json.dumps(data, separators=(",", ":")).encode())
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, path)
    return path


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A training row with plain JSON values (tensors and NumPy arrays as lists)."""
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in row.items()}


def read_entry(path: str | Path) -> JournalEntry:
    """The entry in ``path`` (a ``step-<k>.json.gz`` file)."""
    with gzip.open(path, "rb") as f:
        data = json.loads(f.read())
    return JournalEntry(**data)


def entries_after(out: str | Path, step: int) -> Iterator[JournalEntry]:
    """The journal's entries for the steps after ``step`` steps, in order, as long as they run
    on without a gap (a later entry after a gap belongs to no state this run can reach)."""
    nxt = step + 1
    while (path := _path(Path(out), nxt)).is_file():
        yield read_entry(path)
        nxt += 1


def rng_states() -> tuple[list[int], list[Any]]:
    """The torch and Python RNG states now, JSON-ready."""
    import torch

    version, internal, gauss = random.getstate()
    return torch.get_rng_state().tolist(), [version, list(internal), gauss]
