"""gpuenv.bench_pair: calls of a and b alternating, the ratio of each pair's medians.

The statistic is checked on numbers (a state that moves both sides alike between pairs
cancels in the ratio), the schedule and the result on the simulated GPU."""

from __future__ import annotations

import math
import random

import pytest

import gpuenv
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.timebase import VirtualClock
from gpuenv.timing import pair_ratio, sim_kernel
from gpuenv.timing.pair import min_pairs


def sim() -> SimBackend:
    be = SimBackend("h100", clock=VirtualClock())
    be.open_context(0)
    return be


def test_a_state_that_moves_both_sides_cancels_in_the_pairs_ratio():
    # as on the H100: each call sits in a state of the GPU that moves 4% between pairs
    # (shared by the two calls of a pair), plus 0.1% of its own
    rng = random.Random(7)
    state = [1.0 + 0.04 * rng.random() for _ in range(12)]
    a = [1.000e-3 * s * (1 + 0.001 * rng.gauss(0, 1)) for s in state]
    b = [0.995e-3 * s * (1 + 0.001 * rng.gauss(0, 1)) for s in state]
    assert (max(a) - min(a)) / min(a) > 0.02  # each side alone moves far more than 0.5%
    ratio, (lo, hi), coverage = pair_ratio(a, b)
    assert abs(ratio - 0.995) < 0.001
    assert lo < 0.995 < hi and hi < 1.0  # the 0.5% is shown, the interval excludes 1
    assert coverage >= 0.95
    # the medians of the two sides, compared unpaired, cannot show it
    assert sorted(a)[3] < sorted(b)[-4]


def test_the_interval_is_the_order_statistics_of_the_pairs_ratios():
    a = [1.0] * 10
    b = [0.97, 0.98, 0.99, 1.00, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06]
    ratio, (lo, hi), coverage = pair_ratio(a, b)
    assert math.isclose(ratio, math.sqrt(1.01 * 1.02))  # the median of the log ratios
    assert (lo, hi) == pytest.approx((0.98, 1.05))  # 2nd and 9th of 10
    assert coverage == pytest.approx(1 - 2 * 11 / 1024)
    with pytest.raises(ValueError):
        pair_ratio([1.0], [1.0, 2.0])


def test_bench_pair_alternates_and_shows_a_two_percent_faster_b():
    be = sim()
    order: list[str] = []
    old_k = sim_kernel(be, 0, seconds=1.40e-3)
    new_k = sim_kernel(be, 0, seconds=1.37e-3)

    def old() -> None:
        order.append("a")
        old_k()

    def new() -> None:
        order.append("b")
        new_k()

    p = gpuenv.bench_pair(old, new, pairs=4, names=("old", "new"), backend=be, confidence=0.85)
    runs = [order[0]] + [x for i, x in enumerate(order[1:], 1) if x != order[i - 1]]
    assert runs == ["a", "b", "a", "b", "a"]  # a b | b a | a b | b a (a b a b ...: 8 runs)
    assert len(p.a) == len(p.b) == len(p.ratios) == 4
    assert p.names == ("old", "new") and {m.name for m in p.a} == {"old"}
    assert p.ratio == pytest.approx(1.37 / 1.40, rel=1e-3)
    assert p.outcome == "faster" and p.change == pytest.approx(-0.0214, abs=1e-3)
    text = str(p)
    assert "new / old: 0.9786" in text and "new is 2.14% faster than old" in text
    same = gpuenv.bench_pair(old_k, old_k, pairs=4, backend=be, confidence=0.85)
    assert same.outcome == "no change shown" and "interval holds 1" in str(same)


def test_findings_of_any_call_are_named_and_settings_reach_every_call():
    be = sim()
    heavy = sim_kernel(be, 0, seconds=5.0)
    gemm = sim_kernel(be, 0, seconds=1.4e-3)
    heavy()  # capped: measured as it is, the calls carry the power cap
    p = gpuenv.bench_pair(gemm, gemm, pairs=6, backend=be, condition="none", reps=12)
    assert all(len(m.times_s) == 12 for m in p.a + p.b)
    assert all(m.extra["condition"] == "none" for m in p.a + p.b)
    assert "power_cap" in p.findings and "findings in some calls: " in str(p)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"pairs": 1}, "pairs"),
        ({"pairs": 5}, "fewer than 6 pairs cannot give a 95% interval"),
        ({"pairs": "ten"}, "pairs"),
        ({"names": ("old",)}, "names must be two non-empty strings"),
        ({"names": ("old", "")}, "names must be two non-empty strings"),
        ({"confidence": 1.5}, "confidence"),
        ({"reps": 0}, "reps"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(kwargs, says):
    be = sim()
    ran: list[int] = []

    def fn() -> None:
        ran.append(1)

    with pytest.raises(ConfigError, match=says):
        gpuenv.bench_pair(fn, fn, backend=be, **kwargs)
    assert not ran or "reps" in kwargs  # bench's own settings are checked by bench
    with pytest.raises(ConfigError):
        gpuenv.bench_pair(fn, 42, backend=be)  # type: ignore[arg-type]


def test_the_fewest_pairs_are_those_whose_interval_reaches_the_confidence():
    # the widest interval of n ratios (smallest to largest) covers 1 - 2 / 2**n
    assert [min_pairs(c) for c in (0.5, 0.85, 0.95, 0.99)] == [2, 4, 6, 8]
