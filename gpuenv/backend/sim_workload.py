"""The synthetic workload of the simulated GPU: contexts, work, other processes, the room.

There is no CUDA behind a simulated GPU, so what runs on it is described by its
effect: `run_work` runs cycles at the simulated, time-varying clocks (advancing
a virtual clock, or sleeping on the real one) and heats the chip;
`set_background_load` stands for another process; `set_ambient` for a hot aisle.
This is the backend's `workload` (the `Workload` protocol of `gpuenv.backend.base`).
"""

from __future__ import annotations

import math

from gpuenv.backend.base import MemorySystem
from gpuenv.backend.nvml_codes import GPU_IS_LOST
from gpuenv.backend.sim_core import SimCore
from gpuenv.backend.sim_gpu import GpuModel, Job
from gpuenv.backend.sim_host import LEASE_NS
from gpuenv.errors import ConfigError, GpuLost


class SimWorkload(SimCore):
    """The synthetic workload side of `SimBackend`."""

    def _workload_gpu(self, index: int, op: str, *, share: bool = True) -> GpuModel:
        return self._get(index, op, share=share)

    def memory_system(self, index: int) -> MemorySystem:
        """The profile's L2 and memory bus, as CUDA reports them on that GPU."""
        with self._lock:
            self._workload_gpu(index, "memory_system")
            return MemorySystem(self.profile.l2_bytes, self.profile.mem_bus_bits)

    def open_context(self, index: int, pid: int | None = None) -> None:
        """A CUDA context appears (idle 345 -> boost at the next driver update)."""
        with self._lock:
            g = self._workload_gpu(index, "open_context")
            g.open_context(self._pid if pid is None else int(pid))
            self._presence_changed(index)

    def close_context(self, index: int, pid: int | None = None) -> None:
        """The context of `pid` (default: this process) ends."""
        with self._lock:
            g = self._workload_gpu(index, "close_context")
            pid = self._pid if pid is None else int(pid)
            if pid not in g.contexts:
                raise ConfigError(
                    f"process {pid} has no context open", gpu=index, hint="call open_context first"
                )
            g.contexts.remove(pid)
            g.load_changed()
            self._presence_changed(index)

    def set_background_load(
        self, index: int, utilization: float, *, pid: int | None = None
    ) -> None:
        """Another process keeps the GPU `utilization` (0-1) busy; 0 makes it leave. Its
        kernels time-slice with this process's; under this process's own pid the load is its
        own (it draws power and heats, and takes none of this process's SM time)."""
        if not 0.0 <= utilization <= 1.0:
            raise ConfigError(
                f"background utilization {utilization!r} is out of range", hint="use 0.0 to 1.0"
            )
        with self._lock:
            g = self._workload_gpu(index, "set_background_load")
            pid = (400_000 + index) if pid is None else int(pid)
            if utilization > 0:
                if pid not in g.background:
                    g.applied_app_sm, g.applied_app_mem = g.settings.app_sm, g.settings.app_mem
                g.background[pid] = float(utilization)
            else:
                g.background.pop(pid, None)
            g.load_changed()
            self._presence_changed(index)

    def run_work(
        self, index: int, cycles: float, *, power_intensity: float = 1.0, mem_cycles: float = 0.0
    ) -> float:
        """Run `cycles` SM cycles (+ `mem_cycles` memory cycles) of work; return seconds taken.

        The work runs at the simulated, time-varying clocks: time = cycles / SM clock +
        mem_cycles / memory clock, integrated as the clocks change. A virtual clock is
        advanced (firing its callbacks on the way); the real one is slept on. Opens a
        context for this process first if it has none (and leaves it open, as CUDA does).
        `power_intensity` 1.0 is a heavy bf16 matmul (meets the 700 W cap on an H100);
        ~0.2 a light memory-bound kernel.
        """
        for name, value in (("cycles", cycles), ("mem_cycles", mem_cycles)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r} must be a finite number >= 0")
        if not 0.0 <= power_intensity <= 2.0:
            raise ConfigError(
                f"power_intensity={power_intensity!r} is out of range", hint="use 0.0 to 2.0"
            )
        with self._lock:
            # The running GPU other processes wrote is taken over once the kernel runs, not
            # before it starts: the exchange costs most of a millisecond of real time, which
            # would otherwise lengthen some steps and not others (a 2-3% bimodal step).
            g = self._workload_gpu(index, "run_work", share=False)
            if g.job is not None:
                raise ConfigError(
                    "work is already running on this GPU in this SimBackend",
                    gpu=index,
                    hint="run work from one thread at a time",
                )
            if self._pid not in g.contexts:
                g.open_context(self._pid)
                self._presence_changed(index)
            if cycles == 0 and mem_cycles == 0:
                return 0.0
            start_ns = g.t_ns
            g.job = Job(float(cycles), float(mem_cycles), float(power_intensity))
            g.load_changed()
            self._renew_lease(index, float(power_intensity))
        while True:
            with self._lock:
                # our kernel's progress first: its end is not delayed by the exchange below
                g.advance(self._now_ns())
                if g.job is None:
                    break
                self._sync()
                g.advance(self._now_ns())
                if g.job is None:
                    break
                if g.lost:
                    g.job = None
                    g.load_changed()
                    raise GpuLost(
                        f"GPU is lost: {g.lost}",
                        op="run_work",
                        gpu=index,
                        code=GPU_IS_LOST,
                    )
                wait_ns = min(g.job_ns_left(), g.ns_to_update())
            self.clock.sleep(wait_ns * 1e-9)
        return (g.job_end_ns - start_ns) * 1e-9

    def _renew_lease(self, index: int, intensity: float) -> None:
        """Other processes see our kernels as a load until the lease ends; renewed halfway,
        so back-to-back kernels cost a shared-state write twice a second, not one each."""
        if not self._shares_physics:
            return
        now = self._now_ns()
        work, until = self._lease.get(index, (0.0, None))
        left = (until - now) if until is not None else 0
        if left > LEASE_NS // 2 and work >= intensity:
            return
        live = left > 0
        self._lease[index] = (max(intensity, work if live else 0.0), now + LEASE_NS)
        self._presence_changed(index)

    def idle(self, seconds: float) -> None:
        """Let `seconds` pass with no work from this backend (virtual clock: advance it)."""
        if seconds < 0:
            raise ConfigError(f"cannot idle for {seconds!r} s", hint="use a duration >= 0")
        self.clock.sleep(seconds)
        with self._lock:
            self._sync()
            now = self._now_ns()
            for g in self._gpus:
                g.advance(now)

    def set_ambient(self, index: int, celsius: float) -> None:
        """Change the air the GPU's cooler sees (a hot aisle, a failed fan): a simulator helper.

        Hot enough, the driver's SW thermal slowdown cannot hold the max operating
        temperature, HW slowdown (0x40 | 0x8) follows at the slowdown threshold, and at
        the shutdown temperature the GPU is lost, as a real one shuts itself down.
        """
        if not -20.0 <= celsius <= 120.0:
            raise ConfigError(f"ambient {celsius!r} C is not plausible", hint="use -20 to 120 C")
        with self._lock:
            g = self._get(index, "set_ambient")
            g.ambient_c = float(celsius)
            g.load_changed()


__all__ = ["SimWorkload"]
