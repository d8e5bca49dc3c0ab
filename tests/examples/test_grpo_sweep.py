"""examples/grpo_sweep.py --quick: two GRPO configurations x one seed on the math task, each a
row of the results file, the analysis and the picture; the same command again runs nothing,
and a resume from another student's weights, from none, or a full sweep in the quick sweep's folder is
refused."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tapekit.training import read_sweep
from tests.examples._commands import run

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "datasets")),
    reason="the sweep trains (the train extra)",
)


def test_quick_sweep_runs_two_configurations_resumes_and_draws_its_picture(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = run("examples/grpo_sweep.py", "--quick", "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_sweep(out / "sweep.jsonl")
    assert len(rows) == 2 and [r.error for r in rows] == [None, None]
    assert len({tuple(sorted(r.config)) for r in rows}) == 1 and rows[0].config != rows[1].config
    for row in rows:
        assert set(row.config) == {"learning_rate", "temperature", "group_size", "kl_coef"}
        assert row.metrics["steps"] == 2 and 0.0 <= row.metrics["val_success"] <= 1.0
        where = out / "runs" / grpo_run_name(row.config, row.seed)
        assert (where / "rl_log.jsonl").is_file() and not (where / "rollouts.db").exists()
    assert "2 configuration(s) with a single run" in proc.stdout
    assert (out / "sweep.txt").read_text().startswith("best val_success (higher is better; 10,000 resamples")
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "sweep.png").stat().st_size > 10_000
    written = (out / "sweep.jsonl").read_bytes()
    again = run("examples/grpo_sweep.py", "--quick", "--out", str(out), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "row:" not in again.stdout and (out / "sweep.jsonl").read_bytes() == written
    other_student(out / "untrained-student")
    changed = run("examples/grpo_sweep.py", "--quick", "--out", str(out), timeout=900)
    assert changed.returncode != 0 and "other weights than the student" in changed.stderr
    assert (out / "sweep.jsonl").read_bytes() == written
    shutil.rmtree(out / "untrained-student")
    gone = run("examples/grpo_sweep.py", "--quick", "--out", str(out), timeout=900)
    assert gone.returncode != 0 and "is gone" in gone.stderr and not (out / "untrained-student").exists()
    full = run("examples/grpo_sweep.py", "--out", str(out), timeout=900)
    assert full.returncode != 0 and "other settings (n_val, steps, student)" in full.stderr


def other_student(path: Path) -> None:
    """The student at ``path`` with one weight changed, saved in its place (as a retrained
    student would be)."""
    import torch

    from tapekit.testing.tiny import load_tiny

    model, _ = load_tiny(path)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    model.save_pretrained(path)


def grpo_run_name(config: dict[str, object], seed: int) -> str:
    from examples.grpo_sweep import run_name

    return run_name(config, seed)
