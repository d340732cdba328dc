#!/usr/bin/env python3
"""Where gpuenv.bench's "open" phase goes on a real GPU (read-only): each piece that
_Place.open runs, timed alone a few times after the process is warm, then a cProfile of
whole gpuenv.bench calls on a 64k-row gather (the phase measured 0.26-0.42 s a call on an
H100, against do_bench's whole call of 0.11-0.13 s).

    GPUENV_READONLY=1 python3 scripts/probe_open.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import gpuenv
from gpuenv.backend import open_backend
from gpuenv.clocks.status import lock_status
from gpuenv.judge import read_facts
from gpuenv.telemetry import Sampler
from gpuenv.timing.cuda.events import cuda_device, nvml_index_of_cuda


def timed(name: str, fn: Callable[[], Any], n: int = 5) -> None:
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    med, top = 1e3 * statistics.median(walls), 1e3 * max(walls)
    print(f"{name:<34} median {med:8.2f} ms  max {top:8.2f} ms")


def main() -> None:
    table = torch.randn(1 << 16, 1024, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, 1 << 16, (1 << 16,), device="cuda")

    def gather() -> Any:
        return table[idx]

    gpuenv.bench(gather)  # warm: CUDA, the memo, imports
    backend = open_backend()

    def backend_cycle() -> None:
        open_backend().close()

    def sampler_cycle() -> None:
        s = Sampler(backend, [0])
        s.start()
        s.stop()

    dev = cuda_device("events", flush_l2=True, saturate=True, calls_per_rep=1)
    timed("open_backend + close", backend_cycle)
    timed("lock_status", lambda: lock_status(backend, 0))
    timed("read_facts", lambda: read_facts(backend, [0]))
    timed("device_info", lambda: backend.device_info(0))
    timed("cuda_device (events, flush)", lambda: cuda_device("events", flush_l2=True))
    timed("nvml_index_of_cuda", lambda: nvml_index_of_cuda(backend, dev.device))
    timed("Sampler start + stop", sampler_cycle)
    timed("gpuenv.bench(gather), whole", lambda: gpuenv.bench(gather), n=3)
    m = gpuenv.bench(gather)
    print("m.wall:", {p: round(s, 4) for p, s in m.wall.phases} if m.wall else None)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        gpuenv.bench(gather)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
    print(out.getvalue())
    backend.close()
    after_load(gather)


def after_load(gather: Callable[[], Any]) -> None:
    """As benchmarks/session_wait: inside a stable() session, 7 s of heavy matmuls, then
    gpuenv.bench (profiled), twice; then the same without the session."""
    from gpuenv.telemetry import process

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def load(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(8):
                a @ a
            torch.cuda.synchronize()

    def one(label: str) -> None:
        load(7.0)
        pool = [(p.pid, p.users) for p in process._pool.values()]
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        m = gpuenv.bench(gather)
        prof.disable()
        wall = time.perf_counter() - t0
        phases = {p: round(s, 4) for p, s in m.wall.phases} if m.wall else None
        print(f"\n{label}: {wall:.3f} s; sampler processes before {pool}; m.wall {phases}")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())

    with gpuenv.stable():
        one("in a session, after 7 s of load")
        one("in a session, after 7 s of load, again")
    one("no session, after 7 s of load")


if __name__ == "__main__":
    main()
