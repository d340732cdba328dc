"""What the simulated driver answers: static facts as NVML gives them, one identity per GPU."""

from __future__ import annotations

import pytest

from gpuenv.backend import REASON_SW_POWER_CAP
from gpuenv.backend.sim import SimBackend
from gpuenv.timebase import VirtualClock


def test_static_facts_match_gpu_facts(sim):
    info = sim.device_info(0)
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.compute_capability == (9, 0) and info.memory_total_mib == 81559
    assert info.uuid.startswith("GPU-") and info.mig_mode is False
    lim = sim.clock_limits(0)
    assert len(lim.supported_sm_mhz[2619]) == 110
    assert lim.supported_sm_mhz[2619][0] == 1980 and lim.supported_sm_mhz[2619][-1] == 345
    assert lim.supported_mem_mhz == (2619, 1593)
    assert (lim.max_sm_mhz, lim.default_app_sm_mhz) == (1980, 1980)
    assert lim.base_sm_mhz is None  # as NVML: no getter; CLOCK_LIMIT_TDP still locks to 1590
    assert lim.locked_clocks_supported and not lim.locked_mem_supported
    pl = sim.power_limits(0)
    assert (pl.limit_w, pl.default_w, pl.min_w, pl.max_w) == (700, 700, 200, 700)
    th = sim.thresholds(0)
    assert (th.gpu_max_c, th.slowdown_c, th.shutdown_c, th.mem_max_c) == (87, 89, 95, 95)
    assert sim.supported_reasons(0) == 0x1FF
    assert sim.persistence_mode(0) is True
    assert sim.driver_version() == "580.159.04" and sim.nvml_version() == "13.580.159.04"
    assert sim.state_file is None


def test_multi_gpu_distinct_ids():
    s = SimBackend(n_gpus=4, clock=VirtualClock())
    infos = [s.device_info(i) for i in range(4)]
    assert len({i.uuid for i in infos}) == 4 and len({i.pci_bus_id for i in infos}) == 4
    s.run_work(1, 1.98e10)  # ~13 s of heavy work on GPU 1 only
    assert s.truth(1).temp_c > s.truth(0).temp_c + 5


def test_performance_state_is_p0_under_load_and_the_profiles_idle_state_otherwise(vclock):
    with SimBackend("h100", clock=vclock) as h100, SimBackend("rtx4090", clock=vclock) as rtx:
        assert h100.performance_state(0) == 0  # persistent H100 at 345 MHz: still P0
        assert rtx.performance_state(0) == 8
        rtx.open_context(0)
        assert rtx.performance_state(0) == 0
        rtx.close_context(0)
        rtx.set_background_load(0, 0.5)
        assert rtx.performance_state(0) == 0


@pytest.mark.parametrize("limit_w", [700.0, 300.0])
def test_power_never_reads_above_the_limit_without_the_caps_reason(vclock, limit_w):
    """Load starts (before the cap's ceiling moves), holds, stops, starts again under a lower
    limit: every reading over the limit, instant or the 1 s average, says SwPowerCap."""
    sim = SimBackend(clock=vclock)
    sim.set_power_limit(0, limit_w)
    sim.open_context(0)
    sim.idle(1.0)
    over = 0
    for step in range(1500):
        if step in (0, 900):
            sim.set_background_load(0, 1.0)
        if step == 600:
            sim.set_background_load(0, 0.0)
        if step == 1200:
            sim.set_power_limit(0, limit_w - 100)
        sim.idle(0.01)
        r = sim.read_fast(0)
        if max(r.power_w, r.power_instant_w or 0.0) > sim.power_limits(0).limit_w:
            over += 1
            assert r.reasons & REASON_SW_POWER_CAP, (step, r)
    assert over > 0  # the load did draw more than the limit: the cap had work to do
