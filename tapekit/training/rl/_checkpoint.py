"""Atomic checkpoints of an RL run: model, optimiser, task sampler, RNG states, step, history.

A checkpoint is written to a temporary directory, renamed into place (``ckpt-<step>``, one
``rename``), and only then named by ``latest.json`` (written to a temporary file and renamed
over the old one). A kill at any moment leaves either the previous checkpoint or the new one
as the latest, never a half-written one; leftovers are removed on the next save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LATEST = "latest.json"


@dataclass
class RLCheckpoint:
    """What a resumed run continues from (``meta``: step, policy version, history, ...)."""

    path: Path
    meta: dict[str, Any]
    state: dict[str, Any]
    sampler: dict[str, Any]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    out: str | Path, step: int, model: Any, optimizer: Any, sampler: Any, meta: dict[str, Any]
) -> Path:
    """Write the checkpoint of the run after ``step`` steps; returns its directory."""
    import torch

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"ckpt-{step:06d}"
    tmp = root / f".ckpt-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    torch.save(state, tmp / "state.pt")
    _write_json(tmp / "sampler.json", sampler.state_dict())
    _write_json(tmp / "meta.json", {**meta, "step": step})
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _write_json(root / LATEST, {"checkpoint": final.name, "step": step})
    for old in root.glob("ckpt-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".ckpt-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def load_latest(out: str | Path) -> RLCheckpoint | None:
    """The latest complete checkpoint under ``out`` (None when there is none)."""
    import torch

    root = Path(out)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    name = json.loads(pointer.read_text())["checkpoint"]
    path = root / name
    if not (path / "meta.json").is_file():
        raise FileNotFoundError(f"{pointer} names {path}, which is not a complete checkpoint")
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    meta = json.loads((path / "meta.json").read_text())
    sampler = json.loads((path / "sampler.json").read_text())
    return RLCheckpoint(path, meta, state, sampler)


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the torch and Python RNG states of a checkpoint."""
    import torch

    torch.set_rng_state(state["torch_rng"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
