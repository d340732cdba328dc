"""Findings from the reps over time: a GPU still warming up (`warmup_ramp`), rep times that
drift, step or split in two (`drift`, `bimodal`), an SM clock that moved between reps
(`clock_drift`), and a call too short to time alone (`tiny_kernel`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuenv.reasons import Reason
from gpuenv.stats.descriptive import median as stats_median
from gpuenv.stats.levels import levels, slow_head
from gpuenv.telemetry import Window
from gpuenv.units import fmt_s
from gpuenv.verdict.records import Finding, FindingKind, GpuFacts, VerdictConfig, reps_text


def warmup_ramp(
    g: int, ws: list[Window], times: Sequence[float] | None, f: GpuFacts, c: VerdictConfig
) -> list[Finding]:
    cold: list[int] = []
    for i, w in enumerate(ws):
        # the GPU must also have woken in (or just after) the region: one that stayed
        # idle throughout is one the work did not use (another GPU of a sampled set)
        rose = w.sm_mhz_start is not None and (w.sm_mhz_max or 0.0) > w.sm_mhz_start
        idle = bool(w.reasons_start & Reason.GPU_IDLE)
        rose = rose or (idle and not w.reasons_end & Reason.GPU_IDLE) or bool(w.own_process)
        low = (
            f.max_sm_mhz is not None
            and w.sm_mhz_start is not None
            and w.sm_mhz_start < c.idle_clock_fraction * f.max_sm_mhz
            and f.lock_range_mhz is None
        )
        if (idle or low) and rose:
            cold.append(i)
    head, settled = (
        slow_head(times, rel=c.ramp_rel, mad_k=c.ramp_mad_k, min_reps=c.ramp_min_reps)
        if times is not None
        else ([], None)
    )
    reps = sorted(set(cold) | set(head))
    if not reps:
        return []
    why = []
    if cold:
        w0 = ws[cold[0]]
        if w0.reasons_start & Reason.GPU_IDLE:
            why.append(
                f"{reps_text(cold, len(ws))} started with the GPU idle (GpuIdle: no "
                "CUDA context yet, or one just created)"
            )
        else:
            why.append(
                f"{reps_text(cold, len(ws))} started at an idle clock of {w0.sm_mhz_start:.0f} MHz"
            )
    if head and settled is not None and times is not None:
        worst = max(times[i] for i in head)
        why.append(
            f"the first {len(head)} rep{'s were' if len(head) > 1 else ' was'} "
            f"up to {worst / settled:.2f}x slower than the settled median"
        )
    return [
        Finding(
            "warmup_ramp",
            "warning",
            tuple(reps),
            f"GPU {g} was still warming up: "
            + "; ".join(why)
            + "; warm up longer, or let gpuenv.bench discard warmup reps",
            g,
            {"cold_start_reps": len(cold), "slow_head_reps": len(head)},
        )
    ]


def levels_moved(g: int | None, times: Sequence[float], c: VerdictConfig) -> list[Finding]:
    """Reps that drift, step or split into two modes (the warmup ramp's head left out)."""
    skip = len(slow_head(times, rel=c.ramp_rel, mad_k=c.ramp_mad_k, min_reps=c.ramp_min_reps)[0])
    found = levels(times[skip:], min_rel=c.level_rel)
    if found is None:
        return []
    kind: FindingKind = "bimodal" if found.shape == "split" else "drift"
    return [
        Finding(
            kind,
            "warning",
            tuple(skip + i for i in found.reps),
            found.describe(times[skip:], skip),
            g,
            found.details(times[skip:], skip),
        )
    ]


def tiny_call(
    call_s: float, threshold_s: float, n_reps: int, gpu: int | None, *, asked_events: bool = True
) -> Finding:
    """A call under `threshold_s` timed alone between CUDA events: what its number holds
    besides the kernel, why it moves, and what times the kernel alone. `asked_events`: the
    caller chose the events (mode "events", the do_bench drop-in); otherwise it asked for
    the default, whose CUPTI another profiler of the process holds."""
    remedy = (
        "for the kernel's own time use gpuenv.bench's default (mode='auto': its device "
        "time from CUPTI)"
        if asked_events
        else "gpuenv.bench's default times the kernel's device time from CUPTI, which "
        "another profiler of this process holds (torch.profiler, Nsight): measure outside it"
    )
    return Finding(
        "tiny_kernel",
        "info",
        tuple(range(n_reps)),
        f"one call took {fmt_s(call_s)}, under {fmt_s(threshold_s, 'short')}, timed alone "
        "between CUDA events: the time holds ~2-5 us of launch and event overhead besides "
        f"the kernel, and on an H100 such times moved 7-14% between runs at the same SM clock; "
        f"{remedy}",
        gpu,
        {"call_s": call_s, "threshold_s": threshold_s},
    )


def clock_drift(g: int, ws: list[Window], c: VerdictConfig) -> list[Finding]:
    means = [(i, w.sm_mhz_mean) for i, w in enumerate(ws) if w.sm_mhz_mean is not None]
    if len(means) < 2:
        return []
    median = stats_median([m for _, m in means])
    if median <= 0:
        return []
    reps = [i for i, m in means if abs(m - median) > c.clock_drift_rel * median]
    if not reps:
        return []
    lo = min(m for _, m in means)
    hi = max(m for _, m in means)
    return [
        Finding(
            "clock_drift",
            "warning" if c.stable_clocks else "info",
            tuple(reps),
            f"the SM clock on GPU {g} moved between reps: {lo:.0f}-{hi:.0f} MHz (median "
            f"{median:.0f}); {reps_text(reps, len(ws))} differ by more than "
            f"{100 * c.clock_drift_rel:.0f}%",
            g,
            {"sm_mhz_median": median, "sm_mhz_min": lo, "sm_mhz_max": hi},
        )
    ]
