"""Statistics for benchmark repetitions, in pure Python (no numpy, no scipy).

- `quantile`, `median`, `iqr`: linear interpolation between order statistics
  (Hyndman-Fan type 7, numpy's default), so numbers match what people compute.
- `median_ci`: a distribution-free confidence interval of the median from order
  statistics (binomial); `bootstrap_median_ci` and `bootstrap_ratio_ci` resample.
- `mann_whitney`: the Mann-Whitney U test, normal approximation with tie and
  continuity correction (scipy's `mannwhitneyu(method="asymptotic")`).
- `mann_kendall` and `theil_sen_slope`: is a series trending, and by how much.
  `is_steady` combines them: warmup ends when rep times and clocks stop trending.
- `StopRule`: stop when the median's confidence interval is within a relative
  target, or a time budget or rep cap runs out, whichever first.
- `summarize`: median, IQR, mean, min, max, CI, count and a high-spread flag.

Benchmark times are skewed and carry outliers (a preempted rep, a clock step),
so every decision here rests on medians and ranks, never on means and stdevs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

# Above this many values the binomial order-statistic CI uses the normal
# approximation (exact sums of binomial coefficients get slow and the two agree).
_EXACT_BINOMIAL_MAX_N = 400

# IQR / median above this makes `Summary.high_spread` true.
HIGH_SPREAD_REL_IQR = 0.05


# --- descriptive ------------------------------------------------------------------


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


# --- confidence interval of the median -----------------------------------------------


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


def _binom_half_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    total = sum(math.comb(n, i) for i in range(k + 1))
    return total / 2**n


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
        k = 0
        cdf = 0.0
        while True:
            nxt = _binom_half_cdf(k, n)
            if nxt > alpha / 2:
                break
            cdf = nxt
            k += 1
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


# --- rank tests ----------------------------------------------------------------------


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


# --- trends --------------------------------------------------------------------------


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


# --- summary and stopping rule -------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of rep times (seconds) with the median's CI."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    q1: float
    q3: float
    ci_lo: float
    ci_hi: float
    ci_coverage: float  # actual coverage of [ci_lo, ci_hi] (>= the asked confidence if n allows)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_ci(self) -> float:
        """Half-width of the median's CI relative to the median (the larger side)."""
        return _rel_half_width(self.median, self.ci_lo, self.ci_hi)

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median else math.inf

    @property
    def high_spread(self) -> bool:
        return self.rel_iqr > HIGH_SPREAD_REL_IQR

    def to_dict(self) -> dict[str, float | int | bool]:
        return {
            "n": self.n,
            "median_s": self.median,
            "mean_s": self.mean,
            "min_s": self.min,
            "max_s": self.max,
            "q1_s": self.q1,
            "q3_s": self.q3,
            "iqr_s": self.iqr,
            "ci_lo_s": self.ci_lo,
            "ci_hi_s": self.ci_hi,
            "ci_coverage": self.ci_coverage,
            "rel_ci": self.rel_ci,
            "high_spread": self.high_spread,
        }


def _rel_half_width(med: float, lo: float, hi: float) -> float:
    if med == 0:
        return 0.0 if lo == hi else math.inf
    return max(med - lo, hi - med) / abs(med)


def summarize(values: Sequence[float], confidence: float = 0.95) -> Summary:
    xs = _sorted(values)
    lo, hi, coverage = median_ci_ranks(len(xs), confidence)
    return Summary(
        n=len(xs),
        median=_median_sorted(xs),
        mean=math.fsum(xs) / len(xs),
        min=xs[0],
        max=xs[-1],
        q1=_quantile_sorted(xs, 0.25),
        q3=_quantile_sorted(xs, 0.75),
        ci_lo=xs[lo - 1],
        ci_hi=xs[hi - 1],
        ci_coverage=coverage,
    )


STOP_REASONS = ("converged", "budget", "max_reps")


@dataclass(frozen=True)
class StopRule:
    """When to stop taking reps.

    Stop when the median's CI (at `confidence`) is within `rel_ci` of the median
    ("converged"), when `budget_s` of measuring time has passed ("budget"), or at
    `max_reps` ("max_reps"), whichever comes first; never before `min_reps`
    (except on the budget, which is a hard limit). `rel_ci=0` turns convergence
    off: a fixed count or a fixed time.
    """

    rel_ci: float = 0.01
    budget_s: float = 10.0
    min_reps: int = 10
    max_reps: int = 100_000
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.rel_ci < 0:
            raise ValueError("rel_ci must be >= 0")
        if self.budget_s <= 0:
            raise ValueError("budget_s must be > 0")
        if self.min_reps < 1 or self.max_reps < self.min_reps:
            raise ValueError("need 1 <= min_reps <= max_reps")

    def check(self, times: Sequence[float], elapsed_s: float) -> str | None:
        """The reason to stop now (one of STOP_REASONS), or None to take another rep."""
        n = len(times)
        if n >= self.max_reps:
            return "max_reps"
        if elapsed_s >= self.budget_s and n >= 1:
            return "budget"
        if n < self.min_reps or self.rel_ci <= 0:
            return None
        xs = _sorted(times)
        lo, hi, coverage = median_ci_ranks(n, self.confidence)
        if coverage < self.confidence:
            return None
        if _rel_half_width(_median_sorted(xs), xs[lo - 1], xs[hi - 1]) <= self.rel_ci:
            return "converged"
        return None


__all__ = [
    "HIGH_SPREAD_REL_IQR",
    "STOP_REASONS",
    "MannWhitney",
    "StopRule",
    "Summary",
    "Trend",
    "bootstrap_median_ci",
    "bootstrap_ratio_ci",
    "iqr",
    "is_steady",
    "mann_kendall",
    "mann_whitney",
    "median",
    "median_ci",
    "median_ci_ranks",
    "ols_slope",
    "quantile",
    "relative_drift",
    "summarize",
    "theil_sen_slope",
]
