"""gpuenv.bench(fn) with no options: the safe default, and tiny kernels timed many calls a rep.

The default condition ("auto") measures as is only when gpuenv's own clock lock holds
on the GPU; otherwise it measures in bursts, each started from the cool, uncapped
state; a reason the chosen condition was meant to keep out is a warning.
"""

from __future__ import annotations

import pytest

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import local_lock as lock
from gpuenv.conditioning import ConditionConfig
from gpuenv.errors import ConfigError
from gpuenv.timebase import VirtualClock
from gpuenv.verdict import MeasurementRejected

MATMUL_S = 1.4e-3


def sim_at(hot: bool, profile: str = "h100") -> SimBackend:
    sim = SimBackend(profile, clock=VirtualClock())
    sim.open_context(0)
    sim.idle(10.0)
    if hot:
        timing.sim_kernel(sim, 0, seconds=20.0)()  # 20 s of heavy load: capped, hot
    return sim


def bench(sim: SimBackend, seconds: float = MATMUL_S, **kw):
    return timing.bench(
        timing.sim_kernel(sim, 0, seconds=seconds),
        backend=sim,
        budget_s=1.0,
        keep_trace=False,
        **kw,
    )


def test_unlocked_and_cold_it_measures_in_bursts_without_waiting():
    m = bench(sim_at(hot=False))
    assert m.extra["condition"] == "burst" and "not locked" in m.extra["condition_why"]
    assert m.extra["burst_first_wait_s"] < 0.5
    assert m.verdict == "ok"


def test_unlocked_and_hot_it_waits_for_the_cap_to_clear_and_agrees_with_cold():
    cold, hot = bench(sim_at(hot=False)), bench(sim_at(hot=True))
    assert hot.extra["condition"] == "burst"
    assert hot.extra["burst_first_wait_s"] > 0.1  # it waited for the uncapped state
    assert abs(hot.median_s / cold.median_s - 1) < 0.01
    raw = bench(sim_at(hot=True), condition="none")  # today's raw behaviour, for who asks
    assert raw.median_s / cold.median_s - 1 > 0.05
    assert raw.extra["condition"] == "none" and raw.extra["condition_why"] == "asked for"


def test_locked_and_holding_it_measures_as_is(tmp_path):
    sim = sim_at(hot=False)
    with lock(1350, backend=sim, supervise=False):
        m = bench(sim, seconds=0.2e-3)
    assert m.extra["condition"] == "none"
    assert "locked by gpuenv (1350 MHz) and holding" in m.extra["condition_why"]
    assert "burst_first_wait_s" not in m.extra
    assert m.telemetry.lock_held is True and m.verdict == "ok"


def test_locked_but_not_holding_it_bursts_back_inside_the_lock_and_says_why():
    sim = sim_at(hot=True)  # capped: a lock at the top clock cannot hold right now
    with lock(1980, backend=sim, supervise=False):
        m = bench(sim)
    assert m.extra["condition"] == "burst"
    assert "not holding now" in m.extra["condition_why"]
    assert m.extra["burst_first_wait_s"] > 0.1
    assert m.windows[0].lock_range_mhz == (1980, 1980)  # judged against the lock


def test_a_reason_burst_mode_was_meant_to_avoid_is_a_warning_and_reject_rejects_it():
    def hot_consumer_card() -> SimBackend:
        # it throttles and does not recover within the (shortened) burst timeout
        sim = sim_at(hot=False, profile="rtx4090")
        timing.sim_kernel(sim, 0, seconds=60.0, power_intensity=1.0)()
        return sim

    # 20 ms: the cap clears within ~0.1 s of the load stopping, so the reps start under it
    cfg = timing.BenchConfig(
        conditioning=ConditionConfig(burst_timeout_s=0.02), budget_s=0.5, keep_trace=False
    )
    sim = hot_consumer_card()
    m = timing.bench(timing.sim_kernel(sim, 0, seconds=2e-3), cfg, backend=sim)
    cap = [f for f in m.findings if f.kind == "power_cap"]
    assert cap and cap[0].severity == "warning"  # info when the condition allows capping
    assert m.verdict == "annotated"
    sim = hot_consumer_card()
    with pytest.raises(MeasurementRejected, match="power_cap"):
        timing.bench(timing.sim_kernel(sim, 0, seconds=2e-3), cfg, backend=sim, policy="reject")


def test_a_kernel_is_timed_one_call_a_rep_by_one_method_at_every_size():
    # one meaning at every size: no threshold where the method (and what the number holds)
    # changes; the time is per call, the method named in the measurement
    tiny, big = (bench(sim_at(hot=False), seconds=s) for s in (5e-6, 50e-6))
    assert tiny.median_s == pytest.approx(5e-6, rel=0.02)
    assert big.median_s == pytest.approx(50e-6, rel=0.02)
    for m in (tiny, big):
        assert m.extra["method"] == "the simulated GPU's time of each call"
        assert m.extra["calls_per_rep"] == 1 and "tiny_kernel" not in m.extra
    events = bench(sim_at(hot=False), seconds=5e-6, mode="events")
    assert events.extra["method"] == "mode='events': the simulated GPU's clock"


def test_a_kernel_whose_time_straddles_the_old_threshold_keeps_one_method_over_200_calls():
    sim = sim_at(hot=False)
    kernels = [timing.sim_kernel(sim, 0, seconds=s) for s in (19.5e-6, 20.5e-6)]
    methods = {
        (
            m.extra["method"],
            m.extra["calls_per_rep"],
        )
        for i in range(200)
        for m in [timing.bench(kernels[i % 2], backend=sim, reps=10, keep_trace=False)]
    }
    assert methods == {("the simulated GPU's time of each call", 1)}


def test_bench_config_refuses_unknown_settings_and_conditions():
    with pytest.raises(ConfigError, match="unknown settings: colour"):
        timing.bench(lambda: None, colour="red")
    with pytest.raises(ConfigError, match="unknown condition"):
        timing.BenchConfig(condition="warm")


def test_reps_after_the_cap_cleared_are_not_charged_the_cap_before_them():
    """The time-under-cap counter refreshes every ~100 ms and is interpolated between reads:
    a 1.4 ms rep right after burst mode's wait got a share of the cap before it ("held
    back 100% ... at 1980 MHz"). Where no sample shows the cap bit, it does not count."""
    m = bench(sim_at(hot=True))
    assert m.extra["condition"] == "burst"
    assert all(w.sm_mhz_mean == 1980 for w in m.windows)
    assert "power_cap" not in {f.kind for f in m.findings}
    assert m.verdict == "ok"


class _Samples:
    """What conditioning.recovered reads: samples after a time, and the newest one."""

    def __init__(self, rows: list[tuple[float, int, int]]):  # (t, SM MHz, reasons)
        from gpuenv.telemetry import Sample

        self.rows = [Sample(t, 0, mhz, 2619, 300.0, 40.0, reasons) for t, mhz, reasons in rows]

    def samples(self, t0, t1, gpu):
        return [s for s in self.rows if s.t >= t0 and (t1 is None or s.t <= t1)]

    def latest(self, gpu):
        return self.rows[-1] if self.rows else None


@pytest.mark.parametrize(
    ("rows", "reasons_ready", "clock_ready"),
    [
        # after heavy load on the H100: the clock one step down, the cap bit still set
        ([(1.0, 1965, 0x4), (1.1, 1965, 0x4)], False, True),
        # the clock still held down: neither starts
        ([(1.0, 1965, 0x4), (1.1, 1500, 0x4)], False, False),
        ([(1.0, 1500, 0x4), (1.1, 1965, 0x4)], False, False),  # both newest must be back
        # a thermal slowdown is waited for either way
        ([(1.0, 1980, 0x20), (1.1, 1980, 0x20)], False, False),
        ([(1.0, 1980, 0), (1.1, 1980, 0)], True, True),
    ],
)
def test_burst_ready_clock_starts_once_the_clock_is_back_with_the_cap_bit_still_set(
    rows, reasons_ready, clock_ready
):
    from gpuenv import conditioning
    from gpuenv.verdict import GpuFacts

    facts = GpuFacts(max_sm_mhz=1980.0)
    for ready, how in ((reasons_ready, "reasons"), (clock_ready, "clock")):
        cc = ConditionConfig(burst_ready=how)
        assert (
            conditioning.recovered(_Samples(rows), 0, since=0.5, facts=facts, config=cc) is ready
        ), how
    if rows[0][2] == 0x4 and clock_ready:  # no known maximum clock: the bit is all there is
        assert not conditioning.recovered(
            _Samples(rows), 0, since=0.5, facts=None, config=ConditionConfig(burst_ready="clock")
        )


@pytest.mark.parametrize(
    ("rows", "ready"),
    [
        ([(0.59, 1980, 0), (0.61, 1980, 0)], True),  # one since, one just before
        ([(0.59, 1980, 0x4), (0.61, 1980, 0)], False),  # the one before capped
        ([(0.55, 1980, 0), (0.61, 1980, 0)], False),  # too long before: wait for another
        ([(0.57, 1980, 0), (0.59, 1980, 0)], False),  # the newest never before
    ],
)
def test_a_first_bursts_check_may_judge_the_sample_read_just_before_it(rows, ready):
    from gpuenv import conditioning
    from gpuenv.verdict import GpuFacts

    facts = GpuFacts(max_sm_mhz=1980.0)
    samples = _Samples(rows)  # since 0.5: a driver refresh later, 0.6, the call began
    assert conditioning.recovered(samples, 0, since=0.5, facts=facts, lookback_s=0.02) is ready
    assert not conditioning.recovered(samples, 0, since=0.5, facts=facts)  # two since, as before


def test_burst_ready_is_checked():
    with pytest.raises(ConfigError, match="burst_ready"):
        ConditionConfig(burst_ready="soon")
    for bad in (
        {"burst_clock_fall_rel": 1.0},
        {"burst_clock_fall_rel": -0.1},
        {"burst_clock_redos": -1},
    ):
        with pytest.raises(ConfigError, match="burst_clock"):
            ConditionConfig(**bad)


def test_hot_burst_ready_clock_starts_before_the_cap_bit_clears_and_says_so():
    # the simulated H100 keeps the cap's reason, the clock one step down, ~0.5 s after load
    cold = bench(sim_at(hot=False))
    waits = {}
    for how in ("reasons", "clock"):
        cc = ConditionConfig(burst_wait="seen", burst_duty=0.5, poll_s=0.005, burst_ready=how)
        hot = bench(sim_at(hot=True), conditioning=cc)
        waits[how] = hot.extra["burst_first_wait_s"]
        assert abs(hot.median_s / cold.median_s - 1) < 0.01, how
        # starting under the bit, the reps carry the cap's finding: never a silent number
        assert ("power_cap" in {f.kind for f in hot.findings}) is (how == "clock"), how
    assert waits["clock"] < waits["reasons"] - 0.2


def test_hot_burst_ready_clock_does_not_wait_between_bursts_for_the_bit_alone():
    # bursts after the first: the cap's lingering bit with the clock back is no reason to
    # wait (each wait asks for a driver refresh, ~0.15 s), as it was none before the first
    cc = ConditionConfig(burst_wait="seen", burst_duty=0.5, poll_s=0.005, burst_ready="clock")
    hot = bench(sim_at(hot=True), conditioning=cc, reps=40)  # ~56 ms of reps: 3 bursts
    assert hot.extra["bursts"] >= 3
    assert hot.extra["burst_waits"] == 0
