"""The real GPU, through NVML (nvidia-ml-py's `pynvml`): the only module in gpuenv that imports it.

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

Facts this module respects (shared/GPU_FACTS.md): there is no getter for locked
clocks; `nvmlDeviceGetPowerUsage` is a 1 s average, the instantaneous power is
field 186; `nvmlDeviceGetFieldValues` succeeds when any field was filled, so
each entry's own return code is checked; time under each clock-event reason
comes from the stable field ids 74-81 (not the 251-253 / 269-271 ones, whose
numbers changed between headers); memory temperature is field 82; the energy
counter costs ~3 ms and is read only by `read_slow`; `nvmlDeviceGetSamples`
returns two items in nvidia-ml-py 13.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pynvml as nv

from gpuenv.backend import (
    REASON_COUNTERS,
    AppClocks,
    ClockLimits,
    DeviceInfo,
    FastReading,
    GpuProcess,
    PowerLimits,
    SlowReading,
    Thresholds,
)
from gpuenv.errors import (
    BackendError,
    DeviceNotFound,
    DriverTimeout,
    GpuLost,
    InvalidValue,
    NotSupported,
    NvmlUnavailable,
    PermissionDenied,
)

# NVML return codes, spelled out so that `error_for_code` is a pure function of numbers.
_UNINITIALIZED = nv.NVML_ERROR_UNINITIALIZED  # 1
_INVALID_ARGUMENT = nv.NVML_ERROR_INVALID_ARGUMENT  # 2
_NOT_SUPPORTED = nv.NVML_ERROR_NOT_SUPPORTED  # 3
_NO_PERMISSION = nv.NVML_ERROR_NO_PERMISSION  # 4
_NOT_FOUND = nv.NVML_ERROR_NOT_FOUND  # 6
_DRIVER_NOT_LOADED = nv.NVML_ERROR_DRIVER_NOT_LOADED  # 9
_TIMEOUT = nv.NVML_ERROR_TIMEOUT  # 10
_LIBRARY_NOT_FOUND = nv.NVML_ERROR_LIBRARY_NOT_FOUND  # 12
_FUNCTION_NOT_FOUND = nv.NVML_ERROR_FUNCTION_NOT_FOUND  # 13
_GPU_IS_LOST = nv.NVML_ERROR_GPU_IS_LOST  # 15
_RESET_REQUIRED = nv.NVML_ERROR_RESET_REQUIRED  # 16
_LIB_RM_VERSION_MISMATCH = nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH  # 18

# Field ids (nvml.h). 74-81: cumulative ns under each perf policy, in REASON_COUNTERS order.
FI_PERF_POLICY = tuple(range(74, 82))
FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT, mW
_SLOW_FIELDS = (*FI_PERF_POLICY, FI_MEMORY_TEMP)
assert len(FI_PERF_POLICY) == len(REASON_COUNTERS)

# Raised by bindings whose unversioned name is missing from the driver; absent in old ones.
_MISMATCH: type[Exception] = getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError)

_HW_HINT_LOST = "the GPU needs a reset or a reboot; 'dmesg | grep -i xid' says why"


def error_for_code(
    code: int, *, op: str, gpu: int | None = None, text: str | None = None
) -> BackendError:
    """The gpuenv error for an NVML return code (pure: no NVML needed).

    `op` is the NVML call (or gpuenv operation) that failed; `text` NVML's own words.
    """
    said = f" ({text})" if text else ""
    if code == _NO_PERMISSION:
        return PermissionDenied(f"permission denied for {op}", op=op, gpu=gpu, code=code)
    if code == _NOT_SUPPORTED:
        return NotSupported(
            f"{op} is not supported by this GPU or driver",
            op=op,
            gpu=gpu,
            code=code,
            hint="this GPU cannot do it; 'gpuenv doctor' and 'gpuenv status' show what it offers",
        )
    if code == _FUNCTION_NOT_FOUND:
        return NotSupported(
            f"{op} is not in this driver's NVML",
            op=op,
            gpu=gpu,
            code=code,
            hint="a newer NVIDIA driver has it; gpuenv works without it where it can",
        )
    if code in (_GPU_IS_LOST, _RESET_REQUIRED):
        return GpuLost(
            f"the GPU stopped answering {op}{said}", op=op, gpu=gpu, code=code, hint=_HW_HINT_LOST
        )
    if code == _TIMEOUT:
        return DriverTimeout(
            f"the driver did not answer {op} in time",
            op=op,
            gpu=gpu,
            code=code,
            hint="retry; if it keeps happening, check the driver ('dmesg', 'nvidia-smi')",
        )
    if code == _INVALID_ARGUMENT:
        return InvalidValue(
            f"the driver rejected the arguments of {op}",
            op=op,
            gpu=gpu,
            code=code,
            hint="see 'gpuenv status' and 'nvidia-smi -q -d SUPPORTED_CLOCKS,POWER' "
            "for valid values",
        )
    if code in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED, _UNINITIALIZED):
        words = {
            _LIBRARY_NOT_FOUND: "NVML (libnvidia-ml.so.1) was not found",
            _DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
            _UNINITIALIZED: "NVML is not initialised",
        }[code]
        return NvmlUnavailable(words, code=code)
    if code == _LIB_RM_VERSION_MISMATCH:
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
    if isinstance(err, _MISMATCH):
        return error_for_code(_FUNCTION_NOT_FOUND, op=op, gpu=gpu)
    return BackendError(f"{op} failed: {err}", op=op, gpu=gpu)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# nvmlValueType_t (nvml.h; numbers, since older bindings lack the newer names) -> the
# member of c_nvmlValue_t that holds it
_VALUE_ATTR = {
    0: "dVal",  # NVML_VALUE_TYPE_DOUBLE
    1: "uiVal",  # UNSIGNED_INT
    2: "ulVal",  # UNSIGNED_LONG
    3: "ullVal",  # UNSIGNED_LONG_LONG
    4: "sllVal",  # SIGNED_LONG_LONG
    5: "siVal",  # SIGNED_INT
    6: "usVal",  # UNSIGNED_SHORT
}


def _field_value(entry: Any) -> float | int | None:
    """The value of one c_nvmlFieldValue_t, or None where its own return code is not SUCCESS."""
    if entry.nvmlReturn != nv.NVML_SUCCESS:
        return None
    attr = _VALUE_ATTR.get(int(entry.valueType))
    if attr is None:
        return None
    value = getattr(entry.value, attr)
    return float(value) if attr == "dVal" else int(value)


class NvmlBackend:
    """The real GPUs. One `nvmlInit` per instance; `close()` (or `with`) shuts NVML down.

    Thread-safe: NVML is, and the caches here are filled idempotently.
    """

    name = "nvml"
    readonly = False

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
            raise error_for_code(_FUNCTION_NOT_FOUND, op=fn_name, gpu=gpu)
        try:
            return fn(*args)
        except (nv.NVMLError, _MISMATCH) as err:
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
                if err.code != _FUNCTION_NOT_FOUND:
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

    # -- static / slow-changing reads ---------------------------------------------
    def device_count(self) -> int:
        """`nvidia-smi -L | wc -l`."""
        return self._count

    def device_info(self, index: int) -> DeviceInfo:
        """`nvidia-smi -L` and `nvidia-smi -q`: name, UUID, PCI bus id, compute capability, MIG."""
        info = self._info.get(index)
        if info is not None:
            return info
        h = self._handle(index)
        pci = self._q("nvmlDeviceGetPciInfo", h, gpu=index)
        cc = self._opt("nvmlDeviceGetCudaComputeCapability", h, gpu=index)
        mig = self._opt("nvmlDeviceGetMigMode", h, gpu=index)
        mem = self._opt("nvmlDeviceGetMemoryInfo", h, gpu=index)
        serial = self._opt("nvmlDeviceGetSerial", h, gpu=index)
        info = DeviceInfo(
            index=index,
            uuid=_text(self._q("nvmlDeviceGetUUID", h, gpu=index)),
            pci_bus_id=_text(pci.busId),
            name=_text(self._q("nvmlDeviceGetName", h, gpu=index)),
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            mig_mode=bool(mig[0]) if mig is not None else None,
            memory_total_mib=int(mem.total) // (1024 * 1024) if mem is not None else None,
            serial=_text(serial) if serial else None,
        )
        self._info[index] = info
        return info

    def driver_version(self) -> str:
        """`nvidia-smi --query-gpu=driver_version`."""
        return _text(self._q("nvmlSystemGetDriverVersion"))

    def nvml_version(self) -> str:
        """NVML's own version ("13.580.159.04")."""
        return _text(self._q("nvmlSystemGetNVMLVersion"))

    def clock_limits(self, index: int) -> ClockLimits:
        """`nvidia-smi -q -d CLOCK,SUPPORTED_CLOCKS`. Cached: these do not change while running.

        `base_sm_mhz` is None: NVML has no getter for the base (TDP) clock
        (`nvmlClockId_t` offers current, application target/default and customer
        boost max only); lock to it with CLOCK_LIMIT_TDP instead.
        """
        limits = self._limits.get(index)
        if limits is not None:
            return limits
        h = self._handle(index)
        mems = self._opt("nvmlDeviceGetSupportedMemoryClocks", h, gpu=index) or []
        supported_mem = tuple(sorted({int(m) for m in mems}, reverse=True))
        supported_sm: dict[int, tuple[int, ...]] = {}
        for mem in supported_mem:
            sms = self._opt("nvmlDeviceGetSupportedGraphicsClocks", h, mem, gpu=index) or []
            supported_sm[mem] = tuple(sorted({int(s) for s in sms}, reverse=True))
        cc = self.device_info(index).compute_capability
        limits = ClockLimits(
            max_sm_mhz=int(self._q("nvmlDeviceGetMaxClockInfo", h, nv.NVML_CLOCK_SM, gpu=index)),
            max_mem_mhz=int(self._q("nvmlDeviceGetMaxClockInfo", h, nv.NVML_CLOCK_MEM, gpu=index)),
            default_app_sm_mhz=self._default_app_clock(index, nv.NVML_CLOCK_GRAPHICS),
            default_app_mem_mhz=self._default_app_clock(index, nv.NVML_CLOCK_MEM),
            base_sm_mhz=None,
            supported_mem_mhz=supported_mem,
            supported_sm_mhz=supported_sm,
            # NVML cannot be asked; nvmlDeviceSetGpuLockedClocks is documented for Volta+ (7.0).
            locked_clocks_supported=cc is None or cc >= (7, 0),
            # Ampere and Ada apply it at once; Hopper only at the next GPU init (-lmcd),
            # newer ones are untested: report what is known to work.
            locked_mem_supported=cc is not None and cc[0] == 8,
        )
        self._limits[index] = limits
        return limits

    def _default_app_clock(self, index: int, clock_type: int) -> int | None:
        h = self._handle(index)
        try:
            return int(self._q("nvmlDeviceGetDefaultApplicationsClock", h, clock_type, gpu=index))
        except NotSupported:
            pass
        value = self._opt(
            "nvmlDeviceGetClock", h, clock_type, nv.NVML_CLOCK_ID_APP_CLOCK_DEFAULT, gpu=index
        )
        return int(value) if value is not None else None

    def app_clocks(self, index: int) -> AppClocks:
        """`nvidia-smi -q -d CLOCK`, 'Applications Clocks' (graphics and memory)."""
        return AppClocks(
            sm_mhz=self._app_clock(index, nv.NVML_CLOCK_GRAPHICS),
            mem_mhz=self._app_clock(index, nv.NVML_CLOCK_MEM),
        )

    def _app_clock(self, index: int, clock_type: int) -> int | None:
        h = self._handle(index)
        try:
            return int(self._q("nvmlDeviceGetApplicationsClock", h, clock_type, gpu=index))
        except NotSupported:
            pass
        value = self._opt(
            "nvmlDeviceGetClock", h, clock_type, nv.NVML_CLOCK_ID_APP_CLOCK_TARGET, gpu=index
        )
        return int(value) if value is not None else None

    def power_limits(self, index: int) -> PowerLimits:
        """Watts: `nvidia-smi --query-gpu=power.limit,power.default_limit,power.min_limit,...`."""
        h = self._handle(index)
        lo, hi = self._q("nvmlDeviceGetPowerManagementLimitConstraints", h, gpu=index)
        return PowerLimits(
            limit_w=self._q("nvmlDeviceGetPowerManagementLimit", h, gpu=index) / 1000.0,
            default_w=self._q("nvmlDeviceGetPowerManagementDefaultLimit", h, gpu=index) / 1000.0,
            min_w=lo / 1000.0,
            max_w=hi / 1000.0,
        )

    def thresholds(self, index: int) -> Thresholds:
        """`nvidia-smi -q -d TEMPERATURE`. Cached."""
        cached = self._thresholds.get(index)
        if cached is not None:
            return cached
        h = self._handle(index)

        def get(kind: int) -> float | None:
            value = self._opt("nvmlDeviceGetTemperatureThreshold", h, kind, gpu=index)
            return float(value) if value else None  # 0 means "not reported" on some boards

        cached = Thresholds(
            slowdown_c=get(nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            shutdown_c=get(nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            gpu_max_c=get(nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
            mem_max_c=get(nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        )
        self._thresholds[index] = cached
        return cached

    def supported_reasons(self, index: int) -> int:
        """Bitmask of the clock-event reasons this GPU can report (0x1ff on an H100)."""
        return int(
            self._q_first(
                "supported_reasons",
                (
                    "nvmlDeviceGetSupportedClocksEventReasons",
                    "nvmlDeviceGetSupportedClocksThrottleReasons",
                ),
                self._handle(index),
                gpu=index,
            )
        )

    def persistence_mode(self, index: int) -> bool | None:
        """`nvidia-smi --query-gpu=persistence_mode`; None where there is no such mode (Windows)."""
        value = self._opt("nvmlDeviceGetPersistenceMode", self._handle(index), gpu=index)
        return None if value is None else value == nv.NVML_FEATURE_ENABLED

    def processes(self, index: int) -> list[GpuProcess]:
        """`nvidia-smi --query-compute-apps=pid,used_memory` plus graphics processes.

        Costs 10-100 us (more on some systems): keep it off hot paths. Processes in
        other PID namespaces (containers) may be missing.
        """
        h = self._handle(index)
        seen: dict[int, GpuProcess] = {}
        for kind, role, names in (
            (
                "compute",
                "compute_procs",
                (
                    "nvmlDeviceGetComputeRunningProcesses_v3",
                    "nvmlDeviceGetComputeRunningProcesses_v2",
                ),
            ),
            (
                "graphics",
                "graphics_procs",
                (
                    "nvmlDeviceGetGraphicsRunningProcesses_v3",
                    "nvmlDeviceGetGraphicsRunningProcesses_v2",
                ),
            ),
        ):
            try:
                procs = self._q_first(role, names, h, gpu=index)
            except NotSupported:
                continue
            for p in procs:
                pid = int(p.pid)
                if pid in seen:
                    continue
                used = p.usedGpuMemory
                seen[pid] = GpuProcess(
                    pid=pid,
                    used_memory_mib=int(used) // (1024 * 1024) if used is not None else None,
                    kind=kind,
                )
        return list(seen.values())

    def utilization(self, index: int) -> tuple[int, int] | None:
        """`nvidia-smi --query-gpu=utilization.gpu,utilization.memory` (percent)."""
        util = self._opt("nvmlDeviceGetUtilizationRates", self._handle(index), gpu=index)
        return None if util is None else (int(util.gpu), int(util.memory))

    # -- telemetry ----------------------------------------------------------------
    def read_fast(self, index: int) -> FastReading:
        """The cheap values: `nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,
        temperature.gpu,clocks_event_reasons.active`.

        Six NVML calls of ~2-5 us each on an H100, no allocation beyond the records.
        """
        h = self._handle(index)
        sm = self._q("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM, gpu=index)
        mem = self._q("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM, gpu=index)
        power_mw = self._q("nvmlDeviceGetPowerUsage", h, gpu=index)
        temp = self._q_first(
            "temperature",
            ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
            h,
            nv.NVML_TEMPERATURE_GPU,
            gpu=index,
        )
        reasons = self._q_first(
            "current_reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            h,
            gpu=index,
        )
        instant_w: float | None = None
        ts_us: int | None = None
        if self._instant_ok.get(index, True):
            try:
                entry = self._q("nvmlDeviceGetFieldValues", h, [FI_POWER_INSTANT], gpu=index)[0]
            except NotSupported:
                entry = None
            value = _field_value(entry) if entry is not None else None
            if value is None:
                if entry is None or entry.nvmlReturn in (_NOT_SUPPORTED, _INVALID_ARGUMENT):
                    self._instant_ok[index] = False  # this GPU never fills it: stop asking
            else:
                instant_w = value / 1000.0
                ts_us = int(entry.timestamp) or None
        return FastReading(
            sm_mhz=int(sm),
            mem_mhz=int(mem),
            power_w=power_mw / 1000.0,
            temp_c=float(temp),
            reasons=int(reasons),
            power_instant_w=instant_w,
            driver_ts_us=ts_us,
        )

    def read_slow(self, index: int, *, energy: bool = True) -> SlowReading:
        """Energy counter (~3 ms; skipped with energy=False), time under each clock-event
        reason (fields 74-81) and memory temperature (field 82), in one field-value batch
        (0.1-0.2 ms). Never on a hot path."""
        h = self._handle(index)
        energy_mj = (
            self._opt("nvmlDeviceGetTotalEnergyConsumption", h, gpu=index) if energy else None
        )
        reason_ns: dict[str, int] = {}
        mem_temp: float | None = None
        ts_us: int | None = None
        try:
            entries = self._q("nvmlDeviceGetFieldValues", h, list(_SLOW_FIELDS), gpu=index)
        except NotSupported:
            entries = []
        for entry in entries:
            value = _field_value(entry)
            if value is None:
                continue
            ts = int(entry.timestamp)
            if ts and (ts_us is None or ts > ts_us):
                ts_us = ts
            fid = int(entry.fieldId)
            if fid == FI_MEMORY_TEMP:
                mem_temp = float(value) if value else None  # 0: no sensor
            elif fid in FI_PERF_POLICY:
                reason_ns[REASON_COUNTERS[fid - FI_PERF_POLICY[0]]] = int(value)
        return SlowReading(
            energy_mj=int(energy_mj) if energy_mj is not None else None,
            reason_ns=reason_ns,
            mem_temp_c=mem_temp,
            driver_ts_us=ts_us,
        )

    def power_samples(self, index: int, since_us: int = 0) -> list[tuple[int, float]]:
        """The driver's 20 ms power samples newer than `since_us`: [(timestamp_us, watts)].

        The buffer holds ~2.4 s: drain it at least every 2 s, passing the last
        timestamp seen. An empty buffer is [] (NVML says NOT_FOUND).
        """
        h = self._handle(index)
        try:
            result = self._q(
                "nvmlDeviceGetSamples", h, nv.NVML_TOTAL_POWER_SAMPLES, since_us, gpu=index
            )
        except BackendError as err:
            if err.code == _NOT_FOUND:
                return []
            raise
        value_type, samples = result[0], result[-1]  # 2 items in 13.x; older bindings gave 3
        attr = _VALUE_ATTR.get(int(value_type), "uiVal")
        return [(int(s.timeStamp), getattr(s.sampleValue, attr) / 1000.0) for s in samples]

    def mig_parent_index(self, mig_uuid: str) -> int | None:
        """NVML index of the GPU that holds MIG device `mig_uuid` ("MIG-..."), or None."""
        try:
            mig = self._q("nvmlDeviceGetHandleByUUID", mig_uuid)
            parent = self._q("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig)
            return int(self._q("nvmlDeviceGetIndex", parent))
        except BackendError:
            return None

    # -- writes (root) ------------------------------------------------------------
    def set_locked_sm_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lgc min,max`. Accepts CLOCK_LIMIT_TDP / CLOCK_LIMIT_UNLIMITED for both."""
        self._q(
            "nvmlDeviceSetGpuLockedClocks",
            self._handle(index),
            int(min_mhz),
            int(max_mhz),
            gpu=index,
        )

    def reset_locked_sm_clocks(self, index: int) -> None:
        """`nvidia-smi -rgc`."""
        self._q("nvmlDeviceResetGpuLockedClocks", self._handle(index), gpu=index)

    def set_locked_mem_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lmc min,max`."""
        self._q(
            "nvmlDeviceSetMemoryLockedClocks",
            self._handle(index),
            int(min_mhz),
            int(max_mhz),
            gpu=index,
        )

    def reset_locked_mem_clocks(self, index: int) -> None:
        """`nvidia-smi -rmc`."""
        self._q("nvmlDeviceResetMemoryLockedClocks", self._handle(index), gpu=index)

    def set_app_clocks(self, index: int, mem_mhz: int, sm_mhz: int) -> None:
        """`nvidia-smi -ac mem,sm`: deprecated in NVML 13, the fallback without locked clocks."""
        self._q(
            "nvmlDeviceSetApplicationsClocks",
            self._handle(index),
            int(mem_mhz),
            int(sm_mhz),
            gpu=index,
        )

    def reset_app_clocks(self, index: int) -> None:
        """`nvidia-smi -rac`."""
        self._q("nvmlDeviceResetApplicationsClocks", self._handle(index), gpu=index)

    def set_power_limit(self, index: int, watts: float) -> None:
        """`nvidia-smi -pl W`. Checked against the constraints first, and read back after:
        nvidia-ml-py's `_v2` setter ignores the driver's return code, so only the read-back
        proves the limit took."""
        h = self._handle(index)
        limits = self.power_limits(index)
        if not limits.min_w <= watts <= limits.max_w:
            raise InvalidValue(
                f"power limit {watts:g} W is outside {limits.min_w:g}-{limits.max_w:g} W",
                op="set_power_limit",
                gpu=index,
                hint="choose a value in range ('nvidia-smi -q -d POWER')",
            )
        milliwatts = round(watts * 1000)
        self._q("nvmlDeviceSetPowerManagementLimit", h, milliwatts, gpu=index)
        now_mw = self._q("nvmlDeviceGetPowerManagementLimit", h, gpu=index)
        if abs(now_mw - milliwatts) >= 1000:
            raise InvalidValue(
                f"the power limit reads {now_mw / 1000:g} W after setting {watts:g} W",
                op="set_power_limit",
                gpu=index,
                hint="the driver did not apply it; check 'nvidia-smi -q -d POWER'",
            )

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

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NvmlBackend(gpus={self._count})"
