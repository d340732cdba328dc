"""What the simulated driver answers: static facts as NVML gives them, one identity per GPU."""

from __future__ import annotations

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


def test_power_never_reads_above_the_limit_without_the_caps_reason(vclock):
    """The power NVML reports (the 1 s average that status and the monitor show) says
    SwPowerCap whenever it is over the limit: under a load, after it, and after the limit is
    lowered below what the last second drew. The instant power may run over it only for the
    cap's onset (100-300 ms after a load starts), as on an H100."""
    sim = SimBackend(clock=vclock)
    sim.open_context(0)
    sim.idle(1.0)
    over, load_at = 0, 0.0
    for step in range(700):
        if step in (0, 400):
            sim.set_background_load(0, 1.0)
            load_at = vclock.now()
        if step == 300:
            sim.set_background_load(0, 0.0)
        if step == 360:  # the cap let go, the last second still averages ~600 W
            sim.set_power_limit(0, 300)
        sim.idle(0.01)
        r = sim.read_fast(0)
        limit = sim.power_limits(0).limit_w
        if r.power_w > limit:
            over += 1
            assert r.reasons & REASON_SW_POWER_CAP, (step, r)
        if (r.power_instant_w or 0.0) > limit and not r.reasons & REASON_SW_POWER_CAP:
            assert vclock.now() - load_at <= 0.3, (step, r)
    assert over > 0  # the reading did go over the limit: the reason had something to say
