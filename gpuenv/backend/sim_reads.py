"""What the simulated driver answers: static facts and telemetry, as NVML gives them.

Values come from the `GpuModel`'s latched readings, which refresh at driver
updates (every 100 ms; temperature every 200 ms), so a reader sees what NVML
would: the clock of the last update, power as a 1 s average, integer
temperatures, counters as of the last update.
"""

from __future__ import annotations

import hashlib

from gpuenv.backend.base import (
    AppClocks,
    ClockLimits,
    DeviceInfo,
    FastReading,
    GpuProcess,
    MemoryUsage,
    PowerLimits,
    SlowReading,
    Thresholds,
)
from gpuenv.backend.sim_core import SimCore

BACKGROUND_MIB = 2048  # device memory a background process holds


class SimReads(SimCore):
    """The read side of `SimBackend` (nvidia-smi's equivalents in each docstring)."""

    # -- static reads ----------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._gpus)

    def _pci_bus_id(self, index: int) -> str:
        ids = self.profile.pci_bus_ids
        if index < len(ids):
            return ids[index]
        return f"00000000:{(0xC0 + index) % 256:02X}:00.0"

    def device_info(self, index: int) -> DeviceInfo:
        """`nvidia-smi -L`: index, UUID, PCI bus id, name, compute capability, MIG mode."""
        with self._lock:
            self._get(index, "device_info")
            p = self.profile
            serial = str(
                1652221000000
                + (int(hashlib.sha256(self._uuid(index).encode()).hexdigest(), 16) % 10**6)
            )
            return DeviceInfo(
                index=index,
                uuid=self._uuid(index),
                pci_bus_id=self._pci_bus_id(index),
                name=p.gpu_name,
                compute_capability=p.compute_capability,
                mig_mode=False if p.mig_capable else None,
                memory_total_mib=p.memory_total_mib,
                serial=serial,
            )

    def driver_version(self) -> str:
        return self.profile.driver_version

    def nvml_version(self) -> str:
        """NVML's own version, as the profile's driver would report it ("13.580.159.04")."""
        major = 13 if int(self.profile.driver_version.split(".")[0]) >= 580 else 12
        return f"{major}.{self.profile.driver_version}"

    def clock_limits(self, index: int) -> ClockLimits:
        """`nvidia-smi -q -d CLOCK,SUPPORTED_CLOCKS`.

        `base_sm_mhz` is None, as from the real backend (NVML has no getter for it);
        the simulated driver still knows it: (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP) locks
        to the profile's base clock (1590 MHz on the h100).
        """
        with self._lock:
            self._get(index, "clock_limits")
            p = self.profile
            return ClockLimits(
                max_sm_mhz=p.max_sm_mhz,
                max_mem_mhz=p.max_mem_mhz,
                default_app_sm_mhz=p.default_app_sm_mhz,
                default_app_mem_mhz=p.default_app_mem_mhz,
                base_sm_mhz=None,
                supported_mem_mhz=p.mem_clocks_mhz,
                supported_sm_mhz=dict.fromkeys(p.mem_clocks_mhz, p.sm_clocks_mhz),
                locked_clocks_supported=p.locked_clocks_supported,
                locked_mem_supported=p.locked_mem_supported,
            )

    def app_clocks(self, index: int) -> AppClocks:
        with self._lock:
            s = self._get(index, "app_clocks").settings
            return AppClocks(sm_mhz=s.app_sm, mem_mhz=s.app_mem)

    def power_limits(self, index: int) -> PowerLimits:
        with self._lock:
            s = self._get(index, "power_limits").settings
            p = self.profile
            return PowerLimits(
                limit_w=s.power_limit_w,
                default_w=p.power_default_w,
                min_w=p.power_min_w,
                max_w=p.power_max_w,
            )

    def thresholds(self, index: int) -> Thresholds:
        with self._lock:
            self._get(index, "thresholds")
            p = self.profile
            return Thresholds(
                slowdown_c=p.slowdown_c,
                shutdown_c=p.shutdown_c,
                gpu_max_c=p.gpu_max_c,
                mem_max_c=p.mem_max_c,
            )

    def supported_reasons(self, index: int) -> int:
        with self._lock:
            self._get(index, "supported_reasons")
            return self.profile.supported_reasons

    def performance_state(self, index: int) -> int:
        """P0 while a context or load is on the GPU, else the profile's idle P-state."""
        with self._lock:
            g = self._get(index, "performance_state")
            return 0 if g.contexts or g.background else self.profile.idle_pstate

    def persistence_mode(self, index: int) -> bool | None:
        with self._lock:
            return self._get(index, "persistence_mode").settings.persistence

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute processes: this backend's contexts and background loads (one entry per pid).

        SM shares are the model's: a background load's own utilization, the rest of
        the last second's busy time to this process's context (its work); a
        background load is named, as it stands for no process of this host.
        """
        with self._lock:
            g = self._get(index, "processes")
            bg_busy = sum(g.background.values())
            mine = max(0, round(100 * (g.r_util - min(bg_busy, 1.0))))
            procs = {
                pid: GpuProcess(
                    pid, self.profile.context_mib, "compute", sm_pct=mine if pid == self._pid else 0
                )
                for pid in g.contexts
            }
            for pid, util in g.background.items():
                procs[pid] = GpuProcess(
                    pid,
                    BACKGROUND_MIB,
                    "compute",
                    sm_pct=round(100 * util),
                    user="sim",
                    command=f"(simulated) another process, {util:.0%} busy",
                )
            return list(procs.values())

    def memory(self, index: int) -> MemoryUsage | None:
        """`nvidia-smi --query-gpu=memory.used,memory.total`: what the processes hold."""
        used = sum(p.used_memory_mib or 0 for p in self.processes(index))
        with self._lock:
            self._get(index, "memory")
            return MemoryUsage(used_mib=used, total_mib=self.profile.memory_total_mib)

    def utilization(self, index: int) -> tuple[int, int] | None:
        """(GPU %, memory %) over the last second of busy time."""
        with self._lock:
            g = self._get(index, "utilization")
            gpu = round(100 * g.r_util)
            return gpu, round(gpu * 0.3)

    # -- telemetry -------------------------------------------------------------------
    def _driver_ts_us(self, t_ns: int) -> int:
        return round((self.clock.wall() - (self._now_ns() - t_ns) * 1e-9) * 1e6)

    def read_fast(self, index: int) -> FastReading:
        """`nvidia-smi dmon -s pc`: values as the driver last refreshed them (every 100 ms)."""
        with self._lock:
            g = self._get(index, "read_fast")
            return FastReading(
                sm_mhz=g.r_sm,
                mem_mhz=g.r_mem,
                power_w=round(g.r_power_avg, 3),
                temp_c=float(g.r_temp),
                reasons=g.r_reasons,
                power_instant_w=round(g.r_power_instant, 3),
                driver_ts_us=self._driver_ts_us(g.r_ts_ns),
            )

    def read_slow(self, index: int, *, energy: bool = True) -> SlowReading:
        """Energy (mJ; None with energy=False) and time under each reason (ns), as of the
        last driver update."""
        with self._lock:
            g = self._get(index, "read_slow")
            off = self.profile.mem_temp_offset_c
            return SlowReading(
                energy_mj=g.r_energy_mj if energy else None,
                reason_ns=dict(g.r_reason_ns),
                mem_temp_c=float(g.r_temp + round(off)) if off is not None else None,
                driver_ts_us=self._driver_ts_us(g.r_ts_ns),
            )

    def power_samples(self, index: int, since_us: int = 0) -> list[tuple[int, float]]:
        """The driver's 20 ms power samples newer than `since_us`: [(timestamp_us, watts)].

        As `nvmlDeviceGetSamples(TOTAL_POWER)` (the buffer holds ~2.4 s); [] when empty.
        """
        with self._lock:
            g = self._get(index, "power_samples")
            out = []
            for t_ns, watts in g.power_samples:
                ts = self._driver_ts_us(t_ns)
                if ts > since_us:
                    out.append((ts, round(watts, 3)))
            return out

    def mig_parent_index(self, mig_uuid: str) -> int | None:
        """None: the simulated GPUs have no MIG devices (MIG mode is off or absent)."""
        return None


__all__ = ["BACKGROUND_MIB", "SimReads"]
