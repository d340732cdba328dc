"""Where a bench call runs fn when no device was given (`open_device`): the simulated
GPU where the backend has a synthetic workload, else CUDA through torch, and that
device's GPU as NVML numbers it. Used by the harness and by `rank`'s screen."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuenv.errors import GpuenvError
from gpuenv.timebase import Clock
from gpuenv.timing.cuda import cuda_device
from gpuenv.timing.devices import Device, SimDevice

if TYPE_CHECKING:
    from gpuenv.backend import Backend
    from gpuenv.timing.config import BenchConfig

log = logging.getLogger(__name__)


def open_device(
    cfg: BenchConfig,
    backend: Backend | None,
    gpu: int | None,
    gpus: list[int],
    clock: Clock | None,
) -> tuple[Device, int | None]:
    """The device a bench call times fn on where none was given, and the GPU: the
    simulated GPU where the backend has a synthetic workload (GPU `gpu`, else the one
    CUDA's device 0 would be, else `gpus`' first: a session's), else CUDA through torch
    on the current CUDA device in `cfg`'s mode (events for "auto", which chooses later),
    on `clock` (the sampler's), and `gpu` as given (a caller that needs the CUDA device's
    NVML index finds it: `nvml_index_of_cuda`)."""
    if backend is not None and backend.workload is not None:
        if gpu is None:  # CUDA_VISIBLE_DEVICES's first (a session's, where it samples it)
            zero = safe_index(lambda: cuda_nvml_index(backend))
            gpu = zero if not gpus or zero in gpus else gpus[0]
        return SimDevice(backend, gpu or 0), gpu
    device = cuda_device(
        "events" if cfg.mode == "auto" else cfg.mode,
        flush_l2=cfg.flush_l2,
        saturate=cfg.saturate,
        calls_per_rep=cfg.calls_per_rep,
        clock=clock,
    )
    return device, gpu


def cuda_nvml_index(backend: Backend, ordinal: int = 0) -> int:
    """The NVML index of CUDA's device `ordinal` under this process's CUDA_VISIBLE_DEVICES
    and CUDA_DEVICE_ORDER, read without CUDA (the simulated GPU's stand-in for torch's
    current device; a tuner's opening ahead, on its thread's CUDA device)."""
    from gpuenv.devices import select_gpus

    return select_gpus(backend, f"cuda:{ordinal}")[0]


def safe_index(get: Callable[[], int]) -> int | None:
    """`get()`, the NVML index of a CUDA device, or None (logged) where it cannot be found."""
    try:
        return get()
    except GpuenvError as err:
        log.warning("cannot map the CUDA device to an NVML GPU (%s); using GPU 0", err)
        return None
