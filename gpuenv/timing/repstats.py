"""What a bench publishes about its reps: the kept reps' statistics, their effective
clocks, and what makes the number weak (a high spread, a CI short of its target)."""

from __future__ import annotations

import logging
from typing import Any

from gpuenv import stats
from gpuenv.results import Measurement
from gpuenv.timing.config import BenchConfig
from gpuenv.timing.devices import Rep
from gpuenv.verdict import GpuFacts

log = logging.getLogger(__name__)


def rep_stats(
    m: Measurement,
    reps: list[Rep],
    cfg: BenchConfig,
    stop: str,
    rule: stats.StopRule,
    facts: GpuFacts | None,
    name: str,
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """Statistics of the kept reps, effective clocks (against `facts`' maximum), and what
    makes the number weak, for `extra`; and the median's confidence interval
    (`Stats.ci_s`), None with no rep kept."""
    extra: dict[str, Any] = {"confidence": cfg.confidence, "rel_ci_target": rule.rel_ci}
    rejected = set(m.rejected_reps)
    kept = [r for i, r in enumerate(reps) if i not in rejected]
    rep_clocks = [r.clock_mhz for r in reps if r.clock_mhz is not None]
    extra["rep_clock_mhz"] = [r.clock_mhz for r in reps] if rep_clocks else None
    if not kept:
        return extra, None
    summary = stats.summarize([r.time_s for r in kept], cfg.confidence)
    ci = (summary.ci_lo, summary.ci_hi)
    extra.update(summary=summary.to_dict(), ci_s=list(ci), rel_ci=summary.rel_ci)
    ref_mhz = facts.max_sm_mhz if facts is not None and facts.max_sm_mhz else None
    if rep_clocks:
        extra["rep_clock_mhz_median"] = stats.median(rep_clocks)
    if rep_clocks and len(rep_clocks) == len(reps) and ref_mhz:
        # time x effective clock / reference clock: what the rep would take at the
        # reference clock. Meaningful for compute-bound kernels only.
        extra["time_at_ref_clock_s"] = stats.median(
            [r.time_s * (r.clock_mhz or 0.0) / ref_mhz for r in kept]
        )
        extra["ref_clock_mhz"] = ref_mhz
    warnings_ = []
    if summary.high_spread:
        warnings_.append(
            f"high spread: IQR is {summary.rel_iqr:.1%} of the median "
            f"(over {stats.HIGH_SPREAD_REL_IQR:.0%})"
        )
    if rule.rel_ci > 0 and stop != "converged" and summary.rel_ci > rule.rel_ci:
        warnings_.append(
            f"the median's CI is +-{summary.rel_ci:.2%}, not within the "
            f"{rule.rel_ci:.2%} target ({stop})"
        )
    elif rule.rel_ci > 0 and stop != "converged":
        warnings_.append(
            f"only {summary.n} reps before the {stop} ran out (min_reps is "
            f"{rule.min_reps}): the CI of +-{summary.rel_ci:.2%} rests on few reps"
        )
    if warnings_:
        extra["warnings"] = warnings_
        for w in warnings_:
            log.warning("%s: %s", name, w)
    return extra, ci


__all__ = ["rep_stats"]
