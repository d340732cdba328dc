"""Findings where the driver or the board cut the SM clock: the SW power cap
(`power_cap`), thermal slowdown or a temperature near it (`thermal`), the HW power brake
(`power_brake`) and other HW slowdown (`hw_slowdown`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuenv.reasons import THERMAL, Reason
from gpuenv.stats.descriptive import median as stats_median
from gpuenv.telemetry import Window
from gpuenv.units import fmt_pct, fmt_s
from gpuenv.verdict.records import Finding, GpuFacts, Severity, VerdictConfig, reps_text


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


def power_cap(
    g: int,
    ws: list[Window],
    f: GpuFacts,
    c: VerdictConfig,
    times_s: Sequence[float] | None = None,
) -> list[Finding]:
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
    clock_text = _cap_clock_text([ws[i] for i in reps], f, details, c)
    cost = details.get("clock_cost_mhz")
    # "held back" only where the clock under the cap stood below its maximum: the cap's
    # reason lingers ~0.5 s after heavy load with the clock already back at its maximum
    held = bool(cost is not None and f.max_sm_mhz and cost / f.max_sm_mhz >= c.power_cap_moved_rel)
    full = cost is not None and not held
    what = f"the SW power cap was active on GPU {g}"  # no clock or no maximum to tell
    if held:
        what = f"the SW power cap held GPU {g} back"
    elif full:
        what = f"the SW power cap's reason was set on GPU {g}"
    if total > 0:
        details["fraction_under_cap"] = under / total
        share = under / total
        text = (
            f"{what} for {fmt_s(under, 'short')} of {fmt_s(total, 'short')} "
            f"({'<1%' if share < 0.01 else fmt_pct(share, 0)})"
        )
    else:
        text = what
    text += f" in {reps_text(reps, len(ws))}"
    if full:
        text += " with no effect on the clock"
    text += clock_text
    if f.power_limit_w:
        details["power_limit_w"] = f.power_limit_w
        text += f", at the {f.power_limit_w:.0f} W power limit"
    moved = _cap_moved(reps, times_s, details, f, c)
    details["moved"] = moved
    severity: Severity
    if c.stable_clocks and moved:
        severity = "warning"
        text += " (lock a clock the cap can hold: gpuenv calibrate)"
    elif c.stable_clocks:
        severity = "info"
        text += (
            " (the cap's bit only: the SM clock stayed at its maximum and the reps' times "
            "did not move)"
        )
    else:
        severity = "info"
        if not full:  # at full clock the sentence has said all there is
            text += " (normal for heavy kernels; numbers depend on power and temperature)"
    return [Finding("power_cap", severity, tuple(reps), text, g, details)]


def _cap_clock_text(
    clocked: list[Window], f: GpuFacts, details: dict[str, Any], c: VerdictConfig
) -> str:
    """The SM clock of the capped reps, while busy where their windows saw idle time (a
    long region's mean counts its idle clock too, 345 MHz on an H100); fills `details`."""
    clocked = [w for w in clocked if w.sm_mhz_mean is not None]
    if not clocked:
        return ""
    idle = any(w.reason_sampled_s.get("GpuIdle", 0.0) > 0 for w in clocked)
    means = [
        (w.sm_mhz_busy_mean if idle and w.sm_mhz_busy_mean is not None else w.sm_mhz_mean or 0.0)
        for w in clocked
    ]
    weight = sum(w.duration_s for w in clocked)
    if weight > 0:
        mean = sum(m * w.duration_s for m, w in zip(means, clocked, strict=True)) / weight
    else:
        mean = sum(means) / len(means)
    details["sm_mhz_mean"] = mean
    details["sm_mhz_min"] = min(w.sm_mhz_min or mean for w in clocked)
    what = "SM clock averaged" + (" (while busy)" if idle else "")
    if not f.max_sm_mhz:
        return f": {what} {mean:.0f} MHz"
    cost = f.max_sm_mhz - mean
    details["clock_cost_mhz"] = cost
    details["max_sm_mhz"] = f.max_sm_mhz
    if cost / f.max_sm_mhz < c.power_cap_moved_rel:  # at full clock: no cost to state
        return f": {what} {mean:.0f} MHz, at its {f.max_sm_mhz:.0f} MHz maximum"
    return (
        f": {what} {mean:.0f} MHz, {cost:.0f} MHz"
        f" ({100 * cost / f.max_sm_mhz:.0f}%) below its {f.max_sm_mhz:.0f} MHz maximum"
    )


def _cap_moved(
    reps: list[int],
    times_s: Sequence[float] | None,
    details: dict[str, Any],
    f: GpuFacts,
    c: VerdictConfig,
) -> bool:
    """Whether the cap moved the number: the capped reps' clock under the maximum, or
    their times over the other reps'. Unknown (no clock, no maximum): it did."""
    cost = details.get("clock_cost_mhz")
    if cost is None or not f.max_sm_mhz:
        return True
    if cost / f.max_sm_mhz >= c.power_cap_moved_rel:
        return True
    if times_s is None:
        return False
    capped = set(reps)
    free = [t for i, t in enumerate(times_s) if i not in capped]
    if not free:
        return False
    slower = stats_median([times_s[i] for i in reps]) / stats_median(free) - 1
    details["capped_reps_slower_rel"] = slower
    return slower >= c.power_cap_moved_rel


def thermal(g: int, ws: list[Window], f: GpuFacts, c: VerdictConfig) -> list[Finding]:
    slow = [
        i for i, w in enumerate(ws) if w.reasons & THERMAL or w.reason_s.get("thermal", 0.0) > 0
    ]
    if slow:
        hw = any(ws[i].reasons & Reason.HW_THERMAL for i in slow)
        tmax = max((ws[i].temp_c_max or 0.0) for i in slow)
        kind = "HW" if hw else "SW"
        under = sum(ws[i].reason_s.get("thermal", 0.0) for i in slow)
        text = (
            f"{kind} thermal slowdown on GPU {g} in {reps_text(slow, len(ws))} "
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
            f"GPU {g} reached {tmax:.0f} C in {reps_text(near, len(ws))}, within "
            f"{c.thermal_margin_c:.0f} C of its {limit:.0f} C {what} temperature, where the "
            "driver starts to cut the clock",
            g,
            {"temp_c_max": tmax, "limit_c": limit},
        )
    ]


def hw_slowdown(g: int, ws: list[Window]) -> list[Finding]:
    out = []
    brake = [i for i, w in enumerate(ws) if w.reasons & Reason.HW_POWER_BRAKE]
    if brake:
        out.append(
            Finding(
                "power_brake",
                "error",
                tuple(brake),
                f"HW power brake slowdown on GPU {g} in {reps_text(brake, len(ws))}: the board "
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
                f"HW slowdown on GPU {g} in {reps_text(other, len(ws))}: the hardware cut the "
                "clock (power or thermal protection); check 'gpuenv status' and the cooling",
                g,
            )
        )
    return out
