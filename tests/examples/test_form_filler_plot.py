"""scripts/plot_form_filler.py: the table and the picture of form-filler runs, from greadth.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.examples._commands import load_script


def _summary(value: float, invalid: int) -> dict[str, Any]:
    metrics = ["grounded", "responsive", "accurate", "disciplined", "transparent", "helpful", "greadth"]
    score = {"value": value, "low": value / 2, "high": min(1.0, value * 1.5)}
    return {"turns": 38, "invalid": invalid, "scores": dict.fromkeys(metrics, score)}


def test_table_and_picture_from_runs(tmp_path: Path) -> None:
    script = load_script("plot_form_filler")
    run = tmp_path / "test-run"
    run.mkdir()
    summary = {"teacher": _summary(1.0, 0), "student (tuned)": _summary(0.25, 12)}
    (run / "greadth.json").write_text(json.dumps({"split": "test", "summary": summary}))
    reports = [script.load(run)]
    text = script.table(reports)
    rows = [line for line in text.splitlines() if line.startswith("| test-run")]
    assert rows == [
        "| test-run | test | teacher | 38 | 0 | " + " | ".join(["100.0 [50.0, 100.0]"] * 7) + " |",
        "| test-run | test | student (tuned) | 38 | 12 | " + " | ".join(["25.0 [12.5, 37.5]"] * 7) + " |",
    ]
    with pytest.raises(SystemExit, match=r"no greadth\.json"):
        script.load(tmp_path / "missing")
    pytest.importorskip("matplotlib")  # in the dev extra
    script.plot(reports, tmp_path)
    assert (tmp_path / "criteria.png").stat().st_size > 10_000
