"""Fault injection for the simulated GPU: which calls fail, and with what NVML would raise.

`SimBackend.inject_fault` queues `Fault`s per GPU; every NVML-like call checks
them (`raise_if_faulted`) before it touches the model, so a test can make one
call, a few, or all of them fail as a real driver does: the GPU lost, a
timeout, an unsupported call, a permission refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuenv.backend.base import WRITES
from gpuenv.backend.nvml_codes import (
    GPU_IS_LOST,
    NO_PERMISSION,
    NOT_SUPPORTED,
    TIMEOUT,
    error_for_code,
)

# each kind of fault: the NVML return code a real driver fails with, and NVML's words
FAULT_CODES = {
    "gpu_lost": (GPU_IS_LOST, "GPU is lost"),
    "timeout": (TIMEOUT, "Timeout"),
    "not_supported": (NOT_SUPPORTED, "Not Supported"),
    "permission": (NO_PERMISSION, "Insufficient Permissions"),
}
FAULT_KINDS = tuple(FAULT_CODES)
BACKEND_OPS = (
    "device_info",
    "clock_limits",
    "app_clocks",
    "power_limits",
    "thresholds",
    "supported_reasons",
    "performance_state",
    "persistence_mode",
    "processes",
    "utilization",
    "memory",
    "details",
    "read_fast",
    "read_slow",
    "power_samples",
    *WRITES,
    "set_persistence_mode",
)
WORKLOAD_OPS = ("open_context", "close_context", "run_work", "set_background_load", "set_ambient")


@dataclass
class Fault:
    kind: str
    op: str | None
    count: int | None


def raise_if_faulted(faults: list[Fault] | None, index: int, op: str) -> None:
    """Raise the error of the first fault that applies to `op` on GPU `index` (and use it up)."""
    if not faults:
        return
    for fault in faults:
        applies = fault.op == op or (
            fault.op is None and (op in BACKEND_OPS or fault.kind == "gpu_lost")
        )
        if not applies:
            continue
        if fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                faults.remove(fault)
        # what the real backend raises for the same NVML code (nvml_errors.translate)
        code, words = FAULT_CODES[fault.kind]
        raise error_for_code(code, op=op, gpu=index, text=f"{words}, injected fault")


__all__ = [
    "BACKEND_OPS",
    "FAULT_CODES",
    "FAULT_KINDS",
    "WORKLOAD_OPS",
    "Fault",
    "raise_if_faulted",
]
