"""A region's energy from an H200's own 20 ms power samples, kept read-only in
docs/h200/power_samples-2026-11-29.json (scripts/probe_power_samples.py: 10, 20, 30, 100
and 1000 ms of bf16 matmuls after 2 s idle, three trials each): the estimate
(`summarize(..., power=...)`) lies between the idle and the power limit, and for the
1 s regions agrees with the energy counter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.telemetry import summarize

DATA = Path(__file__).parent.parent / "docs" / "h200" / "power_samples-2026-11-29.json"
IDLE_W = 120.0  # the H200 idled at 123-125 W with a context open (its samples before)
LIMIT_W = 700.0  # its power limit
COUNTER_REFRESH_S = 0.1  # the energy counter moves every ~100 ms


def _rows() -> list[dict]:
    return json.loads(DATA.read_text())["rows"]


def _window(row: dict):
    power = [(ts * 1e-6, float(w)) for ts, w in row["samples"]]
    return summarize([], [], [], row["start_us"] * 1e-6, row["end_us"] * 1e-6, gpu=0, power=power)


@pytest.mark.parametrize("ms", [10, 20, 30, 100, 1000])
def test_the_estimate_lies_between_idle_and_the_power_limit(ms: int) -> None:
    for row in (r for r in _rows() if r["ms"] == ms):
        w = _window(row)
        assert IDLE_W * w.duration_s <= w.energy_j <= LIMIT_W * w.duration_s * 1.3
        assert w.power_w_mean <= w.power_w_max
        # the mark: an estimate under 25 ms (one of three 10 ms regions read idle)
        assert w.energy_interpolated == (w.duration_s < 0.025)


def test_regions_of_29_ms_and_longer_read_alike_across_trials() -> None:
    for ms in (30, 100, 1000):
        means = [_window(r).power_w_mean for r in _rows() if r["ms"] == ms]
        assert max(means) / min(means) < 1.15, (ms, means)


def test_a_30_ms_regions_power_leaves_out_the_decay_after_it() -> None:
    """The power after a 29 ms region decays over 40-60 ms (224, 142, 127 W): the stretch
    after it is not the power beside its end. Read from the idle stretch before it and its
    start stretch alone, the three trials agree within 2% (747-758 W); with the decay's mean
    put past its end they read 810-837 W, 3.3% apart, unmarked either way."""
    windows = [_window(r) for r in _rows() if r["ms"] == 30]
    means = [w.power_w_mean for w in windows]
    assert max(means) / min(means) < 1.02, means
    assert not any(w.energy_interpolated for w in windows)


def test_a_1_s_regions_estimate_is_the_energy_counters() -> None:
    """The counter read just after the work is up to one ~100 ms refresh behind it, so its
    delta is low by up to that much of the work: the estimate lies between the delta and
    the delta plus a refresh at the power limit, and the three trials' total within 5%."""
    rows = [r for r in _rows() if r["ms"] == 1000]
    got, counted = [], []
    for row in rows:
        e0, e1 = row["energy_mj"]
        delta = (e1 - e0) / 1e3
        w = _window(row)
        assert delta - COUNTER_REFRESH_S * IDLE_W <= w.energy_j
        assert w.energy_j <= delta + COUNTER_REFRESH_S * LIMIT_W
        got.append(w.energy_j)
        counted.append(delta)
    assert sum(got) == pytest.approx(sum(counted), rel=0.05)
