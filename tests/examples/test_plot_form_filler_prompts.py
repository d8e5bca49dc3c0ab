"""scripts/plot_form_filler_prompts.py: the table and the picture of the form-filler prompt
study, from a small made-up record in the study's own format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.examples._commands import load_script

CRITERIA = ("grounded", "responsive", "accurate", "disciplined", "transparent", "helpful")


def candidate(passes: int, tokens: float, by_default: int) -> dict[str, object]:
    turns = 10
    return {
        "greadth": {"value": passes / turns, "low": 0.0, "high": min(1.0, passes / turns + 0.2)},
        "criteria": dict.fromkeys(CRITERIA, 0.5),
        "passes": passes,
        "turns": turns,
        "prompt_tokens_per_turn": tokens,
        "output_tokens_per_turn": 40.0,
        "seconds_per_turn": 3.25,
        "pass_sources": {
            "greadth": {"passed": passes, "all_decided": passes - by_default, "some_default": by_default}
        },
    }


def test_table_and_picture_before_and_after_the_test(tmp_path: Path) -> None:
    script = load_script("plot_form_filler_prompts")
    with pytest.raises(SystemExit, match=r"no validation\.json"):
        script.main([str(tmp_path), "--to", str(tmp_path / "out")])
    validation = {"candidates": {"grammar": candidate(1, 400, 1), "grammar + 4": candidate(4, 2000, 3)},
                  "chosen": "grammar + 4"}  # fmt: skip
    (tmp_path / "validation.json").write_text(json.dumps(validation))
    script.main([str(tmp_path), "--to", str(tmp_path / "out")])
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| validation | grammar + 4 (chosen) | 4 / 10 | 40.0 [0.0, 60.0] |" in text
    assert "3 of 4 | 2000 | 40 | 3.2 |" in text and "test (fresh)" not in text
    test = {
        "chosen": "grammar + 4",
        "candidates": {"grammar": candidate(0, 410, 0), "grammar + 4": candidate(2, 2100, 2)},
        "difference": {"a": "grammar + 4", "b": "grammar", "metric": "greadth", "n": 10,
                       "difference": {"value": 0.2, "low": 0.0, "high": 0.5}, "a_only": 2, "b_only": 0,
                       "p_value": 0.5},
    }  # fmt: skip
    (tmp_path / "test.json").write_text(json.dumps(test))
    script.main([str(tmp_path), "--to", str(tmp_path / "out")])
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| test (fresh) | grammar | 0 / 10 | 0.0 [0.0, 20.0] |" in text
    assert "grammar + 4 − grammar (GREADTH, paired over the same 10 turns): +20.0 points [+0.0, +50.0]; " \
        "2 turns won, 0 lost; exact McNemar p = 0.5" in text  # fmt: skip
    assert (tmp_path / "out" / "candidates.png").stat().st_size > 5_000
