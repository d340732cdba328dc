#!/usr/bin/env python3
"""What a `gpuenv.stable()` session's telemetry trace costs: file size and time.

1. Size: a session of each length, sampled at 25 ms (the default), a measurement kept
   every --every seconds; the samples its pieces write per GPU (TracePieces, fed sample
   records directly: no GPU, no sampler thread), against `written_bound`, and the JSON
   bytes of those pieces.
2. Time: what keeping one measurement adds (`TracePieces.piece()`: pull the new samples
   from the sampler, cut the piece), with the sampler's ring full (32,768 samples), on the
   simulated H100 in virtual time; the median of --reps calls.

    python -m benchmarks.session_trace [--every 10] [--reps 200]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import runner
from gpuenv.telemetry import DEFAULT_PERIOD_S, Sample, TracePieces
from gpuenv.telemetry.trace import written_bound

LENGTHS_S = (60.0, 600.0, 3600.0, 6 * 3600.0, 24 * 3600.0)


class Feed:
    """The slice of Sampler that TracePieces reads: the samples since a time."""

    def __init__(self) -> None:
        self.new: list[Sample] = []

    def samples(self, t0: float | None, t1: float | None, gpu: int) -> list[Sample]:
        lo = -math.inf if t0 is None else t0
        return [s for s in self.new if s.t >= lo]


def size(length_s: float, every_s: float) -> tuple[int, int]:
    """Samples and JSON bytes a session of `length_s` writes per GPU."""
    feed = Feed()
    pieces = TracePieces(feed, [0], t_ref=0.0)
    per_piece = round(every_s / DEFAULT_PERIOD_S)
    n_total = round(length_s / DEFAULT_PERIOD_S)
    written = nbytes = 0
    for start in range(0, n_total, per_piece):
        feed.new = [
            Sample(
                k * DEFAULT_PERIOD_S,
                0,
                1980 - k % 600,
                2619,
                650.0 + k % 50,
                40.0 + (k % 30),
                4,
                power_instant_w=655.3,
            )
            for k in range(start, min(start + per_piece, n_total))
        ]
        piece = pieces.piece()
        if piece:
            written += len(piece["trace"]["t_s"])
            nbytes += len(json.dumps(piece, separators=(",", ":")))
    return written, nbytes


def piece_cost(reps: int) -> float:
    """Median seconds of one piece() with a full ring, on the simulated H100."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.telemetry import Sampler
    from gpuenv.timebase import VirtualClock

    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    with Sampler(sim, [0], clock=sim.clock) as sampler:
        sim.idle(sampler.capacity * sampler.period * 1.1)
        pieces = TracePieces(sampler, [0], t_ref=sim.clock.now())
        pieces.piece()
        times = []
        for _ in range(reps):
            sim.idle(1.0)  # a measurement's worth of new samples
            t0 = time.perf_counter()
            pieces.piece()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--every", type=float, default=10.0, help="seconds between measurements")
    p.add_argument("--reps", type=int, default=200)


def run(args: argparse.Namespace) -> int:
    print("| session length | samples taken | samples written | written_bound | JSON |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for length in LENGTHS_S:
        written, nbytes = size(length, args.every)
        taken = round(length / DEFAULT_PERIOD_S)
        when = f"{length / 60:g} min" if length < 3600 else f"{length / 3600:g} h"
        print(
            f"| {when} | {taken:,} | {written:,} | "
            f"{written_bound(length):,} | {nbytes / 1e6:.2f} MB |"
        )
    cost = piece_cost(args.reps)
    print(f"\npiece() with a full ring: median {cost * 1e3:.2f} ms over {args.reps} calls")
    runner.metric("piece_ms", cost * 1e3, "ms", slack=0.05)
    return 0


if __name__ == "__main__":
    sys.exit(
        runner.main("session_trace", __doc__, add_arguments, run, sim_only=True, quick={"reps": 50})
    )
