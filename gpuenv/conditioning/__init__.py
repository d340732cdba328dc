"""Conditioning: put the GPU in a known state before (and while) measuring. One config.

Two states a GPU that cannot be locked can still be measured in, the same way twice:

  burst ("cool and uncapped"): before a measurement, and between short bursts of
    reps, wait until the GPU is back in the state a rested GPU is in: no reason
    holding the clock down (`reasons.HELD_DOWN`: power cap, thermal slowdown, HW
    slowdown, power brake) in the two newest samples taken one driver refresh
    after the last work, the SM clock at its maximum (or inside a lock) unless the
    GPU idles, and (before a measurement, when the idle temperature is known) the
    temperature within a margin of it. The wait is on the GPU's own readings, never
    timed: on an H100 the power cap clears within ~0.5 s of the load stopping, on an
    H200 within 5 s (measured: docs/explanation/what-gpus-do.md).
  sustained ("equilibrium"): run the work back to back until what is measured
    stops drifting. A GPU approaching equilibrium relaxes roughly exponentially
    with a thermal time constant tau, so what is still to come is about tau x the
    present rate of change; the signal is the time per call where the work is
    timed (else the inverse of the median SM clock), and the temperature must
    settle too (leakage lowers a capped clock as the chip heats).

`gpuenv.session` (stable()) and `gpuenv.timing` (bench) both condition through
this package: one `Conditioner` (conditioner.py) decides what a measurement waits for,
for the GPUs it is given, holds the knobs (`ConditionConfig`, config.py) and owns what
was learned (`Memory`, memory.py): a session owns one, a bench outside a session makes one
over the process's memory. burst.py waits and schedules bursts, sustained.py
preconditions to equilibrium, temperature.py learns how far a kernel's time moves with
the temperature (how long a session waits for the chip to cool).
"""

from gpuenv.conditioning.burst import (
    MAX_CLOCK_REDOS,
    Bursts,
    burst_rest_s,
    recovered,
    wait_until_ready,
)
from gpuenv.conditioning.conditioner import Conditioner, Wait
from gpuenv.conditioning.config import CONDITIONS, DEFAULT, Condition, ConditionConfig
from gpuenv.conditioning.memory import Memory, process_memory
from gpuenv.conditioning.sustained import fit_slope, precondition, residual
from gpuenv.conditioning.temperature import Sensitivity
from gpuenv.phases import Conditioning

__all__ = [
    "CONDITIONS",
    "DEFAULT",
    "MAX_CLOCK_REDOS",
    "Bursts",
    "Condition",
    "ConditionConfig",
    "Conditioner",
    "Conditioning",
    "Memory",
    "Sensitivity",
    "Wait",
    "burst_rest_s",
    "fit_slope",
    "precondition",
    "process_memory",
    "recovered",
    "residual",
    "wait_until_ready",
]
