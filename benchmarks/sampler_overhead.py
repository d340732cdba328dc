#!/usr/bin/env python3
"""What the telemetry sampler costs a launch-bound loop, side by side in one run:
no sampler, the sampler thread, and the sampler process.

A launch-bound loop (torch.add on a 1k-element tensor, `--launches` times, then
one synchronize) is timed with no sampler, with the Sampler on a thread, and with
the Sampler in its own process (writing shared memory that this process reads
only when asked). A launch-bound loop is the worst case for the thread: the loop
holds Python's GIL almost all the time, and every NVML call the thread makes
hands the GIL over and back. The process makes its NVML calls on its own GIL.

The loop alone varies by tens of percent from one run to the next (up to 2x
between neighbouring runs on the lent H100), so the design pairs neighbours: each
round runs, for every sampler variant in a random order, one pair of loops, one with
that sampler on and one with it off, the two in a random order, the same random
wait of --settle to twice that before each. On is a thread sampler started for
its loop (and stopped after), or the variant's sampler process, which runs for the
whole session and is paused
(SIGSTOP) while off and continued (SIGCONT) for its loops: a process start takes
~0.3 s. The slowdown of a variant: the Hodges-Lehmann estimate of its paired log
ratios on/off (the median of their pairwise means) with its distribution-free 95%
interval (Wilcoxon signed ranks), and the median of the ratios with a bootstrap 95%
interval. Reads made once a second land in few ~50 ms loops, and robust estimates
discount them: the busy figures below count them in.

A second, independent bound: what the sampler was busy with. Its own CPU time
(the thread's; the process's from /proc, from its continue to its pause) while it
was on, and its reads counted in its ring during its loops, each at the wall time
one read of its kind costs alone (measured in the same run): the NVML time a second
it held the driver. A loop can lose about that much to it (plus, on a thread, the
GIL hand-overs); the CPU time, where it is far above the reads' time alone, says the
reads cost more while the loop runs. A thread sampler also times each of its reads where
it makes them (`Sampler.read_times`: wall time, the GIL's hand-back included, and CPU),
tabled against the same read alone.

Read-only: run with GPUENV_READONLY=1 on a shared GPU; nothing is written.
Needs torch with CUDA. Prints markdown tables. Goal: < 0.5% slower at the defaults,
at 95%.

    GPUENV_READONLY=1 python -m benchmarks.sampler_overhead [--rounds 400] [--launches 6000]

The rounds stop early once --max-seconds (210) have gone; the table says how many ran.

`--sim`: no GPU needed: the simulated H100 (its state in a temporary file, so the
sampler process can open it) and a GIL-bound pure-Python loop in place of the
launches. A smoke check of the mechanics on any machine, not the H100's figure.
`--variants all` adds the thread and process with the cheap reads only, and the
thread with a region edge (`mark()`) before every loop; `--variants periods` the thread
ticking every 25 ms (hurried, as during a conditioning wait; the default until
2026-11-25) and every 50 ms, with the process list once a second, and without it;
`--variants thread` and `--variants process` one sampler alone, one pair a round (the
narrowest interval).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import random
import signal
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
    HURRY_PERIOD_S,
    Sampler,
)
from gpuenv.telemetry.process import close_idle

NEVER = 1e9  # a period so long that the read never comes round again
CHEAP = {"slow_period": NEVER, "energy_period": NEVER, "watch_processes": False}

# name -> Sampler keyword arguments (None: no sampler); MARK: a region edge before each loop
MARK = "mark_every_loop"
VARIANTS: dict[str, dict[str, Any] | None] = {
    "no sampler": None,
    "thread (defaults)": {"mode": "thread"},
    "process (defaults)": {"mode": "process"},
}
MORE_VARIANTS: dict[str, dict[str, Any] | None] = {
    "thread, cheap reads only": {"mode": "thread", **CHEAP},
    "process, cheap reads only": {"mode": "process", **CHEAP},
    "thread, a region edge before every loop": {"mode": "thread", MARK: True},
}
# which of the thread's periodic reads costs the loop (`--variants periods`): its tick at
# a quarter and half the default period (the driver's ~100 ms refresh; 25 ms is the
# hurried tick of a conditioning wait, and was the default with the process list every
# 50 ms until 2026-11-25), the process list once a second (under launches it took half
# of a 100 ms tick's cost on the H100), and no process list at all
PERIOD_VARIANTS: dict[str, dict[str, Any] | None] = {
    "thread, ticks every 25 ms (hurried; the old default)": {
        "mode": "thread",
        "period": 0.025,
        "process_period": 0.05,
    },
    "thread, ticks every 50 ms": {"mode": "thread", "period": 0.05},
    "thread, process list once a second": {"mode": "thread", "process_period": 1.0},
    "thread, no process list": {"mode": "thread", "watch_processes": False},
}
Z95 = 1.959964


def bootstrap_median_ci(
    values: list[float], reps: int = 2000, seed: int = 1
) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choice(values) for _ in values) for _ in range(reps))
    return meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def hodges_lehmann(values: list[float]) -> tuple[float, float, float]:
    """The Hodges-Lehmann estimate of the centre of `values` (the median of all pairwise
    means, each value with itself included) and its distribution-free 95% interval: the
    Walsh averages at the Wilcoxon signed-rank test's critical ranks (normal approximation,
    fine from ~20 values). Assumes symmetry about the centre, not a normal law."""
    n = len(values)
    walsh = sorted((values[i] + values[j]) / 2 for i in range(n) for j in range(i, n))
    m = len(walsh)
    k = int(n * (n + 1) / 4 - Z95 * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
    k = min(max(k, 0), (m - 1) // 2)
    return statistics.median(walsh), walsh[k], walsh[m - 1 - k]


def call_cost(fn: Callable[[], Any], n: int) -> tuple[float, float, float]:
    """p50 and p99 wall time and mean CPU time of one call, in microseconds."""
    return read_cost(fn, n)[:3]


def read_cost(fn: Callable[[], Any], n: int) -> tuple[float, float, float, float]:
    """`call_cost` and the mean wall time of one call (what a read costs on average, its
    long tail included), in microseconds."""
    walls = []
    cpu0 = time.thread_time()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    cpu = (time.thread_time() - cpu0) / n
    mean = statistics.fmean(walls)
    walls.sort()
    return walls[n // 2] * 1e6, walls[min(n - 1, int(0.99 * n))] * 1e6, cpu * 1e6, mean * 1e6


def cuda_workload(launches: int) -> tuple[Backend, list[int], Callable[[], float], str]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "needs a CUDA device (torch.cuda.is_available() is False); "
            "--sim runs a smoke check without one"
        )
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

    what = (
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; {launches} launches "
        "of torch.add on 1,024 floats per run"
    )
    return backend, gpus, loop, what


def sim_workload(launches: int) -> tuple[Backend, list[int], Callable[[], float], str]:
    state = Path(tempfile.mkdtemp(prefix="gpuenv-bench-")) / "sim.json"
    backend = open_backend(
        spec={
            "kind": "sim",
            "profile": "h100",
            "n_gpus": 1,
            "seed": 0,
            "root": False,
            "state_file": str(state),
        }
    )
    values = list(range(500))

    def loop() -> float:  # holds the GIL as a launch loop does: a few us an iteration
        t0 = time.perf_counter()
        for _ in range(launches):
            sum(values)
        return time.perf_counter() - t0

    what = (
        f"simulated H100 (no GPU), {launches} iterations of a GIL-bound Python loop "
        "per run (a smoke check of the mechanics)"
    )
    return backend, [0], loop, what


def run_rounds(
    backend: Backend,
    gpus: list[int],
    loop: Callable[[], float],
    variants: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, dict[str, list[Any]]]:
    """Per sampler variant: (on, off) loop time pairs, and over its on-loops its CPU time,
    their seconds, its reads (counted in its ring); its start seconds and mode. Each
    round runs one pair of every variant, the variants and each pair's two loops in a
    random order. Stops early, after a whole round, past --max-seconds."""
    names = [n for n, kw in variants.items() if kw is not None]
    out: dict[str, dict[str, list[Any]]] = {
        n: {
            "pairs": [],
            "cpu": [],
            "cpu_span": [],
            "span": [],
            "reads": [],
            "read_times": [],
            "start": [],
            "mode": [],
        }
        for n in names
    }
    procs: dict[str, Sampler] = {}
    variants = dict(variants)
    try:
        for name in names:  # the sampler processes run for the whole session, paused when off
            kwargs = dict(variants[name])
            if kwargs.get("mode") == "process":
                sampler = _start(backend, gpus, kwargs, out[name])
                if sampler.child_pid is None:  # it fell back to a thread: one per loop, then
                    sampler.stop()
                    variants[name] = {**kwargs, "mode": "thread"}
                    continue
                procs[name] = sampler
                time.sleep(args.settle)
                _pause(sampler, True)
        rng = random.Random(args.seed)
        deadline = time.monotonic() + args.max_seconds
        for _ in range(args.rounds):
            if time.monotonic() > deadline:
                break
            rng.shuffle(names)
            for name in names:
                on_first = rng.random() < 0.5
                # a random wait, the same before both loops: no loop in step with the ticks
                settle = args.settle * (1 + rng.random())
                times: dict[bool, float] = {}
                for on in (on_first, not on_first):
                    if on:
                        times[on] = _on_loop(
                            backend, gpus, loop, variants[name], out[name], procs.get(name), settle
                        )
                    else:
                        time.sleep(settle)  # as long as the on-loop waits after its start
                        times[on] = loop()
                out[name]["pairs"].append((times[True], times[False]))
    finally:
        for sampler in procs.values():
            _pause(sampler, False)
            sampler.stop()
        close_idle()
    return out


def _start(
    backend: Backend, gpus: list[int], kwargs: dict[str, Any], rec: dict[str, list[Any]]
) -> Sampler:
    kwargs.pop(MARK, None)
    t_start = time.perf_counter()
    sampler = Sampler(backend, gpus, **kwargs)
    sampler.start()
    rec["start"].append(time.perf_counter() - t_start)
    rec["mode"].append(sampler.mode)
    return sampler


def _pause(sampler: Sampler, paused: bool) -> None:
    """Stop (SIGSTOP) or continue (SIGCONT) a sampler process: off, it reads nothing."""
    assert sampler.child_pid is not None
    with contextlib.suppress(ProcessLookupError):  # it died: its windows say so
        os.kill(sampler.child_pid, signal.SIGSTOP if paused else signal.SIGCONT)


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _on_loop(
    backend: Backend,
    gpus: list[int],
    loop: Callable[[], float],
    kwargs: dict[str, Any],
    rec: dict[str, list[Any]],
    proc: Sampler | None,
    settle: float,
) -> float:
    """One loop with the sampler on: a thread sampler started for it (and stopped after),
    or the variant's sampler process continued (and paused again after)."""
    pid = proc.child_pid if proc is not None else None
    if proc is not None and pid is not None:
        sampler = proc
        cpu0 = _process_cpu_s(pid)
        _pause(sampler, False)
    else:  # a thread sampler of its own
        sampler = _start(backend, gpus, dict(kwargs), rec)
        cpu0 = 0.0
    try:
        time.sleep(settle)  # the start's read of every counter is past
        c0 = sampler.clock.now()
        thread_cpu0 = sampler.cpu_time_s
        times0 = sampler.read_times
        if kwargs.get(MARK):
            sampler.mark()
        took = loop()
        c1 = sampler.clock.now()
        if pid is not None:
            _pause(sampler, True)
            rec["cpu"].append(_process_cpu_s(pid) - cpu0)
            rec["cpu_span"].append(c1 - c0 + settle)  # it ran from its continue to its pause
        else:
            rec["cpu"].append(sampler.cpu_time_s - thread_cpu0)
            rec["cpu_span"].append(c1 - c0)
        rec["span"].append(c1 - c0)
        rec["reads"].append(_reads(sampler, gpus[0], c0, c1))
        times1 = sampler.read_times
        if times0 is not None and times1 is not None:  # a thread: its reads during the loop
            rec["read_times"].append(
                {k: [b - a for a, b in zip(times0[k], times1[k], strict=True)] for k in times1}
            )
        return took
    finally:
        if sampler is not proc:
            sampler.stop()
            close_idle()  # in case it started a process after all


def _reads(sampler: Sampler, gpu: int, t0: float, t1: float) -> dict[str, int]:
    """The sampler's reads of one GPU in [t0, t1], by kind, from what it recorded."""
    slow = sampler.slow_samples(t0, t1, gpu)
    return {
        "fast": len(sampler.samples(t0, t1, gpu)),
        "counters": sum(1 for s in slow if s.reason_ns and s.energy_mj is None),
        "energy": sum(1 for s in slow if s.energy_mj is not None),
        "processes": sum(1 for s in slow if s.own_present is not None),
    }


def slowdowns(ratios: list[float]) -> dict[str, float]:
    """Median of the paired ratios (bootstrap 95% CI) and Hodges-Lehmann of their logs
    (Wilcoxon 95% CI), as percentages."""
    lo, hi = bootstrap_median_ci(ratios)
    hl, hl_lo, hl_hi = hodges_lehmann([math.log(r) for r in ratios])
    pct = [100 * (v - 1) for v in (statistics.median(ratios), lo, hi)]
    pct += [100 * math.expm1(v) for v in (hl, hl_lo, hl_hi)]
    return dict(zip(("median", "median_lo", "median_hi", "hl", "hl_lo", "hl_hi"), pct, strict=True))


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
    ap.add_argument("--rounds", type=int, default=400, help="rounds of every variant")
    ap.add_argument("--launches", type=int, default=6000, help="launches per loop")
    ap.add_argument(
        "--variants",
        choices=("main", "all", "periods", "process", "thread"),
        default="main",
        help="process: the sampler process alone (the default on a real GPU), "
        "every round one pair: the most pairs, the narrowest interval; thread: "
        "the same for the thread (`gpuenv run`, a simulated GPU)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=0.03,
        help="seconds between a sampler's start (or continue) and its loop; every "
        "loop waits as long (default 0.03)",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=210.0,
        help="stop after the round that passes this many seconds (default 210)",
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of the rounds' random orders")


COSTS = {  # read kind (as _reads counts them) -> the cost row's label
    "fast": "read_fast (clocks, power, temperature, reasons)",
    "counters": "read_slow(energy=False) (reason counters, memory temperature)",
    "energy": "read_slow(energy=True) (the same and the energy counter)",
    "processes": "processes (compute and graphics)",
}


def run(args: argparse.Namespace) -> int:
    if args.launches < 1:
        raise SystemExit("--launches must be at least 1")
    workload = sim_workload if args.sim else cuda_workload
    backend, gpus, loop, what = workload(args.launches)
    for _ in range(3):  # warm up: context, kernels, clocks
        loop()
    more = {"all": MORE_VARIANTS, "periods": PERIOD_VARIANTS}.get(args.variants, {})
    variants = dict(VARIANTS, **more)
    if args.variants in ("process", "thread"):
        variants = {
            k: v for k, v in variants.items() if v is None or v.get("mode") == args.variants
        }
    results = run_rounds(backend, gpus, loop, variants, args)

    g = gpus[0]
    costs: dict[str, tuple[Callable[[], Any], int]] = {
        "fast": (lambda: backend.read_fast(g), 2000),
        "counters": (lambda: backend.read_slow(g, energy=False), 300),
        "energy": (lambda: backend.read_slow(g, energy=True), 150),
        "processes": (lambda: backend.processes(g), 500),
    }
    cost_rows = {kind: read_cost(fn, n) for kind, (fn, n) in costs.items()}
    marks = {mode: mark_cost_us(backend, gpus, mode) for mode in ("thread", "process")}
    backend.close()
    report(results, cost_rows, marks, what, args)
    return 0


def busy(
    rec: dict[str, list[Any]], costs: dict[str, tuple[float, float, float, float]]
) -> tuple[float, float, dict[str, float]]:
    """The sampler's CPU (fraction of a core) while it was on, the NVML wall time a second
    its reads took during its loops (counted reads x the mean wall time of one read
    alone, fraction of a second), and its reads a second by kind."""
    span = sum(rec["span"])
    per_s = {k: sum(r[k] for r in rec["reads"]) / span for k in COSTS}
    nvml = sum(per_s[k] * costs[k][3] * 1e-6 for k in COSTS)
    return sum(rec["cpu"]) / sum(rec["cpu_span"]), nvml, per_s


def report(
    results: dict[str, dict[str, list[Any]]],
    costs: dict[str, tuple[float, float, float, float]],
    marks: dict[str, float],
    what: str,
    args: argparse.Namespace,
) -> None:
    day = datetime.datetime.now().astimezone()
    n = min(len(rec["pairs"]) for rec in results.values())
    print(
        f"Sampler overhead: {what}; {platform.node()} ({os.cpu_count()} CPUs), "
        f"{day:%Y-%m-%d %H:%M %Z}; {n} rounds (of {args.rounds} asked, at most "
        f"{args.max_seconds:.0f} s), each one on/off pair of loops of every sampler in a "
        f"random order, {args.settle * 1e3:.0f}-{2 * args.settle * 1e3:.0f} ms (random) "
        "before each loop. Defaults: period "
        f"{DEFAULT_PERIOD_S * 1e3:.0f} ms ({HURRY_PERIOD_S * 1e3:.0f} ms only while a "
        "conditioning wait hurries it: none here), counters every "
        f"{DEFAULT_SLOW_PERIOD_S * 1e3:.0f} ms and energy every "
        f"{DEFAULT_ENERGY_PERIOD_S:.0f} s (only while regions are "
        "marked, where this gpuenv knows that), processes every "
        f"{DEFAULT_PROCESS_PERIOD_S * 1e3:.0f} ms; "
        f"GPUENV_READONLY={os.environ.get('GPUENV_READONLY', '')!r}.\n"
    )
    if n < 6:
        raise SystemExit(f"only {n} rounds ran: too few for an interval (raise --max-seconds)")
    print(
        "| sampler | ran as | loop median on / off (ms) | slowdown: Hodges-Lehmann | "
        "95% CI (Wilcoxon) | median of paired ratios | 95% CI (bootstrap) | "
        "start (ms, median) |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: |")
    busy_rows = []
    offs: list[float] = []
    for name, rec in results.items():
        ran = "/".join(sorted(set(rec["mode"])))
        on, off = [a for a, _ in rec["pairs"]], [b for _, b in rec["pairs"]]
        offs += off
        med = slowdowns([a / b for a, b in rec["pairs"]])
        slug = "_".join("".join(c if c.isalnum() else " " for c in name).split())
        runner.metric(f"{slug}_slowdown_pct", med["hl"], "%", slack=0.5)
        cpu, nvml, per_s = busy(rec, costs)
        runner.metric(f"{slug}_cpu_pct", 100 * cpu, "%", slack=0.1)
        busy_rows.append((name, ran, cpu, nvml, per_s))
        print(
            f"| {name} | {ran} | {1e3 * statistics.median(on):.2f} / "
            f"{1e3 * statistics.median(off):.2f} | {med['hl']:+.2f}% | "
            f"{med['hl_lo']:+.2f}% to {med['hl_hi']:+.2f}% | {med['median']:+.2f}% | "
            f"{med['median_lo']:+.2f}% to {med['median_hi']:+.2f}% | "
            f"{1e3 * statistics.median(rec['start']):.0f} |"
        )
    offs.sort()
    mid = statistics.median(offs)
    print(
        f"\nThe loop with no sampler on: p5 to p95 {100 * (offs[int(0.95 * len(offs))] - offs[int(0.05 * len(offs))]) / mid:.1f}% "  # noqa: E501
        f"of its median, min to max {100 * (offs[-1] - offs[0]) / mid:.0f}%.\n"
    )
    print(
        "| sampler | ran as | busy: its CPU (% of a core) | busy: its reads' NVML time "
        "(% of a second, at the costs below) | reads a second: cheap / counters / energy / "
        "processes |"
    )
    print("| --- | --- | ---: | ---: | --- |")
    for name, ran, cpu, nvml, per_s in busy_rows:
        print(
            f"| {name} | {ran} | {100 * cpu:.3f} | {100 * nvml:.3f} | "
            + " / ".join(f"{per_s[k]:.1f}" for k in COSTS)
            + " |"
        )
    under = []
    for name, rec in results.items():
        for kind, label in COSTS.items():
            n, wall, cpu = (sum(t[kind][i] for t in rec["read_times"]) for i in range(3))
            if n:
                under.append(
                    f"| {label} | {name} | {n:.0f} | {1e6 * wall / n:.1f} | "
                    f"{1e6 * cpu / n:.1f} | {costs[kind][3]:.1f} |"
                )
    if under:
        print(
            "\n| read, as a thread sampler made it during its loops | sampler | reads | "
            "mean us | CPU us | alone: mean us |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        print("\n".join(under))
    print("\n| one read (this thread, no loop running) | p50 us | p99 us | mean us | CPU us |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind, label in COSTS.items():
        p50, p99, cpu_us, mean_us = costs[kind]
        print(f"| {label} | {p50:.1f} | {p99:.1f} | {mean_us:.1f} | {cpu_us:.1f} |")
    for mode, us in marks.items():
        print(f"| sampler.mark() on the caller's thread ({mode}) | {us:.2f} | | | |")


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "sampler_overhead",
            __doc__,
            add_arguments,
            run,
            quick={"rounds": 60, "launches": 2000, "max_seconds": 30.0},
        )
    )
