"""The telemetry trace `gpuenv plot` draws: the samples of a whole run or session, bounded.

    log = SampleLog(gpus)          # at most MAX_POINTS samples per GPU, thinned evenly beyond
    log.pull(sampler)              # bring in what the sampler took since the last pull
    log.traces(t_ref)              # {gpu: trace}: what a results file carries

A trace is one record shape wherever it is written (a Measurement's extra["trace"]:
the first GPU's; extra["traces"]: every GPU's by index, when there are several): parallel
lists `t_s` (seconds from `t0`, a host monotonic time), `sm_mhz`, `mem_mhz`, `power_w`
(instantaneous where the GPU gives it), `temp_c` and `reasons`.

`gpuenv run` writes its whole log once, on the "(run)" measurement. A `gpuenv.stable()`
session writes it in pieces (`TracePieces`): each measurement carries the samples taken
since the previous measurement was kept, so the pieces of a file join into the session's
trace and a crash loses no more of it than of the measurements.

The bound: SampleLog holds at most MAX_POINTS samples per GPU (33 minutes at the default
100 ms period, 500 s if every sample came at the hurried 25 ms); past that it keeps every
other sample and takes new ones half as often. A run writes at most MAX_POINTS per GPU.
The pieces of a session are written as they come, so they add up to at most 2 MAX_POINTS
over the first 500 s (counted at 25 ms: the bound holds for any mix of hurried and default
ticks) and MAX_POINTS / 2 more per doubling of the session's length after that
(`written_bound`): at most 115,000 samples per GPU (some 5 MB of JSON) for a day.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from gpuenv.telemetry.samples import HURRY_PERIOD_S, Sample
from gpuenv.telemetry.source import SampleFeed

MAX_POINTS = 20_000  # samples per GPU a log holds (thinned evenly beyond)


def trace_record(samples: Sequence[Sample], t_ref: float) -> dict[str, Any]:
    """One GPU's samples as the trace record (module docstring); times from `t_ref`."""
    return {
        "t0": t_ref,
        "t_s": [round(s.t - t_ref, 4) for s in samples],
        "sm_mhz": [s.sm_mhz for s in samples],
        "mem_mhz": [s.mem_mhz for s in samples],
        "power_w": [
            round(s.power_instant_w if s.power_instant_w is not None else s.power_w, 1)
            for s in samples
        ],
        "temp_c": [s.temp_c for s in samples],
        "reasons": [s.reasons for s in samples],
    }


class SampleLog:
    """The samples kept for plotting: at most `max_points` per GPU, thinned evenly beyond."""

    def __init__(self, gpus: Sequence[int], max_points: int = MAX_POINTS, min_dt: float = 0.0):
        self.max_points = max_points
        self.first_dt = min_dt
        self.points: dict[int, list[Sample]] = {g: [] for g in gpus}
        self.upto: dict[int, float] = {g: -math.inf for g in gpus}  # pulled up to, per GPU
        # per GPU: the spacing below which a new sample is not taken (each GPU's own
        # thinnings double its own, so every GPU's kept samples stay evenly spaced)
        self.min_dt: dict[int, float] = {g: min_dt for g in gpus}

    def add(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            pts = self.points.setdefault(s.gpu, [])
            min_dt = self.min_dt.setdefault(s.gpu, self.first_dt)
            if pts and s.t - pts[-1].t < min_dt:
                continue
            pts.append(s)
            if len(pts) > self.max_points:
                self.points[s.gpu] = pts[::2]
                self.min_dt[s.gpu] = max(min_dt * 2, (pts[-1].t - pts[0].t) / self.max_points)

    def pull(self, sampler: SampleFeed) -> None:
        """Add the samples `sampler` (a telemetry.Sampler) took since the last pull. Its ring
        holds DEFAULT_CAPACITY samples per GPU (55 min at 100 ms): pull at least that often."""
        for g in self.points:
            since = self.upto.get(g, -math.inf)
            new = [
                s
                for s in sampler.samples(None if since == -math.inf else since, None, g)
                if s.t > since
            ]
            if new:
                self.add(new)
                self.upto[g] = new[-1].t

    def traces(self, t_ref: float) -> dict[int, dict[str, Any]]:
        """Per GPU, the trace record of every sample kept, times from t_ref."""
        return {g: trace_record(pts, t_ref) for g, pts in self.points.items()}

    def after(self, gpu: int, t: float) -> list[Sample]:
        """The samples of `gpu` kept with a time after t."""
        pts = self.points.get(gpu, [])
        return pts[bisect.bisect_right([p.t for p in pts], t) :]


class TracePieces:
    """A session's trace, written in pieces: `piece()` is what the next measurement carries.

    Each piece holds the samples taken since the previous piece (the first: since
    `t_ref`, the session's start), as the log kept them (module docstring for the bound).
    """

    def __init__(
        self, sampler: SampleFeed, gpus: Sequence[int], t_ref: float, max_points: int | None = None
    ):
        self.sampler = sampler
        self.gpus = list(gpus)
        self.t_ref = t_ref
        self.log = SampleLog(self.gpus, MAX_POINTS if max_points is None else max_points)
        self.given: dict[int, float] = {g: -math.inf for g in self.gpus}

    def pull(self) -> None:
        """Bring in the sampler's samples (call it at least once per ring's length)."""
        self.log.pull(self.sampler)

    def piece(self) -> dict[str, Any]:
        """{"trace": first GPU's piece, "traces": {"0": ..., "1": ...} with several GPUs};
        {} when nothing was sampled since the last piece."""
        self.pull()
        new = {g: pts for g in self.gpus if (pts := self.log.after(g, self.given[g]))}
        if self.gpus[0] not in new:
            return {}  # the other GPUs' samples wait for the next piece: none is skipped
        out: dict[int, dict[str, Any]] = {}
        for g, pts in new.items():
            self.given[g] = pts[-1].t
            out[g] = trace_record(pts, self.t_ref)
        if len(self.gpus) == 1:
            return {"trace": out[self.gpus[0]]}
        return {"trace": out[self.gpus[0]], "traces": {str(g): t for g, t in out.items()}}


def written_bound(
    seconds: float, period: float = HURRY_PERIOD_S, max_points: int = MAX_POINTS
) -> int:
    """The most samples per GPU the pieces of a session `seconds` long add up to, its
    sampler ticking at most every `period` (default: the hurried tick, the fastest).

    Up to the first thinning (at fill = max_points * period) the log takes every sample;
    each thinning keeps half and at least doubles the spacing of what it takes next, so
    the j-th refill of max_points / 2 samples starts no earlier than fill * 2**(j - 2):
    max_points * (2 + log2(seconds / fill) / 2) + 1 in all.
    """
    fill_s = max_points * period
    return math.floor(max_points * (2 + math.log2(max(seconds, fill_s) / fill_s) / 2)) + 1


def envelope(
    ts: Sequence[float], ys: Sequence[float], slices: int
) -> tuple[list[float], list[float]]:
    """`ys` over `ts` in about 2 * `slices` points: each slice's lowest and highest sample in
    time order, so a one-sample spike is still drawn; a NaN (a break in the line) kept."""
    n = len(ts)
    if n <= 2 * slices:
        return list(ts), list(ys)
    out_t: list[float] = []
    out_y: list[float] = []
    start = 0
    for i in range(n + 1):
        if i < n and ys[i] == ys[i]:
            continue
        if i > start:
            pieces = max(1, round(slices * (i - start) / n))
            step = (i - start) / pieces
            for k in range(pieces):
                lo = start + int(k * step)
                hi = max(lo + 1, start + int((k + 1) * step))
                a = min(range(lo, hi), key=ys.__getitem__)
                b = max(range(lo, hi), key=ys.__getitem__)
                for j in sorted({a, b}):
                    out_t.append(ts[j])
                    out_y.append(ys[j])
        if i < n:
            out_t.append(ts[i])
            out_y.append(math.nan)
        start = i + 1
    return out_t, out_y


__all__ = ["MAX_POINTS", "SampleLog", "TracePieces", "envelope", "trace_record", "written_bound"]
