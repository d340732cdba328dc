"""Every warning points at what moved the number (gpuenv.verdict.effect), in every door.

On the simulated H100, on virtual time: a state finding is a warning only where the reps it
names read differently from the others (or the state probe saw the state move fn's time);
otherwise it is info and says the number shows no effect. And every number that moved more
than 2% still carries a warning.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_verdict import win

import gpuenv
from gpuenv import stats, timing
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.judge import Evidence, judge
from gpuenv.reasons import Reason
from gpuenv.results import Measurement
from gpuenv.run.report import build_measurements
from gpuenv.run.tracker import Region
from gpuenv.session import stable
from gpuenv.telemetry import Window
from gpuenv.timebase import VirtualClock
from gpuenv.verdict import GpuFacts, VerdictConfig
from gpuenv.verdict.effect import clock_bound, margin, number_effect, reps_effect

H100_HZ = 1980e6
HBM_HZ = 2619e6
H100 = {0: GpuFacts(max_sm_mhz=1980, slowdown_c=89, gpu_max_c=87, power_limit_w=700)}


def rested() -> SimBackend:
    sim = SimBackend("h100", clock=VirtualClock())
    sim.open_context(0)
    sim.idle(10.0)
    return sim


def load(sim: SimBackend, seconds: float = 20.0) -> None:
    timing.sim_kernel(sim, 0, seconds=seconds)()  # heavy matmuls back to back: capped, hot


def warnings_of(m: Measurement) -> list[str]:
    return [f.kind for f in m.findings if f.severity in ("warning", "error")]


def window(i: int, *, sm: float = 1980.0, capped_s: float = 0.0, dur: float = 0.1) -> Window:
    return win(
        i,
        sm=sm,
        dur=dur,
        power_w_mean=600.0,
        power_w_max=700.0,
        temp_c_start=50.0,
        temp_c_end=50.0,
        temp_c_max=50.0,
        reasons=int(Reason.SW_POWER_CAP) if capped_s else 0,
        reason_s={"power": capped_s} if capped_s else {},
    )


def test_the_effect_is_the_named_reps_against_the_others_and_the_margin_their_ci() -> None:
    assert reps_effect([2, 3], [1.0, 1.0, 1.1, 1.1, 1.0]) == pytest.approx(0.1)
    assert reps_effect([0, 1, 2], [1.0, 1.0, 1.0]) is None  # every rep named: no others
    assert reps_effect([0], [1.0]) is None
    config = VerdictConfig()
    assert margin([1.0] * 20, config) == config.effect_rel  # at least 0.5%
    assert margin([1.0, 1.05] * 10, config) > 0.02  # a wide CI widens it
    with pytest.raises(ConfigError, match="effect_rel"):
        VerdictConfig(effect_rel=-0.1)


def test_what_is_weighed_is_the_number_the_median_of_all_reps_against_the_others() -> None:
    # two slow reps of five: they read 10% slower, the number (the median of all) 0%
    assert number_effect([2, 3], [1.0, 1.0, 1.1, 1.1, 1.0]) == pytest.approx(0.0)
    # three slow reps of five: the median is theirs
    assert number_effect([2, 3, 4], [1.0, 1.0, 1.1, 1.1, 1.1]) == pytest.approx(0.1)
    assert number_effect([0, 1, 2], [1.0, 1.0, 1.0]) is None  # every rep named: no others
    assert number_effect([0], [1.0]) is None


def test_a_memory_bound_tiny_kernel_right_after_load_gets_no_warning() -> None:
    # a 12.46 us read of HBM: the clock under the cap does not move it
    sim = rested()

    def tiny() -> float:
        return sim.run_work(0, 0.0, mem_cycles=12.46e-6 * HBM_HZ, power_intensity=0.3)

    cold = gpuenv.bench(tiny, backend=sim, keep_trace=False)
    load(sim)
    hot = gpuenv.bench(tiny, backend=sim, keep_trace=False)
    assert hot.median_s == pytest.approx(cold.median_s, rel=0.005)
    assert warnings_of(cold) == warnings_of(hot) == []
    cap = next(f for f in hot.findings if f.kind == "power_cap")  # the cap was there: said
    assert cap.severity == "info" and "the number measured shows no effect" in cap.message
    assert cap.details["moved_number"] is False
    assert abs(cap.details["probe_moved_rel"]) < cap.details["effect_margin_rel"]


def test_a_heavy_kernel_whose_capped_reps_read_slower_gets_the_warning() -> None:
    # 0.1 s reps of a heavy kernel: the first runs before the cap sets in, the later ones
    # under it, at a lower clock: ~30% slower
    sim = rested()
    with stable(backend=sim, config=VerdictConfig(stable_clocks=True)) as env:
        m = env.repeat(lambda: sim.run_work(0, 0.1 * H100_HZ), reps=20, name="heavy")
    cap = next(f for f in m.findings if f.kind == "power_cap")
    assert cap.severity == "warning"
    assert cap.details["effect_rel"] > cap.details["effect_margin_rel"] >= 0.005
    assert "held GPU 0 back" in cap.message and "the number moved" in cap.message
    assert f"{cap.details['effect_rel']:+.1%} against the other reps" in cap.message


def test_capped_reps_that_read_the_same_are_info_through_the_judge() -> None:
    # the cap's bit on reps 3-5, their clock one step down, their times those of the rest
    ws = [
        window(i, sm=1965.0 if 3 <= i <= 5 else 1980.0, capped_s=0.05 * (3 <= i <= 5))
        for i in range(10)
    ]
    times = [1e-3 * (1 + 0.0005 * (i % 2)) for i in range(10)]
    config = VerdictConfig(stable_clocks=True)
    m = judge("x", times, Evidence.given(ws, [0]), facts=H100, config=config, policy="reject")
    cap = next(f for f in m.findings if f.kind == "power_cap")
    assert cap.severity == "info" and m.rejected_reps == ()  # kept: they did not move it
    assert "reps 3-5 read +0.0% against the other reps" in cap.message


def test_capped_reps_that_read_slower_while_the_number_held_are_info() -> None:
    # an H200's hot 8192^3 matmul: its capped reps read slower by more than the margin, its
    # number (the median) +0.00% from the kernel's typical one. The finding says both.
    ws = [
        window(i, sm=1965.0 if 3 <= i <= 5 else 1980.0, capped_s=0.05 * (3 <= i <= 5))
        for i in range(10)
    ]
    times = [1e-3 * (1 + 0.0005 * (i % 2)) * (1.03 if 3 <= i <= 5 else 1.0) for i in range(10)]
    config = VerdictConfig(stable_clocks=True)
    m = judge("x", times, Evidence.given(ws, [0]), facts=H100, config=config, policy="reject")
    cap = next(f for f in m.findings if f.kind == "power_cap")
    assert cap.severity == "info" and m.rejected_reps == ()  # kept: the number held
    assert cap.details["effect_rel"] == pytest.approx(0.03, abs=0.001)
    assert abs(cap.details["number_moved_rel"]) < 0.001 and cap.details["moved_number"] is False
    assert (
        "reps 3-5 read +3.1% against the other reps, but the number held: the median of all "
        "reps read +0.0% against the other reps' median, within the 0.5% margin"
    ) in cap.message
    assert "shows no effect" not in cap.message  # the reps did move: said


def test_capped_reps_that_move_the_number_get_the_warning() -> None:
    # six of ten reps under the cap, 3% slower: the median is theirs, and moved
    ws = [window(i, sm=1965.0 if i >= 4 else 1980.0, capped_s=0.05 * (i >= 4)) for i in range(10)]
    times = [1e-3 * (1 + 0.0005 * (i % 2)) * (1.03 if i >= 4 else 1.0) for i in range(10)]
    config = VerdictConfig(stable_clocks=True)
    m = judge("x", times, Evidence.given(ws, [0]), facts=H100, config=config, policy="reject")
    cap = next(f for f in m.findings if f.kind == "power_cap")
    assert cap.severity == "warning" and m.rejected_reps == (4, 5, 6, 7, 8, 9)
    assert cap.details["number_moved_rel"] == pytest.approx(0.03, abs=0.001)
    assert cap.details["moved_number"] is True
    assert "the number moved: the median of all reps read +3.0% against the other reps' " in (
        cap.message
    )
    assert (
        f"at least 0.5%): reps 4-9 read {cap.details['effect_rel']:+.1%} against the other reps"
        in (cap.message)
    )


def test_a_slow_head_that_left_the_number_where_it_was_is_info() -> None:
    # an H200's 5 us add after a hot call: its first reps read slow (a warmup_ramp), its
    # number +0.00% from the kernel's typical one
    ws = [window(i) for i in range(40)]
    times = [5e-6 * (1.2 if i < 3 else 1 + 0.001 * (i % 3)) for i in range(40)]
    m = judge("add1m", times, Evidence.given(ws, [0]), facts=H100)
    ramp = next(f for f in m.findings if f.kind == "warmup_ramp")
    assert ramp.reps == (0, 1, 2) and ramp.severity == "info" and warnings_of(m) == []
    assert "reps 0-2 read +19.9% against the other reps, but the number held" in ramp.message
    assert ramp.details["moved_number"] is False


def test_a_cold_start_that_moved_the_number_keeps_its_warning() -> None:
    # half the reps still warming up, 10% slow: the median falls between the two levels
    ws = [window(i) for i in range(10)]
    times = [1.1e-3 if i < 5 else 1e-3 for i in range(10)]
    m = judge("cold", times, Evidence.given(ws, [0]), facts=H100)
    ramp = next(f for f in m.findings if f.kind == "warmup_ramp")
    assert ramp.reps == (0, 1, 2, 3, 4) and ramp.severity == "warning"
    assert ramp.details["number_moved_rel"] == pytest.approx(0.05)
    assert "the number moved: the median of all reps read +5.0% against the other reps'" in (
        ramp.message
    )


def test_with_every_rep_under_the_cap_its_clock_bounds_the_number() -> None:
    # no rep outside the cap to weigh against, no probe: a kernel's time grows at most as
    # its clock falls, one 15 MHz step (0.8%) here
    ws = [window(i, sm=1965.0, capped_s=0.05) for i in range(20)]
    config = VerdictConfig(stable_clocks=True)
    wide = [1e-3 * (1 + 0.03 * ((7 * i) % 5)) for i in range(20)]  # the median's CI ~3%
    cap = next(
        f
        for f in judge("w", wide, Evidence.given(ws, [0]), facts=H100, config=config).findings
        if f.kind == "power_cap"
    )
    assert clock_bound(cap) == pytest.approx(1980 / 1965 - 1)
    assert cap.severity == "info" and cap.details["effect_measured"] is False
    assert "the number measured shows no effect: no rep ran outside it to weigh against, " in (
        cap.message
    )
    assert "all 20 reps ran at a clock that slows a kernel by at most 0.8%, within the" in (
        cap.message
    )
    narrow = [1e-3] * 20  # the margin is 0.5%: 0.8% can be a move
    cap = next(
        f
        for f in judge("n", narrow, Evidence.given(ws, [0]), facts=H100, config=config).findings
        if f.kind == "power_cap"
    )
    assert cap.severity == "warning" and "the number can read up to 0.8% slow" in cap.message


def test_clock_drift_gives_the_step_in_the_number() -> None:
    ws = [window(i, sm=1980.0 if i < 8 else 1800.0) for i in range(12)]
    times = [1e-3 if i < 8 else 1.1e-3 for i in range(12)]
    m = judge("x", times, Evidence.given(ws, [0]), facts=H100)
    drift = next(f for f in m.findings if f.kind == "clock_drift")
    assert drift.reps == (8, 9, 10, 11) and drift.severity == "info"  # stable_clocks off
    assert "reps 8-11 read +10.0% against the other reps" in drift.message
    assert drift.details["effect_rel"] == pytest.approx(0.1)


def test_do_bench_under_gpuenv_run_at_full_clock_is_not_held_back() -> None:
    # the region's clock at its maximum throughout, the cap's reason set for 35% of it:
    # today's "held GPU 0 back ... 0 MHz (0%) below its maximum" said both at once
    w = window(0, capped_s=0.035)
    call = Region("do_bench bench.py:12", 1, w.t0, w.t1)
    call.windows = {0: w}
    run = Region("(run)", 1, w.t0, w.t1)
    run.windows = {0: w}
    ms = build_measurements(
        [call],
        run,
        gpus=[0],
        facts=H100,
        policy="annotate",
        stable_clocks=False,
        wall_at=lambda t: t,
    )
    cap = next(f for m in ms if m.name == call.name for f in m.findings if f.kind == "power_cap")
    assert cap.severity == "info"
    assert "held" not in cap.message and "below its" not in cap.message
    assert "reason was set on GPU 0 for 35.0 ms of 100.0 ms (35%)" in cap.message
    assert "with no effect on the clock: SM clock averaged 1980 MHz, at its 1980 MHz maximum" in (
        cap.message
    )


# -- the count: on a set of kernels cold, hot and after load --------------------------------


def kernels(sim: SimBackend) -> dict[str, Callable[[], float]]:
    def mem(seconds: float) -> Callable[[], float]:
        return lambda: sim.run_work(0, 0.0, mem_cycles=seconds * HBM_HZ, power_intensity=0.3)

    return {
        "tiny read 12 us": mem(12.46e-6),
        "read 300 us": mem(300e-6),
        "tiny matmul 15 us": timing.sim_kernel(sim, 0, seconds=15e-6),
        "matmul 200 us": timing.sim_kernel(sim, 0, seconds=200e-6),
        "matmul 1.4 ms": timing.sim_kernel(sim, 0, seconds=1.4e-3),
        "light 50 us": timing.sim_kernel(sim, 0, seconds=50e-6, power_intensity=0.3),
    }


def moved_count(pairs: list[tuple[float, Measurement]]) -> tuple[int, int, int]:
    """(warnings where the number did not move more than its CI or 0.5%, numbers that moved
    more than 2% with no warning, measurements): each against its reference time."""
    quiet_warned = loud_silent = 0
    for ref_s, m in pairs:
        moved = abs(m.median_s / ref_s - 1)
        room = max(0.005, stats.summarize(m.times_s).rel_ci)
        if warnings_of(m) and moved <= room:
            quiet_warned += 1
        if moved > 0.02 and not warnings_of(m):
            loud_silent += 1
    return quiet_warned, loud_silent, len(pairs)


def test_warnings_point_at_numbers_that_moved_on_the_simulated_h100() -> None:
    sim = rested()
    pairs: list[tuple[float, Measurement]] = []
    for fn in kernels(sim).values():
        sim.idle(5.0)
        cold = gpuenv.bench(fn, backend=sim, keep_trace=False)
        pairs.append((cold.median_s, cold))
        load(sim)  # right after heavy load: the default waits, or probes that it need not
        pairs.append((cold.median_s, gpuenv.bench(fn, backend=sim, keep_trace=False)))
        sim.idle(5.0)  # reps of 0.1 s of calls on a rested GPU: heavy ones run into the cap
        calls = max(1, round(0.1 / cold.median_s))
        with stable(backend=sim, config=VerdictConfig(stable_clocks=True)) as env:
            block = env.repeat(lambda fn=fn, k=calls: [fn() for _ in range(k)], reps=20)
        pairs.append((cold.median_s * calls, block))
    quiet_warned, loud_silent, n = moved_count(pairs)
    assert n == 18
    assert sum(abs(m.median_s / ref - 1) > 0.02 for ref, m in pairs) >= 3  # some did move
    assert (quiet_warned, loud_silent) == (0, 0)
