"""The NVML session under `NvmlBackend`: init, handles, and the one chokepoint for calls.

Every NVML call goes through `NvmlCore._q`, which turns an `NVMLError` into a
gpuenv error (`nvml_errors.translate`) that names the call, the GPU and what to
do; `_q_first` tries names that differ between driver generations newest first
and remembers the one that worked, so the hot path never pays for a fallback twice.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pynvml as nv

from gpuenv.backend.base import ClockLimits, DeviceInfo, Thresholds
from gpuenv.backend.nvml_errors import FUNCTION_NOT_FOUND, MISMATCH, error_for_code, translate
from gpuenv.errors import BackendError, DeviceNotFound, NotSupported


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlCore:
    """One `nvmlInit` per instance; `close()` shuts NVML down. `NvmlBackend` is the whole."""

    def __init__(self) -> None:
        try:
            nv.nvmlInit()
        except Exception as err:
            raise translate(err, op="nvmlInit") from err
        self._closed = False
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._info: dict[int, DeviceInfo] = {}
        self._limits: dict[int, ClockLimits] = {}
        self._thresholds: dict[int, Thresholds] = {}
        self._instant_ok: dict[int, bool] = {}  # False once field 186 proved unsupported
        self._chosen: dict[str, str] = {}  # role -> the NVML name that worked on this driver
        try:
            self._count = int(self._q("nvmlDeviceGetCount"))
        except BaseException:
            self.close()
            raise

    # -- the chokepoint -----------------------------------------------------------
    def _q(self, fn_name: str, *args: Any, gpu: int | None = None) -> Any:
        """Call pynvml.`fn_name`(*args); every NVML error leaves as a gpuenv error."""
        fn: Callable[..., Any] | None = getattr(nv, fn_name, None)
        if fn is None:  # an older nvidia-ml-py without the binding
            raise error_for_code(FUNCTION_NOT_FOUND, op=fn_name, gpu=gpu)
        try:
            return fn(*args)
        except (nv.NVMLError, MISMATCH) as err:
            raise translate(err, op=fn_name, gpu=gpu) from err

    def _q_first(self, role: str, names: Sequence[str], *args: Any, gpu: int | None = None) -> Any:
        """Call the first of `names` that this driver has; remember which one it was."""
        chosen = self._chosen.get(role)
        if chosen is not None:
            return self._q(chosen, *args, gpu=gpu)
        last: BackendError | None = None
        for fn_name in names:
            try:
                result = self._q(fn_name, *args, gpu=gpu)
            except NotSupported as err:
                if err.code != FUNCTION_NOT_FOUND:
                    raise
                last = err
                continue
            self._chosen[role] = fn_name
            return result
        assert last is not None
        raise last

    def _opt(self, fn_name: str, *args: Any, gpu: int | None = None) -> Any:
        """Like `_q`, but None where the GPU or driver does not support the call."""
        try:
            return self._q(fn_name, *args, gpu=gpu)
        except NotSupported:
            return None

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is not None:
            return handle
        if not isinstance(index, int) or not 0 <= index < self._count:
            raise DeviceNotFound(str(index), self._count)
        handle = self._q("nvmlDeviceGetHandleByIndex", index, gpu=index)
        self._handles[index] = handle
        return handle

    # -- lifetime -----------------------------------------------------------------
    def close(self) -> None:
        """Shut NVML down (once). Best effort: a driver already gone is not an error here."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._handles.clear()
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


__all__ = ["NvmlCore"]
