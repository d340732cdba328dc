"""NVML telemetry: the cheap values for every sampler tick, the counters for region edges.

`nvmlDeviceGetPowerUsage` is a 1 s average, the instantaneous power is field
186; the energy counter costs ~3 ms and is read only by `read_slow`;
`nvmlDeviceGetSamples` returns two items in nvidia-ml-py 13.
"""

from __future__ import annotations

import pynvml as nv

from gpuenv.backend.base import REASON_COUNTERS, FastReading, SlowReading
from gpuenv.backend.nvml_base import NvmlCore
from gpuenv.backend.nvml_errors import INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED
from gpuenv.backend.nvml_fields import (
    FI_MEMORY_TEMP,
    FI_PERF_POLICY,
    FI_POWER_INSTANT,
    SLOW_FIELDS,
    VALUE_ATTR,
    field_value,
)
from gpuenv.errors import BackendError, NotSupported


class NvmlTelemetry(NvmlCore):
    """The telemetry reads of `NvmlBackend`."""

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
            value = field_value(entry) if entry is not None else None
            if value is None:
                if entry is None or entry.nvmlReturn in (NOT_SUPPORTED, INVALID_ARGUMENT):
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
            entries = self._q("nvmlDeviceGetFieldValues", h, list(SLOW_FIELDS), gpu=index)
        except NotSupported:
            entries = []
        for entry in entries:
            value = field_value(entry)
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
            if err.code == NOT_FOUND:
                return []
            raise
        value_type, samples = result[0], result[-1]  # 2 items in 13.x; older bindings gave 3
        attr = VALUE_ATTR.get(int(value_type), "uiVal")
        return [(int(s.timeStamp), getattr(s.sampleValue, attr) / 1000.0) for s in samples]


__all__ = ["NvmlTelemetry"]
