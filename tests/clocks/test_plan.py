"""Planning a lock (gpuenv/clocks/plan.py): validation, snapping, named targets; reads only."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv import clocks
from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import (
    LockRequest,
    lock_status,
    plan_lock,
    read_state,
    save_calibration,
)
from gpuenv.clocks import (
    local_lock as lock,
)
from gpuenv.clocks.journal import Journal
from gpuenv.clocks.plan import _sm_clocks
from gpuenv.errors import (
    ConfigError,
    NotSupported,
    ReadOnlyError,
)
from gpuenv.timebase import VirtualClock

from .helpers import H100, all_settings, settings

# -- reading and planning ----------------------------------------------------------------------


def test_read_state_is_honest_about_locked_clocks(sim: SimBackend, journal: Journal) -> None:
    st = read_state(sim, 0, journal=journal)
    assert st.uuid == sim.device_info(0).uuid
    assert (st.app_sm_mhz, st.app_mem_mhz, st.power_limit_w, st.persistence) == (
        1980,
        2619,
        700.0,
        True,
    )
    assert st.locked_sm is None and not st.locked_known  # NVML has no getter, no journal says
    with lock(1350, backend=sim, journal=journal):
        st = read_state(sim, 0, journal=journal)
        assert st.locked_sm == (1350, 1350) and st.locked_known


def test_out_of_range_names_the_valid_range(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(ConfigError) as err:
        lock(99999, backend=sim, journal=journal)
    assert f"{H100} supports 345-1980 MHz in 15 MHz steps" in str(err.value)
    with pytest.raises(ConfigError, match="345-1980 MHz"):
        lock(100, backend=sim, journal=journal)
    assert journal.entries() == [] and settings(sim)[0] is None


def test_snaps_to_supported_clock_and_says_so(sim: SimBackend, journal: Journal) -> None:
    with lock(1352, backend=sim, journal=journal, gpus=0) as lk:
        assert sim.truth(0).locked_sm == (1350, 1350)
        assert any("1352 MHz is not a supported clock; using 1350 MHz" in n for n in lk.notes)
    with lock(1200, sm_max=1507, backend=sim, journal=journal, gpus=0):
        assert sim.truth(0).locked_sm == (1200, 1500)


@pytest.mark.parametrize(
    ("sm", "expected"),
    [
        ("max", (1980, 1980)),
        ("base", (1590, 1590)),
        ("1500", (1500, 1500)),
        ("1200,1500", (1200, 1500)),
    ],
)
def test_named_and_text_targets(
    sim: SimBackend, journal: Journal, sm: str, expected: tuple[int, int]
) -> None:
    with lock(sm, backend=sim, journal=journal, gpus=0):
        assert sim.truth(0).locked_sm == expected


def test_sustained_needs_calibration(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(
        ConfigError, match=r"no calibrated clock for GPU 0 .*run 'gpuenv calibrate' first"
    ) as refused:
        lock("sustained", backend=sim, journal=journal, gpus=0)
    # a calibration is kept per account: the message says whose place it looked in
    assert str(journal.path) in str(refused.value), refused.value
    save_calibration(sim.device_info(0).uuid, 1383, power_limit_w=700.0, state_dir=journal.path)
    cal = clocks.load_calibration(sim.device_info(0).uuid, state_dir=journal.path)
    assert cal is not None and cal.sustained_mhz == 1383 and cal.power_limit_w == 700.0
    with lock("sustained", backend=sim, journal=journal, gpus=0):
        assert sim.truth(0).locked_sm == (1380, 1380)  # snapped to the 15 MHz grid


def test_base_on_a_gpu_that_does_not_report_it_locks_with_tdp(journal: Journal) -> None:
    """NVML reports no base clock: lock it symbolically (CLOCK_LIMIT_TDP), like -lgc base."""
    from gpuenv.backend import CLOCK_LIMIT_TDP

    sim = SimBackend(n_gpus=1, clock=VirtualClock())
    limits = replace(sim.clock_limits(0), base_sm_mhz=None)
    sim.clock_limits = lambda index: limits  # type: ignore[method-assign]
    plan = plan_lock(sim, LockRequest(sm="base"), journal=journal)
    assert plan.gpus[0].applied.locked_sm == (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)
    assert "base clock (TDP)" in plan.lines()[0]


def test_memory_lock_on_hopper_is_unsupported_now(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(NotSupported, match=r"Hopper.*next GPU initialisation.*drop --mem"):
        lock(1350, mem=2619, backend=sim, journal=journal)
    assert journal.entries() == [] and settings(sim)[0] is None


def test_memory_lock_where_supported(journal: Journal) -> None:
    sim = SimBackend("rtx4090", clock=VirtualClock())
    before = settings(sim)
    with lock(2000, mem=10501, backend=sim, journal=journal) as lk:
        assert sim.truth(0).locked_mem == (10501, 10501)
        assert any("persistence mode is off" in n for n in lk.notes)  # this card's default
    assert settings(sim) == before


def test_power_limit_validated(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(ConfigError, match="accepts 200-700 W"):
        lock(power_limit_w=900, backend=sim, journal=journal)
    with pytest.raises(ConfigError, match="nothing to lock"):
        lock(backend=sim, journal=journal)
    with pytest.raises(ConfigError, match="sm_max needs sm"):
        lock("max", sm_max=1500, backend=sim, journal=journal)
    with pytest.raises(ConfigError, match="not understood"):
        lock("fast", backend=sim, journal=journal)


def test_plan_reads_only(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    plan = plan_lock(sim, LockRequest(sm=1350, power_limit_w=500), journal=journal)
    assert [gp.index for gp in plan.gpus] == [0, 1]
    assert (
        plan.lines()[0]
        == f"{H100}: set power limit to 500 W (now 700 W), lock SM clock to 1350 MHz"
    )
    assert all_settings(sim) == before and journal.entries() == []


# -- the real GPU, read-only (the lent device: nothing may be written) ---------------------


@pytest.mark.gpu
def test_real_gpu_plans_and_refuses_to_write(tmp_path: Path) -> None:
    from gpuenv.backend import open_backend

    gpu = open_backend("nvml", readonly=True)
    try:
        journal = Journal(tmp_path / "journal")
        st = read_state(gpu, 0, journal=journal)
        assert st.power_limit_w > 0 and st.locked_sm is None and not st.locked_known
        name = gpu.device_info(0).name
        with pytest.raises(ConfigError, match=rf"{re.escape(name)}\) supports \d+-\d+ MHz"):
            plan_lock(gpu, LockRequest(sm=99999), 0, journal=journal)
        top = max(_sm_clocks(gpu.clock_limits(0)))
        plan = plan_lock(gpu, LockRequest(sm="max"), 0, journal=journal)
        assert plan.gpus[0].applied.locked_sm == (top, top)
        base = plan_lock(gpu, LockRequest(sm="base"), 0, journal=journal)
        assert base.gpus[0].applied.locked_sm is not None
        with pytest.raises(ReadOnlyError):
            lock("max", gpus=0, backend=gpu, journal=journal)
        assert journal.entries() == []
        status = lock_status(gpu, 0, journal)
        assert status.locked is None and status.holds is None
    finally:
        gpu.close()
