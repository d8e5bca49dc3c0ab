"""The distributions the intervals invert: the binomial CDF, the regularised incomplete beta
function and Student's t, in pure Python (no scipy).

- :func:`binomial_cdf`: ``P(X <= j)`` for ``X ~ Binomial(r, p)`` at ``j = 0 … r``, from the mode
  outwards with the ratio ``P(j + 1)/P(j) = (r − j)/(j + 1) · p/(1 − p)`` (no under- or overflow
  at large ``r``); the resampling draws multinomial counts by inverting it.
- :func:`betainc`: ``I_x(a, b)`` by its continued fraction (modified Lentz), on the side of
  ``x`` where it converges, with ``I_x(a, b) = 1 − I_{1−x}(b, a)`` on the other; the
  Clopper–Pearson bounds are its quantiles.
- :func:`student_t_quantile`: from ``P(T <= t) = 1 − ½ I_{df/(df+t²)}(df/2, ½)`` for ``t >= 0``,
  inverted by bisection; tested against printed tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def binomial_cdf(r: int, p: float) -> list[float]:
    """The CDF of Binomial(r, p) at 0 … r, its last entry exactly 1.0."""
    if p <= 0.0:
        return [1.0] * (r + 1)
    if p >= 1.0:
        return [0.0] * r + [1.0]
    mode = min(r, int((r + 1) * p))
    pmf = [0.0] * (r + 1)
    pmf[mode] = math.exp(
        math.lgamma(r + 1)
        - math.lgamma(mode + 1)
        - math.lgamma(r - mode + 1)
        + mode * math.log(p)
        + (r - mode) * math.log1p(-p)
    )
    odds = p / (1.0 - p)
    for j in range(mode, r):  # P(j + 1) = P(j) · (r − j)/(j + 1) · p/(1 − p)
        pmf[j + 1] = pmf[j] * (r - j) / (j + 1) * odds
    for j in range(mode, 0, -1):
        pmf[j - 1] = pmf[j] * j / ((r - j + 1) * odds)
    cdf, total = [], 0.0
    for x in pmf:
        total += x
        cdf.append(total)
    return [c / total for c in cdf]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz), for x < (a + 1)/(a + b + 2)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        # even term: m (b − m) x / ((a + 2m − 1)(a + 2m)); odd: −(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def bisect_root(f: Callable[[float], float], low: float, high: float) -> float:
    """The root of increasing ``f`` in ``[low, high]`` (``f(low) <= 0 <= f(high)``)."""
    for _ in range(200):
        mid = (low + high) / 2.0
        if f(mid) < 0.0:
            low = mid
        else:
            high = mid
        if high - low <= 1e-15 * max(1.0, abs(mid)):
            break
    return (low + high) / 2.0


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, e.g.
    ``student_t_quantile(0.975, 2) = 4.303``. Raises ``ValueError`` unless ``0 < p < 1`` and
    ``df > 0``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be between 0 and 1, got {p}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    high = 1.0
    while _t_cdf(high, df) < p:
        high *= 2.0
    return bisect_root(lambda t: _t_cdf(t, df) - p, 0.0, high)
