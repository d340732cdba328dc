"""Fault injection for the simulated GPU: which calls fail, and with what NVML would raise.

`SimBackend.inject_fault` queues `Fault`s per GPU; every NVML-like call checks
them (`raise_if_faulted`) before it touches the model, so a test can make one
call, a few, or all of them fail as a real driver does: the GPU lost, a
timeout, an unsupported call, a permission refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuenv.backend import WRITES
from gpuenv.errors import DriverTimeout, GpuLost, NotSupported, PermissionDenied

# NVML return codes, carried on the errors for people who know them.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15

FAULT_KINDS = ("gpu_lost", "timeout", "not_supported", "permission")
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
        raise fault_error(fault.kind, op, index)


def fault_error(kind: str, op: str, index: int) -> Exception:
    if kind == "gpu_lost":
        return GpuLost(
            "GPU is lost (injected fault)",
            op=op,
            gpu=index,
            code=NVML_ERROR_GPU_IS_LOST,
            hint="the GPU needs a reset (nvidia-smi -r) or a reboot",
        )
    if kind == "timeout":
        return DriverTimeout(
            f"the driver timed out in {op} (injected fault)",
            op=op,
            gpu=index,
            code=NVML_ERROR_TIMEOUT,
            hint="retry; if it persists, check dmesg for Xid errors",
        )
    if kind == "not_supported":
        return NotSupported(
            f"{op} is not supported (injected fault)",
            op=op,
            gpu=index,
            code=NVML_ERROR_NOT_SUPPORTED,
        )
    return PermissionDenied(
        f"permission denied in {op} (injected fault)",
        op=op,
        gpu=index,
        code=NVML_ERROR_NO_PERMISSION,
    )


__all__ = [
    "BACKEND_OPS",
    "FAULT_KINDS",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_TIMEOUT",
    "WORKLOAD_OPS",
    "Fault",
    "fault_error",
    "raise_if_faulted",
]
