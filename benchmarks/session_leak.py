#!/usr/bin/env python3
"""Does conditioning state leak? Each kernel measured alone (`gpuenv.bench`, the process's
conditioning memory forgotten first, and again after it), then in a first `stable()`
session, in a second session, and alone again after them: what one session learned
(warmups, state references, the cap's onset, temperature slopes) must not change another's
number, nor a bench's after it. Each measurement begins on a GPU rested --idle s.

Goal (the "A shared node" issue): each number within 0.3% of the kernel's number alone,
and every first call of a session, or of a bench after one, begins as a fresh one does
(its warmup not "known"). Read-only.

    GPUENV_READONLY=1 python -m benchmarks.session_leak
    python -m benchmarks.session_leak --sim
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner

STEPS = ("alone", "session 1", "session 2", "alone after")


def _kernels(sim: bool) -> tuple[dict[str, Callable[[], Any]], Callable[[float], None], Any]:
    """Kernels on the GPU, a rest of so many seconds, and the backend (None: the default)."""
    if sim:
        from benchmarks._kernels import SimGpuEnv
        from gpuenv import timing

        env = SimGpuEnv()
        be = env.backend
        return (
            {
                "heavy 1.4 ms": timing.sim_kernel(be, 0, seconds=1.4e-3, power_intensity=1.0),
                "memory-bound 0.3 ms": timing.sim_kernel(
                    be, 0, seconds=0.3e-3, power_intensity=0.5
                ),
                "light 20 us": timing.sim_kernel(be, 0, seconds=20e-6, power_intensity=0.3),
            },
            env.idle,
            be,
        )
    import torch

    from benchmarks._kernels import GpuEnv, kernels

    ks = kernels(torch)
    gpu = GpuEnv(torch, ks["mm8192"])
    keep = ("mm4096", "softmax", "layernorm", "conv", "mm512", "relu1m")
    return {k: ks[k] for k in keep}, gpu.idle, None


def run(args: argparse.Namespace) -> int:
    import gpuenv
    from gpuenv.conditioning import process_memory

    ks, idle, backend = _kernels(args.sim)
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for name, fn in ks.items():
        process_memory().forget()
        got: dict[str, Any] = {}
        idle(args.idle)
        got["alone"] = gpuenv.bench(fn, backend=backend, keep_trace=False)
        process_memory().forget()  # what the bench alone learned: a bench after the sessions
        # that began known would have learned it from them
        for step in ("session 1", "session 2"):
            idle(args.idle)
            with gpuenv.stable(backend=backend) as env:
                got[step] = env.bench(fn, keep_trace=False)
        idle(args.idle)
        got["alone after"] = gpuenv.bench(fn, backend=backend, keep_trace=False)
        rows[name] = got
    print("| kernel | " + " | ".join(f"{s} ms" for s in STEPS) + " | most off alone | known |")
    print("| --- | " + " | ".join("---:" for _ in STEPS) + " | ---: | --- |")
    worst, known = 0.0, 0
    for name, got in rows.items():
        ref = got["alone"].median_s
        off = max(abs(got[s].median_s / ref - 1) for s in STEPS[1:]) * 100
        worst = max(worst, off)
        flags = [bool(got[s].warmup and got[s].warmup.known) for s in STEPS]
        known += sum(flags)
        began_known = ", ".join(s for s, k in zip(STEPS, flags, strict=True) if k) or "-"
        print(
            f"| {name} | "
            + " | ".join(f"{got[s].median_s * 1e3:.4f}" for s in STEPS)
            + f" | {off:.2f}% | {began_known} |"
        )
    print()
    print(
        f"Most off alone: {worst:.2f}% (goal 0.3%); first calls that began as known: {known} "
        f"(goal 0); {time.perf_counter() - t0:.0f} s in all"
    )
    runner.metric("most off alone", worst, "%", slack=0.3)
    runner.metric("first calls begun as known", known, "", slack=0.5)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--idle", type=float, default=3.0, help="rest before each measurement (s)")


if __name__ == "__main__":
    sys.exit(runner.main("session_leak", __doc__, add_arguments, run, quick={"idle": 1.0}))
