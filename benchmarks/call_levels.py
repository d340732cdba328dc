"""Do a few-us kernel's calls sit at two levels, and is it the kernel or the timing?

On an H200 (issue 43, read-only), gpuenv.rank's calls of cuBLAS's 1024^3 fp16 mm
(10 ms of reps each, CUDA events around each rep) read 8.38 us or 9.18 us, one level for
a few calls at a time. Two callables of the same work read different levels in the same
rounds. CUPTI's device time of the same mm read 6.0 us. A ranking of about a second then
sees whichever level its calls met: here one round stopped the mm 8.7% behind a Triton
template whose median across passes it beat.

This times, call after call and interleaved, each kernel as a ranking's call times it
(gpuenv.timing.rank.RANK_CALL: 10 ms of flushed reps, no clock probe) with CUDA events
("events") and with CUPTI ("profiler": the kernels' device time, no launch or event in
it). Kernels: the 1024^3 fp16 mm, the same mm through a second callable, a 256k-element
fp16 gelu, and the 4096^3 fp16 mm (~190 us) as a control. Per kernel and method: the
calls' medians (min, median, max), their spread, and the share of calls more than 3%
above the lowest. Levels in events and not in the profiler say the timing makes them;
levels in both, the kernel. Read-only (GPUENV_READONLY=1); about 1 minute on an H200.

    GPUENV_READONLY=1 python -m benchmarks.call_levels [--calls 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import runner

METHODS = ("events", "profiler")
UPPER = 0.03  # a call this far above the kernel's lowest is at the upper level


def kernels(torch: Any) -> dict[str, Any]:
    """name -> one call's work (CUDA)."""
    half = torch.float16
    a, b = (torch.randn(1024, 1024, device="cuda", dtype=half) for _ in range(2))
    c = torch.empty(1024, 1024, device="cuda", dtype=half)
    a4, b4 = (torch.randn(4096, 4096, device="cuda", dtype=half) for _ in range(2))
    x = torch.randn(256 * 1024, device="cuda", dtype=half)
    gelu = torch.nn.functional.gelu
    return {
        "mm 1024^3 fp16": lambda: torch.mm(a, b, out=c),
        "mm 1024^3 fp16, another callable": lambda: torch.mm(a, b, out=c),
        "gelu 256k fp16": lambda: gelu(x),
        "mm 4096^3 fp16": lambda: a4 @ b4,
    }


def summarize(times_s: Sequence[float]) -> dict[str, float]:
    """One kernel and method's call medians: min, median, max, spread (max / min - 1) and
    the share of calls more than UPPER above the lowest."""
    lo = min(times_s)
    return {
        "min_s": lo,
        "median_s": statistics.median(times_s),
        "max_s": max(times_s),
        "spread": max(times_s) / lo - 1,
        "upper_share": sum(t > lo * (1 + UPPER) for t in times_s) / len(times_s),
    }


def table(calls: dict[tuple[str, str], list[float]]) -> list[str]:
    """Markdown: per kernel and method, the calls and their levels."""
    lines = [
        "| kernel | method | calls | min | median | max | spread | calls > 3% above the min |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (kernel, method), times in calls.items():
        s = summarize(times)
        lines.append(
            f"| {kernel} | {method} | {len(times)} | {s['min_s'] * 1e6:.2f} us "
            f"| {s['median_s'] * 1e6:.2f} us | {s['max_s'] * 1e6:.2f} us | {s['spread']:.1%} "
            f"| {s['upper_share']:.0%} |"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=30, help="calls per kernel and method")


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print("the levels are a real GPU's: --sim has nothing to measure", file=sys.stderr)
        return 2
    import torch

    import gpuenv
    from gpuenv.timing.rank import RANK_CALL

    ks = kernels(torch)
    calls: dict[tuple[str, str], list[float]] = {(k, m): [] for k in ks for m in METHODS}
    for i in range(args.calls):
        for method in METHODS:
            names = list(ks)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                m = gpuenv.bench(ks[name], RANK_CALL, name=name, mode=method, wait_power=False)
                calls[name, method].append(float(m.median_s))
    for line in table(calls):
        print(line)
    print()
    for (kernel, method), times in calls.items():
        s = summarize(times)
        runner.metric(f"{kernel}, {method}: spread of the calls", 100 * s["spread"], "%", slack=2)
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("call_levels", __doc__, add_arguments, run, quick={"calls": 5}))
