"""Helpers shared by the tests of gpuenv/clocks/."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Owner, process_start_time

H100 = "GPU 0 (NVIDIA H100 80GB HBM3)"


def settings(sim: SimBackend, index: int = 0) -> tuple[object, ...]:
    t = sim.truth(index)
    return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w, t.persistence)


def all_settings(sim: SimBackend) -> list[tuple[object, ...]]:
    return [settings(sim, i) for i in range(sim.device_count())]


def dead_owner(kind: str = "process") -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(proc.pid)
    proc.wait()
    return replace(
        Owner.current(kind=kind, command="python crashed.py"), pid=proc.pid, pid_start=start
    )
