"""Statistics for benchmark repetitions, in pure Python (no numpy, no scipy).

- `quantile`, `median`, `iqr`: linear interpolation between order statistics
  (Hyndman-Fan type 7, numpy's default), so numbers match what people compute.
- `median_ci`: a distribution-free confidence interval of the median from order
  statistics (binomial); `bootstrap_median_ci` and `bootstrap_ratio_ci` resample.
- `mann_whitney`: the Mann-Whitney U test, normal approximation with tie and
  continuity correction (scipy's `mannwhitneyu(method="asymptotic")`).
- `mann_kendall` and `theil_sen_slope`: is a series trending, and by how much.
  `is_steady` combines them: warmup ends when rep times and clocks stop trending.
- `levels`: did the reps hold one level, or drift, step or split into two modes.
- `StopRule`: stop when the median's confidence interval is within a relative
  target, or a time budget or rep cap runs out, whichever first.
- `summarize`: median, IQR, mean, min, max, CI, count and a high-spread flag.

Benchmark times are skewed and carry outliers (a preempted rep, a clock step),
so every decision here rests on medians and ranks, never on means and stdevs.

The package: descriptive.py (quantiles, the median's CI), trends.py (rank tests,
trends, is_steady), levels.py (levels), summary.py (summarize, StopRule).
"""

from __future__ import annotations

from gpuenv.stats.descriptive import (
    bootstrap_median_ci,
    bootstrap_ratio_ci,
    iqr,
    median,
    median_ci,
    median_ci_ranks,
    quantile,
)
from gpuenv.stats.levels import Levels, levels
from gpuenv.stats.summary import HIGH_SPREAD_REL_IQR, STOP_REASONS, StopRule, Summary, summarize
from gpuenv.stats.trends import (
    MannWhitney,
    Trend,
    is_steady,
    mann_kendall,
    mann_whitney,
    ols_slope,
    relative_drift,
    theil_sen_slope,
)

__all__ = [
    "HIGH_SPREAD_REL_IQR",
    "STOP_REASONS",
    "Levels",
    "MannWhitney",
    "StopRule",
    "Summary",
    "Trend",
    "bootstrap_median_ci",
    "bootstrap_ratio_ci",
    "iqr",
    "is_steady",
    "levels",
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
