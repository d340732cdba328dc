#!/usr/bin/env python3
"""What the telemetry sampler costs a launch-bound loop, side by side in one run.

A launch-bound loop (torch.add on a 1k-element tensor, `--launches` times, then
one synchronize) is timed with no sampler and with the Sampler in a few
configurations. A launch-bound loop is the worst case: the loop holds Python's
GIL almost all the time, and every NVML call the sampler makes hands the GIL
over and back.

The loop alone varies by tens of percent from run to run on a VM, so a 1% effect
needs many runs: each round runs every variant once, in an order that rotates
from round to round, and the slowdown of a variant is the median over rounds of
its time divided by the no-sampler time of the same round, with a bootstrap 95%
interval of that median. Also: the sampler thread's own CPU time, what one read
of each kind costs (wall and CPU), and what `mark()` costs on the caller's thread.

Read-only: run with GPUENV_READONLY=1 on a shared GPU; nothing is written.
Needs torch with CUDA. Prints markdown tables. Goal: < 1% slower at the defaults.

    GPUENV_READONLY=1 python scripts/bench_sampler_overhead.py [--rounds 30] [--launches 20000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuenv.backend import open_backend
from gpuenv.devices import select_gpus
from gpuenv.telemetry import (
    DEFAULT_PERIOD_S,
    DEFAULT_PROCESS_PERIOD_S,
    DEFAULT_SLOW_PERIOD_S,
    Sampler,
)

NEVER = 1e9  # a period so long that the read never comes round again

# name -> Sampler keyword arguments (None: no sampler)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "no sampler": None,
    "defaults": {},
    "cheap reads only, default period": {"slow_period": NEVER, "watch_processes": False},
    "period 50 ms, processes every 100 ms": {"period": 0.05, "process_period": 0.1},
    "period 100 ms (the driver's refresh)": {
        "period": 0.1, "slow_period": 0.1, "process_period": 0.1,
    },
}


def bootstrap_median_ci(
    values: list[float], reps: int = 2000, seed: int = 1
) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(
        statistics.median(rng.choice(values) for _ in values) for _ in range(reps)
    )
    return meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def call_cost(fn: Callable[[], Any], n: int) -> tuple[float, float, float]:
    """p50 and p99 wall time and mean CPU time of one call, in microseconds."""
    walls = []
    cpu0 = time.thread_time()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    cpu = (time.thread_time() - cpu0) / n
    walls.sort()
    return walls[n // 2] * 1e6, walls[min(n - 1, int(0.99 * n))] * 1e6, cpu * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="rounds of every variant")
    ap.add_argument("--launches", type=int, default=20_000)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    backend = open_backend()
    gpus = select_gpus(backend, "cuda:0")
    x = torch.ones(1024, device="cuda")
    y = torch.ones(1024, device="cuda")

    def loop() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.launches):
            torch.add(x, y, out=x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(3):  # warm up: context, kernels, clocks
        loop()

    names = list(VARIANTS)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu_frac: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            kwargs = VARIANTS[name]
            if kwargs is None:
                time.sleep(0.05)  # the same pause before the loop as the sampler variants
                times[name].append(loop())
                continue
            sampler = Sampler(backend, gpus, **kwargs)
            sampler.start()
            time.sleep(0.05)  # the thread is up and ticking, as in a session
            cpu0, t0 = sampler.cpu_time_s, time.perf_counter()
            times[name].append(loop())
            cpu_frac[name].append((sampler.cpu_time_s - cpu0) / (time.perf_counter() - t0))
            sampler.stop()

    # the cost of each read, on this thread (no loop running)
    g = gpus[0]
    costs = [
        ("read_fast (clocks, power, temperature, reasons)", lambda: backend.read_fast(g), 2000),
        ("read_slow (energy, reason counters, memory temperature)",
         lambda: backend.read_slow(g), 200),
        ("processes (compute and graphics)", lambda: backend.processes(g), 500),
    ]
    cost_rows = [(label, *call_cost(fn, n)) for label, fn, n in costs]
    sampler = Sampler(backend, gpus)
    sampler.start()
    n_marks = 100_000
    t0 = time.perf_counter()
    for _ in range(n_marks):
        sampler.mark()
    mark_us = (time.perf_counter() - t0) / n_marks * 1e6
    time.sleep(0.2)
    sampler.stop()
    backend.close()

    base = times["no sampler"]
    day = datetime.datetime.now().astimezone()
    print(f"Sampler overhead on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{platform.node()} ({os.cpu_count()} CPUs), {day:%Y-%m-%d %H:%M %Z}; "
          f"{args.launches} launches of torch.add on 1,024 floats per run, {args.rounds} rounds; "
          f"defaults: period {DEFAULT_PERIOD_S * 1e3:.0f} ms, counters every "
          f"{DEFAULT_SLOW_PERIOD_S * 1e3:.0f} ms, processes every "
          f"{DEFAULT_PROCESS_PERIOD_S * 1e3:.0f} ms; "
          f"GPUENV_READONLY={os.environ.get('GPUENV_READONLY', '')!r}.\n")
    print("| sampler | loop median (s) | slowdown: median of per-round ratios | 95% CI | "
          "sampler thread CPU (% of a core) |")
    print("| --- | ---: | ---: | --- | ---: |")
    for name in names:
        t = times[name]
        if VARIANTS[name] is None:
            print(f"| {name} | {statistics.median(t):.4f} | - | - | - |")
            continue
        ratios = [a / b for a, b in zip(t, base, strict=True)]
        lo, hi = bootstrap_median_ci(ratios)
        print(f"| {name} | {statistics.median(t):.4f} | "
              f"{100 * (statistics.median(ratios) - 1):+.2f}% | "
              f"{100 * (lo - 1):+.2f}% to {100 * (hi - 1):+.2f}% | "
              f"{100 * statistics.median(cpu_frac[name]):.2f} |")
    spread = (max(base) - min(base)) / statistics.median(base)
    print(f"\nThe no-sampler loop itself ranged over {100 * spread:.0f}% of its median.\n")
    print("| one read (this thread, no loop running) | p50 us | p99 us | CPU us |")
    print("| --- | ---: | ---: | ---: |")
    for label, p50, p99, cpu in cost_rows:
        print(f"| {label} | {p50:.1f} | {p99:.1f} | {cpu:.1f} |")
    print(f"| sampler.mark() on the caller's thread | {mark_us:.2f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
