"""What root may change on the simulated GPU, validated as NVML validates it."""

from __future__ import annotations

import pytest
from sim_harness import heavy

from gpuenv.backend import (
    CLOCK_LIMIT_TDP,
    CLOCK_LIMIT_UNLIMITED,
    REASON_APP_CLOCKS,
    REASON_SW_POWER_CAP,
)
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import (
    InvalidValue,
    NotSupported,
    PermissionDenied,
)
from gpuenv.timebase import VirtualClock


def test_locked_clocks_clamp_and_reset(sim):
    sim.open_context(0)
    sim.set_locked_sm_clocks(0, 1350, 1350)
    r = sim.read_fast(0)
    assert r.sm_mhz == 1350 and r.reasons & REASON_APP_CLOCKS
    assert sim.truth(0).locked_sm == (1350, 1350)
    sim.idle(1.0)
    assert sim.read_fast(0).sm_mhz == 1350
    sim.reset_locked_sm_clocks(0)
    sim.idle(0.2)
    assert sim.read_fast(0).sm_mhz == 1980 and sim.truth(0).locked_sm is None


def test_lock_holds_under_load_when_below_the_cap(sim):
    sim.set_locked_sm_clocks(0, 1200, 1200)
    log = heavy(sim, 10.0)
    assert {mhz for t, _, mhz in log if t > 0.2} == {1200}
    assert not sim.read_fast(0).reasons & REASON_SW_POWER_CAP


def test_power_cap_pulls_below_a_lock(sim):
    sim.set_locked_sm_clocks(0, 1500, 1500)
    sim.set_power_limit(0, 400)
    heavy(sim, 5.0)
    r = sim.read_fast(0)
    assert r.sm_mhz < 1500 and r.reasons & REASON_SW_POWER_CAP
    assert r.power_w == pytest.approx(400, abs=15)


def test_lock_symbolic_values(sim):
    sim.set_locked_sm_clocks(0, CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)
    assert sim.truth(0).locked_sm == (1590, 1590)
    sim.set_locked_sm_clocks(0, CLOCK_LIMIT_UNLIMITED, CLOCK_LIMIT_UNLIMITED)
    assert sim.truth(0).locked_sm == (345, 1980)
    with pytest.raises(InvalidValue, match="mix"):
        sim.set_locked_sm_clocks(0, 1350, CLOCK_LIMIT_TDP)


def test_lock_rounds_inward_and_rejects_out_of_range(sim):
    sim.set_locked_sm_clocks(0, 1351, 1409)
    assert sim.truth(0).locked_sm == (1365, 1395)
    sim.set_locked_sm_clocks(0, 1352, 1353)  # inside one 15 MHz gap: the nearest clock
    assert sim.truth(0).locked_sm == (1350, 1350)
    for lo, hi in ((100, 1000), (1000, 2500), (1500, 1400)):
        with pytest.raises(InvalidValue):
            sim.set_locked_sm_clocks(0, lo, hi)
    assert sim.truth(0).locked_sm == (1350, 1350)  # a refused write changes nothing


def test_memory_lock_not_supported_on_hopper(sim):
    with pytest.raises(NotSupported, match="lmcd"):
        sim.set_locked_mem_clocks(0, 2619, 2619)
    sim.reset_locked_mem_clocks(0)  # nothing to reset: fine


def test_memory_lock_on_ada():
    s = SimBackend("rtx4090", clock=VirtualClock())
    s.set_locked_mem_clocks(0, 5001, 5001)
    s.open_context(0)
    s.idle(0.2)
    assert s.read_fast(0).mem_mhz == 5001
    s.reset_locked_mem_clocks(0)
    assert s.read_fast(0).mem_mhz == 10501


def test_app_clocks_take_effect_at_context_creation(sim):
    sim.set_app_clocks(0, 2619, 1410)
    assert sim.app_clocks(0).sm_mhz == 1410
    sim.open_context(0)
    sim.idle(0.2)
    r = sim.read_fast(0)
    assert r.sm_mhz == 1410 and r.reasons & REASON_APP_CLOCKS
    sim.reset_app_clocks(0)
    sim.idle(0.2)
    assert sim.read_fast(0).sm_mhz == 1410  # the running context keeps what it started with
    with pytest.raises(InvalidValue):
        sim.set_app_clocks(0, 2619, 1400)  # not a supported clock


def test_legacy_card_has_application_clocks_only():
    s = SimBackend("legacy", clock=VirtualClock())
    lim = s.clock_limits(0)
    assert lim.locked_clocks_supported is False
    with pytest.raises(NotSupported, match="application clocks"):
        s.set_locked_sm_clocks(0, 1000, 1000)
    s.open_context(0)
    s.idle(0.2)
    assert s.read_fast(0).sm_mhz == 1328 and s.read_fast(0).reasons == 0
    low = lim.supported_sm_mhz[715][10]
    s.set_app_clocks(0, 715, low)
    s.close_context(0)
    s.open_context(0)  # application clocks apply to new contexts
    s.idle(0.2)
    r = s.read_fast(0)
    assert r.sm_mhz == low and r.reasons & REASON_APP_CLOCKS
    assert s.thresholds(0).gpu_max_c is None


def test_power_limit_range_and_effect(sim):
    with pytest.raises(InvalidValue, match="200 to 700"):
        sim.set_power_limit(0, 150)
    with pytest.raises(InvalidValue):
        sim.set_power_limit(0, 701)
    sim.set_power_limit(0, 500)
    assert sim.power_limits(0).limit_w == 500
    heavy(sim, 10.0)
    r = sim.read_fast(0)
    assert r.power_w == pytest.approx(500, abs=12) and r.sm_mhz < 1300


def test_writes_need_root():
    s = SimBackend(clock=VirtualClock(), root=False)
    for call in (
        lambda: s.set_locked_sm_clocks(0, 1350, 1350),
        lambda: s.reset_locked_sm_clocks(0),
        lambda: s.set_app_clocks(0, 2619, 1410),
        lambda: s.reset_app_clocks(0),
        lambda: s.set_power_limit(0, 500),
        lambda: s.set_persistence_mode(0, False),
    ):
        with pytest.raises(PermissionDenied) as err:
            call()
        assert "root" in str(err.value) and err.value.gpu == 0
    assert s.read_fast(0).sm_mhz == 345  # reads are fine
