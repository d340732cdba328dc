"""The simulated GPU behaves as GPU_FACTS.md says an H100 does, and as NVML would answer."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuenv.backend import (
    CLOCK_LIMIT_TDP,
    CLOCK_LIMIT_UNLIMITED,
    REASON_APP_CLOCKS,
    REASON_COUNTERS,
    REASON_GPU_IDLE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    Backend,
    ReadOnlyBackend,
    open_backend,
)
from gpuenv.backend.sim import SimBackend
from gpuenv.backend.sim_profiles import H100, PROFILES
from gpuenv.errors import (
    ConfigError,
    DeviceNotFound,
    DriverTimeout,
    GpuLost,
    InvalidValue,
    NotSupported,
    PermissionDenied,
    ReadOnlyError,
)
from gpuenv.timebase import VirtualClock

# One 8192^3 bf16 matmul on an H100: 1.37 ms at 1980 MHz, about half of it not SM-clock bound
# (GPU_FACTS.md: 1.57 ms in the first 5 s under the cap, 1.62 ms after 25 s).
MATMUL = {"cycles": 1.3085e6, "mem_cycles": 1.857e6}


def heavy(sim: SimBackend, seconds: float, index: int = 0) -> list[tuple[float, float, int]]:
    """Sustained matmuls for `seconds`; (time since start, matmul seconds, SM clock read) each."""
    start = sim.clock.now()
    out = []
    while sim.clock.now() - start < seconds:
        dt = sim.run_work(index, **MATMUL)
        out.append((sim.clock.now() - start, dt, sim.read_fast(index).sm_mhz))
    return out


def test_is_a_backend(sim):
    assert isinstance(sim, Backend)
    assert sim.name == "sim" and sim.readonly is False


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


def test_idle_without_context_parks_at_345_with_gpu_idle(sim):
    sim.idle(2.0)
    r = sim.read_fast(0)
    assert r.sm_mhz == 345 and r.reasons == REASON_GPU_IDLE
    assert r.power_w == pytest.approx(72, abs=3)
    assert r.temp_c == pytest.approx(36, abs=1)
    assert sim.processes(0) == []


def test_context_boosts_to_1980_and_draws_120_w(sim):
    sim.open_context(0, pid=4242)
    sim.idle(1.5)
    r = sim.read_fast(0)
    assert r.sm_mhz == 1980 and r.reasons == 0
    assert r.power_instant_w == pytest.approx(120, abs=5)
    assert [p.pid for p in sim.processes(0)] == [4242]
    sim.close_context(0, pid=4242)
    sim.idle(0.2)
    assert sim.read_fast(0).reasons == REASON_GPU_IDLE


@pytest.mark.parametrize("phase", [0.0, 0.03, 0.07])
def test_power_cap_engages_within_100_to_300_ms(sim, phase):
    sim.open_context(0)
    sim.idle(1.0 + phase)  # the load starts anywhere between two driver updates
    start = sim.clock.now()
    seen = None
    while seen is None and sim.clock.now() - start < 0.5:
        sim.run_work(0, **MATMUL)
        if sim.read_fast(0).reasons & REASON_SW_POWER_CAP:
            seen = sim.clock.now() - start
    assert seen is not None and 0.1 <= seen <= 0.3


def test_sustained_load_settles_near_1380_and_heats_to_63(sim):
    sim.open_context(0)
    sim.idle(1.0)
    log = heavy(sim, 45.0)
    early = [mhz for t, _, mhz in log if 1.0 <= t <= 5.0]
    late = [mhz for t, _, mhz in log if t >= 30.0]
    assert min(early) >= 1440 and max(early) <= 1590
    assert min(late) >= 1335 and max(late) <= 1455
    assert sorted(late)[len(late) // 2] == pytest.approx(1380, abs=45)
    r = sim.read_fast(0)
    assert r.temp_c == pytest.approx(63, abs=3)
    assert r.power_w == pytest.approx(698, abs=10)
    assert r.reasons & REASON_SW_POWER_CAP
    first5 = [dt for t, dt, _ in log if t <= 5.0]
    after25 = [dt for t, dt, _ in log if t >= 25.0]
    assert sum(first5) / len(first5) == pytest.approx(1.57e-3, rel=0.05)
    assert sum(after25) / len(after25) == pytest.approx(1.62e-3, rel=0.05)


def test_after_load_clocks_return_and_cap_clears_within_half_a_second(sim):
    sim.open_context(0)
    heavy(sim, 10.0)
    assert sim.read_fast(0).reasons & REASON_SW_POWER_CAP
    t0 = sim.clock.now()
    while sim.read_fast(0).reasons & REASON_SW_POWER_CAP or sim.read_fast(0).sm_mhz != 1980:
        sim.idle(0.01)
        assert sim.clock.now() - t0 < 0.5
    sim.idle(120)
    assert sim.read_fast(0).temp_c < 45  # and it cools down


def test_run_work_time_follows_the_clock(sim):
    sim.open_context(0)
    sim.idle(0.5)
    t0 = sim.clock.now()
    dt = sim.run_work(0, 1.98e6, power_intensity=0.0)  # 1 ms at 1980 MHz, no power
    assert dt == pytest.approx(1e-3, rel=1e-6)
    assert sim.clock.now() - t0 == pytest.approx(dt, abs=1e-8)
    sim.set_locked_sm_clocks(0, 990, 990)
    assert sim.run_work(0, 1.98e6, power_intensity=0.0) == pytest.approx(2e-3, rel=1e-6)


def test_run_work_opens_a_context(sim):
    sim.run_work(0, 1e3)
    assert sim.truth(0).contexts == (os.getpid(),)


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


def test_consumer_card_reaches_thermal_slowdown():
    s = SimBackend("rtx4090", clock=VirtualClock())
    with pytest.raises(NotSupported):
        s.set_app_clocks(0, 10501, 2520)
    reasons = 0
    start = s.clock.now()
    while s.clock.now() - start < 240:
        s.run_work(0, 2.79e8)  # 100 ms at full clock
        reasons |= s.read_fast(0).reasons
    assert reasons & REASON_SW_THERMAL
    assert not reasons & (REASON_HW_THERMAL | REASON_HW_SLOWDOWN)
    assert s.truth(0).temp_c == pytest.approx(83, abs=1.5)


def test_hot_room_brings_hw_slowdown_then_shutdown():
    s = SimBackend("rtx4090", clock=VirtualClock())
    s.set_background_load(0, 1.0)
    s.set_ambient(0, 84.0)  # SW thermal slowdown cannot hold 83 C with this air
    seen = 0
    for _ in range(3000):
        s.idle(0.1)
        seen |= s.read_fast(0).reasons
        if seen & REASON_HW_THERMAL:
            break
    r = s.read_fast(0)
    assert r.reasons & REASON_HW_THERMAL and r.reasons & REASON_HW_SLOWDOWN
    assert seen & REASON_SW_THERMAL
    assert r.sm_mhz <= 2790 // 2
    h = SimBackend(clock=VirtualClock())
    h.set_background_load(0, 1.0)
    h.set_ambient(0, 90.0)
    with pytest.raises(GpuLost, match="shut down"):
        for _ in range(3000):
            h.idle(0.1)
            h.read_fast(0)
    h.idle(30.0)  # off the bus it draws nothing and cools
    h.clear_faults(0)  # "reset the GPU": it answers again
    assert h.read_fast(0).temp_c < 95


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


def test_readonly_wrapper_refuses_before_the_sim(sim):
    ro = ReadOnlyBackend(sim)
    with pytest.raises(ReadOnlyError):
        ro.set_locked_sm_clocks(0, 1350, 1350)
    assert sim.truth(0).locked_sm is None
    assert ro.read_fast(0).sm_mhz == 345


def test_faults(sim):
    sim.inject_fault(0, "timeout", op="read_fast", count=2)
    for _ in range(2):
        with pytest.raises(DriverTimeout):
            sim.read_fast(0)
    sim.read_fast(0)
    sim.inject_fault(0, "not_supported", op="read_slow")
    with pytest.raises(NotSupported):
        sim.read_slow(0)
    sim.inject_fault(0, "permission", op="set_power_limit")
    with pytest.raises(PermissionDenied):
        sim.set_power_limit(0, 500)
    sim.clear_faults()
    sim.inject_fault(0, "gpu_lost")
    for call in (
        lambda: sim.read_fast(0),
        lambda: sim.device_info(0),
        lambda: sim.run_work(0, 1e6),
    ):
        with pytest.raises(GpuLost):
            call()
    sim.clear_faults(0)
    sim.read_fast(0)
    with pytest.raises(ConfigError):
        sim.inject_fault(0, "meteor")
    with pytest.raises(ConfigError):
        sim.inject_fault(0, "timeout", op="read_fats")


def test_bad_index(sim):
    with pytest.raises(DeviceNotFound, match="indices 0-0"):
        sim.read_fast(1)


def test_counters_are_monotone_and_exact(sim):
    sim.open_context(0)
    sim.idle(0.3)
    prev = sim.read_slow(0)
    for _ in range(30):
        sim.run_work(0, 1.98e8)  # ~0.1-0.15 s each
        now = sim.read_slow(0)
        assert now.energy_mj >= prev.energy_mj
        assert all(now.reason_ns[k] >= prev.reason_ns[k] for k in REASON_COUNTERS)
        prev = now
    assert prev.reason_ns["power"] > 2_000_000_000
    # Exactness: a background load holds the cap on; count 2 s of virtual time.
    s = SimBackend(clock=VirtualClock())
    s.set_background_load(0, 1.0)
    s.idle(5.0)
    a = s.read_slow(0).reason_ns
    s.idle(2.0)
    b = s.read_slow(0).reason_ns
    assert b["power"] - a["power"] == 2_000_000_000
    assert b["total_app_clocks"] - a["total_app_clocks"] == 2_000_000_000
    assert b["total_base_clocks"] - a["total_base_clocks"] == 2_000_000_000  # capped below 1590
    assert b["thermal"] == 0 and b["low_utilization"] == a["low_utilization"]
    e0 = s.truth(0).energy_mj
    s.idle(1.0)
    assert s.truth(0).energy_mj - e0 == pytest.approx(700_000, rel=0.02)  # 700 W for 1 s


def test_low_utilization_counts_idle_time(sim):
    a = sim.read_slow(0).reason_ns["low_utilization"]
    sim.idle(1.0)
    assert sim.read_slow(0).reason_ns["low_utilization"] - a == 1_000_000_000


def test_readings_refresh_every_100_ms(sim):
    sim.open_context(0)
    sim.idle(0.05 + 0.1 - sim.clock.now() % 0.1)
    r1 = sim.read_fast(0)
    sim.idle(0.04)
    assert sim.read_fast(0).driver_ts_us == r1.driver_ts_us
    sim.idle(0.02)
    assert sim.read_fast(0).driver_ts_us == r1.driver_ts_us + 100_000


def test_background_load_appears_as_a_process(sim):
    sim.set_background_load(0, 0.5, pid=777)
    sim.idle(1.0)
    assert [p.pid for p in sim.processes(0)] == [777]
    assert sim.utilization(0)[0] == 50
    sim.set_background_load(0, 0.0, pid=777)
    sim.idle(0.2)
    assert sim.processes(0) == [] and sim.read_fast(0).reasons == REASON_GPU_IDLE


def test_multi_gpu_distinct_ids():
    s = SimBackend(n_gpus=4, clock=VirtualClock())
    infos = [s.device_info(i) for i in range(4)]
    assert len({i.uuid for i in infos}) == 4 and len({i.pci_bus_id for i in infos}) == 4
    s.run_work(1, 1.98e10)  # ~13 s of heavy work on GPU 1 only
    assert s.truth(1).temp_c > s.truth(0).temp_c + 5


def test_state_file_shared_between_instances(tmp_path, vclock):
    path = tmp_path / "sim.json"
    a = SimBackend(clock=vclock, state_file=path)
    b = SimBackend(clock=vclock, state_file=path)
    assert a.state_file == path
    a.set_locked_sm_clocks(0, 1350, 1350)
    a.set_power_limit(0, 600)
    assert b.truth(0).locked_sm == (1350, 1350)
    assert b.power_limits(0).limit_w == 600
    b.open_context(0)
    b.idle(0.2)
    assert b.read_fast(0).sm_mhz == 1350
    b.reset_locked_sm_clocks(0)
    assert a.truth(0).locked_sm is None and a.power_limits(0).limit_w == 600
    data = json.loads(path.read_text())
    assert data["gpus"][0]["power_limit_w"] == 600


def test_state_file_across_processes(tmp_path):
    path = tmp_path / "sim.json"
    parent = SimBackend(state_file=path)  # open before the child, as a monitor would be
    child = textwrap.dedent(
        f"""
        from gpuenv.backend.sim import SimBackend
        s = SimBackend(state_file={str(path)!r})
        s.set_locked_sm_clocks(0, 1410, 1410)
        s.run_work(0, 1.98e8)  # 0.1 s of heavy work: warms the chip a little
        s.close()
        """
    )
    subprocess.run([sys.executable, "-c", child], check=True, cwd=os.getcwd(), timeout=60)
    assert parent.truth(0).locked_sm == (1410, 1410)
    assert parent.read_fast(0).sm_mhz == 1410  # idle, the clock parks at the lock's floor
    parent.reset_locked_sm_clocks(0)
    parent.close()
    again = SimBackend(state_file=path)
    assert again.truth(0).locked_sm is None
    assert json.loads(path.read_text())["clients"] == [os.getpid()]
    again.close()


def test_state_file_for_another_machine_is_replaced(tmp_path, vclock):
    path = tmp_path / "sim.json"
    a = SimBackend(clock=vclock, state_file=path)
    a.set_power_limit(0, 500)
    a.close()
    b = SimBackend("rtx4090", n_gpus=2, clock=vclock, state_file=path)
    assert b.power_limits(0).limit_w == 450
    data = json.loads(path.read_text())
    assert data["profile"] == "rtx4090" and len(data["gpus"]) == 2
    path.write_text("not json")
    c = SimBackend(clock=vclock, state_file=path)  # a broken file: start fresh, do not crash
    assert c.power_limits(0).limit_w == 700


def test_real_time_mode_advances_lazily():
    s = SimBackend()  # RealClock: physics catch up with elapsed time at each call
    s.open_context(0)
    s.idle(0.15)
    assert s.read_fast(0).sm_mhz == 1980
    t0 = s.clock.now()
    dt = s.run_work(0, 1.98e6, power_intensity=0.0)
    assert dt == pytest.approx(1e-3, rel=1e-4)  # simulated time: 1 ms at 1980 MHz (ns steps)
    assert s.clock.now() - t0 >= dt  # it slept at least that long


def test_without_persistence_settings_revert_when_the_last_client_leaves(tmp_path, vclock):
    path = tmp_path / "sim.json"
    a = SimBackend(clock=vclock, state_file=path)
    a.set_persistence_mode(0, False)
    a.set_locked_sm_clocks(0, 1350, 1350)
    b = SimBackend(clock=vclock, state_file=path)
    a.close()
    assert b.truth(0).locked_sm == (1350, 1350)  # b is still a client
    b.close()
    c = SimBackend(clock=vclock, state_file=path)
    assert c.truth(0).locked_sm is None and c.persistence_mode(0) is False
    c.set_persistence_mode(0, True)
    c.set_locked_sm_clocks(0, 1350, 1350)
    c.close()
    d = SimBackend(clock=vclock, state_file=path)
    assert d.truth(0).locked_sm == (1350, 1350)


def test_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUENV_SIM_STATE", str(tmp_path / "s.json"))
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "rtx4090")
    monkeypatch.setenv("GPUENV_SIM_GPUS", "2")
    monkeypatch.setenv("GPUENV_SIM_ROOT", "0")
    s = SimBackend.from_env()
    assert s.device_count() == 2 and s.device_info(0).name == "NVIDIA GeForce RTX 4090"
    with pytest.raises(PermissionDenied):
        s.set_power_limit(0, 400)
    s.close()
    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    b = open_backend()
    assert b.name == "sim"
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "h200")
    with pytest.raises(ConfigError, match="h100"):
        SimBackend.from_env()
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "h100")
    monkeypatch.setenv("GPUENV_SIM_GPUS", "lots")
    with pytest.raises(ConfigError, match="GPUENV_SIM_GPUS"):
        SimBackend.from_env()


def test_profiles_are_data():
    assert set(PROFILES) >= {"h100", "rtx4090", "legacy"}
    assert len(H100.sm_clocks_mhz) == 110
    legacy = PROFILES["legacy"]
    assert legacy.sm_clocks_mhz[0] == 1328 and legacy.sm_clocks_mhz[-1] == 544


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("idle"), st.floats(0.0, 3.0)),
            st.tuples(st.just("work"), st.floats(0.0, 3e9)),
            st.tuples(st.just("lock"), st.integers(0, 109), st.integers(0, 109)),
            st.tuples(st.just("unlock")),
            st.tuples(st.just("limit"), st.floats(200.0, 700.0)),
            st.tuples(st.just("background"), st.floats(0.0, 1.0)),
        ),
        max_size=25,
    )
)
def test_invariants_under_any_sequence(ops):
    s = SimBackend(clock=VirtualClock())
    clocks = set(H100.sm_clocks_mhz)
    prev = s.read_slow(0)
    for op in ops:
        if op[0] == "idle":
            s.idle(op[1])
        elif op[0] == "work":
            s.run_work(0, op[1])
        elif op[0] == "lock":
            lo, hi = sorted((H100.sm_clocks_mhz[op[1]], H100.sm_clocks_mhz[op[2]]))
            s.set_locked_sm_clocks(0, lo, hi)
        elif op[0] == "unlock":
            s.reset_locked_sm_clocks(0)
        elif op[0] == "limit":
            s.set_power_limit(0, op[1])
        else:
            s.set_background_load(0, op[1])
        r, t, now = s.read_fast(0), s.truth(0), s.read_slow(0)
        assert r.sm_mhz in clocks and t.sm_mhz in clocks
        assert r.reasons & ~0x1FF == 0
        if t.locked_sm is not None:
            assert t.sm_mhz <= t.locked_sm[1]  # a cap may pull below a lock, never above
        assert t.temp_c < 95
        assert now.energy_mj >= prev.energy_mj
        assert all(now.reason_ns[k] >= prev.reason_ns[k] for k in REASON_COUNTERS)
        prev = now


def test_power_samples_every_20_ms_like_get_samples(sim):
    sim.open_context(0)
    sim.idle(1.0)
    samples = sim.power_samples(0)
    assert len(samples) == 50
    assert all(b[0] - a[0] == 20_000 for a, b in itertools.pairwise(samples))
    last = samples[-1][0]
    sim.run_work(0, 1.98e8)  # ~0.1 s heavy
    newer = sim.power_samples(0, since_us=last)
    assert newer and newer[0][0] > last and max(w for _, w in newer) > 600
    sim.idle(60.0)
    assert len(sim.power_samples(0)) == 120  # the buffer holds ~2.4 s


def test_memory_clock_slows_memory_bound_work(sim):
    sim.open_context(0)
    sim.idle(0.2)
    fast = sim.run_work(0, 0.0, mem_cycles=2.619e6, power_intensity=0.0)  # 1 ms at 2619 MHz
    sim.set_app_clocks(0, 1593, 1980)
    sim.close_context(0)
    sim.open_context(0)
    sim.idle(0.2)
    assert sim.read_fast(0).mem_mhz == 1593
    slow = sim.run_work(0, 0.0, mem_cycles=2.619e6, power_intensity=0.0)
    assert fast == pytest.approx(1e-3) and slow == pytest.approx(2619 / 1593 * 1e-3)


def test_a_sampler_on_the_virtual_clock_sees_the_run_as_it_happens(sim, vclock):
    seen: list[tuple[int, int]] = []
    vclock.call_every(
        0.05, lambda: seen.append((sim.read_fast(0).sm_mhz, sim.read_fast(0).reasons))
    )
    sim.open_context(0)
    sim.idle(0.5)
    sim.run_work(0, 1.98e9)  # one long kernel: ~1.3 s under the cap
    clocks = [mhz for mhz, _ in seen]
    assert 1980 in clocks and min(clocks) < 1600  # the ramp down happened while it ran
    assert any(r & REASON_SW_POWER_CAP for _, r in seen)
