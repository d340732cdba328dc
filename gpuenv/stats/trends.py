"""Rank tests and trends: the Mann-Whitney U test (do two samples differ), Mann-Kendall
and Theil-Sen (is a series trending, and by how much), `is_steady` (warmup's end)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv.stats.descriptive import _median_sorted, median


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based, ties share their mean rank) and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mid = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mid
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


@dataclass(frozen=True)
class MannWhitney:
    """Result of `mann_whitney(a, b)`.

    `u`: U statistic of `a` (the number of pairs with a > b, ties counting one half);
    `p_value`: two-sided, normal approximation with tie and continuity correction;
    `prob_a_greater`: u / (n_a n_b), the chance a random rep of `a` exceeds one of `b`
    (0.5: no difference).
    """

    u: float
    z: float
    p_value: float
    n_a: int
    n_b: int

    @property
    def prob_a_greater(self) -> float:
        return self.u / (self.n_a * self.n_b)

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test (scipy.stats.mannwhitneyu(a, b, method='asymptotic'))."""
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        raise ValueError("both samples need at least one value")
    pooled = [float(x) for x in a] + [float(x) for x in b]
    if any(math.isnan(x) for x in pooled):
        raise ValueError("NaN among the values")
    ranks, ties = _ranks(pooled)
    r_a = math.fsum(ranks[:na])
    u = r_a - na * (na + 1) / 2.0
    n = na + nb
    mu = na * nb / 2.0
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    var = na * nb / 12.0 * ((n + 1) - tie_term)
    if var <= 0:  # every value equal
        return MannWhitney(u=u, z=0.0, p_value=1.0, n_a=na, n_b=nb)
    diff = u - mu
    corrected = max(abs(diff) - 0.5, 0.0)
    z = math.copysign(corrected, diff) / math.sqrt(var)
    p = min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))
    return MannWhitney(u=u, z=z, p_value=p, n_a=na, n_b=nb)


@dataclass(frozen=True)
class Trend:
    """Result of `mann_kendall(values)`: `s` > 0 rising, < 0 falling; `p_value` two-sided."""

    s: int
    z: float
    p_value: float
    n: int


def mann_kendall(values: Sequence[float]) -> Trend:
    """Mann-Kendall test for a monotonic trend (tie-corrected variance, continuity correction)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n < 3:
        return Trend(s=0, z=0.0, p_value=1.0, n=n)
    s = 0
    for i in range(n - 1):
        xi = xs[i]
        for j in range(i + 1, n):
            d = xs[j] - xi
            s += (d > 0) - (d < 0)
    _, ties = _ranks(xs)
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18.0
    if var <= 0:
        return Trend(s=s, z=0.0, p_value=1.0, n=n)
    if s > 0:
        z = (s - 1) / math.sqrt(var)
    elif s < 0:
        z = (s + 1) / math.sqrt(var)
    else:
        z = 0.0
    return Trend(s=s, z=z, p_value=min(1.0, math.erfc(abs(z) / math.sqrt(2.0))), n=n)


def theil_sen_slope(values: Sequence[float]) -> float:
    """Median of pairwise slopes (per index step): a slope that outliers do not move."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n < 2:
        return 0.0
    slopes = [(xs[j] - xs[i]) / (j - i) for i in range(n - 1) for j in range(i + 1, n)]
    slopes.sort()
    return _median_sorted(slopes)


def ols_slope(values: Sequence[float], *, clip_mad: float = 5.0) -> float:
    """Least-squares slope per index step, after clipping values farther than `clip_mad`
    median absolute deviations from the median (one hiccup must not tilt the line).

    Unlike `theil_sen_slope` it sees a slow staircase (a clock stepping down one
    15 MHz step at a time), where most pairs are equal and the median slope is 0.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n < 2:
        return 0.0
    med = median(xs)
    mad = median([abs(x - med) for x in xs])
    if mad > 0:
        lo, hi = med - clip_mad * mad, med + clip_mad * mad
        xs = [min(max(x, lo), hi) for x in xs]
    mean_i = (n - 1) / 2.0
    mean_x = math.fsum(xs) / n
    num = math.fsum((i - mean_i) * (x - mean_x) for i, x in enumerate(xs))
    den = math.fsum((i - mean_i) ** 2 for i in range(n))
    return num / den


def relative_drift(values: Sequence[float]) -> float:
    """Theil-Sen change across the whole series, relative to its median (signed)."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    if m == 0:
        return 0.0
    return theil_sen_slope(values) * (len(values) - 1) / m


def is_steady(values: Sequence[float], *, rel_tol: float = 0.01, alpha: float = 0.05) -> bool:
    """True when `values` do not trend: no significant Mann-Kendall trend, or one that moves
    the series by less than `rel_tol` of its median from end to end.

    Both conditions are needed: on a long window a 0.1% creep is significant but
    harmless; on a short noisy one a big Theil-Sen slope may be chance.
    """
    if len(values) < 3:
        return False
    if abs(relative_drift(values)) < rel_tol:
        return True
    return mann_kendall(values).p_value >= alpha
