"""scripts/plot_web_prompts.py: the tables and the picture of the web prompt study, from its
figures file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.examples._commands import load_script


def row(
    variant: str, success: float, per_task: dict[str, float], tokens: float, demos: int
) -> dict[str, object]:
    return {
        "id": variant,
        "variant": variant,
        "success": success,
        "per_task": per_task,
        "prompt_tokens_per_episode": tokens,
        "output_tokens_per_episode": 12.0,
        "seconds_per_episode": 2.5,
        "demos": demos,
    }


def test_tables_and_picture_of_a_small_run(tmp_path: Path) -> None:
    script = load_script("plot_web_prompts")
    with pytest.raises(SystemExit, match="no figures"):
        script.main([str(tmp_path), "--to", str(tmp_path / "out")])
    figures = {
        "args": {"val_seeds": "4"},
        "validation": [
            row("baseline (zero-shot, rationale)", 0.25, {"a": 0.5, "b": 0.0}, 300, 0),
            row("nearest-1", 0.625, {"a": 1.0, "b": 0.25}, 700, 12),
        ],
        "tested": {"zero_shot": "baseline", "demos": "nearest-1"},
        "test": {
            "summary": {"test": {"difference": 0.3, "low": 0.1, "high": 0.5}},
            "test/zero_shot": {
                "variant": "baseline",
                "success": 0.2,
                "low": 0.1,
                "high": 0.3,
                "episodes": 40,
                "prompt_tokens_per_episode": 310,
            },
            "test/demos": {
                "variant": "nearest-1",
                "success": 0.5,
                "low": 0.35,
                "high": 0.65,
                "episodes": 40,
                "prompt_tokens_per_episode": 720,
            },
        },
    }
    (tmp_path / "figures.json").write_text(json.dumps(figures))
    script.main([str(tmp_path), "--to", str(tmp_path / "out")])
    text = (tmp_path / "out" / "prompts.md").read_text()
    assert "| baseline (zero-shot, rationale) | 2/8 [0.03, 0.65] | 300 |" in text  # exact interval
    assert "| nearest-1 | 5/8 [" in text and "| 4/4 | 1/4 |" in text  # per task, of 4 seeds
    assert "- test: demos − zero-shot +0.300 [+0.100, +0.500]" in text
    assert (tmp_path / "out" / "prompts.png").stat().st_size > 10_000
