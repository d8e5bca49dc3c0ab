"""Statistics for claims about agents: a mean with its interval, and paired comparisons.

Every function is pure and seeded: the same inputs print the same intervals (pure Python, no
numpy; the resampling stream is :class:`random.Random`'s, stable across Python versions).
``α = 1 − confidence`` below; every bootstrap defaults to 10,000 resamples.

**Percentile bootstrap** (:func:`bootstrap_mean`, :func:`paired_difference`): the statistic
``θ = (1/n) Σ x_i`` is recomputed on ``B`` resamples drawn with replacement,
``θ* = (1/n) Σ_j N_j x_j`` with ``(N_1 … N_n) ~ Multinomial(n; 1/n, …, 1/n)``; the interval is
``[θ*_(⌊B·α/2⌋), θ*_(⌈B·(1 − α/2)⌉)]`` of the sorted resamples, widened to hold ``θ``. With
``strata`` each stratum is resampled within itself (its size kept). Values that take few distinct
values (pass/fail outcomes, their differences) are resampled through their counts: the
multinomial counts of the distinct values are drawn as successive binomials,
``N_j ~ Binomial(n − Σ_{l<j} N_l, c_j / Σ_{l≥j} c_l)``, each by inverting its exact CDF, which is
the same distribution as drawing ``n`` items and costs ``k − 1`` draws per resample instead of
``n``.

**Exact intervals where the bootstrap degenerates.** Values all 0 or all 1 (pass/fail outcomes,
or scores in [0, 1]) make every resample equal; :func:`bootstrap_mean` then returns the
Clopper–Pearson interval, which has a closed form there: ``0/n: [0, 1 − (α/2)^(1/n)]`` and
``n/n: [(α/2)^(1/n), 1]``. (For any ``X`` in [0, 1] with mean ``μ``, ``P(X = 0) ≤ 1 − μ``, so
``P(all n are 0) ≤ (1 − μ)^n``: the bound holds for scores in [0, 1], not only for binary ones.)
:func:`clopper_pearson` gives the general ``k/n`` interval,
``[B⁻¹(α/2; k, n − k + 1), B⁻¹(1 − α/2; k + 1, n − k)]`` with ``B⁻¹`` the quantile of the Beta
distribution. For paired pass/fail outcomes (:func:`paired_difference` with every score 0 or 1)
the difference is ``d = p10 − p01`` (``p10``: the share of items ``a`` passes and ``b`` fails,
``p01`` the reverse). When no pair is discordant, ``|d| ≤ p10 + p01`` (the discordant rate),
whose Clopper–Pearson upper bound for ``0/n`` is ``u = 1 − (α/2)^(1/n)``: the interval is
``[−u, u]``. When every pair is discordant in ``a``'s favour, ``d ≥ 2·p10 − 1`` (as
``p01 ≤ 1 − p10``) and ``p10 ≥ L = (α/2)^(1/n)`` (``n/n``): the interval is ``[2L − 1, 1]``;
in ``b``'s favour, ``[−1, 1 − 2L]``. Both are conservative (coverage at least ``1 − α``).

**Training seeds as the unit** (:func:`seed_paired_difference`). Two arms trained with ``S``
training seeds, each seed's pair of runs scored on items ``I_s`` (``n_s`` of them; the same
item key in two seeds is the same item), ``d_{s,i} = a_{s,i} − b_{s,i}``:

- per-seed mean ``m_s = (1/n_s) Σ_{i∈I_s} d_{s,i}``; estimate ``d̄ = (1/S) Σ_s m_s`` (every
  training seed weighs the same);
- item bootstrap: ``d̄ = Σ_i c_i`` with ``c_i = (1/S) Σ_{s : i∈I_s} d_{s,i} / n_s``, the item's
  seed-averaged difference (in a balanced design, every item in every seed, ``c_i = D_i / n``
  with ``D_i = (1/S) Σ_s d_{s,i}``, and ``d̄`` is the mean over items of ``D_i``). Items are
  resampled with replacement within each cell (stratum × the set of seeds the item was scored
  in, so every ``n_s`` stays fixed; in a balanced design the cells are the strata) and
  ``d̄* = Σ c_i`` over the resampled items: the item-sampling error of ``d̄``, with the
  training seeds held fixed;
- seed-level interval: Student's t over the per-seed means, ``d̄ ± t_{1−α/2, S−1} · s/√S`` with
  ``s² = Σ_s (m_s − d̄)² / (S − 1)``, and the two-sided p-value of ``t = d̄ / (s/√S)`` with
  ``S − 1`` degrees of freedom: the error of ``d̄`` when the training seed is the unit. With one
  seed it is undefined (``None``), not zero.

  Pass/fail scores with every pair tied, or every pair discordant one way, get the exact bounds
  above with the ``n`` distinct items as the unit (an item's seed-averaged difference lies in
  [−1, 1]). Where every item's seed-averaged difference is the same for another reason (e.g. a
  task every item of which flips in two seeds of three), the item bootstrap has zero width:
  the items cannot tell, and the seed-level interval is the one to read.

**Student's t** (:func:`student_t_quantile`): for ``t ≥ 0``,
``F(t; ν) = 1 − ½·I_{ν/(ν+t²)}(ν/2, ½)``, with ``I_x(a, b)`` the regularised incomplete beta
function (evaluated by its continued fraction, modified Lentz); the quantile is found by
bisection on ``F``.

**McNemar** (:func:`mcnemar_exact`): the two-sided exact test for paired pass/fail outcomes:
under "no difference" each discordant pair (one passes, the other fails) is a fair coin, so with
``n01`` and ``n10`` discordant pairs, ``p = min(1, 2 · P[Binomial(n01 + n10, 1/2) ≤ min(n01, n10)])``.
Pooling the (seed, item) pairs of several training seeds into one McNemar test treats them as
independent and ignores the seeds' variance: use :func:`seed_paired_difference` there.

A difference whose interval holds 0 is not a win; report it as it is.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from tapekit.evaluate._distributions import betainc, binomial_cdf, bisect_root, student_t_quantile

_SeedT = TypeVar("_SeedT", bound=Hashable)
_ItemT = TypeVar("_ItemT", bound=Hashable)

DEFAULT_RESAMPLES = 10_000
"""The default number of bootstrap resamples of every function here."""


class Estimate(BaseModel):
    """A metric's value with its confidence interval ``[low, high]``."""

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


_NAN = Estimate(value=math.nan, low=math.nan, high=math.nan)


def _check(n_resamples: int, confidence: float) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 0:
        raise ValueError(f"n_resamples must be an int >= 0, got {n_resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def _percentiles(resampled: list[float], confidence: float, centre: float) -> Estimate:
    resampled.sort()
    m = len(resampled)
    tail = (1.0 - confidence) / 2.0
    low = resampled[min(m - 1, math.floor(tail * m))]
    high = resampled[min(m - 1, math.ceil((1.0 - tail) * m) - 1)]
    return Estimate(value=centre, low=min(low, centre), high=max(high, centre))


# --------------------------------------------------------------------------- resampling


class _Cell:
    """One stratum's values, ready to add a resample's sum to each of ``B`` totals."""

    def __init__(self, values: Sequence[float]) -> None:
        self.values = list(values)
        self.size = len(self.values)
        counts: dict[float, int] = {}
        for v in self.values:
            counts[v] = counts.get(v, 0) + 1
        # ascending counts: the early binomials have small p, so few (r, j) tables are needed
        self.distinct = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]))
        k = len(self.distinct)
        self.by_counts = k == 1 or (k <= 32 and 8 * (k - 1) <= self.size)
        tails, rest = [], self.size
        for _, c in self.distinct:
            tails.append(rest)
            rest -= c
        self.tails = tails
        self._tables: dict[tuple[int, int], list[float]] = {}

    def _draw(self, j: int, r: int, u: float) -> int:
        table = self._tables.get((j, r))
        if table is None:
            table = self._tables[(j, r)] = binomial_cdf(r, self.distinct[j][1] / self.tails[j])
        return min(r, bisect_right(table, u))

    def add_to(self, totals: list[float], rng: random.Random) -> None:
        if len(self.distinct) == 1:
            whole = self.size * self.distinct[0][0]
            for b in range(len(totals)):
                totals[b] += whole
            return
        if not self.by_counts:
            values, size, choices = self.values, self.size, rng.choices
            for b in range(len(totals)):
                totals[b] += sum(choices(values, k=size))
            return
        last = len(self.distinct) - 1
        last_value = self.distinct[last][0]
        uniform = rng.random
        for b in range(len(totals)):
            r, total = self.size, 0.0
            for j in range(last):
                if r == 0:
                    break
                drawn = self._draw(j, r, uniform())
                total += drawn * self.distinct[j][0]
                r -= drawn
            totals[b] += total + r * last_value


def _resampled_sums(cells: Sequence[Sequence[float]], n_resamples: int, seed: int) -> list[float]:
    """``n_resamples`` bootstrap draws of ``Σ_cells Σ (the cell's values resampled with
    replacement within the cell)``, seeded."""
    rng = random.Random(seed)
    totals = [0.0] * n_resamples
    for cell in cells:
        _Cell(cell).add_to(totals, rng)
    return totals


# --------------------------------------------------------------------------- exact intervals


def _binary(values: Sequence[float]) -> bool:
    return all(v == 0.0 or v == 1.0 for v in values)


def _exact_all_same(n: int, all_ones: bool, confidence: float) -> tuple[float, float]:
    """Clopper–Pearson for ``0/n`` or ``n/n`` (closed form)."""
    edge = ((1.0 - confidence) / 2.0) ** (1.0 / n)
    return (edge, 1.0) if all_ones else (0.0, 1.0 - edge)


def _exact_paired(diffs: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """The conservative exact interval of a paired pass/fail difference when every pair is
    tied or every pair is discordant one way (see the module doc); ``None`` otherwise."""
    n = len(diffs)
    if all(d == 0.0 for d in diffs):
        u = _exact_all_same(n, False, confidence)[1]
        return (-u, u)
    if all(d == 1.0 for d in diffs):
        return (2.0 * _exact_all_same(n, True, confidence)[0] - 1.0, 1.0)
    if all(d == -1.0 for d in diffs):
        return (-1.0, 1.0 - 2.0 * _exact_all_same(n, True, confidence)[0])
    return None


def clopper_pearson(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """The share ``successes / n`` with its exact (Clopper–Pearson) interval.

    ``[B⁻¹(α/2; k, n − k + 1), B⁻¹(1 − α/2; k + 1, n − k)]`` (0 and 1 at the edges), the
    Beta quantiles found by bisection on the regularised incomplete beta function. Raises
    ``ValueError`` unless ``0 <= successes <= n`` and ``n >= 1``.
    """
    _check(0, confidence)
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes}/{n}")
    k, tail = successes, (1.0 - confidence) / 2.0
    if k == 0 or k == n:
        low, high = _exact_all_same(n, k == n, confidence)
        return Estimate(value=k / n, low=low, high=high)
    low = bisect_root(lambda x: betainc(k, n - k + 1, x) - tail, 0.0, 1.0)
    high = bisect_root(lambda x: betainc(k + 1, n - k, x) - (1.0 - tail), 0.0, 1.0)
    return Estimate(value=k / n, low=low, high=high)


def _t_stats(values: Sequence[float], confidence: float) -> tuple[float, float, float, float]:
    """Mean, the interval's half-width, and the two-sided p-value against 0 (NaN-free)."""
    s = len(values)
    mean = sum(values) / s
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (s - 1))
    se = sd / math.sqrt(s)
    half = student_t_quantile(1.0 - (1.0 - confidence) / 2.0, s - 1) * se
    if se == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        t = mean / se
        p = betainc((s - 1) / 2.0, 0.5, (s - 1) / (s - 1 + t * t))
    return mean, half, min(1.0, p), sd


def student_t_interval(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """The mean of ``values`` (e.g. one figure per training seed) with Student's t interval
    ``mean ± t_{1−α/2, n−1} · sd/√n``. With fewer than two values the interval is undefined:
    ``ValueError``."""
    _check(0, confidence)
    if len(values) < 2:
        raise ValueError(
            f"a t interval needs at least 2 values (got {len(values)}): with one seed the "
            "seed-level interval is undefined"
        )
    mean, half, _, _ = _t_stats([float(v) for v in values], confidence)
    return Estimate(value=mean, low=mean - half, high=mean + half)


# --------------------------------------------------------------------------- means and differences


def bootstrap_mean(
    values: Sequence[float],
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """The mean of ``values`` with a seeded percentile-bootstrap interval.

    Values that are all 0 or all 1 (pass/fail outcomes, scores in [0, 1]) get the exact
    Clopper–Pearson interval instead of the bootstrap's zero-width one (``0/n``:
    ``[0, 1 − (α/2)^(1/n)]``; ``n/n``: ``[(α/2)^(1/n), 1]``). Empty ``values`` give NaN;
    ``n_resamples=0`` (no interval asked), or one value that is not 0 or 1, gives a zero-width
    interval.
    """
    _check(n_resamples, confidence)
    if not values:
        return _NAN
    xs = [float(v) for v in values]
    n = len(xs)
    mean = sum(xs) / n
    if n_resamples == 0:
        return Estimate(value=mean, low=mean, high=mean)
    if mean in (0.0, 1.0) and _binary(xs):
        low, high = _exact_all_same(n, mean == 1.0, confidence)
        return Estimate(value=mean, low=low, high=high)
    if n == 1:
        return Estimate(value=mean, low=mean, high=mean)
    sums = _resampled_sums([xs], n_resamples, seed)
    return _percentiles([s / n for s in sums], confidence, mean)


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    strata: Sequence[Hashable] | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Mean of ``a[i] - b[i]`` with a paired (optionally stratified) bootstrap interval.

    ``a`` and ``b`` hold the two systems' scores on the same items in the same order;
    ``strata`` (same length) groups the items, e.g. by task, and the bootstrap then resamples
    pairs within each group. For pass/fail scores (every score 0 or 1) where the bootstrap
    degenerates, the interval is the conservative exact one of the module doc: ``[−u, u]``
    when no pair is discordant, ``[2L − 1, 1]`` (or its mirror) when every pair is discordant
    one way. The pairs must be independent: for (training seed, item) pairs use
    :func:`seed_paired_difference`. Raises ``ValueError`` when the lengths differ.
    """
    _check(n_resamples, confidence)
    if len(a) != len(b):
        raise ValueError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    if strata is not None and len(strata) != len(a):
        raise ValueError(f"strata has {len(strata)} labels for {len(a)} pairs")
    xs, ys = [float(x) for x in a], [float(y) for y in b]
    diffs = [x - y for x, y in zip(xs, ys, strict=True)]
    if not diffs:
        return _NAN
    n = len(diffs)
    mean = sum(diffs) / n
    if n_resamples == 0:
        return Estimate(value=mean, low=mean, high=mean)
    if _binary(xs) and _binary(ys):
        exact = _exact_paired(diffs, confidence)
        if exact is not None:
            return Estimate(value=mean, low=exact[0], high=exact[1])
    if n == 1:
        return Estimate(value=mean, low=mean, high=mean)
    groups: dict[Hashable, list[float]] = {}
    for label, d in zip(strata if strata is not None else [None] * n, diffs, strict=True):
        groups.setdefault(label, []).append(d)
    sums = _resampled_sums(list(groups.values()), n_resamples, seed)
    return _percentiles([s / n for s in sums], confidence, mean)


class SeedPairedDifference(BaseModel):
    """Arm ``a`` minus arm ``b`` over several training seeds (:func:`seed_paired_difference`).

    ``value`` is the mean over seeds of each seed's mean per-item difference; ``item_low`` /
    ``item_high`` its item-bootstrap interval (items resampled within strata, the seeds held
    fixed); ``seed_low`` / ``seed_high`` its Student-t interval over the per-seed means
    (``df = n_seeds − 1``) and ``seed_p`` the two-sided t-test p-value against 0, all ``None``
    with one seed (undefined, not zero). ``per_seed`` holds each seed's mean difference (keyed
    by ``str(seed)``), ``n_items`` the distinct items, ``n_pairs`` the (seed, item) pairs.
    """

    model_config = ConfigDict(frozen=True)

    value: float
    item_low: float
    item_high: float
    seed_low: float | None
    seed_high: float | None
    seed_p: float | None
    per_seed: dict[str, float]
    n_seeds: int
    n_items: int
    n_pairs: int
    confidence: float

    @property
    def df(self) -> int:
        """Degrees of freedom of the seed-level interval: seeds − 1."""
        return self.n_seeds - 1

    def item_interval(self) -> Estimate:
        """The estimate with its item-bootstrap interval."""
        return Estimate(value=self.value, low=self.item_low, high=self.item_high)

    def seed_interval(self) -> Estimate | None:
        """The estimate with its seed-level (Student t) interval; ``None`` with one seed."""
        if self.seed_low is None or self.seed_high is None:
            return None
        return Estimate(value=self.value, low=self.seed_low, high=self.seed_high)

    def __str__(self) -> str:
        seeds = (
            "undefined with one seed"
            if self.seed_low is None
            else f"{self.seed_low:+.3f}, {self.seed_high:+.3f}"
        )
        return f"{self.value:+.3f} [items {self.item_low:+.3f}, {self.item_high:+.3f}; seeds {seeds}]"


def seed_paired_difference(
    pairs: Mapping[_SeedT, Mapping[_ItemT, tuple[float, float]]],
    strata: Mapping[_ItemT, Hashable] | Callable[[_ItemT], Hashable] | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> SeedPairedDifference:
    """Arm ``a`` minus arm ``b`` when each arm was trained with several training seeds.

    ``pairs`` maps each training seed to ``{item: (a score, b score)}``: the two arms' runs of
    that seed scored on the same items (an item key names the same item in every seed, e.g.
    ``"click-tab/200003"``; a seed may lack items another has). ``strata`` gives an item's
    stratum (e.g. its task), as a mapping or a function of the item key. Returns the mean over
    seeds of the per-seed mean differences with an item-bootstrap interval and a seed-level
    Student-t interval (formulas in the module doc). Pass/fail scores whose bootstrap
    degenerates (every pair tied, or every pair discordant one way) get the conservative exact
    interval over the ``n_items`` items. Raises ``ValueError`` for no seeds or a seed with no
    items.
    """
    _check(n_resamples, confidence)
    if not pairs:
        raise ValueError("pairs is empty: no training seed to compare")
    seeds = list(pairs)
    means: dict[_SeedT, float] = {}
    present: dict[_ItemT, list[tuple[_SeedT, float]]] = {}  # item -> [(seed, d)]
    scores: list[float] = []
    for s in seeds:
        items = pairs[s]
        if not items:
            raise ValueError(f"training seed {s!r} has no scored item")
        diffs = []
        for item, pair in items.items():
            x, y = float(pair[0]), float(pair[1])
            scores += (x, y)
            diffs.append(x - y)
            present.setdefault(item, []).append((s, x - y))
        means[s] = sum(diffs) / len(diffs)
    n_seeds = len(seeds)
    value = sum(means.values()) / n_seeds
    sizes = {s: len(pairs[s]) for s in seeds}
    contributions: dict[_ItemT, float] = {
        item: sum(d / sizes[s] for s, d in entries) / n_seeds for item, entries in present.items()
    }
    n_items = len(contributions)
    per_seed = {str(s): m for s, m in means.items()}
    seed_low = seed_high = seed_p = None
    if n_seeds >= 2:
        _, half, seed_p, _ = _t_stats(list(means.values()), confidence)
        seed_low, seed_high = value - half, value + half

    def stratum(item: _ItemT) -> Hashable:
        if strata is None:
            return None
        if callable(strata):
            return strata(item)
        if item not in strata:
            raise ValueError(f"strata has no stratum for item {item!r}")
        return strata[item]

    low = high = value
    all_diffs = [d for entries in present.values() for _, d in entries]
    exact = _exact_paired(all_diffs, confidence) if n_resamples and _binary(scores) else None
    if exact is not None:
        # every pair tied, or all one way: the exact bound with the items as the unit (an
        # item's seed-averaged difference lies in [-1, 1], so the 0/n and n/n bounds hold)
        edge = _exact_all_same(n_items, True, confidence)[0]  # L = (α/2)^(1/n_items)
        if all(d == 0.0 for d in all_diffs):
            low, high = edge - 1.0, 1.0 - edge
        elif all(d == 1.0 for d in all_diffs):
            low, high = 2.0 * edge - 1.0, 1.0
        else:
            low, high = -1.0, 1.0 - 2.0 * edge
    elif n_resamples and n_items > 1:
        cells: dict[tuple[Hashable, tuple[str, ...]], list[float]] = {}
        for item, entries in present.items():
            pattern = tuple(sorted(repr(s) for s, _ in entries))
            cells.setdefault((stratum(item), pattern), []).append(contributions[item])
        sums = _resampled_sums(list(cells.values()), n_resamples, seed)
        centre = _percentiles(sums, confidence, value)
        low, high = centre.low, centre.high
    return SeedPairedDifference(
        value=value,
        item_low=low,
        item_high=high,
        seed_low=seed_low,
        seed_high=seed_high,
        seed_p=seed_p,
        per_seed=per_seed,
        n_seeds=n_seeds,
        n_items=n_items,
        n_pairs=sum(sizes.values()),
        confidence=confidence,
    )


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for paired pass/fail outcomes of two systems.

    Only discordant pairs count: ``n10`` items that ``a`` passes and ``b`` fails, ``n01`` the
    reverse. With no discordant pair the p-value is 1. The pairs must be independent: pairs
    pooled over training seeds are not (use :func:`seed_paired_difference`).
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
