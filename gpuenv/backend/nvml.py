"""The real GPU, through NVML (nvidia-ml-py's `pynvml`): `backend/nvml*.py` alone import it.

`NvmlBackend` is assembled from one module per concept: `nvml_base` (init,
handles, the chokepoint), `nvml_queries` (identity, limits, processes),
`nvml_telemetry` (the sampler's reads), `nvml_details` (nvidia-smi -q's
board, link, fan and ECC), `nvml_writes`, with `nvml_errors`
(return codes as gpuenv errors) and `nvml_fields` (field ids and values).

Every NVML call goes through one chokepoint, `NvmlBackend._q`, which turns an
`NVMLError` into a gpuenv error (`translate`) that names the call, the GPU and
what to do. Names that differ between driver generations are tried newest
first and the one that works is remembered, so the hot path never pays for a
fallback twice:

  - clock-event reasons: `nvmlDeviceGetCurrentClocksEventReasons` (R535+), else
    `...ClocksThrottleReasons`;
  - temperature: `nvmlDeviceGetTemperatureV` (NVML 13), else the deprecated
    `nvmlDeviceGetTemperature`;
  - application clocks: `nvmlDeviceGetApplicationsClock` (deprecated in NVML 13),
    else `nvmlDeviceGetClock(..., NVML_CLOCK_ID_APP_CLOCK_TARGET)`.

Facts this module respects (measured read-only on an H100, 2026-11:
docs/explanation/what-gpus-do.md): there is no getter for locked clocks;
`nvmlDeviceGetPowerUsage` is a 1 s average, the instantaneous power is field 186;
`nvmlDeviceGetFieldValues` succeeds when any field was filled, so each entry's own
return code is checked; time under each clock-event reason comes from the stable field
ids 74-81 (not the 251-253 / 269-271 ones, whose
numbers changed between headers); memory temperature is field 82; the energy
counter costs ~3 ms and is read only by `read_slow`; `nvmlDeviceGetSamples`
returns two items in nvidia-ml-py 13.
"""

from __future__ import annotations

import os
from typing import Any

from gpuenv.backend.base import Capabilities, Workload
from gpuenv.backend.nvml_details import NvmlDetails
from gpuenv.backend.nvml_telemetry import NvmlTelemetry
from gpuenv.backend.nvml_writes import NvmlWrites
from gpuenv.timebase import REAL_CLOCK, Clock


class NvmlBackend(NvmlTelemetry, NvmlWrites, NvmlDetails):
    """The real GPUs. One `nvmlInit` per instance; `close()` (or `with`) shuts NVML down.

    Thread-safe: NVML is, and the caches here are filled idempotently.
    """

    name = "nvml"
    readonly = False
    clock: Clock = REAL_CLOCK  # a real GPU lives on real time
    workload: Workload | None = None  # real kernels run through CUDA, not through NVML

    @property
    def capabilities(self) -> Capabilities:
        """A real GPU; writes need root (asked each time: a process may drop privileges)."""
        return Capabilities(simulated=False, privileged=os.geteuid() == 0)

    def spec(self) -> dict[str, Any] | None:
        """Another process opens the same GPUs with its own `nvmlInit`."""
        return {"kind": "nvml"}

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NvmlBackend(gpus={self._count})"


__all__ = ["NvmlBackend"]
