#!/usr/bin/env python3
"""What the telemetry sampler costs a launch-bound loop, side by side in one run:
no sampler, the sampler thread, and the sampler process.

A launch-bound loop (torch.add on a 1k-element tensor, `--launches` times, then
one synchronize) is timed with no sampler, with the Sampler on a thread, and with
the Sampler in its own process (writing shared memory that this process reads
only when asked). A launch-bound loop is the worst case for the thread: the loop
holds Python's GIL almost all the time, and every NVML call the thread makes
hands the GIL over and back. The process makes its NVML calls on its own GIL.

The loop alone varies by tens of percent from run to run on a VM, so a 1% effect
needs many runs: each round runs every variant once, in an order that rotates
from round to round, and the slowdown of a variant is the median over rounds of
its time divided by the no-sampler time of the same round, with a bootstrap 95%
interval of that median. Each sampler is started before and stopped after its
loop, every round, and the sampler process is ended with it (in use it lingers for
the next Sampler): its start-up is reported, not timed in the loop. After the start
(and the same pause for every variant) one loop runs before the timed one: right
after a process start, a loop runs slower once (caches, page faults), which is not
what a sampler costs while it runs; that first loop is reported apart.
Also: the sampler's own CPU time, what one read of each kind costs (wall and
CPU), and what `mark()` costs on the caller's thread.

Read-only: run with GPUENV_READONLY=1 on a shared GPU; nothing is written.
Needs torch with CUDA. Prints markdown tables. Goal: < 1% slower at the defaults.

    GPUENV_READONLY=1 python -m benchmarks.sampler_overhead [--rounds 200] [--launches 20000]

The rounds stop early once --max-seconds (210) have gone, so that one call stays under
5 minutes with the start-up of the sampler process in every round; the table says how
many rounds ran.

`--sim`: no GPU needed: the simulated H100 (its state in a temporary file, so the
sampler process can open it) and a GIL-bound pure-Python loop in place of the
launches. A smoke check of the mechanics on any machine, not the H100's figure.
`--variants all` adds the thread and process at other periods and with the cheap
reads only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import runner
from gpuenv.backend import Backend, open_backend
from gpuenv.devices import select_gpus
from gpuenv.telemetry import (
    DEFAULT_ENERGY_PERIOD_S,
    DEFAULT_PERIOD_S,
    DEFAULT_PROCESS_PERIOD_S,
    DEFAULT_SLOW_PERIOD_S,
    Sampler,
)
from gpuenv.telemetry.process import close_idle

NEVER = 1e9  # a period so long that the read never comes round again
CHEAP = {"slow_period": NEVER, "energy_period": NEVER, "watch_processes": False}

# name -> Sampler keyword arguments (None: no sampler)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "no sampler": None,
    "thread (defaults)": {"mode": "thread"},
    "process (defaults)": {"mode": "process"},
}
MORE_VARIANTS: dict[str, dict[str, Any] | None] = {
    "thread, cheap reads only": {"mode": "thread", **CHEAP},
    "process, cheap reads only": {"mode": "process", **CHEAP},
    "thread, period 100 ms (the driver's refresh)": {
        "mode": "thread", "period": 0.1, "slow_period": 0.1, "process_period": 0.1,
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


def cuda_workload(launches: int) -> tuple[Backend, list[int], Callable[[], float], str]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (torch.cuda.is_available() is False); "
                         "--sim runs a smoke check without one")
    backend = open_backend()
    gpus = select_gpus(backend, "cuda:0")
    x = torch.ones(1024, device="cuda")
    y = torch.ones(1024, device="cuda")

    def loop() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(launches):
            torch.add(x, y, out=x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    what = (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; {launches} launches "
            "of torch.add on 1,024 floats per run")
    return backend, gpus, loop, what


def sim_workload(launches: int) -> tuple[Backend, list[int], Callable[[], float], str]:
    state = Path(tempfile.mkdtemp(prefix="gpuenv-bench-")) / "sim.json"
    backend = open_backend(spec={"kind": "sim", "profile": "h100", "n_gpus": 1, "seed": 0,
                                 "root": False, "state_file": str(state)})
    values = list(range(500))

    def loop() -> float:  # holds the GIL as a launch loop does: a few us an iteration
        t0 = time.perf_counter()
        for _ in range(launches):
            sum(values)
        return time.perf_counter() - t0

    what = (f"simulated H100 (no GPU), {launches} iterations of a GIL-bound Python loop "
            "per run (a smoke check of the mechanics)")
    return backend, [0], loop, what


def run_rounds(
    backend: Backend, gpus: list[int], loop: Callable[[], float], variants: dict[str, Any],
    rounds: int, max_s: float, settle_s: float,
) -> dict[str, dict[str, list[Any]]]:
    """Per variant: loop times, sampler CPU (fraction of a core), start seconds, modes.
    Stops early, after a whole round, once `max_s` seconds have gone."""
    names = list(variants)
    out: dict[str, dict[str, list[Any]]] = {
        n: {"times": [], "first": [], "cpu": [], "start": [], "mode": []} for n in names
    }
    deadline = time.monotonic() + max_s
    for r in range(rounds):
        if time.monotonic() > deadline:
            break
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            kwargs, rec = variants[name], out[name]
            if kwargs is None:
                time.sleep(settle_s)  # the same pause before the loop as the sampler variants
                rec["first"].append(loop())  # and the same loop before the timed one
                rec["times"].append(loop())
                continue
            t_start = time.perf_counter()
            sampler = Sampler(backend, gpus, **kwargs)
            sampler.start()
            rec["start"].append(time.perf_counter() - t_start)
            rec["mode"].append(sampler.mode)
            time.sleep(settle_s)  # the sampler is up and ticking, as in a session
            # first a loop of its own: right after a process start (caches, page faults) a
            # loop runs slower, once; it is reported apart ("first loop after start")
            rec["first"].append(loop())
            cpu0, t0 = sampler.cpu_time_s, time.perf_counter()
            rec["times"].append(loop())
            rec["cpu"].append((sampler.cpu_time_s - cpu0) / (time.perf_counter() - t0))
            sampler.stop()
            close_idle()  # no sampler process lingers into the next variant's loop
    return out


def _slowdown(times: list[float], base: list[float], sep: str) -> str:
    """Median of the per-round ratios, and its bootstrap 95% interval, as percentages."""
    ratios = [a / b for a, b in zip(times, base, strict=True)]
    lo, hi = bootstrap_median_ci(ratios)
    return (f"{100 * (statistics.median(ratios) - 1):+.2f}%{sep}"
            f"{100 * (lo - 1):+.2f}% to {100 * (hi - 1):+.2f}%")


def mark_cost_us(backend: Backend, gpus: list[int], mode: str, n: int = 100_000) -> float:
    sampler = Sampler(backend, gpus, mode=mode)
    sampler.start()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            sampler.mark()
        cost = (time.perf_counter() - t0) / n * 1e6
        time.sleep(0.2)
    finally:
        sampler.stop()
        close_idle()
    return cost


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=200, help="rounds of every variant")
    ap.add_argument("--launches", type=int, default=20_000)
    ap.add_argument("--variants", choices=("main", "all"), default="main")
    ap.add_argument("--settle", type=float, default=0.05,
                    help="seconds between a sampler's start and its loop (every variant waits "
                    "as long; default 0.05)")
    ap.add_argument("--max-seconds", type=float, default=210.0,
                    help="stop after the round that passes this many seconds (default 210)")


def run(args: argparse.Namespace) -> int:

    workload = sim_workload if args.sim else cuda_workload
    backend, gpus, loop, what = workload(args.launches)
    for _ in range(3):  # warm up: context, kernels, clocks
        loop()
    variants = dict(VARIANTS, **(MORE_VARIANTS if args.variants == "all" else {}))
    results = run_rounds(backend, gpus, loop, variants, args.rounds, args.max_seconds,
                         args.settle)

    g = gpus[0]
    costs = [
        ("read_fast (clocks, power, temperature, reasons)", lambda: backend.read_fast(g), 2000),
        ("read_slow (energy, reason counters, memory temperature)",
         lambda: backend.read_slow(g), 200),
        ("processes (compute and graphics)", lambda: backend.processes(g), 500),
    ]
    cost_rows = [(label, *call_cost(fn, n)) for label, fn, n in costs]
    marks = {mode: mark_cost_us(backend, gpus, mode) for mode in ("thread", "process")}
    backend.close()
    report(results, cost_rows, marks, what, args)
    return 0


def report(
    results: dict[str, dict[str, list[Any]]], cost_rows: list[tuple[str, float, float, float]],
    marks: dict[str, float], what: str, args: argparse.Namespace,
) -> None:
    day = datetime.datetime.now().astimezone()
    print(f"Sampler overhead: {what}; {platform.node()} ({os.cpu_count()} CPUs), "
          f"{day:%Y-%m-%d %H:%M %Z}; {len(results['no sampler']['times'])} rounds "
          f"(of {args.rounds} asked, at most {args.max_seconds:.0f} s), {args.settle * 1e3:.0f} ms "
          "from a sampler's start to its loop; defaults: period "
          f"{DEFAULT_PERIOD_S * 1e3:.0f} ms, counters every {DEFAULT_SLOW_PERIOD_S * 1e3:.0f} ms, "
          f"energy every {DEFAULT_ENERGY_PERIOD_S:.0f} s, processes every "
          f"{DEFAULT_PROCESS_PERIOD_S * 1e3:.0f} ms; "
          f"GPUENV_READONLY={os.environ.get('GPUENV_READONLY', '')!r}.\n")
    print("| sampler | ran as | loop median (s) | slowdown: median of per-round ratios | "
          "95% CI | first loop after start: slowdown (95% CI) | sampler CPU (% of a core) | "
          "start (ms, median) |")
    print("| --- | --- | ---: | ---: | --- | --- | ---: | ---: |")
    base = results["no sampler"]
    for name, rec in results.items():
        t = rec["times"]
        if not rec["mode"]:
            print(f"| {name} | - | {statistics.median(t):.4f} | - | - | - | - | - |")
            continue
        ran = "/".join(sorted(set(rec["mode"])))
        ratios = [a / b for a, b in zip(t, base["times"], strict=True)]
        slug = "_".join("".join(c if c.isalnum() else " " for c in name).split())
        runner.metric(f"{slug}_slowdown_pct", 100 * (statistics.median(ratios) - 1), "%",
                      slack=0.5)  # fmt: skip
        print(f"| {name} | {ran} | {statistics.median(t):.4f} | "
              f"{_slowdown(t, base['times'], ' | ')} | "
              f"{_slowdown(rec['first'], base['first'], ' (')}) | "
              f"{100 * statistics.median(rec['cpu']):.2f} | "
              f"{1e3 * statistics.median(rec['start']):.0f} |")
    spread = (max(base["times"]) - min(base["times"])) / statistics.median(base["times"])
    print(f"\nThe no-sampler loop itself ranged over {100 * spread:.0f}% of its median.\n")
    print("| one read (this thread, no loop running) | p50 us | p99 us | CPU us |")
    print("| --- | ---: | ---: | ---: |")
    for label, p50, p99, cpu in cost_rows:
        print(f"| {label} | {p50:.1f} | {p99:.1f} | {cpu:.1f} |")
    for mode, us in marks.items():
        print(f"| sampler.mark() on the caller's thread ({mode}) | {us:.2f} | | |")


if __name__ == "__main__":
    sys.exit(runner.main("sampler_overhead", __doc__, add_arguments, run,
                         quick={"rounds": 30, "launches": 5000, "max_seconds": 60.0}))
