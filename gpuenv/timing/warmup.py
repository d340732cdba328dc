"""Warmup: reps until rep times and effective clocks stop trending, or a fixed count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv import stats
from gpuenv.timing.devices import Device

WARMUP_WINDOW = 8  # reps whose times and clocks must not trend for warmup to end
WARMUP_MIN_REPS = 3  # the first call is set-up (cuBLAS handles, lazy loading): never enough
WARMUP_REL_TOL = 0.01  # a trend moving times by less than this across the window is steady
WARMUP_KNOWN_WINDOW = 4  # a function warmed up before in this process (gpuenv.timing.memo):
# its first-call set-up is done; only the clock's ramp is left


@dataclass(frozen=True)
class _Warmup:
    reps: int
    seconds: float
    steady: bool
    median_s: float | None = None  # of the last few warmup reps: what one call takes now


def _warmup(
    device: Device,
    fn: Callable[[], Any],
    sampler: Any,
    gpu: int,
    warmup: str | int,
    max_s: float,
    max_reps: int,
    window_max: int = WARMUP_WINDOW,
) -> _Warmup:
    """Reps until times and clocks stop trending over `window_max` reps (warmup="auto"), or
    a fixed count."""
    clock = device.clock
    start = clock.now()
    if warmup != "auto":
        fixed = [device.rep(fn).time_s for _ in range(int(warmup))]
        return _Warmup(
            int(warmup),
            clock.now() - start,
            True,
            stats.median(fixed[-WARMUP_WINDOW:]) if fixed else None,
        )
    times: list[float] = []
    clocks: list[float | None] = []
    while True:
        rep = device.rep(fn)
        times.append(rep.time_s)
        mhz = rep.clock_mhz
        if mhz is None and sampler is not None:
            latest = sampler.latest(gpu)
            mhz = float(latest.sm_mhz) if latest is not None else None
        clocks.append(mhz)
        n = len(times)
        # long reps: a shorter window (4 reps of a 100 ms kernel already span 0.4 s)
        window = max(4, min(window_max, int(0.2 / max(stats.median(times[-4:]), 1e-9))))
        if n >= max(WARMUP_MIN_REPS, window):
            last = times[-window:]
            cl = [c for c in clocks[-window:] if c is not None]
            if stats.is_steady(last, rel_tol=WARMUP_REL_TOL) and (
                len(cl) < window or stats.is_steady(cl, rel_tol=WARMUP_REL_TOL)
            ):
                return _Warmup(n, clock.now() - start, True, stats.median(last))
        if clock.now() - start >= max_s or n >= max_reps:
            return _Warmup(n, clock.now() - start, False, stats.median(times[-window:]))
