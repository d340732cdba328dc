"""A moving simulated GPU, for demos: `SimScenario` drives the simulated GPU in the
background so the monitor shows ramps, caps and recoveries."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpuenv.errors import GpuenvError

SCENARIOS: dict[str, str] = {
    "idle": "a CUDA context and no work: the clock boosts to its maximum",
    "load": "sustained heavy matmuls: the power cap engages and the chip heats",
    "bursts": "8 s of heavy work, 6 s idle, repeated: ramps, caps and recoveries",
    "shared": "a second process keeps the GPU 60% busy beside light work of ours",
    "none": "no work of its own: watch what other processes run on the simulated GPU",
}
DEFAULT = "bursts"  # the live view's, when no process of the host runs anything on the GPUs


def choose(
    scenario: str | None, sim: Any, gpus: Sequence[int], *, live: bool
) -> tuple[str | None, str]:
    """The scenario a monitor of the simulated GPU runs (None: none) and what its header
    says about it.

    Asked for none, the live view shows work moving all the same: the other processes'
    when some run on these GPUs (a `gpuenv run`, a benchmark, another monitor's scenario),
    else `DEFAULT`'s, named on screen with how to change it. A snapshot or a stream runs
    nothing it was not asked for: it reports the GPU as it is.
    """
    if scenario == "none" or (scenario is None and not live):
        return None, "SIMULATED GPU"
    if scenario is not None:
        return scenario, f"SIMULATED GPU - scenario {scenario}"
    if any(sim.processes(i) for i in gpus):
        return None, "SIMULATED GPU - the work other processes run (--scenario adds ours)"
    return DEFAULT, (
        f"SIMULATED GPU - scenario {DEFAULT}, the default while nothing else runs "
        "(--scenario none: only watch)"
    )


class SimScenario:
    """Drives simulated GPUs in the background, in real time, so the monitor shows them move.

    Only for the simulated backend: the header says SIMULATED and names the scenario.
    """

    def __init__(self, sim: Any, gpus: Sequence[int], name: str):
        if name not in SCENARIOS or name == "none":
            from gpuenv.errors import ConfigError

            raise ConfigError(
                f"unknown scenario {name!r}", hint=f"use one of {', '.join(SCENARIOS)}"
            )
        self.sim = sim
        self.gpus = list(gpus)
        self.name = name
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in self.gpus:
            th = threading.Thread(
                target=self._drive, args=(i,), name=f"gpuenv-sim-{self.name}-{i}", daemon=True
            )
            th.start()
            self._threads.append(th)

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=2)
        for i in self.gpus:
            with contextlib.suppress(Exception):
                if self.name == "shared":
                    self.sim.set_background_load(i, 0.0)
                self.sim.close_context(i)

    def _work(self, i: int, seconds: float, intensity: float) -> None:
        """About `seconds` of work in small chunks, so stop() is prompt."""
        end = time.monotonic() + seconds
        max_hz = self.sim.clock_limits(i).max_sm_mhz * 1e6
        while not self._stop.is_set() and time.monotonic() < end:
            self.sim.run_work(i, 0.1 * max_hz, power_intensity=intensity)

    def _drive(self, i: int) -> None:
        try:
            self.sim.open_context(i)
            if self.name == "shared":
                self.sim.set_background_load(i, 0.6)
            while not self._stop.is_set():
                if self.name == "idle":
                    self._stop.wait(1.0)
                elif self.name == "load":
                    self._work(i, 3600.0, 1.0)
                elif self.name == "bursts":
                    self._work(i, 8.0, 1.0)
                    self._stop.wait(6.0)
                elif self.name == "shared":
                    self._work(i, 3600.0, 0.3)
        except GpuenvError as err:  # a fault injected in the sim ends the scenario, visibly
            print(f"gpuenv: scenario {self.name} stopped on GPU {i}: {err}", file=sys.stderr)


__all__ = ["DEFAULT", "SCENARIOS", "SimScenario", "choose"]
