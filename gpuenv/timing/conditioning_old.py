"""Conditioning: the burst wait (rest until the GPU is uncapped) and the sustained
precondition (run fn until equilibrium). Moved from timing.py unchanged; gpuenv.conditioning
replaces it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv import stats
from gpuenv.backend import (
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)
from gpuenv.timebase import Clock
from gpuenv.timing.devices import Device

LIMITING_REASONS = REASON_SW_POWER_CAP | REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN

BURST_S = 0.025  # GPU time per burst; the SW power cap engages within 100-300 ms on an H100
BURST_DUTY = 0.2  # rest at least (1 / duty - 1) x the burst between bursts
PRECONDITION_MAX_S = 180.0  # an H100 under a heavy matmul creeps for ~1-2 min from cold
PRECONDITION_CHUNK_S = 0.5
PRECONDITION_WINDOW_S = 10.0
PRECONDITION_TOL = 0.005  # predicted drift still to come, relative to the time per call
PRECONDITION_TAU_S = 20.0  # thermal time constant of a data-centre GPU under load
DEFAULT_TEMP_SENSITIVITY = 0.01  # relative time change per C when it cannot be fitted


def wait_until_ready(
    sampler: Any,
    gpu: int,
    clock: Clock,
    *,
    since: float,
    min_rest_s: float = 0.0,
    max_wait_s: float = 5.0,
    poll_s: float = 0.05,
) -> tuple[float, bool]:
    """Burst mode: rest until the GPU is back in its uncapped state.

    Ready when at least two readings taken one driver refresh after `since` (the
    end of the last burst) show no power-cap or thermal reason. Returns (seconds
    waited, ready). Without a sampler it just rests `min_rest_s`.
    """
    from gpuenv.telemetry import DRIVER_REFRESH_S

    start = clock.now()
    clock.sleep(min_rest_s)
    if sampler is None:
        return clock.now() - start, True
    while True:
        fresh = sampler.samples(since + DRIVER_REFRESH_S, None, gpu)
        if len(fresh) >= 2 and not (fresh[-1].reasons | fresh[-2].reasons) & LIMITING_REASONS:
            return clock.now() - start, True
        if clock.now() - start >= max_wait_s:
            return clock.now() - start, False
        clock.sleep(poll_s)


@dataclass(frozen=True)
class Conditioning:
    """What preconditioning did (mode="sustained")."""

    seconds: float
    steady: bool
    sm_mhz: float | None
    temp_c: float | None
    limited: bool  # a power-cap or thermal reason was seen in the last chunk
    residual: float | None  # predicted drift still to come, relative (tau x slope)

    def to_dict(self) -> dict[str, Any]:
        return {
            "precondition_s": self.seconds,
            "precondition_steady": self.steady,
            "precondition_sm_mhz": self.sm_mhz,
            "precondition_temp_c": self.temp_c,
            "precondition_limited": self.limited,
            "precondition_residual": self.residual,
        }


def precondition(
    device: Device,
    fn: Callable[[], Any],
    sampler: Any,
    gpu: int,
    *,
    max_s: float = PRECONDITION_MAX_S,
    min_s: float | None = None,
    chunk_s: float = PRECONDITION_CHUNK_S,
    window_s: float = PRECONDITION_WINDOW_S,
    tol: float = PRECONDITION_TOL,
    tau_s: float = PRECONDITION_TAU_S,
    progress: Callable[[str], None] | None = None,
) -> Conditioning:
    """Sustained mode: run fn back to back until the GPU reaches equilibrium under it.

    The signal is fn's own mean time per call in each chunk of `chunk_s` (what
    will be measured). A GPU approaching equilibrium relaxes roughly
    exponentially with the thermal time constant `tau_s`, so what is still to
    come is about tau_s x the present rate of change. Two predictions must both
    be below `tol` (relative to the time per call):
      - time: tau_s x the slope of the time per call over the last `window_s`;
      - temperature (leakage grows with temperature and lowers the capped clock,
        in 15 MHz steps that a short window can miss; a kernel not capped on a
        cool GPU may be once it is hot): tau_s x the temperature slope over the
        last three windows x the time's sensitivity to temperature (fitted while
        capped, else 1% per C).
    At least `min_s` (default: one window) runs; `max_s` stops it regardless
    (`steady` False then).
    """
    clock = device.clock
    min_s = window_s if min_s is None else min_s
    start = clock.now()
    pts: list[tuple[float, float, float | None]] = []  # (chunk end, time per call, temp)
    capped_from: int | None = None  # index of the first chunk under a limiting reason
    mhz: float | None = None
    temp: float | None = None
    limited = False
    while True:
        c0 = clock.now()
        per_call = device.run_for(fn, chunk_s)
        c1 = clock.now()
        samples = sampler.samples(c0, c1, gpu) if sampler is not None else []
        temp = None
        if samples:
            mhz = math.fsum(s.sm_mhz for s in samples) / len(samples)
            temp = samples[-1].temp_c
            limited = any(s.reasons & LIMITING_REASONS for s in samples)
            if limited and capped_from is None:
                capped_from = len(pts)
        pts.append((c1, per_call, temp))
        elapsed = c1 - start
        residual = _residual(pts, capped_from, window_s, tau_s)
        if progress is not None:
            progress(
                f"preconditioning {elapsed:5.1f} s: {per_call * 1e3:.4g} ms/call"
                + (f", SM {mhz:.0f} MHz" if mhz is not None else "")
                + (f", {temp:.0f} C" if temp is not None else "")
                + (", capped" if limited else "")
                + (f", still to drift ~{residual:.2%}" if residual is not None else "")
            )
        if elapsed >= min_s and residual is not None and residual <= tol:
            return Conditioning(elapsed, True, mhz, temp, limited, residual)
        if elapsed >= max_s:
            return Conditioning(elapsed, False, mhz, temp, limited, residual)


def _residual(
    pts: list[tuple[float, float, float | None]], capped_from: int | None, window_s: float,
    tau_s: float,
) -> float | None:
    """The relative drift of the time per call still to come (see `precondition`)."""
    end = pts[-1][0]
    recent = [p for p in pts if p[0] >= end - window_s]
    if len(recent) < 4 or recent[-1][0] <= recent[0][0]:
        return None
    step = (recent[-1][0] - recent[0][0]) / (len(recent) - 1)
    level = stats.median([p[1] for p in recent])
    if level <= 0:
        return 0.0
    residual = tau_s * abs(stats.ols_slope([p[1] for p in recent]) / step) / level
    # The temperature must settle too, capped or not: a kernel not capped on a cool GPU
    # may be capped once the chip has heated (leakage grows with temperature). NVML
    # reads whole degrees, so a slow creep shows as 0 or 1 step in a short window: the
    # slope is fitted over 3 windows (an over-estimate while it settles).
    longer = [p for p in pts if p[0] >= end - 3 * window_s]
    temps = [p[2] for p in longer]
    if len(longer) < 4 or any(t is None for t in temps):
        return residual
    long_step = (longer[-1][0] - longer[0][0]) / (len(longer) - 1)
    temp_slope = stats.ols_slope([float(t) for t in temps if t is not None]) / long_step
    since = [(p[2], p[1]) for p in pts[capped_from or 0 :] if p[2] is not None]
    span = max(t for t, _ in since) - min(t for t, _ in since) if since else 0.0
    if capped_from is None or span < 2.0:
        sensitivity = DEFAULT_TEMP_SENSITIVITY  # nothing to fit it from
    else:
        sensitivity = abs(_fit_slope([t for t, _ in since], [v for _, v in since])) / level
    return max(residual, tau_s * abs(temp_slope) * sensitivity)


def _fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    den = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0

