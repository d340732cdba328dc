"""summarize_many: the same Windows as the summary before it (tests/window_oracle.py), on
random sample streams and spans (gaps, idle, missing counters, regions before, after and
between the samples), and on what a Sampler recorded of a simulated bench."""

from __future__ import annotations

import dataclasses
import random

import pytest
import window_oracle

from gpuenv.reasons import COUNTER_NAMES, Reason
from gpuenv.telemetry import Gap, Sample, Sampler, SlowSample, summarize, summarize_many

REASONS = [
    0,
    int(Reason.GPU_IDLE),
    int(Reason.SW_POWER_CAP),
    Reason.SW_POWER_CAP,
    int(Reason.GPU_IDLE | Reason.APP_CLOCKS),
    int(Reason.SW_THERMAL | Reason.HW_SLOWDOWN),
    1 << 40,
]


def _fast(rng: random.Random, t: float, n: int) -> list[Sample]:
    out = []
    for _ in range(n):
        t += rng.choice([0.025, 0.025, 0.024, 0.0, 0.3, 1e-9, 0.001])  # ticks, gaps, ties
        out.append(
            Sample(
                t,
                0,
                rng.choice([1980, 1755, 1410, 345]),
                rng.choice([2619, 1593]),
                rng.uniform(60, 700),
                rng.uniform(30, 90),
                rng.choice(REASONS),
                power_instant_w=rng.choice([None, rng.uniform(60, 700)]),
            )
        )
    return out


def _slow(rng: random.Random, t: float, n: int) -> list[SlowSample]:
    out = []
    energy, ns = 1_000_000, dict.fromkeys(COUNTER_NAMES, 0)
    for _ in range(n):
        step = rng.choice([0.1, 0.02, 0.1, 0.5, 0.0, 1.2])
        t += step
        energy += rng.choice([0, 0, 30_000, 70_000]) if step else 0  # one instant, one value
        for k in ns:
            ns[k] += rng.choice([0, 0, 20_000_000, 100_000_000])
        kind = rng.random()
        if kind < 0.2:  # a process check alone
            out.append(
                SlowSample(
                    t,
                    0,
                    None,
                    {},
                    None,
                    tuple(rng.sample([7, 8, 9], 1)),
                    own_present=rng.choice([None, True, False]),
                )
            )
            continue
        keys = list(ns) if kind < 0.7 else rng.sample(list(ns), rng.randint(0, len(ns)))
        value_t = rng.choice([None, t - rng.uniform(0, 0.1), t - 0.5])
        out.append(
            SlowSample(
                t,
                0,
                rng.choice([energy, energy, None]),
                {k: ns[k] for k in keys},
                rng.choice([None, rng.uniform(40, 80)]),
                tuple(rng.sample([7, 8, 1234], 2)),
                rng.random() < 0.3,
                value_t,
                rng.choice([None, True]),
            )
        )
    return out


def _spans(rng: random.Random, lo: float, hi: float, n: int) -> list[tuple[float, float]]:
    out = []
    t = lo
    for _ in range(n):
        kind = rng.random()
        if kind < 0.6:  # a train of reps, as a bench's
            t += rng.uniform(0, 0.001)
            d = rng.uniform(1e-6, 5e-4)
            out.append((t, t + d))
            t += d
        elif kind < 0.7:
            out.append((t, t))  # an instant
        else:  # anywhere: before, after or across the samples; long ones use the counter
            a = rng.uniform(lo - 1.0, hi + 1.0)
            out.append((a, a + rng.choice([rng.uniform(0, 0.2), rng.uniform(1.0, 4.0)])))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_summarize_many_gives_the_windows_of_the_summary_before_it(seed: int) -> None:
    rng = random.Random(seed)
    t = 1000.0
    fast = [] if seed % 13 == 5 else _fast(rng, t, rng.randint(1, 120))
    slow = [] if seed % 11 == 3 else _slow(rng, t - 0.5, rng.randint(1, 40))
    end = max([t + 1.0] + [s.t for s in fast] + [s.t for s in slow])
    gaps = [Gap(rng.uniform(t, end), 0, "read_fast", "x") for _ in range(rng.randint(0, 3))]
    spans = _spans(rng, t - 0.2, end + 0.2, 300)
    kw = dict(
        gpu=0,
        lock_range=rng.choice([None, (1755, 1755), (1400, 1980)]),
        own_pids=rng.choice([(), (8,), (7, 8)]),
        period=0.025,
        truncated=rng.random() < 0.3,
    )
    new = summarize_many(fast, slow, gaps, spans, **kw)  # type: ignore[arg-type]
    old = [window_oracle.summarize(fast, slow, gaps, a, b, **kw) for a, b in spans]  # type: ignore[arg-type]
    assert len(new) == len(old)
    for k, (n, o) in enumerate(zip(new, old, strict=True)):
        # repr: every field, float bits and types (a Reason vs an int) included; the time
        # under each reason to 1 ps (running sums bound its extrapolation, the oracle adds)
        assert repr(_no_reasons(n)) == repr(_no_reasons(o)), f"span {k} {spans[k]}"
        assert n.reason_s == pytest.approx(o.reason_s, abs=1e-12), f"span {k} {spans[k]}"
    a, b = spans[-1]
    last = summarize(fast, slow, gaps, a, b, **kw)  # type: ignore[arg-type]
    assert repr(_no_reasons(last)) == repr(_no_reasons(old[-1]))
    assert last.reason_s == pytest.approx(old[-1].reason_s, abs=1e-12)


def _no_reasons(w):
    return dataclasses.replace(w, reason_s=list(w.reason_s))  # the keys, in order


def test_a_samplers_windows_of_a_simulated_bench_are_those_of_the_summary_before(
    warm_sim,
) -> None:
    from gpuenv import timing

    kernel = timing.sim_kernel(warm_sim, 0, seconds=7e-6, power_intensity=0.9)
    dev = timing.SimDevice(warm_sim, 0, flush_bytes=100 * 2**20)
    with Sampler(warm_sim, [0], lock_ranges={0: (1400, 1980)}) as sampler:
        sampler.mark()
        reps = [dev.rep(kernel) for _ in range(3000)]  # ~1 s: power cap, counters, energy
        sampler.mark()
        spans = [(r.t0, r.t1) for r in reps] + [(reps[0].t0, reps[-1].t1)]
        new = sampler.windows(spans, 0)
        fast, slow, gaps = sampler.samples(), sampler.slow_samples(), sampler.gaps
        power = sampler.window_inputs(spans[0][0], 0).power
    assert power  # the driver's power samples, as the windows had them
    old = [
        window_oracle.summarize(
            fast,
            slow,
            gaps,
            a,
            b,
            gpu=0,
            lock_range=(1400, 1980),
            own_pids=sampler.own_pids,
            period=sampler.period,
            power=power,
        )
        for a, b in spans
    ]
    assert [repr(w) for w in new] == [repr(w) for w in old]
    assert any(w.reason_s for w in new) and new[-1].energy_j is not None


def test_two_energy_values_read_at_one_instant_do_not_divide_by_zero() -> None:
    """A coarse clock can stamp two counter reads with one time: the later value stands
    (the extrapolation past the last change had a zero-length slope)."""
    fast = [Sample(10.0 + 0.025 * i, 0, 1980, 2619, 300.0, 50.0, 0) for i in range(8)]
    slow = [
        SlowSample(10.0, 0, 1_000_000, {}, None, ()),
        SlowSample(10.1, 0, 1_030_000, {}, None, ()),
        SlowSample(10.1, 0, 1_031_000, {}, None, ()),
    ]
    (w,) = summarize_many(fast, slow, [], [(10.05, 10.15)], gpu=0)
    assert w.energy_j is not None and w.energy_j > 0


@pytest.mark.parametrize("reasons, capped_s", [(0, 0.0), (int(Reason.SW_POWER_CAP), 0.01)])
def test_a_counter_not_refreshed_since_the_cap_cleared_does_not_carry_it_on(
    reasons: int, capped_s: float
) -> None:
    """The power-cap counter last refreshed while the cap held (1 ns per ns); a region
    right after, at full clock with no reason set, is not 'under power cap' for its whole
    length (it was, by extrapolation at the last rate); while the cap still shows, it is."""
    fast = [
        Sample(10.0 + 0.025 * i, 0, 1380, 2619, 700.0, 60.0, int(Reason.SW_POWER_CAP))
        for i in range(6)
    ]
    fast += [Sample(10.15 + 0.005 * i, 0, 1980, 2619, 800.0, 60.0, reasons) for i in range(6)]
    slow = [
        SlowSample(10.0, 0, None, {"power": 0}, None, ()),
        SlowSample(10.1, 0, None, {"power": 100_000_000}, None, ()),
    ]
    (w,) = summarize_many(fast, slow, [], [(10.16, 10.17)], gpu=0)
    assert w.reason_s["power"] == pytest.approx(capped_s)
    assert w.reasons == reasons


def test_a_regions_energy_from_its_start_to_the_first_counter_read_is_the_works_power():
    # the power steps from 100 to 500 W as the region starts (at 0.05 s), between two
    # samples 100 ms apart: the stretch to the first counter read (0.5 s) drew 500 W all
    # along; the sample in force at the start, read before the work, is not its power
    fast = [
        Sample(0.1 * k, 0, 1980, 2619, 300.0, 40.0, 0, power_instant_w=100.0 if k == 0 else 500.0)
        for k in range(21)
    ]

    def energy_mj(t: float) -> int:
        return round(1e3 * (100.0 * 0.05 + 500.0 * (t - 0.05)))

    slow = [SlowSample(t, 0, energy_mj(t), {}) for t in (0.5, 1.5)]
    w = summarize(fast, slow, [], 0.05, 1.95, gpu=0)
    assert not w.energy_interpolated
    assert w.energy_j == pytest.approx(500.0 * 1.9, rel=1e-6)  # held, it read 930 J


def _stretches(watts: list[float], first: float = 0.0, period: float = 0.02) -> list:
    """Driver power samples every `period` from `first`: each the mean of the stretch
    before its stamp."""
    return [(first + period * k, w) for k, w in enumerate(watts)]


@pytest.mark.parametrize(
    ("edge_w", "truth_j"),
    [
        (1000.0, 1000.0 * 0.015 + 800.0 * 0.025),  # the cap stepped down at the stamp 0.1
        (900.0, 1000.0 * 0.005 + 800.0 * 0.035),  # ... at 0.09, inside the region
        (800.0, 800.0 * 0.04),  # ... at 0.08, before it
    ],
)
def test_an_edge_stretch_is_split_where_the_power_stepped(edge_w, truth_j) -> None:
    """A region [0.085, 0.125] with a whole stretch inside, the power stepping from 1000 to
    800 W in its start's stretch (0.08, 0.1]: its energy is the step's wherever the step
    lies. At the stamp, the part inside taken at the inside stretch's power read -8.6%
    (a 35 ms step of a loop at the simulated H100's cap onset: -4.4%)."""
    power = _stretches([1000.0] * 5 + [edge_w] + [800.0] * 5)
    w = summarize([], [], [], 0.085, 0.125, gpu=0, power=power)
    assert w.energy_j == pytest.approx(truth_j, rel=1e-9)
    assert not w.energy_interpolated


def test_an_edge_stretch_off_the_drivers_period_is_at_the_power_inside() -> None:
    """Stamps off the 20 ms period (an H200's: 28 ms then 12 ms) do not say where in the
    stretch the power stepped: the part inside is at the nearest whole stretch's power, at
    most the stretch's energy, not at the power before it."""
    power = [(0.0, 120.0), (0.02, 120.0), (0.048, 180.0), (0.06, 800.0), (0.08, 800.0)]
    power += [(0.1, 800.0), (0.12, 120.0)]
    w = summarize([], [], [], 0.04, 0.1, gpu=0, power=power)
    edge = min(800.0 * 0.008, 180.0 * 0.028)
    assert w.energy_j == pytest.approx(edge + 800.0 * 0.052, rel=1e-9)


def test_the_end_edges_part_waits_for_the_stretch_after() -> None:
    """The power stepped down at the stamp closing a region's last whole stretch: until the
    stretch after its end stretch is in, the part inside is a guess (the last whole
    stretch's power), marked; then it is the end stretch's own."""
    power = _stretches([1000.0] * 6 + [800.0])
    t0, t1 = 0.045, 0.105  # the end stretch (0.1, 0.12] at 800, the one after not in
    guess = summarize([], [], [], t0, t1, gpu=0, power=power)
    assert guess.energy_interpolated
    done = summarize([], [], [], t0, t1, gpu=0, power=[*power, (0.14, 800.0)])
    assert not done.energy_interpolated
    assert done.energy_j == pytest.approx(1000.0 * 0.055 + 800.0 * 0.005, rel=1e-9)
    assert guess.energy_j == pytest.approx(1000.0 * 0.06, rel=1e-9)


def test_a_loops_second_step_is_not_read_against_the_idle_before_the_first() -> None:
    """Back-to-back 26 ms steps from idle (270 W, then 1250 W from 4.4 ms into a stretch):
    the second step has no whole stretch inside, and the stretch before it held the idle and
    the work. Its part before the step taken at that stretch's mean read +6.9%, unmarked;
    both of the step's stretches drew one level, so the step drew it."""
    power = _stretches([270.0] * 3 + [(4.4 * 270.0 + 15.6 * 1250.0) / 20] + [1250.0] * 4, -0.04)
    w = summarize([], [], [], 0.0304, 0.0564, gpu=0, power=power)
    assert w.energy_j == pytest.approx(1250.0 * 0.026, rel=1e-9)
    assert not w.energy_interpolated and w.power_w_mean <= w.power_w_max


def test_a_step_after_the_cap_stepped_down_at_a_stamp_reads_its_own_power() -> None:
    """1100 W up to the stamp 0.04, then the cap holds 1000 W; the region [0.0462, 0.0713]
    ends into 260 W idle. Both neighbours drew one level, but the one before is not the
    power beside the region's start: its start stretch is at the power its end stretch
    gives the region, so the level stepped at the stamp (-2.4% from both sides)."""
    end = (1000.0 * 11.3 + 260.0 * 8.7) / 20
    power = _stretches([1100.0] * 3 + [1000.0, end] + [260.0] * 3)
    w = summarize([], [], [], 0.0462, 0.0713, gpu=0, power=power)
    assert w.energy_j == pytest.approx(1000.0 * 0.0251, rel=1e-6)
    assert not w.energy_interpolated


def test_a_region_the_samples_cannot_place_is_marked() -> None:
    """500 W before and after, the region [0.045, 0.075] at 900 W then 1100 W: its two
    stretches disagree on its power, and nothing says whether it changed or a neighbour
    stepped at a stamp. Read from both sides (right here), and marked an estimate."""
    power = _stretches(
        [500.0] * 3 + [(2500.0 + 13500.0) / 20, (16500.0 + 2500.0) / 20] + [500.0] * 3
    )
    w = summarize([], [], [], 0.045, 0.075, gpu=0, power=power)
    assert w.energy_j == pytest.approx(900.0 * 0.015 + 1100.0 * 0.015, rel=1e-9)
    assert w.energy_interpolated


# tests/window_oracle.py is what "identical" means: edited twice as if it were not frozen
# (house issue, item 8). A deliberate change updates this hash, adds a line to the
# oracle's docstring and says why in its commit.
ORACLE_SHA256 = "45bb57a30875199f6a0655e95ea6e8bcaca09559aa51399517883a843ad037c0"


def test_the_oracle_is_frozen() -> None:
    import hashlib
    from pathlib import Path

    text = (Path(__file__).parent / "window_oracle.py").read_bytes()
    assert hashlib.sha256(text).hexdigest() == ORACLE_SHA256, (
        "tests/window_oracle.py changed: if on purpose, add a line to its docstring, say why "
        "in the commit and update ORACLE_SHA256"
    )
