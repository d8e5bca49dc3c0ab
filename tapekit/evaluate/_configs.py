"""Which hyperparameter settings matter, and how good the best one is: a bootstrap over the
runs of a sweep (many short runs over configurations, a few training seeds each).

Pure Python and seeded, like :mod:`tapekit.evaluate._stats` (10,000 resamples by default).

**Data.** Configurations ``c = 1 … C`` (each a ``{hyperparameter: value}`` mapping, every one
with the same hyperparameters), configuration ``c`` run with ``n_c`` training seeds, its runs'
metric values ``x_{c,1} … x_{c,n_c}`` and mean ``m_c = (1/n_c) Σ_s x_{c,s}``. With
``maximize=False`` (a loss) read "argmin" and "min" for "argmax" and "max" below. A run that
raised (its row has an ``error``), or whose metrics lack the metric or hold a value that is not
finite, is left out and counted; a configuration left with no run is dropped.

**The best configuration** is ``ĉ = argmax_c m_c`` (ties: the configuration seen first).

**Resamples** ``b = 1 … B``: each configuration's runs are resampled with replacement within
the configuration, ``m*_{c,b} = (1/n_c) Σ_s x_{c,S_s}`` with ``S_1 … S_{n_c}`` uniform on
``1 … n_c`` (a configuration with one run resamples to that run: its spread is not counted,
and the result says how many such configurations there are). In each resample the winner is
``w_b = argmax_c m*_{c,b}``. Then:

- **best-setting score** ``m_ĉ`` with the percentile interval of ``m*_{w_b,b}`` (the winner's
  mean in each resample, the selection redone every time, so the interval carries the
  uncertainty of *which* configuration is best as well as of how good it is). The interval is
  widened, if needed, to hold ``m_ĉ``;
- **win rate** of configuration ``c``: ``(1/B) #{b : w_b = c}``;
- for each hyperparameter ``h`` and each of its values ``v`` (``C_{h=v}``: the configurations
  with ``h = v``):

  - ``P(h = v in the best)`` ``= (1/B) #{b : w_b ∈ C_{h=v}}``;
  - the **best score reachable with h = v**: ``max_{c ∈ C_{h=v}} m_c`` with the percentile
    interval of ``max_{c ∈ C_{h=v}} m*_{c,b}`` (the selection redone within ``C_{h=v}``);
  - the **marginal mean**: ``(1/|C_{h=v}|) Σ_{c ∈ C_{h=v}} m_c`` (each configuration weighs
    the same) with the percentile interval of the same average of ``m*_{c,b}``.

**Reading it.** A value of a hyperparameter that matters holds ``P ≈ 1`` and a best reachable
score whose interval lies above the other values'. A hyperparameter with no effect does *not*
show ``P ≈ 1/k`` in every sweep: its probabilities depend on which of the near-equal
configurations happened to score higher, and across repeated sweeps they spread over [0, 1]
(they are near ``1/k`` on average). Its mark is that the best-reachable intervals of its values
overlap. The marginal mean is fair only on the full grid: in a sample of it, a value's
configurations carry the other hyperparameters' values in other proportions, and their
effects come with it.

**How far to trust the interval** (measured on synthetic sweeps, ``tests/evaluate/test_configs.py``:
three learning rates, one clearly best, Gaussian noise per run, 90 % intervals, 400 sweeps
each). The percentile
bootstrap of a mean of ``n`` runs is narrow: the resampled mean's variance is ``(n−1)/n`` of the
mean's, and ``n`` runs estimate the spread poorly. With one best configuration the interval held
the true best mean in 80 % of sweeps at 8 runs per configuration and 63 % at 3. Where several
configurations tie at the top (a hyperparameter without effect makes such twins), picking the
highest of near-equal means is biased upward, the winner's curse, and each resample repeats
the pick: at 8 runs, 73 % covered and 26 % of the intervals lay wholly above the truth. So run
3 or more seeds per configuration, read the interval as a lower bound on the uncertainty, and
read single-run configurations' intervals as having no width from seeds at all.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from tapekit.evaluate._stats import DEFAULT_RESAMPLES, Estimate, _check, _percentiles

ConfigValue = str | bool | int | float | None
"""A hyperparameter's value in a sweep: a JSON scalar."""


def check_config_value(key: str, value: Any, where: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a JSON scalar (str, int, float that is finite,
    bool or None); ``where`` says which configuration, for the message."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if math.isfinite(value):
            return
        raise ValueError(f"{where}: {key}={value!r} is not finite (JSON has no NaN or infinity)")
    raise ValueError(
        f"{where}: {key}={value!r} is a {type(value).__name__}; a hyperparameter's value must be a "
        "JSON scalar (str, int, float, bool or None: write a list or an object as a string)"
    )


def config_key(config: Mapping[str, Any]) -> str:
    """The configuration as canonical JSON (keys sorted): two configurations are the same run
    setting exactly when their keys are equal (so ``1`` and ``1.0`` differ, as in JSON)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), allow_nan=False)


class ConfigScore(BaseModel):
    """One configuration of a sweep: its runs' mean metric and how often it won the resamples."""

    model_config = ConfigDict(frozen=True)

    config: dict[str, ConfigValue]
    n_runs: int
    mean: float
    win_rate: float


class ValueEffect(BaseModel):
    """One value of one hyperparameter (:func:`bootstrap_configs`): ``win_probability`` is the
    share of resamples whose best configuration has this value, ``best`` the best score
    reachable with the value fixed, ``marginal`` the mean over its configurations' means (both
    with percentile intervals), ``n_configs`` how many configurations have it."""

    model_config = ConfigDict(frozen=True)

    hyperparameter: str
    value: ConfigValue
    n_configs: int
    win_probability: float
    best: Estimate
    marginal: Estimate


class ConfigBootstrap(BaseModel):
    """What :func:`bootstrap_configs` found (formulas in :mod:`tapekit.evaluate._configs`).

    ``best`` is the best configuration's mean with the interval of the resamples' winners;
    ``configs`` every configuration, best first; ``effects`` each hyperparameter's values in
    order. ``n_runs`` runs were used; ``n_errors`` rows with an error and ``n_missing`` rows
    without a finite value of the metric were left out; ``single_run_configs`` configurations
    had one run (their resample is that run).
    """

    model_config = ConfigDict(frozen=True)

    metric: str
    maximize: bool
    n_resamples: int
    confidence: float
    seed: int
    best_config: dict[str, ConfigValue]
    best: Estimate
    configs: list[ConfigScore]
    effects: dict[str, list[ValueEffect]]
    n_runs: int
    n_errors: int
    n_missing: int
    single_run_configs: int

    def effect(self, hyperparameter: str, value: ConfigValue) -> ValueEffect:
        """The :class:`ValueEffect` of ``hyperparameter = value``; ``KeyError`` if there is none."""
        for e in self.effects.get(hyperparameter, []):
            if config_key({"v": e.value}) == config_key({"v": value}):
                return e
        raise KeyError(f"no configuration has {hyperparameter}={value!r}")

    def summary(self) -> str:
        """A short text table: the best setting, each hyperparameter's values, the configurations."""
        direction = "higher" if self.maximize else "lower"
        best_row = self.configs[0]
        lines = [
            f"best {self.metric} ({direction} is better; {self.n_resamples:,} resamples, "
            f"{100 * self.confidence:g} % intervals): {_est(self.best)}",
            f"  at {_config_text(self.best_config)}: mean of {best_row.n_runs} run(s), "
            f"best in {100 * best_row.win_rate:.0f} % of resamples",
            f"  runs: {self.n_runs} used, {self.n_errors} with an error and {self.n_missing} without "
            f"{self.metric} left out",
        ]
        if self.single_run_configs:
            lines.append(
                f"  {self.single_run_configs} configuration(s) with a single run: each resamples to "
                "that run, so its seed-to-seed spread is not in the intervals"
            )
        lines += ["", f"{'hyperparameter':<16} {'value':<12} {'P(in best)':>10}  {'best with it':<28} mean"]
        for name, values in self.effects.items():
            for e in values:
                lines.append(
                    f"{name:<16} {_value_text(e.value):<12} {e.win_probability:>10.2f}  "
                    f"{_est(e.best):<28} {_est(e.marginal)}"
                )
        lines += ["", f"{'mean':>10} {'runs':>4} {'wins':>5}  configuration"]
        for c in self.configs:
            lines.append(f"{c.mean:>10.4g} {c.n_runs:>4} {100 * c.win_rate:>4.0f}%  {_config_text(c.config)}")
        return "\n".join(lines) + "\n"


def _est(e: Estimate) -> str:
    return f"{e.value:.4g} [{e.low:.4g}, {e.high:.4g}]"


def _value_text(value: ConfigValue) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _config_text(config: Mapping[str, ConfigValue]) -> str:
    return " ".join(f"{k}={_value_text(v)}" for k, v in config.items())


def _row_fields(row: Any, i: int) -> tuple[Mapping[str, Any], Any, Mapping[str, Any], Any]:
    """``(config, seed, metrics, error)`` of a sweep row: a mapping (a JSON line) or an object
    with those attributes (:class:`tapekit.training.SweepRow`)."""
    if isinstance(row, Mapping):
        config, seed, metrics, error = (row.get(n) for n in ("config", "seed", "metrics", "error"))
    else:
        config, seed, metrics, error = (getattr(row, n, None) for n in ("config", "seed", "metrics", "error"))
    metrics = {} if metrics is None else metrics
    if not isinstance(config, Mapping) or not isinstance(metrics, Mapping):
        raise ValueError(f"row {i} is not a sweep row (it needs a config and a metrics mapping): {row!r}")
    return config, seed, metrics, error


def _ordered_values(values: list[ConfigValue]) -> list[ConfigValue]:
    """Numbers (not bools) ascending, strings alphabetically; any other mix as first seen."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sorted(values, key=lambda v: float(v))  # type: ignore[arg-type]
    if all(isinstance(v, str) for v in values):
        return sorted(values, key=str)
    return values


def _group(
    rows: Iterable[Any], metric: str
) -> tuple[list[dict[str, ConfigValue]], list[list[float]], int, int, set[str]]:
    """The configurations (first seen first), each one's metric values, the counts of rows with
    an error and without the metric, and the metric names seen."""
    configs: dict[str, dict[str, ConfigValue]] = {}
    values: dict[str, list[float]] = {}
    seen_runs: set[tuple[str, str]] = set()
    keys: list[str] | None = None
    errors = missing = 0
    names: set[str] = set()
    for i, row in enumerate(rows):
        config, seed, metrics, error = _row_fields(row, i)
        for k, v in config.items():
            check_config_value(k, v, f"row {i}")
        if keys is None:
            keys = sorted(config)
        elif sorted(config) != keys:
            raise ValueError(
                f"row {i} has hyperparameters {sorted(config)}, the rows before it {keys}: "
                "every configuration of a sweep must set the same ones"
            )
        key = config_key(config)
        run = (key, json.dumps(seed))
        if run in seen_runs:
            raise ValueError(
                f"row {i} repeats the run {key} with seed {seed!r}: keep one row per run "
                "(tapekit.training.read_sweep keeps each run's last row)"
            )
        seen_runs.add(run)
        configs.setdefault(key, dict(config))
        values.setdefault(key, [])
        names.update(str(n) for n in metrics)
        if error:
            errors += 1
            continue
        x = metrics.get(metric)
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            missing += 1
            continue
        values[key].append(float(x))
    kept = [k for k in configs if values[k]]
    return [configs[k] for k in kept], [values[k] for k in kept], errors, missing, names


def _resampled_means(xs: list[float], n_resamples: int, rng: random.Random) -> list[float]:
    """``n_resamples`` means of ``xs`` resampled with replacement (all ``xs[0]`` for one run)."""
    n = len(xs)
    if n == 1:
        return [xs[0]] * n_resamples
    choices = rng.choices
    return [math.fsum(choices(xs, k=n)) / n for _ in range(n_resamples)]


def bootstrap_configs(
    rows: Iterable[Any],
    metric: str,
    *,
    maximize: bool = True,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> ConfigBootstrap:
    """The best configuration of a sweep, its score with an interval that accounts for choosing
    it, and each hyperparameter's effect, by a bootstrap over the runs (module doc).

    ``rows`` are the sweep's runs, one per (configuration, training seed): the
    :class:`tapekit.training.SweepRow` objects of :func:`tapekit.training.read_sweep`, or
    mappings with ``config``, ``seed``, ``metrics`` and ``error``. ``metric`` names the value
    compared, higher is better (``maximize=False``: lower). Rows with an error or without the
    metric are left out and counted. Raises ``ValueError`` when no run has the metric, for rows
    whose configurations set different hyperparameters, for a repeated (configuration, seed)
    and for ``n_resamples < 1``.
    """
    _check(n_resamples, confidence)
    if n_resamples < 1:
        raise ValueError("n_resamples must be >= 1: the win rates and intervals come from resamples")
    configs, values, errors, missing, names = _group(rows, metric)
    if not configs:
        seen = f"the rows' metrics are {sorted(names)}" if names else "no row has metrics"
        raise ValueError(
            f"no run has a finite value of metric {metric!r} ({errors} with an error, {missing} "
            f"without it; {seen})"
        )
    sign = 1.0 if maximize else -1.0
    pick = max if maximize else min
    means = [math.fsum(xs) / len(xs) for xs in values]
    best = max(range(len(configs)), key=lambda c: (sign * means[c], -c))
    rng = random.Random(seed)
    columns = [_resampled_means(xs, n_resamples, rng) for xs in values]  # [config][b]
    winners: list[int] = []
    winner_means: list[float] = []
    for row in zip(*columns, strict=True):
        top = pick(row)
        winners.append(row.index(top))  # ties: the configuration seen first
        winner_means.append(top)
    wins = [0] * len(configs)
    for w in winners:
        wins[w] += 1
    effects: dict[str, list[ValueEffect]] = {}
    for name in configs[0]:
        distinct: dict[str, ConfigValue] = {}
        for config in configs:
            distinct.setdefault(config_key({"v": config[name]}), config[name])
        effects[name] = []
        for value in _ordered_values(list(distinct.values())):
            wanted = config_key({"v": value})
            members = [c for c, config in enumerate(configs) if config_key({"v": config[name]}) == wanted]
            chosen = set(members)
            rows_of = list(zip(*(columns[c] for c in members), strict=True))
            reach = [pick(r) for r in rows_of]
            average = [math.fsum(r) / len(members) for r in rows_of]
            effects[name].append(
                ValueEffect(
                    hyperparameter=name,
                    value=value,
                    n_configs=len(members),
                    win_probability=sum(1 for w in winners if w in chosen) / n_resamples,
                    best=_percentiles(reach, confidence, pick(means[c] for c in members)),
                    marginal=_percentiles(
                        average, confidence, math.fsum(means[c] for c in members) / len(members)
                    ),
                )
            )
    order = sorted(range(len(configs)), key=lambda c: (-sign * means[c], c))
    return ConfigBootstrap(
        metric=metric,
        maximize=maximize,
        n_resamples=n_resamples,
        confidence=confidence,
        seed=seed,
        best_config=configs[best],
        best=_percentiles(winner_means, confidence, means[best]),
        configs=[
            ConfigScore(
                config=configs[c], n_runs=len(values[c]), mean=means[c], win_rate=wins[c] / n_resamples
            )
            for c in order
        ],
        effects=effects,
        n_runs=sum(len(xs) for xs in values),
        n_errors=errors,
        n_missing=missing,
        single_run_configs=sum(1 for xs in values if len(xs) == 1),
    )
