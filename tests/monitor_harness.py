"""Helpers for the tests of gpuenv monitor on the simulated GPU, in virtual time."""

from __future__ import annotations

from gpuenv.backend.sim import SimBackend
from gpuenv.monitor import GpuView, MonitorModel

MAX = 1980e6  # cycles a second at the H100's top clock


def tick(
    model: MonitorModel, sim: SimBackend, seconds: float = 1.0, *, work: bool = False
) -> list[GpuView]:
    """`seconds` of work on GPU 0 (or of idling), then the model's next views."""
    if work:
        sim.run_work(0, seconds * MAX * 0.7, power_intensity=1.0)
    else:
        sim.idle(seconds)
    return model.update()
