"""NVML's return codes as gpuenv errors: what failed, on which GPU, and what to do.

`error_for_code` is a pure function of the code (tests need no driver);
`translate` reads the code of an exception pynvml raised.
"""

from __future__ import annotations

import pynvml as nv

from gpuenv.errors import (
    BackendError,
    DriverTimeout,
    GpuLost,
    InvalidValue,
    NotSupported,
    NvmlUnavailable,
    PermissionDenied,
)

# NVML return codes, spelled out so that `error_for_code` is a pure function of numbers.
UNINITIALIZED = nv.NVML_ERROR_UNINITIALIZED  # 1
INVALID_ARGUMENT = nv.NVML_ERROR_INVALID_ARGUMENT  # 2
NOT_SUPPORTED = nv.NVML_ERROR_NOT_SUPPORTED  # 3
NO_PERMISSION = nv.NVML_ERROR_NO_PERMISSION  # 4
NOT_FOUND = nv.NVML_ERROR_NOT_FOUND  # 6
DRIVER_NOT_LOADED = nv.NVML_ERROR_DRIVER_NOT_LOADED  # 9
TIMEOUT = nv.NVML_ERROR_TIMEOUT  # 10
LIBRARY_NOT_FOUND = nv.NVML_ERROR_LIBRARY_NOT_FOUND  # 12
FUNCTION_NOT_FOUND = nv.NVML_ERROR_FUNCTION_NOT_FOUND  # 13
GPU_IS_LOST = nv.NVML_ERROR_GPU_IS_LOST  # 15
RESET_REQUIRED = nv.NVML_ERROR_RESET_REQUIRED  # 16
LIB_RM_VERSION_MISMATCH = nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH  # 18

# Raised by bindings whose unversioned name is missing from the driver; absent in old ones.
MISMATCH: type[Exception] = getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError)

_HW_HINT_LOST = "the GPU needs a reset or a reboot; 'dmesg | grep -i xid' says why"


def error_for_code(
    code: int, *, op: str, gpu: int | None = None, text: str | None = None
) -> BackendError:
    """The gpuenv error for an NVML return code (pure: no NVML needed).

    `op` is the NVML call (or gpuenv operation) that failed; `text` NVML's own words.
    """
    said = f" ({text})" if text else ""
    if code == NO_PERMISSION:
        return PermissionDenied(f"permission denied for {op}", op=op, gpu=gpu, code=code)
    if code == NOT_SUPPORTED:
        return NotSupported(
            f"{op} is not supported by this GPU or driver",
            op=op,
            gpu=gpu,
            code=code,
            hint="this GPU cannot do it; 'gpuenv doctor' and 'gpuenv status' show what it offers",
        )
    if code == FUNCTION_NOT_FOUND:
        return NotSupported(
            f"{op} is not in this driver's NVML",
            op=op,
            gpu=gpu,
            code=code,
            hint="a newer NVIDIA driver has it; gpuenv works without it where it can",
        )
    if code in (GPU_IS_LOST, RESET_REQUIRED):
        return GpuLost(
            f"the GPU stopped answering {op}{said}", op=op, gpu=gpu, code=code, hint=_HW_HINT_LOST
        )
    if code == TIMEOUT:
        return DriverTimeout(
            f"the driver did not answer {op} in time",
            op=op,
            gpu=gpu,
            code=code,
            hint="retry; if it keeps happening, check the driver ('dmesg', 'nvidia-smi')",
        )
    if code == INVALID_ARGUMENT:
        return InvalidValue(
            f"the driver rejected the arguments of {op}",
            op=op,
            gpu=gpu,
            code=code,
            hint="see 'gpuenv status' and 'nvidia-smi -q -d SUPPORTED_CLOCKS,POWER' "
            "for valid values",
        )
    if code in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, UNINITIALIZED):
        words = {
            LIBRARY_NOT_FOUND: "NVML (libnvidia-ml.so.1) was not found",
            DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
            UNINITIALIZED: "NVML is not initialised",
        }[code]
        return NvmlUnavailable(words, code=code)
    if code == LIB_RM_VERSION_MISMATCH:
        return NvmlUnavailable(
            "NVML and the kernel driver have different versions",
            code=code,
            hint="the driver was upgraded without reloading it: reboot, or reload the "
            "nvidia kernel modules",
        )
    return BackendError(f"{op} failed{said} (NVML error {code})", op=op, gpu=gpu, code=code)


def translate(err: Exception, *, op: str, gpu: int | None = None) -> BackendError:
    """Map an exception raised by pynvml to a gpuenv error."""
    if isinstance(err, nv.NVMLError):
        code = int(err.value)
        try:
            text = str(err)
        except Exception:  # str() asks the library, which may be gone
            text = None
        return error_for_code(code, op=op, gpu=gpu, text=text)
    if isinstance(err, MISMATCH):
        return error_for_code(FUNCTION_NOT_FOUND, op=op, gpu=gpu)
    return BackendError(f"{op} failed: {err}", op=op, gpu=gpu)


__all__ = [
    "FUNCTION_NOT_FOUND",
    "INVALID_ARGUMENT",
    "MISMATCH",
    "NOT_FOUND",
    "NOT_SUPPORTED",
    "error_for_code",
    "translate",
]
