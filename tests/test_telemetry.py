"""The sampler and region windows, on the simulated GPU and on hand-made samples."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from gpuenv.backend import REASON_GPU_IDLE, REASON_SW_POWER_CAP
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.telemetry import (
    DEFAULT_ENERGY_PERIOD_S,
    DEFAULT_PERIOD_S,
    DEFAULT_PROCESS_PERIOD_S,
    DEFAULT_SLOW_PERIOD_S,
    EDGE_MIN_INTERVAL_S,
    Gap,
    Sample,
    Sampler,
    SlowSample,
    Window,
    merge_windows,
    summarize,
)
from gpuenv.timebase import RealClock, VirtualClock

H100_CYCLES_PER_S = 1980e6


def make_sim(profile: str = "h100", **kw: object) -> SimBackend:
    return SimBackend(profile, clock=VirtualClock(), **kw)  # type: ignore[arg-type]


def sample(t: float, sm: int, *, power: float = 300.0, temp: float = 40.0, reasons: int = 0):
    return Sample(t, 0, sm, 2619, power, temp, reasons)


# -- summaries from known samples ------------------------------------------------------


def test_clock_mean_is_time_weighted_and_uses_the_sample_in_force_at_the_start():
    fast = [sample(0.0, 1000), sample(1.0, 2000), sample(3.0, 1500)]
    w = summarize(fast, [], [], 0.5, 1.5, gpu=0)
    # 1000 MHz holds over [0.5, 1.0), 2000 over [1.0, 1.5]
    assert w.sm_mhz_mean == pytest.approx(1500.0)
    assert (w.sm_mhz_min, w.sm_mhz_max) == (1000.0, 2000.0)
    assert w.sm_mhz_start == 1000.0
    assert w.n_samples == 1


def test_a_reading_just_after_the_region_counts_for_extremes_not_for_the_mean():
    # the driver refreshes every 100 ms: the first reading after a short region can be
    # the first to show what happened inside it
    fast = [sample(0.0, 1980), sample(0.2, 1500, reasons=REASON_SW_POWER_CAP | REASON_GPU_IDLE)]
    w = summarize(fast, [], [], 0.1, 0.15, gpu=0)
    assert w.sm_mhz_mean == pytest.approx(1980.0)
    assert w.sm_mhz_min == 1500.0
    assert w.reasons == REASON_SW_POWER_CAP  # GpuIdle after the region is not the region's


def test_a_reading_long_after_the_region_is_ignored():
    fast = [sample(0.0, 1980), sample(0.5, 1500, reasons=REASON_SW_POWER_CAP)]
    w = summarize(fast, [], [], 0.1, 0.15, gpu=0)
    assert w.sm_mhz_min == 1980.0
    assert w.reasons == 0


def test_energy_of_a_short_region_comes_from_the_power_samples_and_is_marked():
    # the counter steps every 100 ms: equal reads around a 20 ms region would say 0 J
    slow = [SlowSample(0.1 * k, 0, 100_000 * k, {}) for k in range(10)]
    fast = [sample(0.0, 1980, power=1000.0)]
    w = summarize(fast, slow, [], 0.32, 0.34, gpu=0)
    assert w.energy_j == pytest.approx(20.0)  # 20 ms at 1 kW
    assert w.energy_interpolated


def test_a_power_reading_stands_for_the_time_back_to_the_refresh_before_it():
    # the driver's reading at a refresh is the power just before it: a 100 ms kernel
    # started at 0.02 from idle (100 W) shows as 1 kW at the 0.1 refresh; holding the
    # 100 W reading in force at the start over the region read ~3x low
    epoch = 1_790_000_000
    fast = [
        Sample(0.0, 0, 1980, 2619, 100.0, 40.0, 0, epoch * 10**6, 100.0),
        Sample(0.1, 0, 1980, 2619, 100.0, 40.0, 0, (epoch + 0.1) * 10**6, 1000.0),
        Sample(0.2, 0, 1980, 2619, 100.0, 40.0, 0, (epoch + 0.2) * 10**6, 1000.0),
    ]
    w = summarize(fast, [], [], 0.02, 0.12, gpu=0)
    assert w.power_w_mean == pytest.approx(1000.0)
    assert w.energy_j == pytest.approx(100.0) and w.energy_interpolated
    assert w.power_w_max == 1000.0


def test_a_power_reading_is_placed_at_its_refresh_not_at_its_read():
    # read 40 ms after its refresh at 0.1 (the driver's stamp says so): the reading stands
    # for [0.0, 0.1], so a region [0.1, 0.14] is not its but the next one's (within lag)
    epoch = 1_790_000_000
    fast = [
        Sample(0.0, 0, 1980, 2619, 100.0, 40.0, 0, epoch * 10**6, 100.0),
        Sample(0.14, 0, 1980, 2619, 100.0, 40.0, 0, (epoch + 0.1) * 10**6, 1000.0),
        Sample(0.2, 0, 1980, 2619, 100.0, 40.0, 0, (epoch + 0.2) * 10**6, 300.0),
    ]
    w = summarize(fast, [], [], 0.1, 0.14, gpu=0)
    assert w.power_w_mean == pytest.approx(300.0)
    assert summarize(fast, [], [], 0.05, 0.1, gpu=0).power_w_mean == pytest.approx(1000.0)


def test_10_ms_regions_of_sustained_work_read_the_simulators_energy():
    """Back-to-back 10 ms steps at a locked clock, as a training loop's: each step's energy
    is the simulator's own counter's within 2%. (A lone 10 ms kernel between idle
    stretches is not: no power reading, refreshed every 100 ms, describes it; its energy
    is marked an estimate.)"""
    sim = make_sim()
    sim.set_locked_sm_clocks(0, 1350, 1350)
    sim.open_context(0)
    sim.idle(0.5)
    steps = []
    with Sampler(sim, [0]) as sampler:
        sim.run_work(0, 1350e6 * 0.25)  # the loop's start: past a driver refresh
        for _ in range(30):
            t0, e0 = sampler.mark(), sim.truth(0).energy_mj
            sim.run_work(0, 1350e6 * 0.01)
            steps.append((t0, sampler.mark(), (sim.truth(0).energy_mj - e0) / 1e3))
        sim.run_work(0, 1350e6 * 0.25)
    for t0, t1, truth_j in steps:
        w = sampler.window(t0, t1)
        assert w.duration_s == pytest.approx(0.01, rel=0.01)
        assert w.energy_j == pytest.approx(truth_j, rel=0.02)
        assert w.power_w_mean <= w.power_w_max


@pytest.mark.parametrize("phase", [0.0, 0.007, 0.013])
@pytest.mark.parametrize("seconds", [0.01, 0.02, 0.03, 0.1, 1.0, 10.0])
def test_a_lone_regions_energy_from_idle_is_the_simulators_own(seconds, phase):
    """One kernel between idle stretches, at the top clock: its window, asked for once the
    driver's next 20 ms power sample is out, reads the simulator's own counter within 2%
    and its mean power within min..max, whatever the phase of the samples' stamps (a
    10-30 ms region read 40-80% low from readings refreshed every 100 ms). Under 25 ms it
    is still marked an estimate: an H200's stamps jitter by several ms (one of three
    10 ms regions there read idle), which the simulator's regular stamps do not show."""
    sim = make_sim()
    sim.open_context(0)
    sim.idle(1.0 + phase)
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.3)
        t0, e0 = sampler.mark(), sim.truth(0).energy_mj
        sim.run_work(0, 1980e6 * seconds)  # longer under the power cap
        t1, e1 = sampler.mark(), sim.truth(0).energy_mj
        sim.idle(0.05)  # the samples stamped after the region's end
        w = sampler.window(t0, t1)
    truth_j = (e1 - e0) / 1e3
    assert w.energy_j == pytest.approx(truth_j, rel=0.02)
    assert w.power_w_mean == pytest.approx(truth_j / w.duration_s, rel=0.02)
    assert w.power_w_mean <= w.power_w_max
    assert w.energy_interpolated == (seconds < 0.025)


@pytest.mark.parametrize("later", [0.05, 5.0, 30.0])
def test_a_window_asked_for_long_after_its_region_still_has_the_power_samples(later):
    """The driver keeps ~2.4 s of power samples; the sampler drains them into its own ring
    every POWER_DRAIN_S while it runs, so a 30 ms region's window asked for 5 s or 30 s
    later (`gpuenv run`'s regions are summarised every 30 s) reads the simulator's own
    counter within 2%, as one asked for at once does (without the drains: 3.6 J of 33)."""
    sim = make_sim()
    sim.open_context(0)
    sim.idle(1.0)
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.3)
        t0, e0 = sampler.mark(), sim.truth(0).energy_mj
        sim.run_work(0, 1980e6 * 0.03)
        t1, e1 = sampler.mark(), sim.truth(0).energy_mj
        sim.idle(later)
        w = sampler.window(t0, t1)
    assert w.energy_j == pytest.approx((e1 - e0) / 1e3, rel=0.02)
    assert not w.energy_interpolated


def test_energy_of_a_long_region_is_the_counter_delta_at_its_changes():
    # reads every 25 ms, counter refreshed every 100 ms (1 kW): equal reads are not changes
    slow = [SlowSample(0.025 * k, 0, 100_000 * (k // 4), {}) for k in range(160)]
    fast = [sample(0.0, 1980, power=300.0)]  # a power reading that disagrees: not used
    w = summarize(fast, slow, [], 0.5, 2.5, gpu=0)
    assert w.energy_j == pytest.approx(2000.0)
    assert not w.energy_interpolated


def test_time_under_a_reason_comes_from_the_cumulative_counters():
    slow = [
        SlowSample(0.0, 0, None, {"power": 0}),
        SlowSample(0.4, 0, None, {"power": 0}),  # a region edge
        SlowSample(0.45, 0, None, {"power": 30_000_000}),  # the other edge
    ]
    w = summarize([sample(0.0, 1980)], slow, [], 0.4, 0.45, gpu=0)
    assert w.reason_s == {"power": pytest.approx(0.03)}


def test_lock_held_ignores_idle_samples_and_compares_busy_ones_with_the_range():
    fast = [sample(0.0, 345, reasons=REASON_GPU_IDLE), sample(0.1, 1350), sample(0.2, 1335)]
    assert summarize(fast, [], [], 0.0, 0.15, gpu=0, lock_range=(1350, 1350)).lock_held is True
    w = summarize(fast, [], [], 0.0, 0.25, gpu=0, lock_range=(1350, 1350))
    assert w.lock_held is False and w.lock_range_mhz == (1350, 1350)


def test_other_processes_come_from_the_slow_reads_minus_our_own():
    slow = [SlowSample(0.0, 0, None, {}, other_pids=(7,)), SlowSample(0.1, 0, None, {})]
    assert summarize([sample(0, 1980)], slow, [], 0.05, 0.08, gpu=0).other_pids == (7,)
    w = summarize([sample(0, 1980)], slow, [], 0.05, 0.08, gpu=0, own_pids=[7])
    assert w.other_pids == ()


def test_no_samples_gives_an_empty_window_not_an_error():
    w = summarize([], [], [], 1.0, 2.0, gpu=0)
    assert w.sm_mhz_mean is None and w.n_samples == 0


def test_a_failed_read_in_the_region_marks_the_window():
    gaps = [Gap(1.5, 0, "read_fast", "timeout")]
    assert summarize([sample(1.0, 1980)], [], gaps, 1.2, 1.8, gpu=0).gap
    assert not summarize([sample(1.0, 1980)], [], gaps, 2.0, 2.5, gpu=0).gap


def test_records_round_trip_through_json():
    w = Window(
        gpu=1,
        t0=1.0,
        t1=2.0,
        n_samples=3,
        sm_mhz_mean=1500.0,
        reason_s={"power": 0.5},
        lock_range_mhz=(1350, 1350),
        other_pids=(4, 5),
        reasons=4,
    )
    assert Window.from_dict(json.loads(json.dumps(w.to_dict()))) == w
    s = Sample(1.0, 0, 1980, 2619, 300.0, 40.0, 4, 123, 310.0)
    assert Sample.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert Window.from_dict({**w.to_dict(), "from_a_newer_gpuenv": 1}) == w


def test_window_summary_reads_like_a_sentence():
    w = Window(
        gpu=0,
        t0=0.0,
        t1=2.0,
        n_samples=80,
        sm_mhz_min=1380.0,
        sm_mhz_mean=1452.0,
        sm_mhz_max=1980.0,
        power_w_mean=690.0,
        power_w_max=699.0,
        energy_j=1380.0,
        temp_c_start=45.0,
        temp_c_end=47.0,
        reasons=REASON_SW_POWER_CAP,
        reason_s={"power": 1.9},
        lock_held=False,
    )
    text = str(w)
    assert "SM 1452 MHz (1380-1980)" in text
    assert "SwPowerCap" in text and "under power cap 1.90 s" in text
    assert "1380 J" in text and "lock NOT held" in text


# -- merging windows (a long region's chunks, a name's regions) ---------------------------


def _w(t0, t1, **kw) -> Window:
    return Window(gpu=0, t0=t0, t1=t1, n_samples=kw.pop("n", 1), **kw)


def test_merge_windows_weights_by_time_and_adds_counters():
    a = _w(
        0,
        1,
        sm_mhz_mean=1000,
        sm_mhz_min=900,
        sm_mhz_max=1100,
        power_w_mean=100,
        energy_j=100.0,
        temp_c_start=30,
        temp_c_end=40,
        temp_c_max=40,
        reasons=0x1,
        reasons_start=0x1,
        reason_s={"power": 0.5},
        lock_held=True,
        sm_mhz_start=900,
    )
    b = _w(
        1,
        4,
        sm_mhz_mean=2000,
        sm_mhz_min=1900,
        sm_mhz_max=2100,
        power_w_mean=300,
        energy_j=900.0,
        temp_c_start=40,
        temp_c_end=50,
        temp_c_max=55,
        reasons=0x4,
        reason_s={"power": 1.0, "thermal": 0.25},
        lock_held=False,
        sm_mhz_end=2000,
    )
    m = merge_windows([a, b])
    assert (m.t0, m.t1, m.n_samples) == (0, 4, 2)
    assert m.sm_mhz_mean == pytest.approx(1750)  # (1000*1 + 2000*3) / 4
    assert m.power_w_mean == pytest.approx(250)
    assert (m.sm_mhz_min, m.sm_mhz_max) == (900, 2100)
    assert m.energy_j == 1000.0
    assert (m.temp_c_start, m.temp_c_end, m.temp_c_max) == (30, 50, 55)
    assert m.reasons == 0x5 and m.reasons_start == 0x1
    assert m.reason_s == {"power": 1.5, "thermal": 0.25}
    assert m.lock_held is False
    assert (m.sm_mhz_start, m.sm_mhz_end) == (900, 2000)
    assert merge_windows([a]) is a


def test_merged_windows_end_in_the_last_chunks_state():
    # a region that started capped and ended uncapped: its end state is the last chunk's
    a = _w(0, 1, reasons=0x4, reasons_start=0x4, reasons_end=0x4)
    b = _w(1, 2, reasons=0x4, reasons_start=0x4, reasons_end=0x0, own_process=True)
    m = merge_windows([a, b])
    assert (m.reasons_start, m.reasons_end, m.reasons) == (0x4, 0x0, 0x4)
    assert m.own_process is True  # seen in any chunk, as one window over both would say
    assert merge_windows([b, a]).reasons_end == 0x4
    assert merge_windows([_w(0, 1, own_process=False), _w(1, 2)]).own_process is False
    assert merge_windows([_w(0, 1), _w(1, 2)]).own_process is None


# -- the sampler on virtual time ---------------------------------------------------------


def test_sampler_ticks_at_its_period_and_reads_counters_at_most_every_slow_period():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(1.0)
    fast = sampler.samples()
    counters = [s for s in sampler.slow_samples() if s.reason_ns]
    energy = [s for s in sampler.slow_samples() if s.energy_mj is not None]
    assert len(fast) == pytest.approx(1 + 1.0 / DEFAULT_PERIOD_S, abs=1)
    assert len(counters) == pytest.approx(1 + 1.0 / DEFAULT_SLOW_PERIOD_S, abs=1)
    # the energy counter costs ~3 ms a read: once a second, not with every counter read
    assert len(energy) == pytest.approx(1 + 1.0 / DEFAULT_ENERGY_PERIOD_S, abs=1)
    # the process list is read twice per driver period, the counters once
    assert len(sampler.slow_samples()) == pytest.approx(1 + 1.0 / DEFAULT_PROCESS_PERIOD_S, abs=1)
    assert all(b.t - a.t == pytest.approx(DEFAULT_PERIOD_S) for a, b in itertools.pairwise(fast))


def test_edge_reads_do_not_delay_the_periodic_counter_reads():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        for _ in range(int(3 * DEFAULT_SLOW_PERIOD_S / 0.037) + 1):  # three periods of edges
            sim.idle(0.037)
            sampler.mark()
    periodic = [s.t for s in sampler.slow_samples() if not s.edge and s.reason_ns]
    assert len(periodic) >= 2
    assert max(b - a for a, b in itertools.pairwise(periodic)) <= DEFAULT_SLOW_PERIOD_S + 1e-6


def test_mark_reads_the_counters_at_the_edge_on_virtual_time():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.33)
        t = sampler.mark()
        edges = [s for s in sampler.slow_samples() if s.edge]
    assert edges[-1].t == t


def test_a_train_of_tiny_regions_does_not_read_the_energy_counter_at_its_edges():
    # each energy read costs ~3 ms of driver time: edges a few ms apart must not each pay it
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.open_context(0)
        for _ in range(200):  # 1.7 s of 5 ms regions: 400 edges
            sampler.mark()
            sim.run_work(0, 0.005 * H100_CYCLES_PER_S * 0.3)
            sim.idle(0.0035)
            sampler.mark()
    energy = [s for s in sampler.slow_samples() if s.energy_mj is not None]
    edges = [s for s in sampler.slow_samples() if s.edge]
    assert len(edges) > 300 and all(s.reason_ns for s in edges)  # reason times stay exact
    assert 2 <= len(energy) <= 2 + 1.7 / DEFAULT_ENERGY_PERIOD_S


def test_energy_of_a_long_region_matches_the_truth_across_a_power_step():
    # reads once a second; the region starts 0.3 s after one, at the step from idle to load
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.open_context(0)
        sim.idle(0.3)
        t0, t1, joules = _loaded_region(sim, sampler, 2.3)
        sim.idle(0.5)
    w = sampler.window(t0, t1)
    assert not w.energy_interpolated
    assert w.energy_j == pytest.approx(joules, rel=0.02)


def _loaded_region(sim, sampler, seconds: float) -> tuple[float, float, float]:
    """A region of `seconds` of half-loaded work: its marked edges and its true energy (J)."""
    t0 = sampler.mark()
    e0 = sim.truth(0).energy_mj
    while sim.clock.now() < t0 + seconds:
        sim.run_work(0, 0.1 * H100_CYCLES_PER_S * 0.5)
    t1 = sampler.mark()
    return t0, t1, (sim.truth(0).energy_mj - e0) / 1e3


def test_a_sampler_no_one_marks_reads_no_energy_and_a_long_region_still_gets_its_energy():
    # the energy counter adds nothing between a region's edges: with no region marked for
    # a while it is not read (a ~3 ms read), and the edges of a long region, past that
    # while, still give its exact energy; the reason times are read once a second marked
    # or not (doors that judge spans after the fact mark no edge)
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.open_context(0)
        sim.idle(5.0)  # no region: after the start's read, no energy reads
        idle = [s for s in sampler.slow_samples() if s.energy_mj is not None]
        assert [s.t for s in idle] == [sampler.samples()[0].t]
        assert 4 <= len([s for s in sampler.slow_samples() if s.reason_ns]) <= 7
        checks = [s for s in sampler.slow_samples() if s.own_present is not None]
        assert len(checks) >= 5.0 / DEFAULT_PROCESS_PERIOD_S
        t0, t1, joules = _loaded_region(sim, sampler, 6.0)  # past the 2 s of periodic reads
    energy_t = [s.t for s in sampler.slow_samples() if s.energy_mj is not None]
    assert energy_t[1] == t0 and energy_t[-1] == t1  # read at both edges
    assert all(t <= t0 + 2.0 * DEFAULT_ENERGY_PERIOD_S + 0.1 for t in energy_t[1:-1])
    w = sampler.window(t0, t1)
    assert not w.energy_interpolated
    assert w.energy_j == pytest.approx(joules, rel=0.01)


def test_the_sampler_counts_and_times_each_kind_of_read_it_makes():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.5)
        sampler.mark()
        sim.idle(0.55)  # past the tick a period after the start's read (the energy read)
    times = sampler.read_times
    assert times is not None
    slow = sampler.slow_samples()
    assert times["fast"][0] == len(sampler.samples())
    assert times["processes"][0] == sum(1 for s in slow if s.own_present is not None)
    assert times["energy"][0] == sum(1 for s in slow if s.energy_mj is not None) == 2
    assert times["counters"][0] == sum(1 for s in slow if s.reason_ns and s.energy_mj is None)
    assert all(wall > 0 and cpu >= 0 for n, wall, cpu in times.values() if n)


def test_sampler_stops_ticking_after_stop():
    sim = make_sim()
    sampler = Sampler(sim, [0])
    sampler.start()
    sim.idle(0.5)
    sampler.stop()
    n = len(sampler.samples())
    sim.idle(0.5)
    assert len(sampler.samples()) == n
    sampler.stop()  # twice is fine


def test_ring_buffer_is_bounded_and_an_overwritten_region_is_a_gap():
    sim = make_sim()
    with Sampler(sim, [0], capacity=16) as sampler:
        sim.idle(0.1)
        t_old = sampler.mark()
        sim.idle(2.0)
    assert len(sampler.samples()) == 16
    assert sampler.window(t_old, t_old + 0.05).gap


def test_samples_from_a_time_on_are_those_of_the_whole_ring_from_then():
    """samples(t0) walks back from the newest sample (a trace's pull): the same answer as
    filtering the whole ring, for a t0 inside it, before it and after it."""
    sim = make_sim()
    with Sampler(sim, [0], capacity=64) as sampler:
        sim.idle(5.0)  # the ring wrapped
        ring = sampler.samples()
        for t0 in (
            ring[0].t - 1,
            ring[0].t,
            ring[20].t,
            ring[20].t + 0.001,
            ring[-1].t,
            ring[-1].t + 1,
        ):
            assert sampler.samples(t0) == [s for s in ring if s.t >= t0]
            assert sampler.samples(t0, ring[40].t) == [s for s in ring if t0 <= s.t <= ring[40].t]


def test_a_failing_read_becomes_a_gap_never_an_exception():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.open_context(0)
        sim.idle(0.5)
        sim.inject_fault(0, "timeout", op="read_fast", count=3)
        t0 = sampler.mark()
        sim.run_work(0, 0.2 * H100_CYCLES_PER_S, power_intensity=0.3)
        t1 = sampler.mark()
        sim.idle(0.5)
        t2 = sampler.mark()
        sim.run_work(0, 0.2 * H100_CYCLES_PER_S, power_intensity=0.3)
        t3 = sampler.mark()
    assert [g.op for g in sampler.gaps] == ["read_fast"] * 3
    assert sampler.window(t0, t1).gap
    assert not sampler.window(t2, t3).gap


def test_a_lost_gpu_mid_run_is_a_gap_and_the_sampler_keeps_going():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.2)
        sim.inject_fault(0, "gpu_lost", op="read_slow")
        sim.idle(0.5)
        t = sampler.mark()
    assert any(g.op == "read_slow" and "lost" in g.error.lower() for g in sampler.gaps)
    assert sampler.samples(t, t)  # cheap reads still arrive


def test_unsupported_counters_are_skipped_without_gaps():
    sim = make_sim()
    sim.inject_fault(0, "not_supported", op="read_slow")
    with Sampler(sim, [0]) as sampler:
        t0 = sampler.mark()
        sim.idle(0.5)
        t1 = sampler.mark()
    w = sampler.window(t0, t1)
    assert not sampler.gaps and not w.gap
    assert w.reason_s == {} and w.sm_mhz_mean is not None
    assert w.energy_interpolated  # from the power readings, not the missing counter


def test_window_of_a_capped_region_on_the_sim_matches_the_ground_truth():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.open_context(0)
        sim.idle(1.0)
        t0 = sampler.mark()
        e0 = sim.truth(0).energy_mj
        cap0 = sim.truth(0).reason_ns["power"]
        sim.run_work(0, 3.0 * H100_CYCLES_PER_S)
        t1 = sampler.mark()
        truth = sim.truth(0)
    w = sampler.window(t0, t1)
    assert w.reasons & REASON_SW_POWER_CAP
    true_cap_s = (truth.reason_ns["power"] - cap0) / 1e9
    assert w.reason_s["power"] == pytest.approx(true_cap_s, abs=0.1)  # one driver refresh
    assert w.energy_j == pytest.approx((truth.energy_mj - e0) / 1e3, rel=0.05)
    assert w.sm_mhz_min < 1980 <= w.sm_mhz_max


def test_sampler_covers_several_gpus_independently():
    sim = SimBackend("h100", n_gpus=2, clock=VirtualClock())
    with Sampler(sim, [0, 1]) as sampler:
        t0 = sampler.mark()
        sim.run_work(1, 1.0 * H100_CYCLES_PER_S)
        t1 = sampler.mark()
    assert sampler.window(t0, t1, 0).sm_mhz_max == 345  # GPU 0 never got a context
    assert sampler.window(t0, t1, 1).sm_mhz_max == 1980
    with pytest.raises(ConfigError, match="not sampled"):
        sampler.window(t0, t1, 5)


@pytest.mark.parametrize("kwargs", [{"period": 0}, {"slow_period": -1}, {"capacity": 2}], ids=str)
def test_bad_settings_are_refused_with_a_clear_error(kwargs):
    with pytest.raises(ConfigError):
        Sampler(make_sim(), [0], **kwargs)
    with pytest.raises(ConfigError, match="at least one GPU"):
        Sampler(make_sim(), [])


def test_a_second_start_is_refused():
    sampler = Sampler(make_sim(), [0])
    sampler.start()
    with pytest.raises(RuntimeError):
        sampler.start()
    sampler.stop()


# -- the sampler on real time (no timing asserted) -----------------------------------------


class _ThreadRecorder:
    """A backend wrapper that records which threads call the slow reads."""

    def __init__(self, inner: SimBackend):
        self.inner = inner
        self.slow_threads: set[int] = set()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def read_slow(self, index: int, *, energy: bool = True):
        self.slow_threads.add(threading.get_ident())
        return self.inner.read_slow(index, energy=energy)


def test_real_time_sampler_reads_slow_counters_off_the_callers_thread():
    backend = _ThreadRecorder(SimBackend("h100", clock=RealClock()))
    sampler = Sampler(backend, [0], period=0.005)  # type: ignore[arg-type]
    sampler.start()
    try:
        t0 = sampler.mark()
        backend.inner.idle(0.05)
        t1 = sampler.mark()
        w = sampler.window(t0, t1)  # waits for the sampler's end-edge read
    finally:
        sampler.stop()
    assert threading.get_ident() not in backend.slow_threads
    assert backend.slow_threads
    assert any(s.t >= t1 and s.edge for s in sampler.slow_samples())
    assert w.sm_mhz_mean is not None
    assert not sampler.running


def test_real_time_marks_in_a_tight_loop_share_edge_reads():
    sim = SimBackend("h100", clock=RealClock())
    sampler = Sampler(sim, [0])
    sampler.start()
    try:
        start = time.monotonic()
        for _ in range(20_000):
            sampler.mark()
        elapsed = time.monotonic() - start
        last = sampler.mark()
        sampler.window(last, last)  # waits for the last edge read
    finally:
        sampler.stop()
    edges = [s for s in sampler.slow_samples() if s.edge]
    assert 1 <= len(edges) <= elapsed / EDGE_MIN_INTERVAL_S + 3
