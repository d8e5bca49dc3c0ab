"""scripts/plot_sweep.py: the picture and the table of a sweep, from its results file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tapekit.training import config_grid, run_sweep
from tests.examples._commands import load_script


def test_the_picture_and_the_table_of_a_synthetic_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "sweep.jsonl"
    space = {"lr": [1e-4, 2e-4, 5e-4], "temperature": [0.5, 1.0], "kl": [0.0, 0.05]}
    truth = {1e-4: 0.4, 2e-4: 0.6, 5e-4: 0.3}

    def run(config: dict[str, float], seed: int) -> dict[str, float]:
        return {
            "val_success": truth[config["lr"]]
            + random.Random(hash((config["lr"], config["kl"], seed))).gauss(0, 0.05)
        }

    run_sweep(run, config_grid(space), [0, 1], results)
    script = load_script("plot_sweep")
    with pytest.raises(SystemExit, match="no such results file"):
        script.main([str(tmp_path / "missing.jsonl"), "--metric", "val_success", "--to", str(tmp_path)])
    pytest.importorskip("matplotlib")  # in the dev extra
    out = tmp_path / "picture"
    assert script.main([str(results), "--metric", "val_success", "--to", str(out), "--resamples", "500"]) == 0
    assert (out / "sweep.png").stat().st_size > 20_000
    table = (out / "sweep.txt").read_text()
    assert table.startswith("best val_success (higher is better; 500 resamples") and "lr=0.0002" in table
    assert table in capsys.readouterr().out


def test_each_configuration_against_its_starting_model(tmp_path: Path) -> None:
    """scripts/sweep_vs_baseline.py: mean change per configuration, a seed-level t interval."""
    import json

    from tapekit.evaluate import student_t_interval

    values = {(1e-4, 0): 0.50, (1e-4, 1): 0.60, (1e-4, 2): 0.58, (5e-4, 0): 0.30}

    def run(config: dict[str, float], seed: int) -> dict[str, float]:
        return {"val_success": values[(config["lr"], seed)]}

    run_sweep(run, [{"lr": 1e-4}], [0, 1, 2], tmp_path / "sweep.jsonl")
    run_sweep(run, [{"lr": 5e-4}], [0], tmp_path / "sweep.jsonl")
    script = load_script("sweep_vs_baseline")
    with pytest.raises(SystemExit, match=r"no baseline\.json"):
        script.main([str(tmp_path)])
    (tmp_path / "baseline.json").write_text(json.dumps({"val_success": 0.5}))
    assert script.main([str(tmp_path)]) == 0
    rows = [
        line for line in (tmp_path / "vs_baseline.md").read_text().splitlines() if line.startswith("| lr")
    ]
    ci = student_t_interval([0.0, 0.1, 0.08])
    assert rows == [
        f"| lr=0.0001 | 3 | 0.560 | +0.060 | [{ci.low:+.3f}, {ci.high:+.3f}] |",
        "| lr=0.0005 | 1 | 0.300 | -0.200 | (one seed) |",
    ]
