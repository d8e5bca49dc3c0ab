"""Statistics for claims about agents: a mean with its interval, and paired comparisons.

Every function is pure and seeded: the same inputs print the same intervals.

- :func:`bootstrap_mean`: the mean of ``values`` with a percentile-bootstrap interval (values
  resampled with replacement, ``n_resamples`` times).
- :func:`paired_difference`: the mean of ``a[i] - b[i]`` over paired items (the same task, seed or
  turn scored under two systems) with a percentile-bootstrap interval that resamples *pairs*. With
  ``strata`` (e.g. the task name of each (task, seed) pair) the resampling is stratified: each
  stratum keeps its size, so a benchmark with few seeds of many tasks is resampled as it was
  built, and the estimate is the mean over all pairs.
- :func:`mcnemar_exact`: the two-sided exact McNemar test for paired pass/fail outcomes: under
  "no difference" each discordant pair (one passes, the other fails) is a fair coin, so with
  ``n01`` and ``n10`` discordant pairs, ``p = min(1, 2 * P[Binomial(n01 + n10, 1/2) <= min(n01, n10)])``.

A difference whose interval holds 0 is not a win; report it as it is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence

from pydantic import BaseModel, ConfigDict

__all__ = ["Estimate", "bootstrap_mean", "mcnemar_exact", "paired_difference"]


class Estimate(BaseModel):
    """A metric's value with its bootstrap confidence interval ``[low, high]``."""

    model_config = ConfigDict(frozen=True)

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def short(self) -> str:
        """Two decimals: ``0.94 [0.81, 1.00]`` (what tables show)."""
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"

    def excludes_zero(self) -> bool:
        """Whether the interval lies strictly on one side of 0 (a difference that holds up)."""
        return self.low > 0.0 or self.high < 0.0


def _check(n_resamples: int, confidence: float) -> None:
    if n_resamples < 0:
        raise ValueError(f"n_resamples must be >= 0, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def _percentiles(means: list[float], confidence: float, centre: float) -> Estimate:
    means.sort()
    m = len(means)
    tail = (1.0 - confidence) / 2.0
    low = means[min(m - 1, math.floor(tail * m))]
    high = means[min(m - 1, math.ceil((1.0 - tail) * m) - 1)]
    return Estimate(value=centre, low=min(low, centre), high=max(high, centre))


def bootstrap_mean(
    values: Sequence[float], n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Estimate:
    """The mean of ``values`` with a seeded percentile-bootstrap interval.

    Empty ``values`` give NaN; one value (or ``n_resamples=0``) gives a zero-width interval.
    """
    _check(n_resamples, confidence)
    if not values:
        return Estimate(value=math.nan, low=math.nan, high=math.nan)
    n = len(values)
    mean = sum(values) / n
    if n == 1 or n_resamples == 0:
        return Estimate(value=mean, low=mean, high=mean)
    rng = random.Random(seed)
    means = [sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_resamples)]
    return _percentiles(means, confidence, mean)


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    strata: Sequence[Hashable] | None = None,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Mean of ``a[i] - b[i]`` with a paired (optionally stratified) bootstrap interval.

    ``a`` and ``b`` hold the two systems' scores on the same items in the same order;
    ``strata`` (same length) groups the items, e.g. by task, and the bootstrap then resamples
    pairs within each group. Raises ``ValueError`` when the lengths differ.
    """
    _check(n_resamples, confidence)
    if len(a) != len(b):
        raise ValueError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    if strata is not None and len(strata) != len(a):
        raise ValueError(f"strata has {len(strata)} labels for {len(a)} pairs")
    diffs = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    if strata is None:
        return bootstrap_mean(diffs, n_resamples, confidence, seed)
    if not diffs:
        return Estimate(value=math.nan, low=math.nan, high=math.nan)
    groups: dict[Hashable, list[float]] = {}
    for label, d in zip(strata, diffs, strict=True):
        groups.setdefault(label, []).append(d)
    n = len(diffs)
    mean = sum(diffs) / n
    if n_resamples == 0 or n == 1:
        return Estimate(value=mean, low=mean, high=mean)
    rng = random.Random(seed)
    ordered = [groups[k] for k in groups]
    means = []
    for _ in range(n_resamples):
        total = 0.0
        for g in ordered:
            size = len(g)
            total += sum(g[rng.randrange(size)] for _ in range(size))
        means.append(total / n)
    return _percentiles(means, confidence, mean)


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for paired pass/fail outcomes of two systems.

    Only discordant pairs count: ``n10`` items that ``a`` passes and ``b`` fails, ``n01`` the
    reverse. With no discordant pair the p-value is 1.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need equal lengths, got {len(a)} and {len(b)}")
    n10 = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    n01 = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    n = n10 + n01
    if n == 0:
        return 1.0
    k = min(n10, n01)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)
