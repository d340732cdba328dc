"""Findings: what in the telemetry makes a measurement less than trustworthy.

`assess()` turns per-rep Windows (and the rep times) into Findings. What a
policy makes of them, and the Measurement, are gpuenv.judge's: every door to a
measurement calls `gpuenv.judge.judge()`, which calls `assess()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import JsonRecord
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.reasons import THERMAL, Reason, reason_names
from gpuenv.stats.descriptive import median as stats_median
from gpuenv.stats.levels import levels, slow_head
from gpuenv.telemetry import Window
from gpuenv.units import fmt_pct, fmt_s

SEVERITIES = ("info", "warning", "error")
KINDS = (
    "warmup_ramp",
    "power_cap",
    "thermal",
    "hw_slowdown",
    "power_brake",
    "lock_not_held",
    "other_process",
    "clock_drift",
    "drift",  # the rep times moved (trend, step) or split in two ("bimodal")
    "bimodal",
    "tiny_kernel",
    "telemetry_gap",
    "command_failed",  # gpuenv run: the wrapped command exited non-zero or was killed
)


@dataclass(frozen=True)
class Finding(JsonRecord):
    """One thing the telemetry says about a measurement.

    `reps` are the indices of the repetitions it touched (all of them for a
    single region: (0,)). `details` holds the numbers behind the sentence
    (e.g. {"time_under_cap_s": 0.8, "clock_cost_mhz": 540}).
    """

    kind: str  # one of KINDS
    severity: str  # "info" | "warning" | "error"
    reps: tuple[int, ...]
    message: str
    gpu: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"


class MeasurementRejected(GpuenvError):
    """The reject (or retry) policy left too few trustworthy repetitions."""

    exit_code = 1  # the CLI's "rejected verdict" code


@dataclass(frozen=True)
class VerdictConfig:
    """Every threshold the findings use. Defaults suit an H100 (GPU_FACTS.md).

    warmup_ramp
      idle_clock_fraction: a region that starts with the SM clock below this
        fraction of the maximum (or with the GpuIdle reason), and whose clock then
        rises (or whose GpuIdle reason clears, or where this process holds a
        context), started cold; a GPU idle throughout, without our context, was
        not in use.
      ramp_rel: leading reps slower than the settled median by more than this
        fraction (and by more than `ramp_mad_k` median absolute deviations) are
        still warming up. The settled median is that of the last half of the reps.
      ramp_min_reps: fewer reps than this: no trend test (only the start state).
    power_cap
      power_cap_min_fraction: time under the power cap below this fraction of a
        region is not reported (one counter tick of noise).
      stable_clocks: True treats power capping and clock drift as problems
        (severity warning: the reject and retry policies act on them). False
        (the default unless a lock is asked for): capping at the default power
        limit is normal for heavy kernels and is reported at severity info.
    thermal
      thermal_margin_c: a temperature within this of the GPU's max operating
        temperature (else its slowdown threshold) is reported (info) before the
        GPU slows down.
    lock_not_held
      lock_tolerance_mhz: how far outside the locked range the SM clock may read.
    clock_drift
      clock_drift_rel: reps whose mean SM clock differs from the median rep's by
        more than this fraction have drifted.
    drift, bimodal
      level_rel: rep times that drift, step or split in two modes further apart than this
        (`gpuenv.stats.levels`) get a warning naming both levels (warmup's head left out).
    policies
      reject_severity: findings at or above this severity make their reps
        "affected": dropped by reject, re-run by retry.
      min_reps: reject and retry raise `MeasurementRejected` when fewer
        repetitions than this remain (single regions are never raised on:
        their verdict says "rejected").
      retry_delay_s, retry_backoff, retry_max_delay_s, max_retries: retry waits
        retry_delay_s, then that times retry_backoff each round, at most
        retry_max_delay_s, for at most max_retries rounds; reps still affected
        afterwards are rejected.
    """

    idle_clock_fraction: float = 0.5
    ramp_rel: float = 0.05
    ramp_mad_k: float = 5.0
    ramp_min_reps: int = 5
    power_cap_min_fraction: float = 0.01
    stable_clocks: bool = False
    thermal_margin_c: float = 5.0
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ
    clock_drift_rel: float = 0.02
    level_rel: float = 0.02
    reject_severity: str = "warning"
    min_reps: int = 3
    retry_delay_s: float = 1.0
    retry_backoff: float = 2.0
    retry_max_delay_s: float = 30.0
    max_retries: int = 3

    def __post_init__(self) -> None:
        if self.reject_severity not in SEVERITIES:
            raise ConfigError(
                f"reject_severity {self.reject_severity!r} is not a severity",
                hint=f"use one of {', '.join(SEVERITIES)}",
            )
        for name in (
            "ramp_rel",
            "clock_drift_rel",
            "level_rel",
            "power_cap_min_fraction",
            "retry_delay_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative (got {getattr(self, name)})")
        if self.min_reps < 1 or self.max_retries < 0:
            raise ConfigError("min_reps must be at least 1 and max_retries not negative")


DEFAULT_CONFIG = VerdictConfig()


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class GpuFacts:
    """What the findings compare against, per GPU (read once per session)."""

    max_sm_mhz: float | None = None
    slowdown_c: float | None = None
    gpu_max_c: float | None = None  # max operating temperature: SW thermal slowdown begins
    power_limit_w: float | None = None
    lock_range_mhz: tuple[int, int] | None = None


def assess(
    windows: Sequence[Window],
    times_s: Sequence[float] | None = None,
    *,
    config: VerdictConfig = DEFAULT_CONFIG,
    facts: dict[int, GpuFacts] | None = None,
) -> list[Finding]:
    """Findings for one measurement.

    `windows` are per rep, rep-major when several GPUs are sampled (rep 0 GPU a,
    rep 0 GPU b, rep 1 GPU a, ...). `times_s` (one per rep) enables the trend
    test for warmup. `facts` gives each GPU's maximum clock, slowdown
    temperature and lock range.
    """
    facts = facts or {}
    gpus = list(dict.fromkeys(w.gpu for w in windows))
    if not gpus:  # no telemetry: what the rep times alone say
        return _levels(None, times_s, config) if times_s is not None else []
    if len(windows) % len(gpus):
        raise ConfigError(
            f"{len(windows)} windows do not split evenly over GPUs {gpus}",
            hint="pass one window per rep and GPU, rep-major",
        )
    n_reps = len(windows) // len(gpus)
    if times_s is not None and len(times_s) != n_reps:
        raise ConfigError(f"{len(times_s)} rep times for {n_reps} reps of windows")
    findings: list[Finding] = []
    for g in gpus:
        per_rep = [w for w in windows if w.gpu == g]
        f = facts.get(g, GpuFacts())
        findings += _gaps(g, per_rep)
        findings += _warmup(g, per_rep, times_s if g == gpus[0] else None, f, config)
        findings += _power_cap(g, per_rep, f, config)
        findings += _thermal(g, per_rep, f, config)
        findings += _hw(g, per_rep)
        findings += _lock(g, per_rep, f, config)
        findings += _other(g, per_rep)
        findings += _drift(g, per_rep, config)
    if times_s is not None:
        findings += _levels(gpus[0], times_s, config)
    return findings


# -- the checks: each returns at most a few findings for one GPU ------------------------


def _reps_text(reps: Sequence[int], n: int) -> str:
    if n == 1:
        return "the region"
    if len(reps) == n:
        return f"all {n} reps"
    spans: list[str] = []
    start = prev = reps[0]
    for r in [*reps[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rep " if len(reps) == 1 else "reps ") + ", ".join(spans)


def _gaps(g: int, ws: list[Window]) -> list[Finding]:
    reps = [i for i, w in enumerate(ws) if w.gap or w.sm_mhz_mean is None]
    if not reps:
        return []
    return [
        Finding(
            "telemetry_gap",
            "warning",
            tuple(reps),
            f"telemetry on GPU {g} is incomplete for {_reps_text(reps, len(ws))} "
            "(an NVML read failed or no sample covered it): their GPU state is unverified",
            g,
        )
    ]


def _warmup(
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
                f"{_reps_text(cold, len(ws))} started with the GPU idle (GpuIdle: no "
                "CUDA context yet, or one just created)"
            )
        else:
            why.append(
                f"{_reps_text(cold, len(ws))} started at an idle clock of {w0.sm_mhz_start:.0f} MHz"
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


def _levels(g: int | None, times: Sequence[float], c: VerdictConfig) -> list[Finding]:
    """Reps that drift, step or split into two modes (the warmup ramp's head left out)."""
    skip = len(slow_head(times, rel=c.ramp_rel, mad_k=c.ramp_mad_k, min_reps=c.ramp_min_reps)[0])
    found = levels(times[skip:], min_rel=c.level_rel)
    if found is None:
        return []
    kind = "bimodal" if found.shape == "split" else "drift"
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


def cap_time_s(w: Window) -> float:
    """Seconds under the power cap: the cumulative counter where read, else the samples.

    The counter refreshes every ~100 ms and is interpolated between reads, so a window
    much shorter than that, just after the cap cleared, gets a share of the time under
    the cap before it (found on the simulated RTX 4090 and H100: "held back 100% ... at
    1980 MHz"). The counter counts only where a sample in or at the edges of the window
    shows the cap bit. Where the counter did not move over a window whose samples show
    the bit (it had not refreshed yet), the samples' time under the bit counts (a
    finding once read "held GPU 0 back for 0 us ... (0%)")."""
    if not (w.reasons | w.reasons_start | w.reasons_end) & Reason.SW_POWER_CAP:
        return 0.0
    counted = w.reason_s.get("power", 0.0)
    return counted if counted > 0 else w.reason_sampled_s.get("SwPowerCap", 0.0)


def _power_cap(g: int, ws: list[Window], f: GpuFacts, c: VerdictConfig) -> list[Finding]:
    reps = []
    for i, w in enumerate(ws):
        dur = w.duration_s
        under = cap_time_s(w)
        frac = under / dur if dur > 0 else 0.0
        # a rep the samples saw capped counts however short its time under the cap, but
        # only with some time under it: a finding never says "0 us"
        if frac >= c.power_cap_min_fraction or (w.reasons & Reason.SW_POWER_CAP and under > 0):
            reps.append(i)
    if not reps:
        return []
    under = sum(cap_time_s(ws[i]) for i in reps)
    total = sum(w.duration_s for w in ws)
    details: dict[str, Any] = {"time_under_cap_s": under}
    if total > 0:
        details["fraction_under_cap"] = under / total
        share = under / total
        text = (
            f"the SW power cap held GPU {g} back for {fmt_s(under, 'short')} of "
            f"{fmt_s(total, 'short')} ({'<1%' if share < 0.01 else fmt_pct(share, 0)})"
        )
    else:
        text = f"the SW power cap was active on GPU {g}"
    text += f" in {_reps_text(reps, len(ws))}"
    clocked = [ws[i] for i in reps if ws[i].sm_mhz_mean is not None]
    if clocked:
        weight = sum(w.duration_s for w in clocked)
        if weight > 0:
            mean = sum((w.sm_mhz_mean or 0.0) * w.duration_s for w in clocked) / weight
        else:
            mean = sum(w.sm_mhz_mean or 0.0 for w in clocked) / len(clocked)
        details["sm_mhz_mean"] = mean
        details["sm_mhz_min"] = min(w.sm_mhz_min or mean for w in clocked)
        if f.max_sm_mhz:
            cost = f.max_sm_mhz - mean
            details["clock_cost_mhz"] = cost
            details["max_sm_mhz"] = f.max_sm_mhz
            text += (
                f": SM clock averaged {mean:.0f} MHz, {cost:.0f} MHz"
                f" ({100 * cost / f.max_sm_mhz:.0f}%) below its {f.max_sm_mhz:.0f} MHz maximum"
            )
        else:
            text += f": SM clock averaged {mean:.0f} MHz"
    if f.power_limit_w:
        details["power_limit_w"] = f.power_limit_w
        text += f", at the {f.power_limit_w:.0f} W power limit"
    if c.stable_clocks:
        severity = "warning"
        text += " (lock a clock the cap can hold: gpuenv calibrate)"
    else:
        severity = "info"
        text += " (normal for heavy kernels; numbers depend on power and temperature)"
    return [Finding("power_cap", severity, tuple(reps), text, g, details)]


def _thermal(g: int, ws: list[Window], f: GpuFacts, c: VerdictConfig) -> list[Finding]:
    slow = [
        i for i, w in enumerate(ws) if w.reasons & THERMAL or w.reason_s.get("thermal", 0.0) > 0
    ]
    if slow:
        hw = any(ws[i].reasons & Reason.HW_THERMAL for i in slow)
        tmax = max((ws[i].temp_c_max or 0.0) for i in slow)
        kind = "HW" if hw else "SW"
        under = sum(ws[i].reason_s.get("thermal", 0.0) for i in slow)
        text = (
            f"{kind} thermal slowdown on GPU {g} in {_reps_text(slow, len(ws))} "
            f"(up to {tmax:.0f} C"
            + (f", slowdown at {f.slowdown_c:.0f} C" if f.slowdown_c else "")
            + (f", {fmt_s(under, 'short')} under it" if under > 0 else "")
            + "): the clock was cut to cool the GPU; improve cooling or let it cool between runs"
        )
        return [
            Finding(
                "thermal",
                "error" if hw else "warning",
                tuple(slow),
                text,
                g,
                {"temp_c_max": tmax, "time_under_thermal_s": under},
            )
        ]
    # the first temperature where the driver cuts clocks: max operating, else slowdown
    limit, what = (f.gpu_max_c, "max operating") if f.gpu_max_c else (f.slowdown_c, "slowdown")
    if limit is None:
        return []
    near = [
        i
        for i, w in enumerate(ws)
        if w.temp_c_max is not None and w.temp_c_max >= limit - c.thermal_margin_c
    ]
    if not near:
        return []
    tmax = max((ws[i].temp_c_max or 0.0) for i in near)
    return [
        Finding(
            "thermal",
            "info",
            tuple(near),
            f"GPU {g} reached {tmax:.0f} C in {_reps_text(near, len(ws))}, within "
            f"{c.thermal_margin_c:.0f} C of its {limit:.0f} C {what} temperature, where the "
            "driver starts to cut the clock",
            g,
            {"temp_c_max": tmax, "limit_c": limit},
        )
    ]


def _hw(g: int, ws: list[Window]) -> list[Finding]:
    out = []
    brake = [i for i, w in enumerate(ws) if w.reasons & Reason.HW_POWER_BRAKE]
    if brake:
        out.append(
            Finding(
                "power_brake",
                "error",
                tuple(brake),
                f"HW power brake slowdown on GPU {g} in {_reps_text(brake, len(ws))}: the board "
                "cut the clock (power supply or an external signal); these numbers are not "
                "comparable",
                g,
            )
        )
    # HwSlowdown is also set whenever HW thermal or power brake is: report it alone only
    other = [
        i
        for i, w in enumerate(ws)
        if w.reasons & Reason.HW_SLOWDOWN
        and not w.reasons & (Reason.HW_THERMAL | Reason.HW_POWER_BRAKE)
    ]
    if other:
        out.append(
            Finding(
                "hw_slowdown",
                "error",
                tuple(other),
                f"HW slowdown on GPU {g} in {_reps_text(other, len(ws))}: the hardware cut the "
                "clock (power or thermal protection); check 'gpuenv status' and the cooling",
                g,
            )
        )
    return out


def _lock(g: int, ws: list[Window], f: GpuFacts, c: VerdictConfig) -> list[Finding]:
    bad = [i for i, w in enumerate(ws) if w.lock_held is False]
    if not bad:
        return []
    rng = next((ws[i].lock_range_mhz for i in bad if ws[i].lock_range_mhz), f.lock_range_mhz)
    lo = min(ws[i].sm_mhz_min or 0.0 for i in bad)
    hi = max(ws[i].sm_mhz_max or 0.0 for i in bad)
    union = 0
    for i in bad:
        union |= ws[i].reasons
    causes = [n for n in reason_names(union) if n not in ("GpuIdle", "ApplicationsClocksSetting")]
    text = f"the SM clock on GPU {g} read {lo:.0f}-{hi:.0f} MHz in {_reps_text(bad, len(ws))}"
    if rng:
        text += (
            f", outside the locked {rng[0]}-{rng[1]} MHz"
            if rng[0] != rng[1]
            else (f", not the locked {rng[0]} MHz")
        )
    if union & Reason.SW_POWER_CAP:
        text += (
            ": the power cap overrides locked clocks; "
            "lock a clock the cap can hold (gpuenv calibrate)"
        )
    elif causes:
        text += f" while {', '.join(causes)} was active"
    return [
        Finding(
            "lock_not_held",
            "warning",
            tuple(bad),
            text,
            g,
            {"sm_mhz_min": lo, "sm_mhz_max": hi, "lock_range_mhz": list(rng) if rng else None},
        )
    ]


def _other(g: int, ws: list[Window]) -> list[Finding]:
    reps = [i for i, w in enumerate(ws) if w.other_pids]
    if not reps:
        return []
    pids = sorted({p for i in reps for p in ws[i].other_pids})
    return [
        Finding(
            "other_process",
            "warning",
            tuple(reps),
            f"another process used GPU {g} during {_reps_text(reps, len(ws))} "
            f"(pid {', '.join(map(str, pids))}): it competes for the GPU and its power budget",
            g,
            {"pids": pids},
        )
    ]


def _drift(g: int, ws: list[Window], c: VerdictConfig) -> list[Finding]:
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
            f"{median:.0f}); {_reps_text(reps, len(ws))} differ by more than "
            f"{100 * c.clock_drift_rel:.0f}%",
            g,
            {"sm_mhz_median": median, "sm_mhz_min": lo, "sm_mhz_max": hi},
        )
    ]
