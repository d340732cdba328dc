"""NVML's return codes, and the gpuenv error each one means: what failed, on which GPU,
and what to do.

Pure numbers (nvml.h's; tests/test_nvml_errors.py checks them against pynvml), so
that the simulated GPU raises for an injected fault exactly what the real backend
raises for the same code, and neither needs a driver. `nvml_errors.translate` reads
the code of an exception pynvml raised.
"""

from __future__ import annotations

from gpuenv import errors
from gpuenv.errors import BackendError

UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18

_HW_HINT_LOST = "the GPU needs a reset or a reboot; 'dmesg | grep -i xid' says why"

# code -> (error, what happened: {op} is the call, {said} NVML's own words, what to do);
# None: the error's own hint
_ON_A_GPU: dict[int, tuple[type[BackendError], str, str | None]] = {
    NO_PERMISSION: (errors.PermissionDenied, "permission denied for {op}{said}", None),
    NOT_SUPPORTED: (
        errors.NotSupported,
        "{op} is not supported by this GPU or driver{said}",
        "this GPU cannot do it; 'gpuenv doctor' and 'gpuenv status' show what it offers",
    ),
    FUNCTION_NOT_FOUND: (
        errors.NotSupported,
        "{op} is not in this driver's NVML{said}",
        "a newer NVIDIA driver has it; gpuenv works without it where it can",
    ),
    GPU_IS_LOST: (errors.GpuLost, "the GPU stopped answering {op}{said}", _HW_HINT_LOST),
    RESET_REQUIRED: (errors.GpuLost, "the GPU stopped answering {op}{said}", _HW_HINT_LOST),
    TIMEOUT: (
        errors.DriverTimeout,
        "the driver timed out answering {op}{said}",
        "retry; if it keeps happening, check the driver ('dmesg', 'nvidia-smi')",
    ),
    INVALID_ARGUMENT: (
        errors.InvalidValue,
        "the driver rejected the arguments of {op}{said}",
        "see 'gpuenv status' and 'nvidia-smi -q -d SUPPORTED_CLOCKS,POWER' for valid values",
    ),
}
# code -> (what is wrong with NVML itself: no GPU in particular, what to do)
_NO_NVML: dict[int, tuple[str, str | None]] = {
    LIBRARY_NOT_FOUND: ("NVML (libnvidia-ml.so.1) was not found", None),
    DRIVER_NOT_LOADED: ("the NVIDIA kernel driver is not loaded", None),
    UNINITIALIZED: ("NVML is not initialised", None),
    LIB_RM_VERSION_MISMATCH: (
        "NVML and the kernel driver have different versions",
        "the driver was upgraded without reloading it: reboot, or reload the nvidia kernel modules",
    ),
}


def error_for_code(
    code: int, *, op: str, gpu: int | None = None, text: str | None = None
) -> BackendError:
    """The gpuenv error for an NVML return code (pure: no NVML needed).

    `op` is the NVML call (or gpuenv operation) that failed; `text` NVML's own words.
    """
    said = f" ({text})" if text else ""
    if code in _ON_A_GPU:
        cls, what, hint = _ON_A_GPU[code]
        return cls(what.format(op=op, said=said), op=op, gpu=gpu, code=code, hint=hint)
    if code in _NO_NVML:
        words, hint = _NO_NVML[code]
        return errors.NvmlUnavailable(words, code=code, hint=hint)
    return BackendError(f"{op} failed{said} (NVML error {code})", op=op, gpu=gpu, code=code)


__all__ = [
    "DRIVER_NOT_LOADED",
    "FUNCTION_NOT_FOUND",
    "GPU_IS_LOST",
    "INVALID_ARGUMENT",
    "LIBRARY_NOT_FOUND",
    "LIB_RM_VERSION_MISMATCH",
    "NOT_FOUND",
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "RESET_REQUIRED",
    "TIMEOUT",
    "UNINITIALIZED",
    "error_for_code",
]
