#!/usr/bin/env python3
"""Does every warning point at something that moved the number, and does every number that
moved carry one? gpuenv.bench's default on ten kernels (benchmarks.session_wait's six: three
memory-bound, three heavy; and four under 20 us: a 64k sum, a 256k gelu, a 4k-row
index_select, a 1M add), each cold (after --idle s of rest), hot (right after the cold
call) and right after --load s of heavy 8192^3 bf16 matmuls. Each number is set against the
kernel's typical one, the median of its three: a cold call that met the cap is then the one
that moved, not the two that did not (against the cold number, an H200 run counted the MLP's
sound hot and after-load numbers as moves of 6% without a warning, and the cold call's own
power_cap warning as a warning on a number that did not move).

Counts (issue 45, "Every warning points at what moved the number"):
- warnings where the number did not move more than its CI or --moved (0.5%): goal 0;
- numbers that moved more than --loud (2%) with no warning: goal 0.

With --procs N, N processes measure at once, one per GPU (the concurrent case).

Read-only; needs torch and a GPU (about 4 minutes on an H200), or --sim (the simulated
H100, on virtual time: tests/test_effect.py counts the same).

    GPUENV_READONLY=1 python -m benchmarks.warnings_moved
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from benchmarks._kernels import GpuEnv, SimGpuEnv
from benchmarks.checkout import checkout_env, finish_within
from benchmarks.session_wait import state_kernels

HBM_HZ = 2619e6  # the simulated H100's memory clock: a read of N s is N * HBM_HZ cycles


def tiny_kernels(torch: Any) -> dict[str, Callable[[], Any]]:
    """Four kernels under 20 us on an H100/H200, set up (each called once)."""
    F = torch.nn.functional
    v64k = torch.randn(1 << 16, device="cuda")
    v256k = torch.randn(1 << 18, device="cuda", dtype=torch.bfloat16)
    table = torch.randn(1 << 16, 256, device="cuda")
    idx = torch.randint(0, 1 << 16, (4096,), device="cuda")
    a, b = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    out = {
        "sum64k": lambda: v64k.sum(),
        "gelu256k": lambda: F.gelu(v256k),
        "index_select4k": lambda: table.index_select(0, idx),
        "add1m": lambda: a + b,
    }
    for fn in out.values():
        fn()
    torch.cuda.synchronize()
    return out


def sim_kernels(backend: Any) -> dict[str, Callable[[], Any]]:
    """The simulated H100's stand-ins: reads of HBM (their time does not follow the SM
    clock) and matmuls (it does), four of them under 20 us."""
    from gpuenv import timing

    def read(seconds: float) -> Callable[[], float]:
        return lambda: backend.run_work(0, 0.0, mem_cycles=seconds * HBM_HZ, power_intensity=0.3)

    def mm(seconds: float, intensity: float = 1.0) -> Callable[[], float]:
        return timing.sim_kernel(backend, 0, seconds=seconds, power_intensity=intensity)

    return {
        "read12us": read(12.46e-6),
        "read8us": read(8e-6),
        "mm15us": mm(15e-6),
        "light18us": mm(18e-6, 0.3),
        "read300us": read(300e-6),
        "read1ms": read(1e-3),
        "mm200us": mm(200e-6),
        "mm1.4ms": mm(1.4e-3),
        "light50us": mm(50e-6, 0.3),
        "mm3ms": mm(3e-3),
    }


def count(rows: list[dict[str, Any]], quiet_rel: float, loud_rel: float) -> tuple[int, int]:
    """(warnings where the number moved no more than its CI or `quiet_rel`, numbers that
    moved more than `loud_rel` with no warning) over `measure`'s rows."""
    quiet = loud = 0
    for r in rows:
        moved = abs(r["median_s"] / r["typical_s"] - 1)
        room = max(quiet_rel, r["ci"])
        quiet += len(r["warned"]) if moved <= room else 0
        loud += moved > loud_rel and not r["warned"]
    return quiet, loud


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each kernel cold, hot and after load, in this process: a row per measurement."""
    import gpuenv
    from gpuenv import stats

    if args.sim:
        env: Any = SimGpuEnv()
        ks = sim_kernels(env.backend)
        bench = lambda fn: gpuenv.bench(fn, backend=env.backend, keep_trace=False)  # noqa: E731
    else:
        import torch

        heavy = state_kernels(torch)
        env = GpuEnv(torch, heavy["mm8192"])
        ks = {**tiny_kernels(torch), **heavy}
        bench = lambda fn: gpuenv.bench(fn, keep_trace=False)  # noqa: E731
    rows: list[dict[str, Any]] = []
    for name, fn in ks.items():
        env.idle(args.idle)
        cold = bench(fn)
        hot = bench(fn)
        env.load(args.load)
        after = bench(fn)
        typical = statistics.median(m.median_s for m in (cold, hot, after))
        for when, m in (("cold", cold), ("hot", hot), ("after load", after)):
            rows.append(
                {
                    "kernel": name,
                    "when": when,
                    "typical_s": typical,
                    "median_s": m.median_s,
                    "ci": stats.summarize(m.times_s).rel_ci,
                    "warned": [f.kind for f in m.findings if f.severity in ("warning", "error")],
                    "info": [f.kind for f in m.findings if f.severity == "info"],
                    "gpu": m.gpus[0] if m.gpus else None,
                }
            )
    return rows


def concurrent(args: argparse.Namespace, n: int) -> list[dict[str, Any]]:
    """`n` processes at once, one per GPU (CUDA_VISIBLE_DEVICES), each measuring every
    kernel: their rows, each marked with its process."""
    env = checkout_env(dict(os.environ, GPUENV_READONLY="1"))
    argv = [
        sys.executable,
        "-m",
        "benchmarks.warnings_moved",
        "--child",
        "--out",
        "-",
        "--idle",
        str(args.idle),
        "--load",
        str(args.load),
    ]
    procs = [
        subprocess.Popen(
            argv,
            env=dict(env, CUDA_VISIBLE_DEVICES=str(g)),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for g in range(n)
    ]
    rows = []
    for g, proc in enumerate(procs):
        done = finish_within(proc, 600)
        lines = [] if done is None else [x for x in done[0].splitlines() if x.startswith("CHILD ")]
        if not lines:
            print(f"(process {g} failed: {'timed out' if done is None else done[1][-1500:]})")
            continue
        rows += [dict(r, proc=g) for r in json.loads(lines[-1][6:])]
    return rows


def run(args: argparse.Namespace) -> int:
    if args.child:
        print("CHILD " + json.dumps(measure(args)))
        return 0
    n = max(1, args.procs)
    rows = measure(args) if n == 1 or args.sim else concurrent(args, n)
    if n > 1 and not args.sim:
        print(
            f"{n} processes at once, one per GPU (CUDA_VISIBLE_DEVICES), each measuring "
            "every kernel cold, hot and after its own load.\n"
        )
    print("| process | kernel | when | ms | moved % | CI +-% | warnings | info |")
    print("| ---: | --- | --- | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        print(
            f"| {r.get('proc', 0)} | {r['kernel']} | {r['when']} | {r['median_s'] * 1e3:.4f} | "
            f"{100 * (r['median_s'] / r['typical_s'] - 1):+.2f} | {100 * r['ci']:.2f} | "
            f"{', '.join(r['warned']) or '-'} | {', '.join(r['info']) or '-'} |"
        )
    quiet, loud = count(rows, args.moved, args.loud)
    kernels = len({r["kernel"] for r in rows})
    print()
    print(
        f"{len(rows)} measurements of {kernels} kernels; warnings where the number did not move "
        f"more than its CI or {args.moved:.1%}: {quiet} (goal 0); numbers that moved more "
        f"than {args.loud:.0%} with no warning: {loud} (goal 0)"
    )
    runner.metric("warnings where the number did not move", quiet, "", slack=0.5)
    runner.metric("moves over 2% without a warning", loud, "", slack=0.5)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--idle", type=float, default=3.0, help="rest before cold (s)")
    parser.add_argument(
        "--load", type=float, default=5.0, help="heavy load before 'after load' (s)"
    )
    parser.add_argument("--moved", type=float, default=0.005, help="a move, against the typical")
    parser.add_argument("--loud", type=float, default=0.02, help="a move that needs a warning")
    parser.add_argument("--procs", type=int, default=1, help="processes at once, one per GPU")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


if __name__ == "__main__":
    sys.exit(runner.main("warnings_moved", __doc__, add_arguments, run))
