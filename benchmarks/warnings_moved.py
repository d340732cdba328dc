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

Read-only; needs torch and a GPU (about 4 minutes on an H200), or --sim (the simulated
H100, on virtual time: tests/test_effect.py counts the same).

    GPUENV_READONLY=1 python -m benchmarks.warnings_moved
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from benchmarks._kernels import GpuEnv, SimGpuEnv
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


def count(
    rows: list[tuple[str, str, float, Any]], quiet_rel: float, loud_rel: float
) -> tuple[int, int]:
    """(warnings where the number moved no more than its CI or `quiet_rel`, numbers that
    moved more than `loud_rel` with no warning) over rows of (kernel, when, typical s, m)."""
    from gpuenv import stats

    quiet = loud = 0
    for _, _, typical_s, m in rows:
        moved = abs(m.median_s / typical_s - 1)
        warned = [f for f in m.findings if f.severity in ("warning", "error")]
        room = max(quiet_rel, stats.summarize(m.times_s).rel_ci)
        quiet += len(warned) if moved <= room else 0
        loud += moved > loud_rel and not warned
    return quiet, loud


def run(args: argparse.Namespace) -> int:
    import gpuenv

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
    print("| kernel | when | ms | moved % | CI +-% | warnings | info |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- |")
    rows: list[tuple[str, str, float, Any]] = []
    for name, fn in ks.items():
        env.idle(args.idle)
        cold = bench(fn)
        hot = bench(fn)
        env.load(args.load)
        after = bench(fn)
        typical = statistics.median(m.median_s for m in (cold, hot, after))
        for when, m in (("cold", cold), ("hot", hot), ("after load", after)):
            rows.append((name, when, typical, m))
            warned = [f.kind for f in m.findings if f.severity in ("warning", "error")]
            info = [f.kind for f in m.findings if f.severity == "info"]
            ci = m.extra.get("rel_ci")
            print(
                f"| {name} | {when} | {m.median_s * 1e3:.4f} | "
                f"{100 * (m.median_s / typical - 1):+.2f} | "
                f"{'-' if ci is None else f'{100 * ci:.2f}'} | "
                f"{', '.join(warned) or '-'} | {', '.join(info) or '-'} |"
            )
    quiet, loud = count(rows, args.moved, args.loud)
    print()
    print(
        f"{len(rows)} measurements of {len(ks)} kernels; warnings where the number did not move "
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


if __name__ == "__main__":
    sys.exit(runner.main("warnings_moved", __doc__, add_arguments, run))
