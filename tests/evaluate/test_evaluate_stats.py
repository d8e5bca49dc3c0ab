"""tapekit.evaluate's statistics: bootstrap means, paired differences, exact McNemar, exact
intervals where the bootstrap degenerates, Student's t, and differences over training seeds."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tapekit.evaluate import (
    Estimate,
    EvalReport,
    JsonReport,
    SampleResult,
    Score,
    SeedPairedDifference,
    bootstrap_mean,
    clopper_pearson,
    mcnemar_exact,
    paired_difference,
    seed_paired_difference,
    student_t_interval,
    student_t_quantile,
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


# --------------------------------------------------------------------------- defaults and speed


def test_every_bootstrap_defaults_to_ten_thousand_resamples() -> None:
    import inspect

    from tapekit.evaluate import aevaluate, arescore, evaluate, rescore

    for fn in (bootstrap_mean, paired_difference, seed_paired_difference):
        assert inspect.signature(fn).parameters["n_resamples"].default == 10_000
    for fn in (evaluate, aevaluate, rescore, arescore):
        assert inspect.signature(fn).parameters["n_bootstrap"].default == 10_000
    assert EvalReport().n_bootstrap == 10_000  # the form filler's GREADTH: tests/examples


def test_ten_thousand_resamples_of_a_few_hundred_items_are_seeded() -> None:
    """(Their speed, ~0.5 s for the three on 2 cores, is a benchmark's business, not a test's: a
    timed assertion failed under load.)"""
    rng = random.Random(5)
    passed = [float(rng.random() < 0.4) for _ in range(400)]
    other = [float(rng.random() < 0.5) for _ in range(400)]
    scores = [rng.random() for _ in range(300)]  # continuous: every value distinct
    binary = bootstrap_mean(passed)
    diff = paired_difference(passed, other, [i % 4 for i in range(400)])
    continuous = bootstrap_mean(scores)
    assert (binary, diff, continuous) == (
        bootstrap_mean(passed),
        paired_difference(passed, other, [i % 4 for i in range(400)]),
        bootstrap_mean(scores),
    )
    assert bootstrap_mean(scores, seed=1) != continuous


def test_the_bootstrap_of_pass_fail_outcomes_has_the_binomial_quantiles() -> None:
    # 30 of 100 pass: a resampled mean is Binomial(100, 0.3)/100, whose 2.5 % and 97.5 %
    # quantiles are 0.21 and 0.39; 10,000 resamples land on them
    est = bootstrap_mean([1.0] * 30 + [0.0] * 70)
    assert est.value == pytest.approx(0.3)
    assert est.low == pytest.approx(0.21, abs=0.0101) and est.high == pytest.approx(0.39, abs=0.0101)
    # differences of 20 wins, 10 losses and 70 ties: sd of the mean sqrt((0.3 - 0.01)/100)
    d = paired_difference([1.0] * 20 + [0.0] * 80, [0.0] * 20 + [1.0] * 10 + [0.0] * 70)
    half = 1.96 * math.sqrt(0.29 / 100)
    assert d.value == pytest.approx(0.1)
    assert d.low == pytest.approx(0.1 - half, abs=0.015) and d.high == pytest.approx(0.1 + half, abs=0.015)


def test_continuous_values_have_the_normal_width() -> None:
    rng = random.Random(11)
    values = [rng.random() for _ in range(400)]
    mean = sum(values) / 400
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 400)
    est = bootstrap_mean(values)
    assert est.low == pytest.approx(mean - 1.96 * sd / 20, abs=0.004)
    assert est.high == pytest.approx(mean + 1.96 * sd / 20, abs=0.004)


# --------------------------------------------------------------------------- exact intervals


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.3085),  # 1 − 0.025^(1/10)
        (20, 20, 0.8316, 1.0),  # 0.025^(1/20)
        (3, 10, 0.0667, 0.6525),
        (50, 100, 0.3983, 0.6017),
        (1, 1, 0.025, 1.0),
    ],
)
def test_clopper_pearson_known_values(k: int, n: int, low: float, high: float) -> None:
    est = clopper_pearson(k, n)
    assert est.value == pytest.approx(k / n)
    assert (est.low, est.high) == pytest.approx((low, high), abs=1e-4)


def test_clopper_pearson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        clopper_pearson(1, 10, confidence=1.0)


def test_all_fail_or_all_pass_gets_the_exact_interval_not_zero_width() -> None:
    none = bootstrap_mean([0.0] * 10)
    assert none.value == 0.0 and none.low == 0.0 and none.high == pytest.approx(0.3085, abs=1e-4)
    every = bootstrap_mean([True] * 20)  # bools are pass/fail too
    assert every.value == 1.0 and every.high == 1.0 and every.low == pytest.approx(0.8316, abs=1e-4)
    assert bootstrap_mean([1.0] * 20, confidence=0.9).low == pytest.approx(0.05 ** (1 / 20))
    assert bootstrap_mean([0.0] * 10, n_resamples=0) == Estimate(value=0.0, low=0.0, high=0.0)
    assert bootstrap_mean([0.5] * 10) == Estimate(value=0.5, low=0.5, high=0.5)  # not pass/fail


def test_paired_pass_fail_with_no_discordant_pair_is_bounded_by_the_discordant_rate() -> None:
    a = [1.0] * 6 + [0.0] * 4
    d = paired_difference(a, list(a))
    u = 1 - 0.025 ** (1 / 10)
    assert d.value == 0.0 and (d.low, d.high) == pytest.approx((-u, u))
    assert d.high == pytest.approx(0.3085, abs=1e-4)


def test_paired_pass_fail_all_one_way_gets_two_l_minus_one() -> None:
    win = paired_difference([1.0] * 20, [0.0] * 20)
    assert win.value == 1.0 and win.high == 1.0 and win.low == pytest.approx(2 * 0.8316 - 1, abs=2e-4)
    loss = paired_difference([0.0] * 20, [1.0] * 20, ["x"] * 10 + ["y"] * 10)
    assert loss.value == -1.0 and loss.low == -1.0 and loss.high == pytest.approx(1 - 2 * 0.8316, abs=2e-4)


# --------------------------------------------------------------------------- Student's t


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 4, 2.776),
        (0.975, 30, 2.042),
        (0.95, 10, 1.812),
        (0.995, 5, 4.032),
    ],
)
def test_student_t_quantiles_match_the_table(p: float, df: int, expected: float) -> None:
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=5e-4)
    assert student_t_quantile(1 - p, df) == pytest.approx(-expected, abs=5e-4)


def test_student_t_interval_needs_two_values() -> None:
    est = student_t_interval([-0.175, -0.1375, -0.100])
    half = 4.3027 * 0.0375 / math.sqrt(3)
    assert (est.value, est.low, est.high) == pytest.approx(
        (-0.1375, -0.1375 - half, -0.1375 + half), abs=1e-4
    )
    with pytest.raises(ValueError, match="undefined"):
        student_t_interval([0.3])


# --------------------------------------------------------------------------- training seeds


def _seeds(per_seed: dict[int, list[tuple[str, float, float]]]) -> dict[int, dict[str, tuple[float, float]]]:
    return {s: {item: (a, b) for item, a, b in rows} for s, rows in per_seed.items()}


def test_seed_paired_difference_by_hand() -> None:
    # three seeds, four items in two tasks, every item in every seed (balanced)
    pairs = _seeds(
        {
            0: [("x/1", 1, 0), ("x/2", 1, 1), ("y/1", 0, 0), ("y/2", 1, 0)],  # +0.50
            1: [("x/1", 1, 0), ("x/2", 0, 1), ("y/1", 0, 0), ("y/2", 1, 1)],  # 0.00
            2: [("x/1", 1, 1), ("x/2", 1, 0), ("y/1", 1, 0), ("y/2", 1, 0)],  # +0.75
        }
    )
    d = seed_paired_difference(pairs, strata=lambda item: str(item).split("/")[0])
    assert isinstance(d, SeedPairedDifference)
    assert d.value == pytest.approx(1.25 / 3)
    assert d.per_seed == pytest.approx({"0": 0.5, "1": 0.0, "2": 0.75})
    assert (d.n_seeds, d.n_items, d.n_pairs, d.df) == (3, 4, 12, 2)
    sd = math.sqrt(((0.5 - 1.25 / 3) ** 2 + (1.25 / 3) ** 2 + (0.75 - 1.25 / 3) ** 2) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert d.seed_low == pytest.approx(1.25 / 3 - half) and d.seed_high == pytest.approx(1.25 / 3 + half)
    t = (1.25 / 3) / (sd / math.sqrt(3))  # t = 1.8898 on 2 df: two-sided p = 0.1994
    assert t == pytest.approx(1.8898, abs=1e-4) and d.seed_p == pytest.approx(0.1994, abs=1e-4)
    # item bootstrap: the items' seed-averaged differences are x/1 2/3, x/2 0, y/1 1/3, y/2 2/3
    # (mean 5/12); resampled within tasks x and y, the mean lies in [(0 + 0 + 1/3 + 1/3)/4, 2/3]
    assert 1 / 6 - 1e-12 <= d.item_low < d.value < d.item_high <= 2 / 3 + 1e-12
    assert d.item_interval() == Estimate(value=d.value, low=d.item_low, high=d.item_high)
    assert d.seed_interval() == Estimate(value=d.value, low=d.seed_low, high=d.seed_high)
    assert "seeds" in str(d) and d == seed_paired_difference(pairs, strata=lambda i: str(i).split("/")[0])


def test_the_item_bootstrap_resamples_items_not_seed_item_pairs() -> None:
    # item "a" always gains 1 in every seed, item "b" never: with items as the unit and
    # strata {a}, {b} the resampled mean is fixed at 0.5; every seed says +0.5, so the
    # seed-level interval is [0.5, 0.5] too and the t p-value is 0
    pairs = _seeds({s: [("a", 1, 0), ("b", 0, 0)] for s in range(4)})
    d = seed_paired_difference(pairs, strata={"a": "a", "b": "b"})
    assert (d.value, d.item_low, d.item_high) == pytest.approx((0.5, 0.5, 0.5))
    assert (d.seed_low, d.seed_high, d.seed_p) == pytest.approx((0.5, 0.5, 0.0))
    loose = seed_paired_difference(pairs)
    assert loose.item_low < 0.5 < loose.item_high  # unstratified: 0/2, 1/2 or 2/2 gains
    with pytest.raises(ValueError, match="no stratum for item 'b'"):
        seed_paired_difference(pairs, strata={"a": "a"})


def test_one_seed_leaves_the_seed_interval_undefined() -> None:
    d = seed_paired_difference({7: {"a": (1.0, 0.0), "b": (1.0, 1.0), "c": (0.0, 0.0)}})
    assert d.value == pytest.approx(1 / 3) and d.per_seed == {"7": pytest.approx(1 / 3)}
    assert d.seed_low is None and d.seed_high is None and d.seed_p is None and d.seed_interval() is None
    assert "undefined with one seed" in str(d)
    with pytest.raises(ValueError, match="no scored item"):
        seed_paired_difference({0: {"a": (1.0, 0.0)}, 1: {}})
    with pytest.raises(ValueError, match="empty"):
        seed_paired_difference({})


def test_an_unbalanced_design_weighs_every_seed_alike() -> None:
    # seed 1 scored twice as many items; the estimate is the mean of the seeds' means, not of
    # the pooled pairs (pooled: (4 + 0 + 4)/16 = 0.5; per seed: (1.0 + 0.0 + 1.0)/3 = 2/3)
    pairs = {
        0: {f"t/{i}": (1.0, 0.0) for i in range(4)},
        1: {f"t/{i}": (1.0, 1.0) for i in range(8)},
        2: {f"t/{i}": (1.0, 0.0) for i in range(4)},
    }
    d = seed_paired_difference(pairs)
    assert d.value == pytest.approx(2 / 3) and (d.n_items, d.n_pairs) == (8, 16)
    # items t/0-3 contribute (1/4 + 0/8 + 1/4)/3 = 1/6 each, t/4-7 nothing: resampling within
    # the two presence patterns keeps the estimate at 2/3 in every resample
    assert (d.item_low, d.item_high) == pytest.approx((2 / 3, 2 / 3))


def test_seed_pairs_all_tied_or_all_one_way_get_the_exact_item_bound() -> None:
    tied = seed_paired_difference(
        {s: {f"i{j}": (float(j % 2), float(j % 2)) for j in range(10)} for s in range(3)}
    )
    u = 1 - 0.025 ** (1 / 10)  # ten items (not thirty pairs)
    assert tied.value == 0.0 and (tied.item_low, tied.item_high) == pytest.approx((-u, u))
    won = seed_paired_difference({s: {f"i{j}": (1.0, 0.0) for j in range(20)} for s in range(2)})
    assert won.item_high == 1.0 and won.item_low == pytest.approx(2 * 0.8316 - 1, abs=2e-4)


def test_seed_variance_is_what_pooling_hides() -> None:
    # the 360 s web study's sft_rl − sft per-seed means: −0.175, −0.1375, −0.100; with the seed
    # as the unit p ≈ 0.02 (pooled McNemar on the 320 pairs said 3·10⁻⁵)
    rng = random.Random(0)
    per_seed = {0: -0.175, 1: -0.1375, 2: -0.100}
    pairs: dict[int, dict[str, tuple[float, float]]] = {}
    for s, mean in per_seed.items():
        n = 80
        losses = round(-mean * n)
        order = list(range(n))
        rng.shuffle(order)
        pairs[s] = {
            f"t{i % 4}/{i}": (0.0, 1.0) if rank < losses else (1.0, 1.0) for rank, i in enumerate(order)
        }
    d = seed_paired_difference(pairs, strata=lambda item: str(item).split("/")[0])
    assert d.value == pytest.approx(-0.1375)
    assert d.seed_p == pytest.approx(0.0239, abs=5e-4)
    assert d.seed_low == pytest.approx(-0.1375 - 4.3027 * 0.0375 / math.sqrt(3), abs=1e-4)
    assert d.seed_high < 0 and d.item_high < 0
    assert d.seed_high - d.seed_low > 1.5 * (d.item_high - d.item_low)  # the seeds spread it more
    pooled = [pair for seed in pairs.values() for pair in seed.values()]
    assert mcnemar_exact([a > 0 for a, _ in pooled], [b > 0 for _, b in pooled]) < 1e-6
