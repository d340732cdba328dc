"""`levels(values)`: did a series of rep times hold one level, or two? A trend (the reps
drift), a step (they move from one level to another at some rep) or a split (they
alternate between two modes, e.g. 3.2 and 3.55 us).

Each shape must pass two tests: its size (the two levels differ by more than
`min_rel` of the lower one) and its evidence against plain noise, judged on ranks so
that outliers do not move it:
  step   the split of the series in time whose Mann-Whitney z is largest (prefix sums of
         ranks: O(n) over every split), |z| >= STEP_Z (well past what the largest of a
         steady series' splits reaches) and its levels STEP_SIGMAS noise sigmas apart;
  trend  Mann-Kendall on block medians (at most TREND_BLOCKS of them, so 10,000 reps
         cost what 64 do), p < TREND_ALPHA, and a Theil-Sen change end to end;
  split  the largest gap between sorted values that leaves at least SPLIT_MIN_SHARE of
         the reps on each side, wider than SPLIT_GAP_IQR times the larger side's IQR: two
         modes leave an empty band between them, noise does not.
A step and a trend both fitting: the one whose model leaves the smaller absolute
residuals (on the block medians) names it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.stats.descriptive import _median_sorted, _quantile_sorted
from gpuenv.stats.trends import _ranks, mann_kendall, mann_whitney, theil_sen_slope
from gpuenv.units import fmt_s

MIN_REPS = 10  # fewer reps: no claim about their shape
MIN_SHARE = 0.1  # a step leaves at least this share of the reps (and 3) on each side
SPLIT_MIN_REPS = 20  # two modes: only from this many reps, each mode holding at least
SPLIT_MIN_SIDE = 5  # this many reps and this share of them (a few outliers are no mode)
SPLIT_MIN_SHARE = 0.15
STEP_Z = 4.0  # a steady series' largest split reaches ~2.5-3; 4 is rare by chance
STEP_SIGMAS = 1.0  # ...and its levels this many noise sigmas apart
TREND_ALPHA = 1e-4
TREND_BLOCKS = 64
SPLIT_GAP_IQR = 3.0
SPLIT_STRAY = 0.005
SEGREGATED_Z = 3.0  # two modes apart in time (Mann-Whitney z of their indices): a step


@dataclass(frozen=True)
class Levels:
    """Two levels a series held. `shape`: "trend", "step" or "split"; `first`/`second`:
    the level at the start and at the end (trend, step; the fitted line's ends for a
    trend), or the lower and the higher mode (split); `reps`: the indices at the second
    level (after the step, where a trend has moved by more than half its change, or the
    smaller mode); `at`: the first rep of the second level (step) else None."""

    shape: str
    first: float
    second: float
    reps: tuple[int, ...]
    at: int | None = None

    @property
    def rel(self) -> float:
        """The change, relative to the lower level (signed: + when the second is higher)."""
        lo = min(self.first, self.second)
        return (self.second - self.first) / lo if lo > 0 else math.inf

    def counts(self, values: Sequence[float]) -> tuple[int, int]:
        """Of `values` (the series it was found in), how many lie nearer each level."""
        mid = (self.first + self.second) / 2
        above = sum(1 for v in values if v > mid)
        return (
            (len(values) - above, above)
            if self.second >= self.first
            else (above, len(values) - above)
        )

    def details(self, values: Sequence[float], offset: int = 0) -> dict[str, Any]:
        """The numbers behind `describe`, for a finding's details (rep indices + offset)."""
        out: dict[str, Any] = {
            "shape": self.shape,
            "first_s": self.first,
            "second_s": self.second,
            "rel": self.rel,
        }
        if self.shape == "split":
            out["low_reps"], out["high_reps"] = self.counts(values)
        if self.at is not None:
            out["at_rep"] = offset + self.at
        return out

    def describe(self, values: Sequence[float], offset: int = 0) -> str:
        """What a person reads: the shape and its two levels (times in seconds)."""
        a, b, n = fmt_s(self.first), fmt_s(self.second), len(values)
        if self.shape == "split":
            lo, hi = self.counts(values)
            return (
                f"the reps split into two levels, {a} ({lo} reps) and {b} ({hi} reps), "
                f"{abs(self.rel):.1%} apart: the median stands for neither; look for what "
                "alternates (the kernel chosen, where memory lands, a graph's capture)"
            )
        if self.shape == "step":
            how = (
                f"stepped from {a} to {b} ({self.rel:+.1%}) at rep "
                f"{offset + (self.at or 0)} of {offset + n}"
            )
        else:
            how = f"drifted from {a} to {b} ({self.rel:+.1%}) over {n} reps"
        return (
            f"the reps {how}: something changed while they ran (the GPU's clock under "
            "the power cap or heat, another process, the host); the median mixes both "
            "levels"
        )


def levels(values: Sequence[float], *, min_rel: float = 0.02) -> Levels | None:
    """The two levels `values` held, or None when they held one (see the module docstring)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n < MIN_REPS or any(math.isnan(x) for x in xs):
        return None
    m = max(3, math.ceil(MIN_SHARE * n))
    blocks = _blocks(xs)
    step = _step(xs, m, min_rel)
    trend = _trend(xs, blocks, min_rel)
    if step is not None and trend is not None:
        return step if _residual_step(blocks, step, n) <= _residual_trend(blocks) else trend
    if step or trend or n < SPLIT_MIN_REPS:
        return step or trend
    return _split(xs, max(SPLIT_MIN_SIDE, math.ceil(SPLIT_MIN_SHARE * n)), min_rel)


def slow_head(
    times: Sequence[float], *, rel: float, mad_k: float, min_reps: int
) -> tuple[list[int], float | None]:
    """The leading reps slower than the settled median (that of the last half) by more than
    `rel` of it and `mad_k` median absolute deviations (a warmup ramp), and that median."""
    if len(times) < min_reps:
        return [], None
    tail = sorted(times[len(times) // 2 :])
    settled = _median_sorted(tail)
    mad = _median_sorted(sorted(abs(t - settled) for t in tail))
    limit = settled + max(rel * settled, mad_k * mad)
    head: list[int] = []
    for i, t in enumerate(times):
        if t <= limit or i >= len(times) // 2:
            break
        head.append(i)
    return head, settled


def _iqr_sorted(xs: list[float]) -> float:
    return _quantile_sorted(xs, 0.75) - _quantile_sorted(xs, 0.25)


def _blocks(xs: list[float]) -> list[float]:
    """Medians of at most TREND_BLOCKS consecutive runs of about equal length."""
    n = len(xs)
    k = min(TREND_BLOCKS, max(MIN_REPS, n // 2))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [_median_sorted(sorted(xs[a:b])) for a, b in itertools.pairwise(bounds)]


def _step(xs: list[float], m: int, min_rel: float) -> Levels | None:
    n = len(xs)
    ranks, ties = _ranks(xs)
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    best_z, best_k = 0.0, None
    prefix = 0.0
    for k in range(1, n - m + 1):
        prefix += ranks[k - 1]
        if k < m:
            continue
        u = prefix - k * (k + 1) / 2.0
        var = k * (n - k) / 12.0 * ((n + 1) - tie_term)
        if var <= 0:
            continue
        z = (u - k * (n - k) / 2.0) / math.sqrt(var)
        if abs(z) > abs(best_z):
            best_z, best_k = z, k
    if best_k is None or abs(best_z) < STEP_Z:
        return None
    left, right = sorted(xs[:best_k]), sorted(xs[best_k:])
    before, after = _median_sorted(left), _median_sorted(right)
    # the levels apart by more than the noise around them (a robust sigma, IQR / 1.349):
    # the largest of many splits of a noisy series finds a significant but small shift
    sigma = max(_iqr_sorted(left), _iqr_sorted(right)) / 1.349
    if abs(after - before) <= max(min_rel * min(before, after), STEP_SIGMAS * sigma):
        return None
    return Levels("step", before, after, tuple(range(best_k, n)), best_k)


def _trend(xs: list[float], blocks: list[float], min_rel: float) -> Levels | None:
    if len(blocks) < MIN_REPS or mann_kendall(blocks).p_value >= TREND_ALPHA:
        return None
    start, end = _line(blocks)
    if min(start, end) <= 0 or abs(end - start) <= min_rel * min(start, end):
        return None
    n = len(xs)
    cut = n // 2  # past the middle the line has made more than half its change
    return Levels("trend", start, end, tuple(range(cut, n)))


def _split(xs: list[float], m: int, min_rel: float) -> Levels | None:
    n = len(xs)
    order = sorted(range(n), key=lambda i: xs[i])
    s = [xs[i] for i in order]
    # the band's width with a few stragglers in it ignored (SPLIT_STRAY of the reps each
    # side): among 1000 reps of two modes, one rep between them must not hide the band
    t = int(SPLIT_STRAY * n)
    best, cut = 0.0, None
    for i in range(max(m, t + 1), min(n - m, n - 1 - t) + 1):
        gap = s[i + t] - s[i - 1 - t]
        if gap > best:
            best, cut = gap, i
    if cut is None:
        return None
    lo, hi = s[:cut], s[cut:]
    lo_med, hi_med = _median_sorted(lo), _median_sorted(hi)
    # two modes leave an empty band between them, several times wider than either's IQR;
    # noise cut at its widest gap does not. A timer's resolution (values in steps) must not
    # pass for a narrow mode.
    quantum = min(
        (b - a for side in (lo, hi) for a, b in itertools.pairwise(side) if b > a), default=0.0
    )
    spread = max(_iqr_sorted(lo), _iqr_sorted(hi), 2 * quantum)
    if hi_med - lo_med <= min_rel * lo_med or best <= SPLIT_GAP_IQR * spread:
        return None
    low_idx, high_idx = order[:cut], order[cut:]
    z = mann_whitney([float(i) for i in high_idx], [float(i) for i in low_idx]).z
    if abs(z) >= SEGREGATED_Z:  # one mode before the other: a step, too few reps for _step
        first, second = (lo_med, hi_med) if z > 0 else (hi_med, lo_med)
        later = high_idx if z > 0 else low_idx
        at = min(later)
        return Levels("step", first, second, tuple(range(at, n)), at)
    minority = high_idx if len(hi) <= len(lo) else low_idx
    return Levels("split", lo_med, hi_med, tuple(sorted(minority)))


def _residual_step(blocks: list[float], step: Levels, n: int) -> float:
    k = len(blocks)
    at = (step.at or 0) * k / n
    return math.fsum(
        abs(b - (step.first if i + 0.5 < at else step.second)) for i, b in enumerate(blocks)
    )


def _line(blocks: list[float]) -> tuple[float, float]:
    """The Theil-Sen line through the blocks, at the first and the last."""
    slope = theil_sen_slope(blocks)
    intercept = _median_sorted(sorted(b - slope * i for i, b in enumerate(blocks)))
    return intercept, intercept + slope * (len(blocks) - 1)


def _residual_trend(blocks: list[float]) -> float:
    start, end = _line(blocks)
    slope = (end - start) / max(len(blocks) - 1, 1)
    return math.fsum(abs(b - (start + slope * i)) for i, b in enumerate(blocks))


__all__ = ["Levels", "levels", "slow_head"]
