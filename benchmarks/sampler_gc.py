#!/usr/bin/env python3
"""What the telemetry sampler's ring buffers cost gpuenvd's garbage collections, and what
the sampler costs to fill and to read, with full rings on 2 simulated H100s.

gpuenvd keeps one Sampler over every GPU for as long as it runs (period 0.1 s), and
freezes its start-up objects (`gc.freeze()`) once started. The rings fill later: after
an hour, 32,768 cheap samples and 32,768 counter reads per GPU. This script builds the
daemon's sampler the same way on virtual time (the rings fill in seconds), freezes
what exists then, fills the rings, and measures:

  - a full collection (`gc.collect()`), the daemon's worst pause, with the rings full;
  - the collector's own pauses while the rings filled (`gc.callbacks`);
  - the sampler's CPU per tick while filling (every read of the simulated GPUs included:
    a relative figure, to compare two versions on one machine);
  - what readers pay: latest(), a 1 s window, the last second of samples, and the whole
    ring (samples(), slow_samples()).

    python -m benchmarks.sampler_gc [--repeat 9] [--capacity 32768]

It uses the public Sampler API only, so the same file run from a checkout of an older
commit (copied there) measures that commit's code.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpuenv.daemon.server  # noqa: F401  (the daemon's start-up objects, as it has them)
from benchmarks import runner
from gpuenv.backend.sim import SimBackend
from gpuenv.telemetry import Sampler
from gpuenv.timebase import VirtualClock

DAEMON_PERIOD_S = 0.1  # gpuenvd's default sample_period


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _us(f: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


class _Pauses:
    """The collector's pauses by generation, from gc.callbacks."""

    def __init__(self) -> None:
        self.by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.by_gen[info["generation"]].append(time.perf_counter() - self._t0)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeat", type=int, default=9, help="full collections timed")
    ap.add_argument("--capacity", type=int, default=32768, help="samples per GPU (default)")


def run(args: argparse.Namespace) -> None:

    clock = VirtualClock()
    backend = SimBackend("h100", n_gpus=2, clock=clock)
    sampler = Sampler(
        backend,
        [0, 1],
        period=DAEMON_PERIOD_S,
        clock=clock,
        own_pids=[os.getpid()],
        capacity=args.capacity,
    )
    sampler.start()
    gc.collect()
    gc.freeze()  # as gpuenvd does once started
    base_objects = len(gc.get_objects())
    rss0 = _rss_mib()

    pauses = _Pauses()
    gc.callbacks.append(pauses)
    ticks = int(args.capacity * 1.05)  # every ring full, and overwritten a while
    cpu0, wall0 = time.process_time(), time.perf_counter()
    clock.advance(ticks * DAEMON_PERIOD_S)
    fill_cpu, fill_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    gc.callbacks.remove(pauses)
    assert len(sampler.samples(gpu=0)) == args.capacity, "the cheap ring is not full"
    n_slow = len(sampler.slow_samples(gpu=0))

    gc.collect()
    full = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        gc.collect()
        full.append(time.perf_counter() - t0)
    tracked = len(gc.get_objects()) - base_objects

    now = clock.now()
    reads = {
        "latest()": _us(lambda: sampler.latest(1), 2000),
        "window(now - 1 s, now)": _us(lambda: sampler.window(now - 1.0, now, 1), 200),
        "samples(now - 1 s)": _us(lambda: sampler.samples(now - 1.0, gpu=1), 500),
        "samples() of one GPU, whole ring": _us(lambda: sampler.samples(gpu=1), 5),
        "slow_samples() of one GPU, whole ring": _us(lambda: sampler.slow_samples(gpu=1), 5),
    }
    sampler.stop()

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"{when}, {os.cpu_count()}-core CPU machine ({platform.machine()}), no GPU, 2 simulated "
        f"H100, Python {platform.python_version()}; load average "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print(
        f"rings: {args.capacity} cheap samples and {n_slow} counter reads per GPU, "
        f"{ticks} ticks of {DAEMON_PERIOD_S} s (virtual)\n"
    )
    print("| figure | value |")
    print("| --- | --- |")
    print(
        f"| full collection, rings full, median / max of {args.repeat} | "
        f"{statistics.median(full) * 1e3:.2f} / {max(full) * 1e3:.2f} ms |"
    )
    print(f"| objects the collector tracks, beyond the frozen start-up | {tracked:,} |")
    for gen in (2, 1):
        p = pauses.by_gen[gen]
        if p:
            print(
                f"| generation-{gen} collections while filling: count, max pause | "
                f"{len(p)}, {max(p) * 1e3:.2f} ms |"
            )
        else:
            print(f"| generation-{gen} collections while filling: count, max pause | 0 |")
    print(
        f"| sampler CPU per tick (2 GPUs, simulated reads included) | "
        f"{fill_cpu / ticks * 1e6:.1f} us (wall {fill_wall / ticks * 1e6:.1f} us) |"
    )
    print(f"| memory of the full rings (RSS growth) | {_rss_mib() - rss0:.1f} MiB |")
    for what, us in reads.items():
        print(
            f"| read: {what} | {us / 1e3:.3f} ms |"
            if us >= 1000
            else f"| read: {what} | {us:.1f} us |"
        )
    runner.metric("full_collection_ms", statistics.median(full) * 1e3, "ms", slack=1.0)
    runner.metric("sampler_cpu_per_tick_us", fill_cpu / ticks * 1e6, "us", slack=5.0)


if __name__ == "__main__":
    sys.exit(runner.main("sampler_gc", __doc__, add_arguments, run, sim_only=True))
