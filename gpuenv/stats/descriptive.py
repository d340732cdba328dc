"""Order statistics: quantiles, median, IQR, and confidence intervals of the median
(distribution-free from order statistics, or by bootstrap)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

# Above this many values the binomial order-statistic CI uses the normal
# approximation (exact sums of binomial coefficients get slow and the two agree).
_EXACT_BINOMIAL_MAX_N = 400


def _sorted(values: Sequence[float]) -> list[float]:
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("no values")
    if any(math.isnan(x) for x in xs):
        raise ValueError("NaN among the values")
    return xs


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1), linear interpolation between order statistics."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    xs = _sorted(values)
    return _quantile_sorted(xs, q)


def _quantile_sorted(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    """Interquartile range: the 75th minus the 25th percentile."""
    xs = _sorted(values)
    return _quantile_sorted(xs, 0.75) - _quantile_sorted(xs, 0.25)


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _normal_ppf(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9,
    polished by one Newton step)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability {p} is outside (0, 1)")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    plow = 0.02425
    if p < plow:
        q = math.sqrt(-2 * math.log(p))
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    elif p > 1 - plow:
        q = math.sqrt(-2 * math.log(1 - p))
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    else:
        q = p - 0.5
        r = q * q
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
            ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    # one Newton step against erfc
    e = _normal_cdf(x) - p
    return x - e * math.sqrt(2 * math.pi) * math.exp(x * x / 2)


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """1-based ranks (lo, hi) of the order statistics that bound the median, and their coverage.

    The interval [x_(lo), x_(hi)] covers the true median with probability
    `coverage` >= `confidence` for any continuous distribution. When n is too
    small for the asked confidence (n < 6 at 95%), it is [min, max] and
    `coverage` says how much less it is.
    """
    if n < 1:
        raise ValueError("no values")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    alpha = 1.0 - confidence
    if n <= _EXACT_BINOMIAL_MAX_N:
        # largest k with P(X <= k - 1) <= alpha / 2: the interval is [x_(k), x_(n-k+1)]
        # P(X <= k) summed as k grows (exact integers; one comb update a step: recomputing
        # each CDF from scratch cost ~30,000 comb() calls, ~28 ms, for 300 reps on the H100)
        k, cdf, total, term, denom = 0, 0.0, 0, 1, 2**n
        while True:
            total += term  # sum of C(n, i) for i <= k
            nxt = total / denom
            if nxt > alpha / 2:
                break
            cdf = nxt
            k += 1
            term = term * (n - k + 1) // k
        if k == 0:
            return 1, n, 1.0 - 2.0 * 0.5**n
        return k, n - k + 1, 1.0 - 2.0 * cdf
    z = _normal_ppf(1.0 - alpha / 2)
    k = max(1, math.floor((n - z * math.sqrt(n)) / 2.0))
    # coverage by the normal approximation with continuity correction
    tail = _normal_cdf((k - 1 + 0.5 - n / 2) / (math.sqrt(n) / 2))
    return k, n - k + 1, 1.0 - 2.0 * tail


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median from order statistics (see `median_ci_ranks`)."""
    xs = _sorted(values)
    lo, hi, _ = median_ci_ranks(len(xs), confidence)
    return xs[lo - 1], xs[hi - 1]


def bootstrap_median_ci(
    values: Sequence[float], confidence: float = 0.95, *, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap CI of the median (deterministic for a given seed)."""
    xs = _sorted(values)
    rng = random.Random(seed)
    n = len(xs)
    meds = sorted(_median_sorted(sorted(rng.choices(xs, k=n))) for _ in range(n_boot))
    alpha = 1.0 - confidence
    return _quantile_sorted(meds, alpha / 2), _quantile_sorted(meds, 1 - alpha / 2)


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    *,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of median(b) / median(a), resampling each side on its own."""
    xa, xb = _sorted(a), _sorted(b)
    rng = random.Random(seed)
    ratios = []
    for _ in range(n_boot):
        ma = _median_sorted(sorted(rng.choices(xa, k=len(xa))))
        mb = _median_sorted(sorted(rng.choices(xb, k=len(xb))))
        ratios.append(mb / ma if ma else math.inf)
    ratios.sort()
    alpha = 1.0 - confidence
    return _quantile_sorted(ratios, alpha / 2), _quantile_sorted(ratios, 1 - alpha / 2)


def _median_sorted(xs: list[float]) -> float:
    return _quantile_sorted(xs, 0.5)
