"""NVML's return codes as gpuenv errors (CPU: a pure function of the codes)."""

from __future__ import annotations

import pynvml
import pytest

from gpuenv.backend import nvml_codes, nvml_errors
from gpuenv.errors import (
    BackendError,
    DriverTimeout,
    GpuLost,
    InvalidValue,
    NotSupported,
    NvmlUnavailable,
    PermissionDenied,
)

# -- error mapping (CPU) -----------------------------------------------------------------

MAPPING = [
    (pynvml.NVML_ERROR_NO_PERMISSION, PermissionDenied),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, NotSupported),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, NotSupported),
    (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost),
    (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost),
    (pynvml.NVML_ERROR_TIMEOUT, DriverTimeout),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, InvalidValue),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, NvmlUnavailable),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlUnavailable),
    (pynvml.NVML_ERROR_UNINITIALIZED, NvmlUnavailable),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, NvmlUnavailable),
]


def test_the_codes_are_the_ones_pynvml_defines() -> None:
    names = [n for n in nvml_codes.__all__ if n.isupper()]
    assert len(names) == 12
    for name in names:
        assert getattr(nvml_codes, name) == getattr(pynvml, f"NVML_ERROR_{name}"), name


@pytest.mark.parametrize(("code", "cls"), MAPPING)
def test_error_for_code_maps_each_nvml_code_to_its_gpuenv_error(code: int, cls: type) -> None:
    err = nvml_errors.error_for_code(code, op="nvmlDeviceSetGpuLockedClocks", gpu=0)
    assert type(err) is cls
    assert err.code == code
    text = str(err)
    assert "\n" not in text
    if cls is not NvmlUnavailable:  # a driver-wide failure is about no GPU in particular
        assert "nvmlDeviceSetGpuLockedClocks" in text and "on GPU 0" in text
    assert err.hint, "every mapped error says what to do"


def test_unknown_codes_stay_backend_errors_with_the_code() -> None:
    err = nvml_errors.error_for_code(pynvml.NVML_ERROR_IN_USE, op="nvmlDeviceGetPowerUsage", gpu=1)
    assert type(err) is BackendError
    assert err.code == pynvml.NVML_ERROR_IN_USE
    assert f"NVML error {pynvml.NVML_ERROR_IN_USE}" in str(err)


def test_permission_error_tells_how_to_get_permission() -> None:
    err = nvml_errors.error_for_code(
        pynvml.NVML_ERROR_NO_PERMISSION, op="nvmlDeviceSetGpuLockedClocks"
    )
    assert "root" in str(err) and "gpuenv daemon" in str(err)


@pytest.mark.parametrize(("code", "cls"), MAPPING)
def test_translate_reads_the_code_of_real_pynvml_exceptions(code: int, cls: type) -> None:
    raised = pynvml.NVMLError(code)  # pynvml picks its subclass, e.g. NVMLError_NoPermission
    assert isinstance(raised, pynvml.NVMLError) and type(raised) is not pynvml.NVMLError
    assert type(nvml_errors.translate(raised, op="op", gpu=2)) is cls


def test_translate_library_mismatch_is_not_supported() -> None:
    err = nvml_errors.translate(pynvml.NVMLLibraryMismatchError("old driver"), op="procs", gpu=0)
    assert isinstance(err, NotSupported)
