"""What `gpuenv check` runs on a GPU, and how GPUs run at once.

On a real GPU the kernels are torch's (imported through gpuenv.timing, the one torch
importer): an 8192^3 bf16 matmul (compute-bound, draws the power cap), a 512 MiB
device-to-device copy (memory-bound) and an add on 1k floats (tiny: launch-bound),
timed with CUDA events on the CUDA device whose UUID is the GPU's. On the simulated GPU
they are its own work at the same shapes: heavy at full power, memory cycles at low
power, a few microseconds. "All at once" runs one thread per GPU on a real node; on the
simulator, whose work advances one shared clock, every GPU gets a full background load
while each in turn runs its kernels.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuenv import timing
from gpuenv.backend import Backend

KERNELS = ("heavy", "copy", "tiny")
WHAT = {
    "heavy": "8192^3 bf16 matmul",
    "copy": "512 MiB copy",
    "tiny": "add on 1k floats",
}
COPY_BYTES = 512 * 2**20
# the simulated heavy kernel: this long at the GPU's own top clock (an H100's 8192^3 bf16
# matmul, 1.37 ms at 1980 MHz; on another model the same cycles at its clock)
SIM_HEAVY_S = 1.4e-3
SIM_TINY_S = 4e-6


@dataclass
class GpuKernels:
    """One GPU's kernels and the device that times them."""

    gpu: int
    device: timing.Device
    kernels: dict[str, Callable[[], Any]]


def kernels_for(backend: Backend, gpu: int) -> GpuKernels:
    """The kernels of `gpu`: the simulator's work, or torch's on the CUDA device with its
    UUID (ConfigError when torch cannot see it)."""
    if backend.workload is not None:
        return _sim_kernels(backend, gpu)
    from gpuenv.clocks.calibration import reference_load

    heavy, _, ordinal = reference_load(backend, gpu)
    torch = timing._torch()
    dev = torch.device("cuda", ordinal)
    src = torch.empty(COPY_BYTES // 4, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    small = torch.zeros(1024, device=dev)
    # saturate: a spin before each rep keeps launch latency out of the tiny kernel's time
    device = timing.CudaEvents(flush_l2=False, saturate=True, device=ordinal)
    return GpuKernels(
        gpu,
        device,
        {"heavy": heavy, "copy": lambda: dst.copy_(src), "tiny": lambda: small.add_(1.0)},
    )


def _sim_kernels(backend: Backend, gpu: int) -> GpuKernels:
    work = backend.workload
    assert work is not None
    work.open_context(gpu)
    max_hz = backend.clock_limits(gpu).max_sm_mhz * 1e6
    # read + write, at what this GPU's memory bus moves a cycle (an H100's 3.35 TB/s)
    copy_mem_cycles = 2 * COPY_BYTES / work.memory_system(gpu).bytes_per_mem_cycle

    def copy() -> float:
        return work.run_work(gpu, 2e-6 * max_hz, power_intensity=0.35, mem_cycles=copy_mem_cycles)

    return GpuKernels(
        gpu,
        timing.SimDevice(backend, gpu, rep_probe_cycles=0),
        {
            "heavy": timing.sim_kernel(backend, gpu, seconds=SIM_HEAVY_S, power_intensity=1.0),
            "copy": copy,
            "tiny": timing.sim_kernel(backend, gpu, seconds=SIM_TINY_S, power_intensity=0.2),
        },
    )


def close_kernels(backend: Backend, kernels: Sequence[GpuKernels]) -> None:
    """Let the GPUs go (the simulator's contexts; torch frees its tensors itself)."""
    if backend.workload is not None:
        for k in kernels:
            with contextlib.suppress(Exception):
                backend.workload.close_context(k.gpu)


Steps = Generator[None, None, Any]  # a GPU's work in steps; its result is the return value


def finish(steps: Steps) -> Any:
    """Run `steps` to the end; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def at_once(backend: Backend, jobs: Mapping[int, Steps]) -> tuple[dict[int, Any], float]:
    """Run each GPU's steps at the same time: a thread per GPU on real GPUs; on the
    simulator, whose work advances one clock, in turns of one step each, every GPU under
    a full background load between its turns (see the module doc). Returns the results and
    how long running them together takes (on the simulator: the longest job's own time,
    not the sum of the turns)."""
    clock = backend.clock
    t0 = clock.now()
    if backend.workload is None:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            futures = {g: pool.submit(finish, job) for g, job in jobs.items()}
            return {g: f.result() for g, f in futures.items()}, clock.now() - t0
    done: dict[int, Any] = {}
    busy = dict.fromkeys(jobs, 0.0)
    with _all_loaded(backend, list(jobs)):
        while len(done) < len(jobs):
            for g, job in jobs.items():
                if g in done:
                    continue
                t = clock.now()
                try:
                    next(job)
                except StopIteration as end:
                    done[g] = end.value
                busy[g] += clock.now() - t
    return done, max(busy.values(), default=0.0)


@contextlib.contextmanager
def _all_loaded(backend: Backend, gpus: Sequence[int]) -> Iterator[None]:
    work = backend.workload
    assert work is not None
    try:
        for g in gpus:
            work.set_background_load(g, 1.0, pid=os.getpid())  # this process's own load
        yield
    finally:
        for g in gpus:
            with contextlib.suppress(Exception):
                work.set_background_load(g, 0.0, pid=os.getpid())


__all__ = [
    "KERNELS",
    "WHAT",
    "GpuKernels",
    "Steps",
    "at_once",
    "close_kernels",
    "finish",
    "kernels_for",
]
