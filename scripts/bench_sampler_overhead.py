#!/usr/bin/env python3
"""What the telemetry sampler costs a launch-bound loop, side by side in one run.

20,000 tiny kernel launches (torch add on a 1k-element tensor, then one
synchronize), with and without gpuenv's Sampler running at its default
settings, in interleaved pairs (the order alternates, so drift in the machine
hits both sides alike). Also: the sampler thread's own CPU time, and what
`mark()` (a region edge on the caller's thread) costs.

Read-only: run with GPUENV_READONLY=1 on a shared GPU; nothing is written.
Needs torch with CUDA. Prints a markdown table. Goal: < 1% slower.

    GPUENV_READONLY=1 python scripts/bench_sampler_overhead.py [--pairs 10] [--launches 20000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuenv.backend import open_backend
from gpuenv.devices import select_gpus
from gpuenv.telemetry import DEFAULT_PERIOD_S, DEFAULT_SLOW_PERIOD_S, Sampler


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=10, help="interleaved with/without pairs")
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

    without: list[float] = []
    with_s: list[float] = []
    cpu_s: list[float] = []
    awake_s: list[float] = []  # wall time the sampler ran
    ticks: list[int] = []
    for i in range(args.pairs):
        for run_with in ((False, True) if i % 2 == 0 else (True, False)):
            if not run_with:
                without.append(loop())
                continue
            sampler = Sampler(backend, gpus)
            started = time.perf_counter()
            sampler.start()
            time.sleep(0.05)  # the thread is up and ticking, as in a session
            t = loop()
            sampler.stop()
            awake_s.append(time.perf_counter() - started)
            with_s.append(t)
            cpu_s.append(sampler.cpu_time_s)
            ticks.append(sampler.ticks)

    # the cost of a region edge on the caller's thread, with the sampler running
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

    ratios = [w / o for w, o in zip(with_s, without, strict=True)]
    med_with, med_without = statistics.median(with_s), statistics.median(without)
    name = torch.cuda.get_device_name(0)
    day = datetime.datetime.now().astimezone()
    print(f"Sampler overhead on {name}, torch {torch.__version__}, {platform.node()}, "
          f"{day:%Y-%m-%d}; {args.launches} launches of torch.add on 1,024 floats per run, "
          f"{args.pairs} interleaved pairs; sampler defaults (period {DEFAULT_PERIOD_S * 1e3:.0f} "
          f"ms, counters every {DEFAULT_SLOW_PERIOD_S * 1e3:.0f} ms); "
          f"GPUENV_READONLY={os.environ.get('GPUENV_READONLY', '')!r}.\n")
    print("| pair | without sampler (s) | with sampler (s) | ratio | sampler CPU (ms) | ticks |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, (o, w, c, k) in enumerate(zip(without, with_s, cpu_s, ticks, strict=True)):
        print(f"| {i} | {o:.4f} | {w:.4f} | {w / o:.4f} | {c * 1e3:.1f} | {k} |")
    cpu_frac = sum(cpu_s) / sum(awake_s)
    print(f"| median | {med_without:.4f} | {med_with:.4f} | {statistics.median(ratios):.4f} | "
          f"{statistics.median(cpu_s) * 1e3:.1f} | {int(statistics.median(ticks))} |")
    print()
    print(f"- slowdown with the sampler: median ratio {statistics.median(ratios):.4f} "
          f"({100 * (statistics.median(ratios) - 1):+.2f}%; goal < 1%), "
          f"min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"- sampler thread CPU: {100 * cpu_frac:.2f}% of one core while sampling "
          f"(time.thread_time in the thread)")
    print(f"- sampler.mark() on the caller's thread: {mark_us:.2f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
