"""Sustained ("equilibrium"): run the work back to back until what is measured, and the
temperature, stop drifting."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuenv import stats
from gpuenv.conditioning.config import DEFAULT, ConditionConfig
from gpuenv.phases import Conditioning
from gpuenv.reasons import HELD_DOWN
from gpuenv.telemetry import SampleSource
from gpuenv.timebase import Clock

# -- sustained: equilibrium --------------------------------------------------------------


@dataclass
class _Track:
    """One GPU's chunk points: (chunk end, signal, temperature)."""

    pts: list[tuple[float, float, float | None]] = field(default_factory=list)
    capped_from: int | None = None  # index of the first chunk under a limiting reason


def residual(
    pts: Sequence[tuple[float, float, float | None]],
    capped_from: int | None,
    config: ConditionConfig = DEFAULT,
) -> float | None:
    """The relative drift of the signal still to come; None while there is too little history.

    max(tau x |slope of the signal| / level, tau x |temperature slope| x sensitivity),
    slopes fitted over the last window (the temperature's over three: NVML reads whole
    degrees, so a slow creep shows as 0 or 1 step in a short window), the sensitivity
    fitted from the chunks since the clock was first held down when the temperature
    moved enough, else `config.temp_sensitivity`.
    """
    window_s, tau_s = config.sustained_window_s, config.sustained_tau_s
    end = pts[-1][0]
    recent = [p for p in pts if p[0] >= end - window_s]
    if len(recent) < 4 or recent[-1][0] <= recent[0][0]:
        return None
    step = (recent[-1][0] - recent[0][0]) / (len(recent) - 1)
    level = stats.median([p[1] for p in recent])
    if level <= 0:
        return 0.0
    drift = tau_s * abs(stats.ols_slope([p[1] for p in recent]) / step) / level
    longer = [p for p in pts if p[0] >= end - 3 * window_s]
    temps = [p[2] for p in longer]
    if len(longer) < 4 or any(t is None for t in temps):
        return drift
    long_step = (longer[-1][0] - longer[0][0]) / (len(longer) - 1)
    temp_slope = stats.ols_slope([float(t) for t in temps if t is not None]) / long_step
    since = [(p[2], p[1]) for p in pts[capped_from or 0 :] if p[2] is not None]
    span = max(t for t, _ in since) - min(t for t, _ in since) if since else 0.0
    if capped_from is None or span < 2.0:
        sensitivity = config.temp_sensitivity
    else:
        sensitivity = abs(fit_slope([t for t, _ in since], [v for _, v in since])) / level
    return max(drift, tau_s * abs(temp_slope) * sensitivity)


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 when xs do not vary)."""
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    den = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def precondition(
    run_chunk: Callable[[float], float | None],
    sampler: SampleSource | None,
    gpus: Sequence[int],
    clock: Clock,
    *,
    config: ConditionConfig = DEFAULT,
    progress: Callable[[str, bool], None] | None = None,
) -> Conditioning:
    """Sustained: call `run_chunk(config.sustained_chunk_s)` until every GPU is at equilibrium.

    `run_chunk(seconds)` runs the work back to back for about that long and returns
    the time per call (None when the work is not timed: then the signal is the
    inverse of the chunk's median SM clock). `progress(line, settled)` gets a line
    after each chunk. Runs at least `sustained_min_s` (default: one window), at most
    `sustained_timeout_s` (`steady` False then).
    """
    # a chunk's clock is the median of its samples: every 25 ms while preconditioning, as
    # any wait (Sampler.hurry); nothing is measured here
    with sampler.hurry() if sampler is not None else contextlib.nullcontext():
        return _precondition(run_chunk, sampler, gpus, clock, config, progress)


def _precondition(
    run_chunk: Callable[[float], float | None],
    sampler: SampleSource | None,
    gpus: Sequence[int],
    clock: Clock,
    config: ConditionConfig,
    progress: Callable[[str, bool], None] | None,
) -> Conditioning:
    min_s = config.sustained_window_s if config.sustained_min_s is None else config.sustained_min_s
    start = clock.now()
    tracks = {g: _Track() for g in gpus}
    while True:
        c0 = clock.now()
        per_call = run_chunk(config.sustained_chunk_s)
        c1 = clock.now()
        states = []
        for g in gpus:
            chunk = sampler.samples(c0, c1, g) if sampler is not None else []
            mhz = stats.median([float(s.sm_mhz) for s in chunk]) if chunk else None
            temp = chunk[-1].temp_c if chunk else None
            limited = any(s.reasons & HELD_DOWN for s in chunk)
            tr = tracks[g]
            if limited and tr.capped_from is None:
                tr.capped_from = len(tr.pts)
            signal = per_call if per_call is not None else (1.0 / mhz if mhz else None)
            if signal is not None:
                tr.pts.append((c1, signal, temp))
            left = residual(tr.pts, tr.capped_from, config) if tr.pts else None
            states.append((g, mhz, temp, limited, left))
        elapsed = c1 - start
        lefts = [s[4] for s in states]
        worst = None if any(x is None for x in lefts) else max(lefts)  # type: ignore[type-var]
        settled = elapsed >= min_s and worst is not None and worst <= config.sustained_tol
        if progress is not None:
            progress(_progress_line(elapsed, per_call, states, worst, settled), settled)
        if settled or elapsed >= config.sustained_timeout_s:
            _, mhz, temp, _, _ = states[0] if states else (None, None, None, False, None)
            return Conditioning(elapsed, settled, mhz, temp, any(s[3] for s in states), worst)


def _progress_line(
    elapsed: float,
    per_call: float | None,
    states: Sequence[tuple[int, float | None, float | None, bool, float | None]],
    worst: float | None,
    settled: bool,
) -> str:
    from gpuenv.units import fmt_s

    parts = [
        f"GPU {g}"
        + (f" {mhz:.0f} MHz" if mhz is not None else "")
        + (f" {temp:.0f} C" if temp is not None else "")
        + (" capped" if limited else "")
        for g, mhz, temp, limited, _ in states
    ]
    line = f"preconditioning {elapsed:5.1f} s: " + ", ".join(parts)
    if per_call is not None:
        line += f", {fmt_s(per_call)}/call"
    if worst is not None:
        line += f", still to drift ~{worst:.2%}"
    return line + (": steady" if settled else "")
