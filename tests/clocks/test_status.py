"""Does the lock hold (gpuenv/clocks/status.py)."""

from __future__ import annotations

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import (
    local_lock as lock,
)
from gpuenv.clocks import (
    lock_status,
)
from gpuenv.clocks.journal import Journal
from gpuenv.timebase import VirtualClock

# -- does it hold? -----------------------------------------------------------------------------


def test_lock_status_says_when_the_power_cap_pulls_below_the_lock(journal: Journal) -> None:
    sim = SimBackend(n_gpus=1, clock=VirtualClock())
    assert lock_status(sim, 0, journal).locked is None  # no gpuenv lock; NVML cannot tell more
    with lock("max", power_limit_w=300, backend=sim, journal=journal) as lk:
        for _ in range(20):
            sim.run_work(0, 2e8, power_intensity=1.0)  # a heavy load meets the 300 W cap
        st = lock_status(sim, 0, journal)
        assert st.locked and st.range == (1980, 1980) and st.holds is False
        assert "power cap" in (st.reason_if_not_held or "")
        assert lk.holds() == {0: False}
        assert "NOT held" in st.describe() and f"pid {lk.owner.pid}" in st.describe()
    with lock(900, backend=sim, journal=journal) as lk:
        sim.run_work(0, 2e8, power_intensity=1.0)
        assert lk.holds() == {0: True} and lock_status(sim, 0, journal).holds is True


def test_one_answer_to_does_the_lock_hold() -> None:
    """Both sides count, within one tolerance that the sampler and the judge share."""
    import inspect

    from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ, lock_holds
    from gpuenv.telemetry import Sampler, summarize
    from gpuenv.verdict import VerdictConfig

    assert lock_holds(1349, (1350, 1350)) and lock_holds(1351, (1350, 1350))
    assert not lock_holds(1348, (1350, 1350))  # held down below the lock
    assert not lock_holds(1500, (1200, 1350))  # above: the lock is not in force
    assert lock_holds(1300, (1350, 1350), tolerance_mhz=50)
    for fn in (Sampler, summarize):
        default = inspect.signature(fn).parameters["lock_tolerance_mhz"].default
        assert default == LOCK_TOLERANCE_MHZ
    assert VerdictConfig().lock_tolerance_mhz == LOCK_TOLERANCE_MHZ


def test_a_clock_locked_outside_gpuenv_looks_pinned(sim: SimBackend) -> None:
    from gpuenv.clocks.status import looks_pinned

    assert looks_pinned(sim, 0) is None  # idle at the lowest clock: not locked
    sim.set_locked_sm_clocks(0, 1350, 1350)  # as 'nvidia-smi -lgc 1350', or a lost journal
    why = looks_pinned(sim, 0)
    assert why is not None and "1350 MHz" in why and "restore --defaults" in why
    sim.reset_locked_sm_clocks(0)
    assert looks_pinned(sim, 0) is None
