"""Loads for tests of the simulated GPU."""

from __future__ import annotations

from gpuenv.backend.sim import SimBackend

# One 8192^3 bf16 matmul on an H100: 1.37 ms at 1980 MHz, about half of it not SM-clock bound
# (an H100: 1.57 ms in the first 5 s under the cap, 1.62 ms after 25 s).
MATMUL = {"cycles": 1.3085e6, "mem_cycles": 1.857e6}


def heavy(sim: SimBackend, seconds: float, index: int = 0) -> list[tuple[float, float, int]]:
    """Sustained matmuls for `seconds`; (time since start, matmul seconds, SM clock read) each."""
    start = sim.clock.now()
    out = []
    while sim.clock.now() - start < seconds:
        dt = sim.run_work(index, **MATMUL)
        out.append((sim.clock.now() - start, dt, sim.read_fast(index).sm_mhz))
    return out
