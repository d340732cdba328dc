"""What a bench publishes about its reps: the kept reps' statistics and their effective
clocks. What makes the number weak (a high spread, a CI short of its target) is the judge's
(findings "spread" and "weak_ci", gpuenv.verdict.number)."""

from __future__ import annotations

from typing import Any

from gpuenv import stats
from gpuenv.results import Measurement
from gpuenv.timing.config import BenchConfig
from gpuenv.timing.devices import Rep
from gpuenv.verdict import GpuFacts


def rep_stats(
    m: Measurement,
    reps: list[Rep],
    cfg: BenchConfig,
    rule: stats.StopRule,
    facts: GpuFacts | None,
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """Statistics of the kept reps and effective clocks (against `facts`' maximum), for
    `extra`; and the median's confidence interval (`Stats.ci_s`), None with no rep kept."""
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
    return extra, ci


__all__ = ["rep_stats"]
