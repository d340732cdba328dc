"""Findings where the GPU was not in the state the measurement assumed, or was not seen:
the lock did not hold (`lock_not_held`), another process used the GPU (`other_process`),
telemetry is missing (`telemetry_gap`)."""

from __future__ import annotations

from typing import Any

from gpuenv.reasons import Reason, reason_names
from gpuenv.telemetry import Window
from gpuenv.telemetry.window import merge_windows
from gpuenv.verdict.records import Finding, GpuFacts, VerdictConfig, reps_text


def telemetry_gap(g: int, ws: list[Window]) -> list[Finding]:
    reps = [i for i, w in enumerate(ws) if w.gap or w.sm_mhz_mean is None]
    if not reps:
        return []
    return [
        Finding(
            "telemetry_gap",
            "warning",
            tuple(reps),
            f"telemetry on GPU {g} is incomplete for {reps_text(reps, len(ws))} "
            "(an NVML read failed or no sample covered it): their GPU state is unverified",
            g,
        )
    ]


def lock_not_held(g: int, ws: list[Window], f: GpuFacts, c: VerdictConfig) -> list[Finding]:
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
    text = f"the SM clock on GPU {g} read {lo:.0f}-{hi:.0f} MHz in {reps_text(bad, len(ws))}"
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


def other_process(g: int, ws: list[Window]) -> list[Finding]:
    """Another tenant on the measured GPU during the reps (NVML's process list, read at
    region edges): named with its pid, user where the host shows it, and the GPU memory it
    held. A warning where the judge cannot rule its effect out: the judge's one rule
    (gpuenv.verdict.effect) makes it info where the number (the median of all reps) held
    against the median of the reps it did not share."""
    reps = [i for i, w in enumerate(ws) if w.other_pids]
    if not reps:
        return []
    merged = merge_windows([ws[i] for i in reps])
    pids = list(merged.other_pids)
    who = [
        _tenant(p, _at(merged.other_users, k), _at(merged.other_mib, k)) for k, p in enumerate(pids)
    ]
    text = (
        f"another process used GPU {g} during {reps_text(reps, len(ws))} ({'; '.join(who)}): "
        "it competes for the GPU and its power budget"
    )
    details = {
        "pids": pids,
        "users": [_at(merged.other_users, k) for k in range(len(pids))],
        "memory_mib": [_at(merged.other_mib, k) for k in range(len(pids))],
    }
    return [Finding("other_process", "warning", tuple(reps), text, g, details)]


def _at(values: tuple[Any, ...], k: int) -> Any:
    return values[k] if k < len(values) else None


def _tenant(pid: int, user: str | None, mib: int | None) -> str:
    """'pid 4242, user alice, 512 MiB'."""
    parts = [f"pid {pid}"]
    if user:
        parts.append(f"user {user}")
    if mib is not None:
        parts.append(f"{mib} MiB")
    return ", ".join(parts)
