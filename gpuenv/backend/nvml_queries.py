"""What NVML says about a GPU that changes slowly or not at all: identity, limits, processes.

Each method names its `nvidia-smi` equivalent. Values that cannot change while
the driver runs (identity, supported clocks, thresholds) are cached.
"""

from __future__ import annotations

import pynvml as nv

from gpuenv.backend.base import (
    AppClocks,
    ClockLimits,
    DeviceInfo,
    GpuProcess,
    MemoryUsage,
    PowerLimits,
    Thresholds,
)
from gpuenv.backend.nvml_base import NvmlCore, text
from gpuenv.errors import BackendError, NotSupported


class NvmlQueries(NvmlCore):
    """Static and slow-changing reads of `NvmlBackend`."""

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
            uuid=text(self._q("nvmlDeviceGetUUID", h, gpu=index)),
            pci_bus_id=text(pci.busId),
            name=text(self._q("nvmlDeviceGetName", h, gpu=index)),
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            mig_mode=bool(mig[0]) if mig is not None else None,
            memory_total_mib=int(mem.total) // (1024 * 1024) if mem is not None else None,
            serial=text(serial) if serial else None,
        )
        self._info[index] = info
        return info

    def driver_version(self) -> str:
        """`nvidia-smi --query-gpu=driver_version`."""
        return text(self._q("nvmlSystemGetDriverVersion"))

    def nvml_version(self) -> str:
        """NVML's own version ("13.580.159.04")."""
        return text(self._q("nvmlSystemGetNVMLVersion"))

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
            default_app_sm_mhz=self._app_clock(index, nv.NVML_CLOCK_GRAPHICS, default=True),
            default_app_mem_mhz=self._app_clock(index, nv.NVML_CLOCK_MEM, default=True),
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

    def app_clocks(self, index: int) -> AppClocks:
        """`nvidia-smi -q -d CLOCK`, 'Applications Clocks' (graphics and memory)."""
        return AppClocks(
            sm_mhz=self._app_clock(index, nv.NVML_CLOCK_GRAPHICS),
            mem_mhz=self._app_clock(index, nv.NVML_CLOCK_MEM),
        )

    def _app_clock(self, index: int, clock_type: int, *, default: bool = False) -> int | None:
        """The application clock (the default one with `default`): its own NVML getter, else
        nvmlDeviceGetClock, which newer drivers keep when they drop the getter."""
        getter, clock_id = (
            ("nvmlDeviceGetDefaultApplicationsClock", nv.NVML_CLOCK_ID_APP_CLOCK_DEFAULT)
            if default
            else ("nvmlDeviceGetApplicationsClock", nv.NVML_CLOCK_ID_APP_CLOCK_TARGET)
        )
        h = self._handle(index)
        try:
            return int(self._q(getter, h, clock_type, gpu=index))
        except NotSupported:
            pass
        value = self._opt("nvmlDeviceGetClock", h, clock_type, clock_id, gpu=index)
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

    def performance_state(self, index: int) -> int:
        """`nvidia-smi --query-gpu=pstate` (P0 even at the idle clock on an H100 kept
        persistent: a P-state is not a clock)."""
        return int(self._q("nvmlDeviceGetPerformanceState", self._handle(index), gpu=index))

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

    def memory(self, index: int) -> MemoryUsage | None:
        """`nvidia-smi --query-gpu=memory.used,memory.total` (MiB); None where not supported.

        Through nvmlDeviceGetMemoryInfo_v2 where the driver has it: its `used` leaves out the
        memory the driver reserves, as nvidia-smi's and nvitop's do (v1's counts it in)."""
        handle = self._handle(index)
        v2 = getattr(nv, "nvmlMemory_v2", None)
        mem = None
        if v2 is not None and self._chosen.get("memory") != "v1":
            mem = self._opt("nvmlDeviceGetMemoryInfo", handle, v2, gpu=index)
            if mem is None:  # this driver has no v2: ask v1 alone from now on (the monitor's
                self._chosen["memory"] = "v1"  # every tick would otherwise ask twice)
        if mem is None:
            mem = self._opt("nvmlDeviceGetMemoryInfo", handle, gpu=index)
        if mem is None:
            return None
        return MemoryUsage(int(mem.used) // (1024 * 1024), int(mem.total) // (1024 * 1024))

    def mig_parent_index(self, mig_uuid: str) -> int | None:
        """NVML index of the GPU that holds MIG device `mig_uuid` ("MIG-..."), or None."""
        try:
            mig = self._q("nvmlDeviceGetHandleByUUID", mig_uuid)
            parent = self._q("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig)
            return int(self._q("nvmlDeviceGetIndex", parent))
        except BackendError:
            return None


__all__ = ["NvmlQueries"]
