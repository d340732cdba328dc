"""torch and its profiler: torch imported when a CUDA device is made (`_torch`, a
ConfigError saying how to get it where it is missing), a torch.profiler session of CUDA
activity, its trace, each rep's device time in it (what CudaProfiler reports), and
`cupti_median_s`, the reference a tiny kernel's number is checked against."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from gpuenv import stats
from gpuenv.errors import ConfigError, GpuenvError

PROFILER_BATCH = 10  # profiled reps per torch.profiler session
PROFILER_MAX_REPS = 200
ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")  # what a rep's device time sums


# Where there is no GPU: the simulated one, said for both a command and a Python caller
# (a `--sim` alone means nothing to a script that called gpuenv.bench)
NO_GPU = (
    "with no GPU, time the simulated one: GPUENV_BACKEND=sim (the command line's --sim), or "
    "backend=gpuenv.open_backend('sim') in Python"
)


def _torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise ConfigError(
            "timing a CUDA function needs PyTorch", hint=f"pip install torch; {NO_GPU}"
        ) from err
    if not torch.cuda.is_available():
        raise ConfigError(
            "torch sees no CUDA GPU", hint=f"check nvidia-smi and CUDA_VISIBLE_DEVICES; {NO_GPU}"
        )
    return torch


@contextlib.contextmanager
def _profiling() -> Iterator[Any]:
    """A profiler session of CUDA activity only (CUPTI, through torch's kineto): what
    `torch.profiler.profile(activities=[ProfilerActivity.CUDA])` starts, without its
    wrapper, whose first start imports torch._inductor and with it torch._dynamo (it asks
    `hasattr(torch, "_inductor")`): 5-6 s of a process's first measurement on the H200,
    3.3 s on this project's CPU runner, where the session itself takes milliseconds
    (benchmarks/one_meaning.py --part startup). Warnings torch raises as it starts and
    stops concern gpuenv's use of the profiler, and under `-W error` would end the
    measurement: silenced there alone, not fn's own."""
    from torch.autograd.profiler import profile

    prof: Any = profile(use_cpu=False, use_device="cuda", use_kineto=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof.__enter__()
    try:
        yield prof
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof.__exit__(None, None, None)


def _trace_events(prof: Any) -> list[dict[str, Any]]:
    """GPU activity from a profiler session, through its Chrome trace (stable across torch
    versions, unlike the in-memory event API)."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="gpuenv-prof-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    finally:
        os.unlink(path)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ACTIVITY]


def _profiled_rep_times(events: list[dict[str, Any]], n: int) -> tuple[list[float], list[float]]:
    """Per-rep device time (s) and the fn-marker spin duration (s) from trace events: in
    device order, spins alternate (before flush, before fn); fn's activity lies between a
    before-fn spin and the next before-flush spin."""
    events = sorted(events, key=lambda e: float(e["ts"]))
    spins = [i for i, e in enumerate(events) if "spin_kernel" in str(e.get("name", ""))]
    if len(spins) != 2 * n:
        raise GpuenvError(
            f"the profiler trace has {len(spins)} marker kernels where {2 * n} were launched",
            hint="does fn call torch.cuda._sleep itself? use mode='events' for it",
        )
    times, spin_s = [], []
    for r in range(n):
        start = spins[2 * r + 1]
        stop = spins[2 * r + 2] if 2 * r + 2 < len(spins) else len(events)
        total_us = sum(float(e.get("dur", 0.0)) for e in events[start + 1 : stop])
        times.append(total_us / 1e6)
        spin_s.append(float(events[start].get("dur", 0.0)) / 1e6)
    return times, spin_s


def cupti_median_s(
    fn: Callable[[], Any], calls: int = 200, warmup: int = 30, *, flush_l2: bool = False
) -> float:
    """The reference a number is checked against: the median device time of one call of
    fn (its kernels, copies and memsets summed) over `calls` calls under torch.profiler
    (CUPTI), all queued behind a spin so the GPU never idles between them (launched one by
    one from a launch-bound loop, the same kernels read 7-14% longer each on the H100).
    `flush_l2=False`: back to back, L2 warm; True: each call after a flush of twice the L2
    and a short spin, as bench() measures by default. No sync between calls: the harness's
    own schedule of reps takes no part."""
    torch = _torch()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if flush_l2:
        l2 = int(getattr(torch.cuda.get_device_properties(None), "L2_cache_size", 0) or 0)
        flush = torch.empty(max(2 * l2, 8 << 20) // 4, dtype=torch.int32, device="cuda")
        with _profiling() as prof:
            torch.cuda._sleep(int(20e-3 * 2e9))
            for _ in range(calls):
                torch.cuda._sleep(1000)  # marker: the flush follows
                flush.zero_()
                torch.cuda._sleep(20_000)  # marker: fn follows (covers its launch)
                fn()
            torch.cuda.synchronize()
        events = sorted(_trace_events(prof), key=lambda e: float(e["ts"]))
        lead = next(i for i, e in enumerate(events) if "spin_kernel" in str(e.get("name")))
        return stats.median(_profiled_rep_times(events[:lead] + events[lead + 1 :], calls)[0])
    with _profiling() as prof:
        torch.cuda._sleep(int(20e-3 * 2e9))  # ~10-20 ms: every call is queued before it ends
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in _trace_events(prof) if "spin_kernel" not in str(e.get("name"))),
        key=lambda e: float(e["ts"]),
    )
    per_call, extra = divmod(len(events), calls)
    if per_call == 0 or extra:
        raise GpuenvError(
            f"{len(events)} GPU activities in {calls} calls: fn does not launch "
            "the same work each call"
        )
    durations = [float(e.get("dur", 0.0)) for e in events]
    return (
        stats.median([sum(durations[i : i + per_call]) for i in range(0, len(durations), per_call)])
        / 1e6
    )
