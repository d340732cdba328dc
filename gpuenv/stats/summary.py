"""`summarize` (median, IQR, mean, min, max, CI, count, high spread) and `StopRule`
(stop when the median's CI is within a relative target, or a budget runs out)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv.stats.descriptive import _median_sorted, _quantile_sorted, _sorted, median_ci_ranks

# IQR / median above this makes `Summary.high_spread` true.
HIGH_SPREAD_REL_IQR = 0.05


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
