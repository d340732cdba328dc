#!/usr/bin/env python3
"""Does every warning point at something that moved the number? gpuenv.bench's default on
six kernels (benchmarks.session_wait's: three memory-bound, three heavy), cold (after --idle
s of rest) and hot (right after --load s of heavy 8192^3 bf16 matmuls): each warning
finding, and whether the number moved, hot against cold, by more than --moved (0.5%).

Goal (the "One number, one meaning" issue, item 3): warnings where the number did not move
= 0. Read-only; needs torch and a GPU.

    GPUENV_READONLY=1 python -m benchmarks.warnings_moved
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import runner
from benchmarks._kernels import GpuEnv
from benchmarks.session_wait import state_kernels


def run(args: argparse.Namespace) -> int:
    import torch

    import gpuenv

    ks = state_kernels(torch)
    gpu = GpuEnv(torch, ks["mm8192"])
    print("| kernel | cold ms | hot ms | moved % | warnings cold | warnings hot |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    unmoved_warnings = total_warnings = 0
    for name, fn in ks.items():
        gpu.idle(args.idle)
        cold = gpuenv.bench(fn)
        gpu.load(args.load)
        hot = gpuenv.bench(fn)
        moved = abs(hot.median_s / cold.median_s - 1) * 100
        warned = [
            [f.kind for f in m.findings if f.severity in ("warning", "error")] for m in (cold, hot)
        ]
        total_warnings += sum(map(len, warned))
        if moved <= args.moved * 100:
            unmoved_warnings += sum(map(len, warned))
        print(
            f"| {name} | {cold.median_s * 1e3:.4f} | {hot.median_s * 1e3:.4f} | {moved:.2f} | "
            f"{', '.join(warned[0]) or '-'} | {', '.join(warned[1]) or '-'} |"
        )
    print()
    print(
        f"{total_warnings} warning(s) in {2 * len(ks)} measurements; where the number did not "
        f"move more than {args.moved:.1%}: {unmoved_warnings} (goal 0)"
    )
    runner.metric("warnings where the number did not move", unmoved_warnings, "", slack=0.5)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--idle", type=float, default=3.0, help="rest before cold (s)")
    parser.add_argument("--load", type=float, default=7.0, help="heavy load before hot (s)")
    parser.add_argument("--moved", type=float, default=0.005, help="a move, hot vs cold")


if __name__ == "__main__":
    sys.exit(runner.main("warnings_moved", __doc__, add_arguments, run))
