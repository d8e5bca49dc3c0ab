"""tapekit.evaluate's statistics: bootstrap means, paired differences, exact McNemar."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tapekit.evaluate import (
    Estimate,
    EvalReport,
    JsonReport,
    SampleResult,
    Score,
    bootstrap_mean,
    mcnemar_exact,
    paired_difference,
)


def test_bootstrap_mean_is_seeded_and_brackets_the_mean() -> None:
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    first = bootstrap_mean(values, 500, 0.95, seed=3)
    assert first == bootstrap_mean(values, 500, 0.95, seed=3)
    assert first.value == pytest.approx(5 / 8)
    assert 0.0 <= first.low < first.value < first.high <= 1.0
    assert bootstrap_mean([0.4]) == Estimate(value=0.4, low=0.4, high=0.4)
    assert math.isnan(bootstrap_mean([]).value)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_mean(values, confidence=1.5)


def test_a_paired_difference_resamples_pairs_not_systems() -> None:
    # b is a plus a constant: every resample of pairs has the same difference, so the
    # interval has zero width; resampling the two systems separately would not.
    a = [0.1, 0.9, 0.4, 0.7, 0.2, 0.8]
    b = [x - 0.25 for x in a]
    d = paired_difference(a, b, n_resamples=300)
    assert d.value == pytest.approx(0.25)
    assert d.low == pytest.approx(0.25) and d.high == pytest.approx(0.25)
    assert d.excludes_zero()
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1.0], [1.0, 0.0])


def test_a_stratified_bootstrap_keeps_each_stratum_size() -> None:
    # Task "x" always gains 1, task "y" never gains: any resample that keeps each stratum's
    # size has mean exactly 0.5; an unstratified one varies.
    a = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    b = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    strata = ["x", "x", "x", "y", "y", "y"]
    fixed = paired_difference(a, b, strata, n_resamples=300)
    assert (fixed.value, fixed.low, fixed.high) == pytest.approx((0.5, 0.5, 0.5))
    loose = paired_difference(a, b, n_resamples=300)
    assert loose.low < 0.5 < loose.high
    with pytest.raises(ValueError, match="strata has 2 labels for 6 pairs"):
        paired_difference(a, b, ["x", "y"])


def test_an_interval_that_holds_zero_is_no_win() -> None:
    d = paired_difference([1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], n_resamples=300)
    assert d.value == 0.0 and not d.excludes_zero()


@pytest.mark.parametrize(
    ("n10", "n01", "expected"),
    [
        (4, 0, 0.125),  # 4 of 38 against 0 of 38: the form filler's earlier "win"
        (0, 0, 1.0),
        (3, 3, 1.0),
        (10, 1, 2 * (1 + 11) / 2**11),
    ],
)
def test_exact_mcnemar_by_hand(n10: int, n01: int, expected: float) -> None:
    a = [True] * n10 + [False] * n01 + [True, False] * 5
    b = [False] * n10 + [True] * n01 + [True, False] * 5
    assert mcnemar_exact(a, b) == pytest.approx(expected)


def _report(passed: dict[str, list[bool]], categories: dict[str, str]) -> EvalReport:
    samples = [
        SampleResult(
            task_id=task,
            sample=i,
            category=categories[task],
            scores={"ok": Score(value=float(p), passed=p)},
        )
        for task, outcomes in passed.items()
        for i, p in enumerate(outcomes)
    ]
    return EvalReport(name="r", scorers=["ok"], k=len(next(iter(passed.values()))), samples=samples)


def test_reports_compare_paired_by_task() -> None:
    categories = {"t1": "easy", "t2": "easy", "t3": "hard", "t4": "hard"}
    new = _report(
        {"t1": [True, True], "t2": [True, False], "t3": [True, False], "t4": [False, False]}, categories
    )
    old = _report(
        {"t1": [True, False], "t2": [False, False], "t3": [False, False], "t4": [False, False]}, categories
    )
    d = new.compare(old)
    assert d.value == pytest.approx((0.5 + 0.5 + 0.5 + 0.0) / 4)
    assert d.low <= d.value <= d.high
    assert old.compare(new).value == pytest.approx(-d.value)
    fewer = _report({"t1": [True, True]}, {"t1": "easy"})
    with pytest.raises(ValueError, match="same tasks"):
        new.compare(fewer)


def test_a_json_report_saves_its_summary_as_valid_json_and_loads_back(tmp_path: Path) -> None:
    class Tiny(JsonReport):
        name: str
        values: list[float]

        def summary_data(self) -> dict[str, float]:
            return {"mean": sum(self.values) / len(self.values) if self.values else math.nan}

    path = Tiny(name="empty", values=[]).save(tmp_path / "r.json")
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))[
        "summary"
    ] == {"mean": None}
    assert Tiny.load(path) == Tiny(name="empty", values=[])
