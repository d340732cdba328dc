"""The simulated GPU's model behaves as an H100 measured read-only does: governor, power cap,
thermals, the driver's refresh periods and counters."""

from __future__ import annotations

import itertools

import pytest
from sim_harness import MATMUL, heavy

from gpuenv.backend import (
    REASON_COUNTERS,
    REASON_GPU_IDLE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)
from gpuenv.backend.sim import SimBackend
from gpuenv.backend.sim_gpu import MAX_CONTENTION, GpuModel, Job, Presence
from gpuenv.backend.sim_profiles import get_profile
from gpuenv.errors import (
    GpuLost,
    NotSupported,
)
from gpuenv.timebase import VirtualClock


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
    # the H100 after 1 s of 8192^3 matmuls (benchmarks.speed --recovery, 2026-11-24): the
    # clock one 15 MHz step under 1980 from ~0.2 s with the cap's reason still set, 1980
    # and the reason cleared at 0.50-0.59 s
    sim.open_context(0)
    heavy(sim, 10.0)
    assert sim.read_fast(0).reasons & REASON_SW_POWER_CAP
    t0 = sim.clock.now()
    sim.idle(0.2)
    s = sim.read_fast(0)
    assert s.sm_mhz == 1965 and s.reasons & REASON_SW_POWER_CAP
    while sim.read_fast(0).reasons & REASON_SW_POWER_CAP or sim.read_fast(0).sm_mhz != 1980:
        sim.idle(0.01)
        assert sim.clock.now() - t0 < 0.6
    assert sim.clock.now() - t0 > 0.4
    sim.idle(120)
    assert sim.read_fast(0).temp_c < 45  # and it cools down


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


def test_a_power_sample_is_the_mean_power_since_the_one_before(sim):
    """As an H200's: a 10 ms kernel from idle shows as one sample of the 20 ms mean at the
    first stamp after it (331-446 W for ~700 W of work there), not as the power at the
    stamp (idle again); the samples' energy is the counter's."""
    sim.open_context(0)
    sim.idle(1.0 + 0.005 - sim.clock.now() % 0.02)  # 5 ms past a stamp
    since, idle_w = sim.power_samples(0)[-1]
    e0 = sim.truth(0).energy_mj
    sim.run_work(0, 1.98e9 * 0.01)  # ~10 ms at the top clock, inside one 20 ms interval
    work_j = (sim.truth(0).energy_mj - e0) / 1e3
    sim.idle(0.2 - sim.clock.now() % 0.02)  # to a stamp
    samples = sim.power_samples(0, since_us=since)
    assert idle_w < 150 and samples[1][1] == pytest.approx(idle_w, rel=0.02)
    assert 300 < samples[0][1] < 700  # the work's 10 ms and 10 ms of idle, averaged
    assert samples[0][1] * 0.02 == pytest.approx(work_j + idle_w * 0.01, rel=0.02)
    total_j = (sim.truth(0).energy_mj - e0) / 1e3 + idle_w * 0.005  # from the stamp `since`
    assert sum(w * 0.02 for _, w in samples) == pytest.approx(total_j, rel=0.005)


def test_a_kernel_keeps_its_progress_when_it_takes_over_another_process_newer_state():
    """The process running a kernel takes over the running GPU that another process of
    the host (gpuenv run's sampler) wrote 20 ms into it: the kernel still ends 30 ms after
    it started, as alone, not 20 ms later (it skipped the 20 ms and redid them)."""
    p = get_profile("h100")
    start = 5_000_000_000
    ends = []
    for share in (False, True):
        ours, theirs = GpuModel(p, 0, 0), GpuModel(p, 0, 0)
        ours.open_context(1)
        theirs.set_others({"1:a": Presence(contexts=1, work=1.0, until_ns=start + 10**9)})
        for g in (ours, theirs):
            g.settings.locked_sm = (1350, 1350)  # as under `gpuenv run --sm 1350`
            g.relatch_clock()
            g.advance(start)
        ours.job = Job(ours.sm_mhz * 1e6 * 0.030, 0.0, 1.0)
        ours.load_changed()
        if share:
            theirs.advance(start + 20_000_000)
            ours.adopt(theirs.physics(), start + 20_000_000)
        ours.advance(start + 100_000_000)
        assert ours.job is None
        ends.append(ours.job_end_ns - start)
    assert ends[0] == pytest.approx(30_000_000, rel=0.01)
    assert ends[1] == pytest.approx(ends[0], rel=0.01)


def _a_30ms_kernel_ns(g: GpuModel, within_ns: int) -> int:
    """How long a 30 ms kernel (at the 1350 MHz lock) takes on `g`, alone but for what `g`
    was given, run to its end within `within_ns`."""
    g.settings.locked_sm = (1350, 1350)
    g.relatch_clock()
    g.load_changed()
    g.advance(g.t_ns + 1_000_000)
    start = g.t_ns
    g.job = Job(g.sm_mhz * 1e6 * 0.030, 0.0, 1.0)
    g.load_changed()
    g.advance(start + within_ns)
    assert g.job is None
    return g.job_end_ns - start


@pytest.mark.parametrize("own", ["1:a", None])
def test_a_process_own_kernels_never_time_slice_with_themselves(own: str | None) -> None:
    """The host's presences include this process's own (its load counts, max not sum):
    under its own key it takes none of its own work's SM time, so a 30 ms kernel alone
    takes 30 ms; the same presence under another key is another process, and halves it."""
    g = GpuModel(get_profile("h100"), 0, 0, own_key=own)
    g.open_context(1)
    g.set_others({"1:a": Presence(contexts=1, work=1.0, until_ns=10**12)})
    want = 30_000_000 if own else 60_000_000
    assert _a_30ms_kernel_ns(g, 200_000_000) == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("pid", [7, 4242])
def test_a_background_load_under_our_own_pid_takes_none_of_our_sm_time(pid: int) -> None:
    """gpuenv check loads every GPU under its own pid while each takes its turn: that load
    draws power and heats, but is no other process, so a 30 ms kernel takes 30 ms; under
    another pid it is another process's kernels, which take MAX_CONTENTION of the SM."""
    g = GpuModel(get_profile("h100"), 0, 0, own_pid=7)
    g.open_context(7)
    g.background[pid] = 1.0
    want = 30_000_000 if pid == 7 else 30_000_000 / (1 - MAX_CONTENTION)
    assert _a_30ms_kernel_ns(g, 1_000_000_000) == pytest.approx(want, rel=0.01)
