"""`gpuenv demo`: why the same kernel, measured twice, gives two different numbers.

tour.py      the two tours people watch: sim_tour (simulated GPU, virtual time)
             and real_tour (a real GPU, read-only)
measure.py   the measurements behind them: one kernel, cold and hot, several ways
"""

from __future__ import annotations

from gpuenv.demo.tour import (
    KERNEL_MEM_CYCLES,
    KERNEL_SM_CYCLES,
    REAL_LOAD_S,
    REAL_REST_S,
    SIM_LOAD_S,
    SIM_REST_S,
    real_tour,
    sim_tour,
)

__all__ = [
    "KERNEL_MEM_CYCLES",
    "KERNEL_SM_CYCLES",
    "REAL_LOAD_S",
    "REAL_REST_S",
    "SIM_LOAD_S",
    "SIM_REST_S",
    "real_tour",
    "sim_tour",
]
