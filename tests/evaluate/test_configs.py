"""tapekit.evaluate.bootstrap_configs on synthetic sweeps with a known answer: a metric that
depends on the learning rate and not at all on the temperature, plus noise per run."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tapekit.evaluate import ConfigBootstrap, Estimate, bootstrap_configs
from tapekit.training import SweepRow

LRS = [1e-4, 2e-4, 5e-4]
TEMPERATURES = [0.5, 1.0]
TRUTH = {1e-4: 0.40, 2e-4: 0.60, 5e-4: 0.30}  # the temperature has no effect
TRUE_BEST = 0.60


def sweep(seed: int, n_seeds: int = 4, noise: float = 0.05, lrs: list[float] = LRS) -> list[dict[str, Any]]:
    """One synthetic sweep: every (lr, temperature) with ``n_seeds`` runs, metric = the lr's
    true mean + Gaussian noise."""
    rng = random.Random(seed)
    return [
        {
            "config": {"lr": lr, "temperature": t},
            "seed": s,
            "metrics": {"success": TRUTH[lr] + rng.gauss(0.0, noise)},
            "error": None,
        }
        for lr in lrs
        for t in TEMPERATURES
        for s in range(n_seeds)
    ]


def test_the_truly_best_setting_is_found_with_an_interval_that_covers_it() -> None:
    result = bootstrap_configs(sweep(0), "success", n_resamples=2000)
    assert result.best_config["lr"] == 2e-4
    assert result.best.low <= TRUE_BEST <= result.best.high
    assert result.best.high - result.best.low < 0.15  # four runs of sd 0.05 per config
    assert result.configs[0].config == result.best_config
    assert sum(c.win_rate for c in result.configs) == pytest.approx(1.0)
    assert result.effect("lr", 2e-4).win_probability > 0.99
    assert sum(c.win_rate for c in result.configs if c.config["lr"] == 2e-4) > 0.99
    # the lr matters: the best reachable with a worse lr lies below the best lr's
    best_lr = result.effect("lr", 2e-4).best
    for lr in (1e-4, 5e-4):
        assert result.effect("lr", lr).best.high < best_lr.low
        assert result.effect("lr", lr).marginal.value == pytest.approx(TRUTH[lr], abs=0.05)
    # the temperature does not: its two values' best reachable intervals overlap
    a, b = (result.effect("temperature", t).best for t in TEMPERATURES)
    assert a.low <= b.high and b.low <= a.high
    assert [e.value for e in result.effects["lr"]] == LRS  # numbers in ascending order
    assert result.n_runs == 24 and result.n_errors == result.n_missing == result.single_run_configs == 0


def test_a_single_clear_best_wins_nearly_every_resample() -> None:
    rows = [r for r in sweep(1) if r["config"]["temperature"] == 0.5]
    result = bootstrap_configs(rows, "success", n_resamples=2000)
    assert result.best_config == {"lr": 2e-4, "temperature": 0.5}
    assert result.configs[0].win_rate > 0.99
    assert result.effect("temperature", 0.5).win_probability == 1.0  # one value: always in the best


def test_a_hyperparameter_without_effect_splits_the_wins_evenly_on_average() -> None:
    """In one sweep the no-effect temperature's P(in best) is whatever the noise made of the
    two near-equal configurations (across sweeps it spreads over [0, 1]); its mean over
    independent sweeps is 1/2. Treating P as roughly uniform on [0, 1] per sweep (sd 0.29),
    the mean of 60 sweeps has sd 0.037: 0.5 ± 0.15 is four of them."""
    probabilities = []
    for rep in range(60):
        result = bootstrap_configs(sweep(100 + rep, n_seeds=3), "success", n_resamples=200, seed=rep)
        assert result.effect("lr", 2e-4).win_probability > 0.95
        probabilities.append(result.effect("temperature", 0.5).win_probability)
    mean = sum(probabilities) / len(probabilities)
    assert 0.35 < mean < 0.65, mean
    assert max(probabilities) - min(probabilities) > 0.5  # per sweep it is far from 1/2 at times


def test_the_best_setting_interval_covers_the_true_best_as_measured_and_says_why_not_more() -> None:
    """100 sweeps each, 8 runs of sd 0.1 per configuration, 300 resamples, 90 % intervals.

    One best configuration (the temperature fixed): the percentile bootstrap of a mean of 8 is
    narrow (its spread is sqrt(7/8) of the mean's, and 8 values estimate the spread poorly:
    |t_7| < 1.645 sqrt(7/8) has probability 0.83); measured over 400 sweeps, 0.80. The band
    70-92 is 0.80 +- 3 binomial sd of 100 sweeps: intervals of zero width (coverage ~0) or far
    too wide (~1) fail it.

    Two configurations tied at the top (the no-effect temperature): choosing the higher of two
    equal means is biased upward (the winner's curse), and so is each resample's choice, so the
    misses are intervals lying above the truth (measured over 400 sweeps: 0.73 covered, 0.26
    above, 0.01 below)."""
    covered = 0
    for rep in range(100):
        rows = [r for r in sweep(1000 + rep, n_seeds=8, noise=0.1) if r["config"]["temperature"] == 0.5]
        result = bootstrap_configs(rows, "success", n_resamples=300, confidence=0.9, seed=rep)
        covered += result.best.low <= TRUE_BEST <= result.best.high
    assert 70 <= covered <= 92, covered
    covered = above = 0
    for rep in range(100):
        rows = sweep(1000 + rep, n_seeds=8, noise=0.1)
        result = bootstrap_configs(rows, "success", n_resamples=300, confidence=0.9, seed=rep)
        covered += result.best.low <= TRUE_BEST <= result.best.high
        above += result.best.low > TRUE_BEST
    assert 60 <= covered <= 90 and above >= 3 * (100 - covered - above) + 5, (covered, above)


def test_single_runs_failures_and_missing_metrics_are_handled_and_reported() -> None:
    rows = sweep(2, n_seeds=2)
    rows[0] = {**rows[0], "metrics": {}, "error": "RuntimeError: diverged"}  # lr 1e-4, t 0.5 keeps one run
    rows[2] = {**rows[2], "metrics": {"loss": 1.0}}  # lr 1e-4, t 1.0: no success
    rows[3] = {**rows[3], "metrics": {"success": float("nan")}}  # and now no run at all
    result = bootstrap_configs(rows, "success", n_resamples=500)
    assert result.n_errors == 1 and result.n_missing == 2 and result.n_runs == 9
    assert result.single_run_configs == 1
    assert {"lr": 1e-4, "temperature": 1.0} not in [c.config for c in result.configs]  # dropped
    assert [e.n_configs for e in result.effects["lr"]] == [1, 2, 2]
    assert "1 configuration(s) with a single run" in result.summary()
    # one configuration with one run: its resample is that run, a zero-width interval
    alone = bootstrap_configs([rows[1]], "success", n_resamples=100)
    assert alone.best == Estimate(
        value=rows[1]["metrics"]["success"], low=alone.best.value, high=alone.best.value
    )
    assert alone.configs[0].win_rate == 1.0 and alone.single_run_configs == 1


def test_lower_is_better_when_asked() -> None:
    rows = [{**r, "metrics": {"loss": 1.0 - r["metrics"]["success"]}} for r in sweep(3)]
    result = bootstrap_configs(rows, "loss", maximize=False, n_resamples=1000)
    assert result.best_config["lr"] == 2e-4 and not result.maximize
    assert result.best.low <= 1.0 - TRUE_BEST <= result.best.high
    assert result.effect("lr", 2e-4).best.value < result.effect("lr", 5e-4).best.value
    assert "lower is better" in result.summary()


def test_it_is_seeded_reads_sweep_rows_and_prints_a_table() -> None:
    rows = sweep(4)
    first = bootstrap_configs(rows, "success", n_resamples=500, seed=1)
    assert first == bootstrap_configs(rows, "success", n_resamples=500, seed=1)
    assert first.best != bootstrap_configs(rows, "success", n_resamples=500, seed=2).best
    typed = [SweepRow.model_validate(r) for r in rows]
    assert bootstrap_configs(typed, "success", n_resamples=500, seed=1) == first
    assert ConfigBootstrap.model_validate_json(first.model_dump_json()) == first
    text = first.summary()
    assert text.startswith("best success (higher is better; 500 resamples, 95 % intervals): ")
    assert "lr               0.0002" in text and "temperature      0.5" in text
    assert len([line for line in text.splitlines() if "lr=" in line]) == 7  # the best, then 6 configs


def test_bad_input_is_refused_by_name() -> None:
    rows = sweep(5, n_seeds=1)
    with pytest.raises(ValueError, match=r"no run has a finite value of metric 'accuracy'.*\['success'\]"):
        bootstrap_configs(rows, "accuracy")
    with pytest.raises(ValueError, match=r"row 1 has hyperparameters \['lr'\]"):
        bootstrap_configs([rows[0], {**rows[1], "config": {"lr": 1e-4}}], "success")
    with pytest.raises(ValueError, match="row 1 repeats the run"):
        bootstrap_configs([rows[0], rows[0]], "success")
    with pytest.raises(ValueError, match="n_resamples must be >= 1"):
        bootstrap_configs(rows, "success", n_resamples=0)
    with pytest.raises(ValueError, match="row 0 is not a sweep row"):
        bootstrap_configs([{"seed": 0}], "success")
