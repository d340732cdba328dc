"""The synthetic workload of the simulated GPU: contexts, work, other processes, the room.

There is no CUDA behind a simulated GPU, so what runs on it is described by its
effect: `run_work` runs cycles at the simulated, time-varying clocks (advancing
a virtual clock, or sleeping on the real one) and heats the chip;
`set_background_load` stands for another process; `set_ambient` for a hot aisle.
This is the backend's `workload` (the `Workload` protocol of `gpuenv.backend.base`).
"""

from __future__ import annotations

import math

from gpuenv.backend.nvml_codes import GPU_IS_LOST
from gpuenv.backend.sim_core import SimCore
from gpuenv.backend.sim_gpu import GpuModel, Job
from gpuenv.errors import ConfigError, GpuLost

# how this process's work shows to the other processes of the simulated machine (the state
# file): its utilization over at least PUBLISH_S, written as a job ends (one write per
# PUBLISH_S at most, however short the kernels), or at the start of a job that long; it
# weighs on their model of the GPU until HOLD_S after it was written, or the job's end
PUBLISH_S = 0.1
HOLD_S = 0.3


class SimWorkload(SimCore):
    """The synthetic workload side of `SimBackend`."""

    def _workload_gpu(self, index: int, op: str) -> GpuModel:
        return self._get(index, op)

    def open_context(self, index: int, pid: int | None = None) -> None:
        """A CUDA context appears (idle 345 -> boost at the next driver update)."""
        with self._lock:
            g = self._workload_gpu(index, "open_context")
            g.open_context(self._pid if pid is None else int(pid))

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

    def set_background_load(
        self, index: int, utilization: float, *, pid: int | None = None
    ) -> None:
        """Another process keeps the GPU `utilization` (0-1) busy; 0 makes it leave."""
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
                g.active_here = True
            else:
                g.background.pop(pid, None)
            g.load_changed()

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
            g = self._workload_gpu(index, "run_work")
            if g.job is not None:
                raise ConfigError(
                    "work is already running on this GPU in this SimBackend",
                    gpu=index,
                    hint="run work from one thread at a time",
                )
            if self._pid not in g.contexts:
                g.open_context(self._pid)
            if cycles == 0 and mem_cycles == 0:
                return 0.0
            start_ns = g.t_ns
            g.job = Job(float(cycles), float(mem_cycles), float(power_intensity))
            g.active_here = True
            g.load_changed()
            expect_s = cycles / (g.sm_mhz * 1e6) + mem_cycles / (g.mem_mhz * 1e6)
            if expect_s >= PUBLISH_S:
                self._publish_work(index, power_intensity, expect_s + HOLD_S)
        while True:
            with self._lock:
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
        seconds = (g.job_end_ns - start_ns) * 1e-9
        self._account_work(index, seconds * power_intensity)
        self._save_thermal()
        return seconds

    def _account_work(self, index: int, weighted_s: float) -> None:
        """Add a finished job to this GPU's account; publish its utilization once PUBLISH_S
        has passed since the last time (a state-file write: not one per tiny kernel)."""
        if self._state is None:
            return
        now = self.clock.now()
        since, done = self._work_account.get(index, (now, 0.0))
        done += weighted_s
        if now - since < PUBLISH_S:
            self._work_account[index] = (since, done)
            return
        self._work_account[index] = (now, 0.0)
        self._publish_work(index, min(done / (now - since), 1.0), HOLD_S)

    def _publish_work(self, index: int, utilization: float, hold_s: float) -> None:
        """Show this process's work on a GPU to the others (their model of it carries the
        load: power, clock, cap), as a real driver shows every process's kernels."""
        if self._state is None:
            return
        self._published[index] = (utilization, self.clock.now() + hold_s)
        self._thermal_saved_at = self.clock.now()
        with self._state.locked():
            self._rewrite_state()

    def idle(self, seconds: float) -> None:
        """Let `seconds` pass with no work from this backend (virtual clock: advance it)."""
        if seconds < 0:
            raise ConfigError(f"cannot idle for {seconds!r} s", hint="use a duration >= 0")
        self.clock.sleep(seconds)
        with self._lock:
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
