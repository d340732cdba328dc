"""What one side's GPU did during one measurement name, and what differs between sides.

A lock is claimed for the measurements taken under it only. A side that pools
measurements in different lock states (a locked file and an unlocked one, two
locked ranges) says how many were under each, and is `lock_mixed`: its pooled
median and clocks mix two GPU states, so report.py compares like with like
(the measurements under the same lock state on both sides) instead of
attributing a change to the pooled clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv import stats
from gpuenv.clocks.request import fmt_clock
from gpuenv.verdict import cap_time_s

CLOCK_REL = 0.02  # mean SM clocks further apart than this are a state change
CAP_FRACTION = 0.10  # time under the power cap differing by more than this (of the run)
TEMP_C = 5.0  # mean temperatures further apart than this

LockKey = tuple[tuple[int, int], ...]  # the locked SM ranges of a measurement; () unlocked


@dataclass(frozen=True)
class GpuState:
    """What one side's GPU did during one measurement name (pooled over its records)."""

    sm_mhz: float | None  # time-weighted mean of NVML's SM clock
    effective_mhz: float | None  # median of the `_sleep` probes (gpuenv.bench only)
    cap_fraction: float | None  # fraction of the measured time under the SW power cap
    temp_c: float | None  # mean of the measurements' mean temperatures
    temp_c_max: float | None
    # "1350 MHz held", "1350 MHz NOT held in 1 of 4 measurements", "2 of 5 measurements
    # under 1350 MHz" (a pooled side), None: no measurement was taken under a lock
    lock: str | None
    verdicts: tuple[str, ...]
    findings: tuple[str, ...]  # kinds
    lock_mixed: bool = False  # its measurements were taken in different lock states


def _windows(m: Any) -> tuple[Any, ...]:
    return tuple(m.summary_windows or m.windows)


def lock_key(m: Any) -> LockKey:
    """The locked SM range(s) a measurement was taken under; () when none was asked."""
    return tuple(
        sorted(
            {
                (int(w.lock_range_mhz[0]), int(w.lock_range_mhz[1]))
                for w in _windows(m)
                if w.lock_range_mhz is not None
            }
        )
    )


def lock_label(key: LockKey) -> str:
    return ", ".join(fmt_clock(r) for r in key) if key else "no lock"


def _lock_broke(m: Any) -> bool:
    return any(w.lock_held is False for w in _windows(m) if w.lock_range_mhz is not None)


def _lock_text(ms: Sequence[Any]) -> tuple[str | None, bool]:
    """The lock sentence of a side, and whether it pools different lock states."""
    groups: dict[LockKey, list[Any]] = {}
    for m in ms:
        groups.setdefault(lock_key(m), []).append(m)
    if set(groups) <= {()}:
        return None, False
    n = len(ms)
    if len(groups) == 1:
        ((key, members),) = groups.items()
        broke = sum(_lock_broke(m) for m in members)
        if not broke:
            return f"{lock_label(key)} held", False
        if broke == n:
            return f"{lock_label(key)} NOT held", False
        return f"{lock_label(key)} NOT held in {broke} of {n} measurements", False
    parts = []
    for key, members in groups.items():
        if key:
            broke = sum(_lock_broke(m) for m in members)
            parts.append(
                f"{len(members)} of {n} measurements under {lock_label(key)}"
                + (f" (NOT held in {broke})" if broke else "")
            )
    return "; ".join(parts), True


def gpu_state(ms: Sequence[Any]) -> GpuState:
    windows = [w for m in ms for w in _windows(m)]
    weighted = [(w.sm_mhz_mean, w.duration_s) for w in windows if w.sm_mhz_mean is not None]
    sm = None
    if weighted:
        total = sum(d for _, d in weighted)
        sm = (
            sum(v * d for v, d in weighted) / total
            if total > 0
            else stats.median([v for v, _ in weighted])
        )
    eff = [m.extra.get("rep_clock_mhz_median") for m in ms]
    eff_v = [float(e) for e in eff if e]
    dur = sum(w.duration_s for w in windows)
    # the findings' own reading of the time under the cap (the counter where a sample
    # shows the cap bit, else the samples), so compare and the findings agree
    cap = min(1.0, sum(cap_time_s(w) for w in windows) / dur) if windows and dur > 0 else None
    temps = [
        (w.temp_c_start + w.temp_c_end) / 2
        for w in windows
        if w.temp_c_start is not None and w.temp_c_end is not None
    ]
    tmax = [w.temp_c_max for w in windows if w.temp_c_max is not None]
    lock, mixed = _lock_text(ms)
    return GpuState(
        sm_mhz=sm,
        effective_mhz=stats.median(eff_v) if eff_v else None,
        cap_fraction=cap,
        temp_c=sum(temps) / len(temps) if temps else None,
        temp_c_max=max(tmax) if tmax else None,
        lock=lock,
        verdicts=tuple(sorted({m.verdict for m in ms})),
        # what moved a number: an info finding's state showed no effect on it (the judge's
        # one rule, gpuenv.verdict.effect), so it is no state change a slowdown coincides with
        findings=tuple(
            sorted({f.kind for m in ms for f in m.findings if f.severity in ("warning", "error")})
        ),
        lock_mixed=mixed,
    )


def state_changes(a: GpuState, b: GpuState) -> list[str]:
    out = []
    for label, va, vb in (
        ("mean SM clock", a.sm_mhz, b.sm_mhz),
        ("effective SM clock", a.effective_mhz, b.effective_mhz),
    ):
        if va and vb and abs(vb / va - 1) > CLOCK_REL:
            out.append(f"{label} {va:.0f} -> {vb:.0f} MHz ({vb / va - 1:+.1%})")
    if (
        a.cap_fraction is not None
        and b.cap_fraction is not None
        and abs(a.cap_fraction - b.cap_fraction) > CAP_FRACTION
    ):
        out.append(f"time under the power cap {a.cap_fraction:.0%} -> {b.cap_fraction:.0%}")
    if a.temp_c is not None and b.temp_c is not None and abs(a.temp_c - b.temp_c) > TEMP_C:
        out.append(f"temperature {a.temp_c:.0f} -> {b.temp_c:.0f} C")
    if a.lock != b.lock:
        out.append(f"clock lock {a.lock or 'none'} -> {b.lock or 'none'}")
    if a.verdicts != b.verdicts:
        out.append(f"verdict {'/'.join(a.verdicts)} -> {'/'.join(b.verdicts)}")
    new = sorted(set(b.findings) - set(a.findings))
    gone = sorted(set(a.findings) - set(b.findings))
    if new:
        out.append("new findings: " + ", ".join(new))
    if gone:
        out.append("findings gone: " + ", ".join(gone))
    return out


def normalized_ratio(ms_a: Sequence[Any], ms_b: Sequence[Any]) -> float | None:
    na = [m.extra.get("time_at_ref_clock_s") for m in ms_a]
    nb = [m.extra.get("time_at_ref_clock_s") for m in ms_b]
    if not all(na) or not all(nb):
        return None
    return stats.median([float(x) for x in nb]) / stats.median([float(x) for x in na])


def attribution(
    ratio: float, a: GpuState, b: GpuState, changes: Sequence[str], norm: float | None
) -> str:
    """What a real change (faster or slower) of `ratio` coincides with in the GPU's
    state; "" when nothing moved. Only for sides each in one lock state."""
    clock_moved = [c for c in changes if "clock" in c or "power cap" in c or "temperature" in c]
    if not clock_moved:
        return ""
    # does the clock explain it? time ~ 1 / clock for compute-bound work
    clock_a = a.effective_mhz or a.sm_mhz
    clock_b = b.effective_mhz or b.sm_mhz
    text = f", but it coincides with a GPU state change ({'; '.join(clock_moved)})"
    if clock_a and clock_b and (clock_b > clock_a) == (ratio < 1):
        text += ": the GPU, not the code, may explain it"
    if norm is not None:
        text += f"; at the reference clock the change is {norm - 1:+.1%}"
    return text


__all__ = [
    "GpuState",
    "attribution",
    "gpu_state",
    "lock_key",
    "lock_label",
    "normalized_ratio",
    "state_changes",
]
