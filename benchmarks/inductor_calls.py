"""What a call of Inductor's other benchmarking costs under `patch_inductor(rank=True)`.

After a max-autotune selection Inductor times more: the epilogue-fusion check and the
tuning of a pointwise kernel, each call through `benchmark_gpu`, which the switch makes
gpuenv's do_bench drop-in with a ranking's call's limits (10 ms of reps, up to 50 ms of
warmup). On an H200 those calls took ~40 ms each against plain Inductor's ~20 ms
(inductor_rank's "other benchmarking" over its calls). A ranking's calls judge with the
reason-counter reads already in (`wait_counters=False`); the switch's other calls now do
too (41 to 28 ms a call on an H200). And a drop-in call's check for a ready GPU counts the
samples since its first call and estimate (`BenchConfig.burst_lead_s`), and the one read
just before them (the older of the two it judges), not only two taken after bench
opened: on an H200 the sampler reads every ~4 ms while bench marks, and a call is ~6 ms
old at its check. Per variant, in alternating blocks of calls back to back: the switch's
own `benchmark_gpu`, the same call judged after waiting for the counter read, and the
switch's call with its check as before (samples since bench opened alone); each call's
wall, its check for a ready GPU and its judging, medians; asked warmup=25, rep=100 as
Inductor asks. With `--sim`, a 17 us kernel (mm+relu 4096x4096x128's best template) on
the simulated H200 in real time under a sampler process, read as a real GPU is; without,
on the process's GPU, read-only, relu(a @ b) of 4096x4096 by 4096x128 fp16 (CUDA torch).

    python -m benchmarks.inductor_calls --sim [--calls 30]
    GPUENV_READONLY=1 python -m benchmarks.inductor_calls [--calls 30]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import runner

KERNEL_S = 17e-6  # the best Triton template of mm+relu 4096x4096x128 on the H200
BLOCK = 10  # calls of one variant back to back
SIM = "the simulated H200 under a sampler process (real time), a 17 us kernel"
PHASES = ("condition", "judge")  # a call's phases tabled: its check for a ready GPU, judging


def run(args: argparse.Namespace) -> int:
    from gpuenv.integrations import inductor
    from gpuenv.integrations import triton as gtriton

    if args.calls < 1:
        raise SystemExit(f"--calls {args.calls}: at least 1")
    kernel, defaults = _sim_kernel() if args.sim else _gpu_kernel()
    caps = inductor._caps(True)
    switch = inductor._benchmark_gpu(defaults, True)  # the switch's benchmark_gpu

    def waited() -> Any:  # the same call, judged after the counter read (as before)
        warmup, rep = min(25.0, caps["warmup"]), min(100.0, caps["rep"])
        return gtriton.do_bench(kernel, warmup, rep, return_mode="median", **defaults)

    def unled() -> Any:  # the switch's call, its check for a ready GPU as before
        with _old_check():
            return switch(None, kernel, warmup=25, rep=100)

    variants = {
        "the switch's call (no wait for the counter read)": lambda: switch(
            None, kernel, warmup=25, rep=100
        ),
        "the same call, waiting for the counter read": waited,
        "the switch's call, its check as before (samples since bench opened)": unled,
    }
    switch(None, kernel)  # not counted: the sampler process's start
    where = SIM if args.sim else _gpu()
    report(*time_calls(variants, args.calls), where)
    return 0


def _sim_kernel() -> tuple[Callable[[], Any], dict[str, Any]]:
    """The 17 us kernel on the simulated H200, read as a real GPU is (a sampler process)."""
    from gpuenv.backend import open_backend
    from gpuenv.backend.sim import SimBackend

    os.environ["GPUENV_SAMPLER"] = "process"  # read as a real GPU is (runner: a child's env)
    os.environ.setdefault("GPUENV_SIM_PROFILE", "h200")
    be = open_backend("sim")
    assert isinstance(be, SimBackend)
    be.open_context(0)
    hz = be.clock_limits(0).max_sm_mhz * 1e6

    def kernel() -> Any:
        return be.run_work(0, KERNEL_S * hz, power_intensity=0.5)

    return kernel, {"backend": be}


def _gpu_kernel() -> tuple[Callable[[], Any], dict[str, Any]]:
    """The template's own work on the process's GPU: relu(a @ b), 4096x4096 by 4096x128."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: pass --sim for the simulated H200")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 128, device="cuda", dtype=torch.float16)
    return (lambda: torch.relu(a @ b)), {}


def _gpu() -> str:
    import torch

    return (
        f"the {torch.cuda.get_device_name()}, relu(a @ b) of 4096x4096 by 4096x128 fp16\n(torch's "
        "matmul and relu kernels)"
    )


@contextlib.contextmanager
def _old_check() -> Iterator[None]:
    """The drop-in's check for a ready GPU as it was before 2026-11-29: only samples taken
    after bench opened count, not those of the drop-in's first call and estimate (no lead,
    `burst_lead_s` 0) nor the one read just before (no lookback)."""
    from gpuenv.integrations.triton import bench as dropin
    from gpuenv.timing import harness

    own, interval = dropin._bench, harness.READY_LOOKBACK_S

    def bench(*args: Any, **settings: Any) -> Any:
        return own(*args, **{**settings, "burst_lead_s": 0.0})

    dropin._bench, harness.READY_LOOKBACK_S = bench, 0.0
    try:
        yield
    finally:
        dropin._bench, harness.READY_LOOKBACK_S = own, interval


def time_calls(
    variants: dict[str, Callable[[], Any]], calls: int
) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """Each variant's calls' walls, and their PHASES (s), in blocks of BLOCK calls back to
    back, as Inductor makes them (one kind of call: alternated call by call, each would
    find the other's counter read a few ms old), the blocks alternating."""
    from gpuenv.integrations import triton as gtriton

    walls: dict[str, list[float]] = {v: [] for v in variants}
    parts: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PHASES} for v in variants}
    for _ in range(-(-calls // BLOCK)):
        for name, call in variants.items():
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                call()
                walls[name].append(time.perf_counter() - t0)
                m = gtriton.last_measurement()
                phases = dict(m.wall.phases) if m is not None and m.wall is not None else {}
                for p in PHASES:
                    parts[name][p].append(phases.get(p, float("nan")))
    return walls, parts


def report(
    walls: dict[str, list[float]], parts: dict[str, dict[str, list[float]]], gpu: str
) -> None:
    n = len(next(iter(walls.values())))
    print(f"{n} calls a variant in blocks of {BLOCK} back to back, the blocks alternating, on")
    print(f"{gpu};")
    print("asked warmup=25, rep=100 (ms):")
    print()
    print("| call | wall (median) | wall (quartiles) | its check for a ready GPU | its judging |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in walls:
        q = statistics.quantiles(walls[name], n=4) if len(walls[name]) > 1 else walls[name] * 3
        check, judge = (statistics.median(parts[name][p]) * 1e3 for p in PHASES)
        print(
            f"| {name} | {statistics.median(walls[name]) * 1e3:.1f} ms "
            f"| {q[0] * 1e3:.1f}-{q[-1] * 1e3:.1f} ms | {check:.1f} ms | {judge:.1f} ms |"
        )
    mine, old, unled = (statistics.median(w) for w in walls.values())
    print()
    print(f"The switch's call took {mine / old:.2f}x the waiting one's wall, {mine / unled:.2f}x")
    print("the one whose check for a ready GPU counted samples since bench opened alone.")
    runner.metric("switch call wall", mine * 1e3, "ms", slack=3.0)
    runner.metric("waited call wall", old * 1e3, "ms", slack=3.0)
    runner.metric("switch call wall, the check as before", unled * 1e3, "ms", slack=3.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=30, help="calls a variant (30)")


if __name__ == "__main__":
    sys.exit(runner.main("inductor_calls", __doc__, add_arguments, run, quick={"calls": 5}))
