"""Findings from windows, and the policies that turn them into verdicts."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from gpuenv.backend import (
    REASON_GPU_IDLE,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)
from gpuenv.errors import ConfigError
from gpuenv.telemetry import Window
from gpuenv.verdict import (
    Finding,
    GpuFacts,
    VerdictConfig,
    assess,
)
from gpuenv.verdict.effect import weigh

H100 = {0: GpuFacts(max_sm_mhz=1980, slowdown_c=89, gpu_max_c=87, power_limit_w=700)}


def win(i: int = 0, *, gpu: int = 0, sm: float = 1980, dur: float = 0.1, **kw) -> Window:
    fields = dict(
        gpu=gpu,
        t0=i * 1.0,
        t1=i * 1.0 + dur,
        n_samples=4,
        sm_mhz_min=sm,
        sm_mhz_mean=sm,
        sm_mhz_max=sm,
        sm_mhz_start=sm,
        sm_mhz_end=sm,
        power_w_mean=300.0,
        power_w_max=300.0,
        temp_c_start=40.0,
        temp_c_end=40.0,
        temp_c_max=40.0,
    )
    fields.update(kw)
    return Window(**fields)  # type: ignore[arg-type]


def kinds(findings: list[Finding]) -> dict[str, Finding]:
    return {f.kind: f for f in findings}


def test_a_steady_uncapped_gpu_has_no_findings():
    ws = [win(i) for i in range(20)]
    assert assess(ws, [0.010] * 20, facts=H100) == []


def test_noisy_but_steady_times_raise_no_warmup_alarm():
    rng = random.Random(3)
    for _ in range(200):
        times = [0.010 * (1 + rng.gauss(0, 0.02)) for _ in range(30)]
        found = assess([win(i) for i in range(30)], times, facts=H100)
        assert found == [], found


def test_slow_first_reps_are_a_warmup_ramp_and_name_those_reps():
    times = [0.150, 0.020, 0.011] + [0.010] * 17
    f = kinds(assess([win(i) for i in range(20)], times, facts=H100))["warmup_ramp"]
    assert f.reps == (0, 1, 2)
    assert f.severity == "warning"
    assert "first 3 reps" in f.message and "15.00x slower" in f.message


def test_a_region_starting_from_idle_is_a_cold_start():
    ws = [win(0, sm_mhz_start=345, sm_mhz_min=345, reasons_start=REASON_GPU_IDLE)] + [
        win(i) for i in range(1, 5)
    ]
    f = kinds(assess(ws, facts=H100))["warmup_ramp"]
    assert f.reps == (0,)
    assert "GpuIdle" in f.message


def test_a_locked_gpu_starting_without_a_context_is_a_cold_start_too():
    # locked clocks do not ramp, but GpuIdle clearing shows the context arriving
    ws = [win(0, sm=1350, reasons_start=REASON_GPU_IDLE, reasons=REASON_GPU_IDLE)]
    assert "warmup_ramp" in kinds(assess(ws, facts=H100))


def test_a_region_shorter_than_the_wake_up_is_cold_when_our_context_is_there():
    # idle readings throughout (the driver had not refreshed yet), but this process
    # holds a context on the GPU: it ran at the idle clock
    ws = [
        win(
            0,
            sm=345,
            reasons_start=REASON_GPU_IDLE,
            reasons=REASON_GPU_IDLE,
            reasons_end=REASON_GPU_IDLE,
            own_process=True,
        )
    ]
    assert "warmup_ramp" in kinds(assess(ws, facts=H100))


def test_a_gpu_idle_throughout_is_not_warming_up_it_is_unused():
    ws = [
        win(
            i,
            sm=345,
            reasons_start=REASON_GPU_IDLE,
            reasons=REASON_GPU_IDLE,
            reasons_end=REASON_GPU_IDLE,
        )
        for i in range(5)
    ]
    assert assess(ws, [0.01] * 5, facts=H100) == []


def test_power_cap_is_info_by_default_with_time_under_it_and_the_clock_it_cost():
    ws = [
        win(i, sm=1380, dur=1.0, reasons=REASON_SW_POWER_CAP, reason_s={"power": 0.9})
        for i in range(3)
    ]
    f = kinds(assess(ws, facts=H100))["power_cap"]
    assert f.severity == "info"
    assert f.details["time_under_cap_s"] == pytest.approx(2.7)
    assert f.details["clock_cost_mhz"] == pytest.approx(600)
    assert "2.70 s of 3.00 s (90%)" in f.message and "600 MHz (30%)" in f.message
    # the same under a policy that asks for stable clocks is a warning
    strict = kinds(assess(ws, facts=H100, config=VerdictConfig(stable_clocks=True)))
    assert strict["power_cap"].severity == "warning"


def test_power_cap_is_a_warning_only_where_it_moved_the_number():
    strict = VerdictConfig(stable_clocks=True)
    # the cap's bit lingering after heavy load, the clock at its maximum: a tiny kernel once
    # got "SM clock averaged 1980 MHz, 0 MHz (0%) below its 1980 MHz maximum" as a warning
    ws = [win(i, reasons=REASON_SW_POWER_CAP, reason_s={"power": 0.05}) for i in range(4)]
    f = kinds(assess(ws, [1e-3] * 4, facts=H100, config=strict))["power_cap"]
    assert f.severity == "info" and f.details["moved"] is False
    assert "the SM clock stayed at its maximum and the reps' times did not move" in f.message
    # one 15 MHz step down moved it (0.76% of 1980 MHz)
    ws = [win(i, sm=1965, reasons=REASON_SW_POWER_CAP, reason_s={"power": 0.05}) for i in range(4)]
    assert kinds(assess(ws, facts=H100, config=strict))["power_cap"].severity == "warning"
    # the clock at its maximum, but the capped reps 3% slower than the others: moved
    ws = [win(i) for i in range(6)]
    for i in (1, 3, 5):
        ws[i] = win(i, reasons=REASON_SW_POWER_CAP, reason_s={"power": 0.05})
    times = [1.00e-3, 1.03e-3, 1.00e-3, 1.03e-3, 1.00e-3, 1.03e-3]
    f = kinds(assess(ws, times, facts=H100, config=strict))["power_cap"]
    assert f.severity == "warning" and f.details["capped_reps_slower_rel"] == pytest.approx(0.03)
    times = [1.000e-3, 1.001e-3] * 3
    assert kinds(assess(ws, times, facts=H100, config=strict))["power_cap"].severity == "info"


def test_a_long_regions_cap_sentence_gives_the_clock_while_busy_not_over_idle_time():
    # a (run) region of 19.27 s, mostly idle at 345 MHz: its mean clock (615 MHz) is no
    # clock the cap set
    w = win(
        0,
        sm=615,
        dur=19.27,
        sm_mhz_busy_mean=1905.0,
        reasons=REASON_SW_POWER_CAP,
        reason_s={"power": 0.5},
        reason_sampled_s={"GpuIdle": 15.0, "SwPowerCap": 0.5},
    )
    f = kinds(assess([w], facts=H100))["power_cap"]
    assert "SM clock averaged (while busy) 1905 MHz, 75 MHz (4%) below" in f.message
    assert "615" not in f.message


def test_a_counter_tick_of_power_cap_noise_is_not_reported():
    ws = [win(0, dur=10.0, reason_s={"power": 0.001})]
    assert assess(ws, facts=H100) == []


def test_a_power_cap_finding_never_says_zero_time_or_zero_share():
    # the cap bit in a sample, the counter not refreshed over the window: the user saw
    # "the SW power cap held GPU 0 back for 0 us of ... (0%)"
    ws = [win(i, reasons=REASON_SW_POWER_CAP, reason_s={"power": 0.0}) for i in range(3)]
    assert "power_cap" not in kinds(assess(ws, facts=H100))
    # the samples saw it for 20 ms of each rep: that is the time under the cap
    ws = [
        win(
            i,
            reasons=REASON_SW_POWER_CAP,
            reason_s={"power": 0.0},
            reason_sampled_s={"SwPowerCap": 0.02},
        )
        for i in range(3)
    ]
    f = kinds(assess(ws, facts=H100))["power_cap"]
    assert "for 60.0 ms of 300.0 ms (20%)" in f.message
    assert f.details["time_under_cap_s"] == pytest.approx(0.06)
    # one capped rep among many: a share under 1% reads "<1%", never "0%"
    ws = [win(i) for i in range(200)]
    ws[7] = win(7, reasons=REASON_SW_POWER_CAP, reason_s={"power": 0.05})
    f = kinds(assess(ws, facts=H100))["power_cap"]
    assert f.reps == (7,) and "for 50.0 ms of 20.00 s (<1%)" in f.message


def test_thermal_slowdown_and_closeness_to_the_limit():
    sw = kinds(assess([win(0, reasons=REASON_SW_THERMAL, temp_c_max=84.0)], facts=H100))
    assert sw["thermal"].severity == "warning"
    hw = kinds(
        assess(
            [win(0, reasons=REASON_HW_THERMAL | REASON_HW_SLOWDOWN, temp_c_max=90.0)], facts=H100
        )
    )
    assert hw["thermal"].severity == "error"
    assert "hw_slowdown" not in hw  # HwSlowdown is implied by HW thermal
    near = kinds(assess([win(0, temp_c_max=83.0)], facts=H100))
    assert near["thermal"].severity == "info" and "87 C" in near["thermal"].message
    assert assess([win(0, temp_c_max=70.0)], facts=H100) == []


def test_hw_slowdown_and_power_brake():
    f = kinds(assess([win(0, reasons=REASON_HW_POWER_BRAKE | REASON_HW_SLOWDOWN)], facts=H100))
    assert set(f) == {"power_brake"} and f["power_brake"].severity == "error"
    f = kinds(assess([win(0, reasons=REASON_HW_SLOWDOWN)], facts=H100))
    assert set(f) == {"hw_slowdown"}


def test_lock_not_held_names_the_range_and_the_power_cap_as_the_cause():
    ws = [
        win(
            0,
            sm=1290,
            sm_mhz_min=1275,
            lock_held=False,
            lock_range_mhz=(1350, 1350),
            reasons=REASON_SW_POWER_CAP,
        )
    ]
    f = kinds(assess(ws, facts=H100))["lock_not_held"]
    assert f.severity == "warning"
    assert "not the locked 1350 MHz" in f.message and "power cap" in f.message


def test_other_process_and_telemetry_gap():
    f = kinds(assess([win(0, other_pids=(4242,)), win(1, gap=True)], facts=H100))
    assert f["other_process"].reps == (0,) and "4242" in f["other_process"].message
    assert f["telemetry_gap"].reps == (1,)


def test_a_tenant_is_a_warning_only_where_the_reps_it_shared_moved():
    ws = [win(i, other_pids=(4242,) if i < 2 else ()) for i in range(8)]
    ws[0] = dataclasses.replace(ws[0], other_mib=(512,), other_users=("alice",))

    def judged(times: list[float], windows: list[Window] = ws) -> Finding:
        # the judge's one rule weighs every state finding against the reps (verdict.effect)
        cfg = VerdictConfig()
        return kinds(weigh(assess(windows, times, facts=H100), times, cfg))["other_process"]

    same = judged([0.0100] * 8)
    assert same.severity == "info" and same.reps == (0, 1)
    assert "pid 4242, user alice, 512 MiB" in same.message
    # the two reps it shared read 30% slower, the number (the median of 8) held: info
    slower = judged([0.0130] * 2 + [0.0100] * 6)
    assert slower.severity == "info" and "+30.0%" in slower.message
    assert "but the number held" in slower.message
    # it shared five of eight reps, and they moved the median with them
    most = [win(i, other_pids=(4242,) if i < 5 else ()) for i in range(8)]
    moved = judged([0.0130] * 5 + [0.0100] * 3, most)
    assert moved.severity == "warning" and "the number moved" in moved.message
    assert "+30.0% against the other reps' median" in moved.message
    # nothing to compare with (every rep shared, or no rep times): not ruled out
    every = [win(i, other_pids=(4242,)) for i in range(3)]
    assert judged([0.01] * 3, every).severity == "warning"
    assert kinds(assess(ws[:1], facts=H100))["other_process"].severity == "warning"


def test_a_window_without_any_sample_is_a_gap():
    f = kinds(assess([Window(gpu=0, t0=0.0, t1=1.0, n_samples=0)], facts=H100))
    assert "telemetry_gap" in f


def test_clock_drift_between_reps():
    ws = [win(i, sm=s) for i, s in enumerate([1500, 1500, 1500, 1440, 1380])]
    f = kinds(assess(ws, facts=H100))["clock_drift"]
    assert f.reps == (3, 4) and f.severity == "info"
    assert "1380-1500 MHz" in f.message


def test_windows_of_several_gpus_are_split_rep_major():
    ws = [win(0, gpu=0), win(0, gpu=1, other_pids=(9,)), win(1, gpu=0), win(1, gpu=1)]
    f = assess(ws, [0.01, 0.01], facts=H100)
    assert [(x.kind, x.gpu, x.reps) for x in f] == [("other_process", 1, (0,))]
    with pytest.raises(ConfigError, match="rep times"):
        assess(ws, [0.01], facts=H100)


def test_reps_text_collapses_runs():
    ws = [win(i, other_pids=(1,) if i in (0, 1, 2, 5, 7, 8) else ()) for i in range(10)]
    assert "reps 0-2, 5, 7-8" in assess(ws, facts=H100)[0].message


def test_bad_config_is_refused():
    with pytest.raises(ConfigError):
        VerdictConfig(reject_severity="fatal")
    with pytest.raises(ConfigError):
        VerdictConfig(min_reps=0)


def test_finding_round_trips_through_json():
    f = Finding("power_cap", "info", (0, 2), "msg", 1, {"time_under_cap_s": 0.5, "pids": [1]})
    assert Finding.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    assert str(f) == "[info] power_cap: msg"


# -- drift and two modes: reps that did not hold one level ------------------------------


def steady(n: int, level: float, rng: random.Random, noise: float = 0.005) -> list[float]:
    return [level * (1 + rng.gauss(0, noise)) for _ in range(n)]


def only(found: list[Finding], kind: str) -> Finding:
    hits = [f for f in found if f.kind in ("drift", "bimodal")]
    assert [f.kind for f in hits] == [kind], found
    return hits[0]


@pytest.mark.parametrize("noise", [0.003, 0.01, 0.02, 0.04])
def test_noisy_but_steady_reps_hold_one_level(noise: float) -> None:
    """Plain noise (normal, a slow tail, rare outliers, a timer's steps) is one level."""
    rng = random.Random(7)
    for n in (12, 33, 100, 400):
        for _ in range(40):
            times = steady(n, 2.9e-3, rng, noise)
            if rng.random() < 0.5:  # a preempted rep now and then, 10-50% slower
                times = [
                    t * (1 + rng.uniform(0.1, 0.5)) if rng.random() < 0.03 else t for t in times
                ]
            times = [round(t, 7) for t in times]  # 0.1 us steps, as a timer reads
            found = assess([win(i) for i in range(n)], times, facts=H100)
            assert not [f for f in found if f.kind in ("drift", "bimodal")], found


def test_a_four_percent_step_is_drift_naming_both_levels_and_where() -> None:
    rng = random.Random(1)
    times = steady(20, 2.90e-3, rng) + steady(13, 3.016e-3, rng)
    f = only(assess([win(i) for i in range(33)], times, facts=H100), "drift")
    assert f.severity == "warning" and f.details["shape"] == "step"
    assert f.details["at_rep"] == 20 and f.reps == tuple(range(20, 33))
    assert "from 2.90" in f.message and "to 3.0" in f.message and "at rep 20 of 33" in f.message
    assert f.details["rel"] == pytest.approx(0.04, abs=0.01)


def test_a_three_percent_linear_trend_is_drift() -> None:
    rng = random.Random(2)
    times = [t * (1 + 0.03 * i / 59) for i, t in enumerate(steady(60, 2.90e-3, rng, 0.003))]
    f = only(assess([win(i) for i in range(60)], times, facts=H100), "drift")
    assert f.details["shape"] == "trend"
    assert f.details["rel"] == pytest.approx(0.03, abs=0.01)
    assert "drifted from 2.89" in f.message and "over 60 reps" in f.message


def test_two_modes_are_bimodal_naming_the_two_levels_and_their_reps() -> None:
    rng = random.Random(3)
    high = {i for i in range(1, 60) if rng.random() < 0.3}  # rep 0 high: a warmup ramp
    times = [(3.55e-6 if i in high else 3.20e-6) * (1 + rng.gauss(0, 0.005)) for i in range(60)]
    f = only(assess([win(i) for i in range(60)], times, facts=H100), "bimodal")
    assert f.severity == "warning" and set(f.reps) == high
    assert "3.20 us (48 reps) and 3.5" in f.message and "(12 reps)" in f.message
    assert f.details["low_reps"] == 60 - len(high) and f.details["high_reps"] == len(high)


def test_a_warmup_ramp_is_not_also_a_drift_and_times_alone_are_judged() -> None:
    rng = random.Random(4)
    times = [0.150, 0.020, 0.011, *steady(30, 0.010, rng)]
    found = assess([win(i) for i in range(33)], times, facts=H100)
    assert {f.kind for f in found} == {"warmup_ramp"}
    # no telemetry at all: the reps' times still get their finding
    stepped = steady(20, 1e-3, rng) + steady(20, 1.05e-3, rng)
    assert only(assess([], stepped), "drift").gpu is None
