"""pynvml's exceptions as gpuenv errors: what failed, on which GPU, and what to do.

`translate` reads the code of an exception pynvml raised; `error_for_code`, a pure
function of the code (tests need no driver), and the codes are gpuenv.backend.nvml_codes'.
"""

from __future__ import annotations

import pynvml as nv

from gpuenv.backend.nvml_codes import (
    FUNCTION_NOT_FOUND,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    error_for_code,
)
from gpuenv.errors import BackendError

# Raised by bindings whose unversioned name is missing from the driver; absent in old ones.
MISMATCH: type[Exception] = getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError)


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
