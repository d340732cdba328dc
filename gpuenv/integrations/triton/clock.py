"""set_gpu_clock: triton's context manager, locking through gpuenv and putting back
exactly what was there."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

A100_SMS, A100_TENSOR_CORES_PER_SM, A100_FMA_PER_TENSOR_CORE = 108, 4, 256
A100_BUS_BYTES = 640  # 5120-bit HBM2e, two transfers a clock


class ClockRef(NamedTuple):
    """What triton's set_gpu_clock yields: reference peaks at the locked clocks, from an
    A100's figures whatever the GPU (as triton computes them): dense fp16 tensor-core
    TFLOP/s and DRAM GB/s (None when the memory clock is left alone)."""

    tflops: float
    gbps: float | None

    @classmethod
    def of(cls, sm_mhz: int, mem_mhz: int | None) -> ClockRef:
        per_clock = 2 * A100_SMS * A100_TENSOR_CORES_PER_SM * A100_FMA_PER_TENSOR_CORE
        gbps = 2 * A100_BUS_BYTES * mem_mhz / 1e3 if mem_mhz is not None else None
        return cls(per_clock * sm_mhz / 1e6, gbps)


@contextlib.contextmanager
def set_gpu_clock(
    ref_sm_clock: int = 1350,
    ref_mem_clock: int | None = 1215,
    *,
    gpus: Any = 0,
    backend: Any = None,
) -> Iterator[ClockRef]:
    """Lock the SM (and memory) clock of GPU 0, as triton.testing.set_gpu_clock does, and
    on exit put back exactly what was there before (triton resets to factory defaults and
    turns persistence mode off). Locks through gpuenv (the daemon when one serves the GPU,
    else locally as root: `nvidia-smi -lgc`/`-lmc`), so the lock shows in `gpuenv status`
    and a watchdog restores it if this process dies. `ref_mem_clock=None` leaves the
    memory clock alone (Hopper GPUs cannot lock it now). Refused under GPUENV_READONLY=1.
    """
    from gpuenv.backend import env_readonly
    from gpuenv.errors import ReadOnlyError
    from gpuenv.locking import acquire

    what = f"lock GPU clocks for set_gpu_clock (SM {ref_sm_clock} MHz" + (
        f", memory {ref_mem_clock} MHz)" if ref_mem_clock is not None else ")"
    )
    if env_readonly():
        raise ReadOnlyError(what, gpu=gpus)
    if backend is not None and backend.readonly:
        raise ReadOnlyError(what, gpu=gpus, reason=getattr(backend, "reason", "read-only"))
    held = acquire(
        ref_sm_clock, mem=ref_mem_clock, gpus=gpus, backend=backend, command="set_gpu_clock"
    )
    for note in held.notes:
        log.info("set_gpu_clock: %s", note)
    try:
        yield ClockRef.of(ref_sm_clock, ref_mem_clock)
    finally:
        held.release()


__all__ = ["ClockRef", "set_gpu_clock"]
