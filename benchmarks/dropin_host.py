#!/usr/bin/env python3
"""Host (CPU) time per do_bench drop-in call: what gpuenv spends on top of running the kernel.

On a real GPU a ~7 us relu (the CPU time then includes torch's launches and the spin of
each sync: read the wall time there, beside triton's, timed the same way after gpuenv's
calls); with --sim the simulated H100 on virtual time, where every CPU second is host
overhead.

    python -m benchmarks.dropin_host --sim                  # 20 calls: dropin_host-sim.json
    python -m benchmarks.dropin_host --sim --profile 25     # + cProfile's top 25 (cumulative)
    GPUENV_READONLY=1 python -m benchmarks.dropin_host --calls 5 --profile 25   # the GPU
    python -m benchmarks.dropin_host --sim --graph          # do_bench_cudagraph instead

Prints CPU and wall seconds per call (time.process_time, perf_counter), the CPU time in
Sampler.windows (the reps' telemetry summaries), and where the last call's time went
(warmup, measuring, the burst check's wait, the drop-in's plan).
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from gpuenv.integrations import triton as gt


def sim_setup(kernel_s: float) -> tuple[Callable[[], Any], dict[str, Any]]:
    from gpuenv import timing
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    be = SimBackend(clock=VirtualClock())
    be.open_context(0)
    be.idle(10.0)
    return timing.sim_kernel(be, 0, seconds=kernel_s, power_intensity=0.2), {"backend": be}


def gpu_setup() -> tuple[Callable[[], Any], dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    x = torch.randn(1 << 20, device="cuda")
    fn = lambda: F.relu(x)  # noqa: E731  ~7 us on an H100
    fn()
    torch.cuda.synchronize()
    return fn, {}


def _triton_wall(fn: Callable[[], Any], graph: bool, calls: int) -> float:
    """triton's own do_bench(_cudagraph) on the same kernel: its table row, and its wall
    time per call (nan without triton)."""
    try:
        import torch
        import triton.testing as tt
    except ImportError as err:
        print(f"| triton | not importable ({err}) | | | |")
        return math.nan

    def theirs() -> Any:
        if not graph:
            return tt.do_bench(fn)
        with torch.cuda.stream(torch.cuda.Stream()):
            return tt.do_bench_cudagraph(fn)

    theirs()
    wall = []
    for _ in range(calls):
        w0 = time.perf_counter()
        theirs()
        wall.append(time.perf_counter() - w0)
    print(
        f"| triton {'do_bench_cudagraph' if graph else 'do_bench'} | | | "
        f"{statistics.mean(wall) * 1e3:.1f} ms | |"
    )
    return statistics.mean(wall)


def _time_windows() -> list[float]:
    """Count the CPU time spent in Sampler.windows (the reps' telemetry summaries)."""
    from gpuenv.telemetry import Sampler

    spent = [0.0]
    inner = Sampler.windows

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        try:
            return inner(self, *args, **kwargs)
        finally:
            spent[0] += time.process_time() - c0

    Sampler.windows = timed  # type: ignore[method-assign]
    return spent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--graph", action="store_true", help="do_bench_cudagraph")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--kernel-us", type=float, default=7.0, help="the sim kernel's time")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print cProfile's top N entries by cumulative time",
    )


def run(args: argparse.Namespace) -> int:
    args.gpu = not args.sim
    fn, kw = gpu_setup() if args.gpu else sim_setup(args.kernel_us * 1e-6)
    bench = gt.do_bench_cudagraph if args.graph else gt.do_bench
    bench(fn, **kw)  # start-up (NVML, the flush buffer, imports): not counted
    in_windows = _time_windows()
    prof = cProfile.Profile() if args.profile else None
    cpu, wall = [], []
    for _ in range(args.calls):
        c0, w0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        bench(fn, **kw)
        if prof is not None:
            prof.disable()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    m = gt.last_measurement()
    where = "the GPU" if args.gpu else f"simulated H100, {args.kernel_us:g} us kernel"
    print(f"{args.calls} calls on {where}{' (cProfile on: slower)' if prof else ''}:\n")
    print(
        "| call | reps in the last | CPU per call (median) | wall per call | of which the reps' "
        "windows (CPU) |\n| --- | ---: | ---: | ---: | ---: |"
    )
    print(
        f"| gpuenv {'do_bench_cudagraph' if args.graph else 'do_bench'} | {len(m.times_s)} "
        f"| {statistics.mean(cpu) * 1e3:.1f} ms ({statistics.median(cpu) * 1e3:.1f}) "
        f"| {statistics.mean(wall) * 1e3:.1f} ms | {in_windows[0] / args.calls * 1e3:.1f} ms |"
    )
    if args.gpu:  # wall against triton's, timed the same way (the GPU's CPU time spins)
        ratio = statistics.mean(wall) / _triton_wall(fn, args.graph, args.calls)
        runner.metric("wall_vs_triton", ratio, "x", slack=0.1)
    x = m.extra
    print(
        "\nthe last call's parts:",
        {
            k: x.get(k)
            for k in (
                "warmup_reps",
                "warmup_s",
                "warmup_steady",
                "measure_s",
                "burst_first_wait_s",
                "stop_reason",
                "dropin",
            )
        },
    )
    runner.metric("cpu_per_call_ms", statistics.mean(cpu) * 1e3, "ms", slack=5.0)
    runner.metric("wall_per_call_ms", statistics.mean(wall) * 1e3, "ms", slack=5.0)
    if prof is not None:  # its lines as printed, in the report's text
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("dropin_host", __doc__, add_arguments, run, quick={"calls": 5}))
