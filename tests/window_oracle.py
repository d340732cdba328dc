"""The summary of samples as gpuenv computed it before `summarize_many` (main at 5e0893c,
gpuenv/telemetry/window.py): a frozen copy, the oracle that tests/test_telemetry_summary.py
holds today's windows to. Do not edit: it is what "identical" means. One deliberate change
since (2026-11-24): a reason counter extrapolated past its last refresh grows no more than
the cheap samples show its reasons (`_shown`): a counter not refreshed since the power cap
cleared carried the cap into regions run at 1980 MHz ("reasons: none; under power cap").
Another (2026-11-25): the energy of the stretch from a region's start to its first counter
read comes from the samples after the start, each covering the time back to the one
before (`_back_weights`), not from the one in force at the start: at the 100 ms tick that
one, read before the work began, stood for up to a tick of the work.
And (2026-11-27) a new field, `sm_mhz_busy_mean`: the clock over the samples without
GpuIdle, weighted as the mean is; no existing value changed. And (2026-11-28) another
tenant's memory and user (`other_mib`, `other_users`, issue 41), and a child of this
process is no other process; no existing value changed.
And (2026-11-28, issue 44) power and energy: each power reading is placed at the driver
refresh that took it (its stamp, on the host clock by the largest stamp-minus-read offset)
and stands for the time back to the refresh before (`_power_segments`): the reading in
force at t0, held over a 100 ms kernel run from idle, gave it the idle power (~10x low).
The counter's values are placed at their refresh (`value_t`) where known, and the stretches
at a region's edges come from the same readings. The file is held to its hash
by tests/test_telemetry_summary.py: a change comes with a line here and its reason.
And (2026-11-29, issue 44) the driver's 20 ms power samples (`power`: host seconds, watts),
each the mean since the one before, give a region's power segments where they cover it
(`_sampled_segments`): a 10 ms kernel from idle read low from the readings refreshed every
100 ms. Their max leaves out segments under 5 ms (a sliver of an interval is not a reading)
and is at least the mean. Without driver samples no value changes.
And (2026-11-29, issue 44) a region with whole sample intervals inside takes its edges' parts
at its power in the nearest of them (at most the edge interval's energy), not the energy less
the power before it over the rest: a loop's first 100 ms step from idle took in the next
step's work (+12% on the simulated H100), its last the idle after it (-6%).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Sequence
from typing import Any

from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ, lock_holds
from gpuenv.reasons import Reason, info, reason_names
from gpuenv.telemetry import host
from gpuenv.telemetry.samples import DEFAULT_PERIOD_S, DRIVER_REFRESH_S, Gap, Sample, SlowSample
from gpuenv.telemetry.window import Window

ENERGY_EXACT_MIN_S = 1.0


def summarize(
    fast: Sequence[Sample],
    slow: Sequence[SlowSample],
    gaps: Sequence[Gap],
    t0: float,
    t1: float,
    *,
    gpu: int,
    lock_range: tuple[int, int] | None = None,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    own_pids: Iterable[int] = (),
    period: float = DEFAULT_PERIOD_S,
    lag_s: float = DRIVER_REFRESH_S,
    truncated: bool = False,
    power: Sequence[tuple[float, float]] = (),
) -> Window:
    """The `Window` of one GPU over [t0, t1] from its samples (each in time order).

    Each cheap sample holds until the next one (the driver's values are step
    functions). The sample in force at t0 and those inside the region give the
    time-weighted means; the first sample after t1 (within `lag_s`, one driver
    refresh: a reading just after may be the first to show what happened inside)
    also counts for min/max, reasons and the end temperature.
    """
    times = [s.t for s in fast]
    i0 = bisect.bisect_right(times, t0)  # fast[:i0] have t <= t0
    i1 = bisect.bisect_right(times, t1)  # fast[i0:i1] are inside (t0, t1]
    before = fast[i0 - 1] if i0 > 0 else None
    inside = list(fast[i0:i1])
    after = fast[i1] if i1 < len(fast) and fast[i1].t - t1 <= lag_s else None
    held = ([before] if before else []) + inside  # samples whose values hold over the region
    if not held and after is not None:
        held = [after]
    covering = held + ([after] if after is not None and held[-1] is not after else [])

    relevant_gaps = [x for x in gaps if t0 - period <= x.t <= t1 + period]
    gap = bool(relevant_gaps) or (truncated and (not fast or fast[0].t > t0))
    values = _from_samples(held, covering, after, t0, t1, lock_range, lock_tolerance_mhz)
    driver = _sampled_segments(power, t0, t1)
    segments = driver if driver is not None else _power_segments(fast, t0, t1, lag_s)
    if segments:
        span = sum(b - a for a, b, _ in segments)
        values["power_w_mean"] = (
            sum((b - a) * w for a, b, w in segments) / span if span > 0 else segments[-1][2]
        )
        high = max(w for _, _, w in segments)
        if driver is not None:
            high = max([values["power_w_mean"]] + [w for a, b, w in segments if b - a >= 0.005])
        sampled = values.get("power_w_max")
        values["power_w_max"] = high if sampled is None else max(high, sampled)
    if lock_range is not None:
        values["lock_range_mhz"] = (int(lock_range[0]), int(lock_range[1]))

    values.update(_from_counters(slow, t0, t1, own_pids, lag_s, fast))
    counted = _counter_energy_j(slow, segments, t0, t1)
    if counted is not None and t1 - t0 >= ENERGY_EXACT_MIN_S:
        values["energy_j"] = counted
    elif values.get("power_w_mean") is not None:
        # within a few counter steps, or with fewer than two counter reads inside, the
        # power samples (instantaneous where the GPU gives it) place the energy better
        # than a counter that moves every ~100 ms and is read once a second
        values["energy_j"] = values["power_w_mean"] * (t1 - t0)
        values["energy_interpolated"] = t1 - t0 < 0.025 or driver is None
    elif "energy_j" in values:  # no power samples: the counter interpolated across reads
        values["energy_interpolated"] = True
    return Window(gpu=gpu, t0=t0, t1=t1, n_samples=len(inside), gap=gap, **values)


def _from_samples(
    held: list[Sample],
    covering: list[Sample],
    after: Sample | None,
    t0: float,
    t1: float,
    lock_range: tuple[int, int] | None,
    lock_tolerance_mhz: float,
) -> dict[str, Any]:
    """What the cheap samples say: `held` hold over the region, `covering` adds the
    reading just `after` it (see `summarize`)."""
    values: dict[str, Any] = {}
    if not held:
        return values
    weights = _hold_weights(held, t0, t1)
    first, last = held[0], covering[-1]
    sm = [s.sm_mhz for s in covering]
    powers = [_power(s) for s in covering]
    bits_s: dict[str, float] = {}
    for s, w in zip(held, weights, strict=True):
        for name in reason_names(s.reasons):
            bits_s[name] = bits_s.get(name, 0.0) + w
    union = 0
    for s in covering:
        union |= s.reasons & ~Reason.GPU_IDLE if s is after and s not in held else s.reasons
    values.update(
        sm_mhz_min=float(min(sm)),
        sm_mhz_max=float(max(sm)),
        sm_mhz_mean=_weighted([s.sm_mhz for s in held], weights),
        sm_mhz_busy_mean=_busy_mean(held, weights),
        sm_mhz_start=float(first.sm_mhz),
        sm_mhz_end=float(last.sm_mhz),
        mem_mhz_mean=_weighted([s.mem_mhz for s in held], weights),
        power_w_max=max(powers),
        temp_c_start=first.temp_c,
        temp_c_end=last.temp_c,
        temp_c_max=max(s.temp_c for s in covering),
        reasons=union,
        reasons_start=first.reasons,
        reasons_end=last.reasons,
        reason_sampled_s=bits_s,
    )
    if lock_range is not None:
        busy = [s for s in held if not s.reasons & Reason.GPU_IDLE]
        if busy:
            values["lock_held"] = all(
                lock_holds(s.sm_mhz, lock_range, lock_tolerance_mhz) for s in busy
            )
    return values


def _energy_changes(slow: Sequence[SlowSample]) -> list[tuple[float, float]]:
    """(read time, mJ) of each read that shows a new energy value: the counter steps
    every ~100 ms, so the first read showing a value best places when it changed."""
    changes: list[tuple[float, float]] = []
    for s in slow:
        if s.energy_mj is not None and (not changes or s.energy_mj != changes[-1][1]):
            changes.append((s.t, float(s.energy_mj)))
    return changes


def _counter_energy_j(
    slow: Sequence[SlowSample],
    segments: list[tuple[float, float, float]],
    t0: float,
    t1: float,
) -> float | None:
    """Energy (J) over [t0, t1]: the counter's delta between the first and the last value
    refreshed inside the region (at `value_t` where known, else at the read), plus the
    stretches from t0 to the first and from the last to t1 from the power readings. None
    with fewer than two such values, or without power readings."""
    refreshed: list[tuple[float, float]] = []
    for s in slow:
        if s.energy_mj is None or (refreshed and s.energy_mj == refreshed[-1][1]):
            continue
        at = s.value_t if s.value_t is not None else s.t
        if refreshed and at <= refreshed[-1][0]:
            refreshed[-1] = (refreshed[-1][0], float(s.energy_mj))
        else:
            refreshed.append((at, float(s.energy_mj)))
    inside = [c for c in refreshed if t0 <= c[0] <= t1]
    if len(inside) < 2:
        return None
    (ta, ea), (tb, eb) = inside[0], inside[-1]
    fill = 0.0
    for a, b in ((t0, ta), (tb, t1)):
        if b <= a:
            continue
        if not segments:
            return None
        fill += sum(max(0.0, min(b, y) - max(a, x)) * w for x, y, w in segments)
    return max(0.0, eb - ea) / 1000.0 + fill


def _power_segments(
    fast: Sequence[Sample], t0: float, t1: float, lag_s: float
) -> list[tuple[float, float, float]]:
    """[(a, b, watts)] over [t0, t1]: each refresh's reading once, at its refresh (the
    driver's stamp less the largest stamp-minus-read offset; at the read without a stamp
    or more than 2 s before it), standing back to the refresh before; the last one inside
    on to t1; with none inside, the first after (within lag_s), else the one in force."""
    stamps = [s.driver_ts_us * 1e-6 - s.t for s in fast if s.driver_ts_us]
    offset = max(stamps) if stamps else None
    readings: list[tuple[float, float]] = []
    seen = None
    for s in fast:
        if s.driver_ts_us and offset is not None:
            if s.driver_ts_us == seen:
                continue
            at = s.driver_ts_us * 1e-6 - offset
            if not s.t - 2.0 <= at <= s.t:
                at = s.t
        else:
            at = s.t
        seen = s.driver_ts_us
        if not readings or at > readings[-1][0]:
            readings.append((at, _power(s)))
    inside = [(u, w) for u, w in readings if t0 < u <= t1]
    if inside:
        out, prev = [], t0
        for u, w in inside:
            out.append((prev, u, w))
            prev = u
        if prev < t1:
            out.append((prev, t1, inside[-1][1]))
        return out
    later = [(u, w) for u, w in readings if u > t1]
    if later and later[0][0] - t1 <= lag_s:
        return [(t0, t1, later[0][1])]
    before = [(u, w) for u, w in readings if u <= t0]
    return [(t0, t1, before[-1][1])] if before else []


def _sampled_segments(
    power: Sequence[tuple[float, float]], t0: float, t1: float
) -> list[tuple[float, float, float]] | None:
    """[(a, b, watts)] over [t0, t1] from samples each the mean since the one before: of
    each interval (prev, ts] that meets the region, the part inside it at the power of the
    nearest interval wholly inside (at most the interval's energy), or, with none inside, the
    interval's energy less the part outside at the last sample's power before it. None: the
    region shorter than 5 ms, no sample at or before t0 or at or after t1, or two more than
    50 ms apart."""
    before = [(u, w) for u, w in power if u <= t0]
    after = [k for k, (u, _) in enumerate(power) if u >= t1]
    if t1 - t0 < 0.005 or not before or not after:
        return None
    first, last = len(before), after[0]
    base = before[-1][1]
    if any(power[k][0] - power[k - 1][0] > 0.05 for k in range(first, last + 1)):
        return None
    out = []
    inner = [
        power[k][1] for k in range(first, last + 1) if power[k - 1][0] >= t0 and power[k][0] <= t1
    ]
    for k in range(first, last + 1):
        a, (b, w) = power[k - 1][0], power[k]
        lo, hi = max(a, t0), min(b, t1)
        if hi <= lo:
            continue
        if inner and (a < t0 or b > t1):
            own = inner[0] if a < t0 else inner[-1]
            out.append((lo, hi, min(own, w * (b - a) / (hi - lo))))
        else:
            joules = w * (b - a) - base * ((b - a) - (hi - lo))
            out.append((lo, hi, max(0.0, joules / (hi - lo))))
    return out


def _power(s: Sample) -> float:
    # the instantaneous power where the GPU gives it: power_w is a 1 s average on Ampere+
    return s.power_instant_w if s.power_instant_w is not None else s.power_w


def _hold_weights(held: Sequence[Sample], t0: float, t1: float) -> list[float]:
    """Seconds of [t0, t1] over which each held sample is the value in force."""
    if t1 <= t0:
        return [0.0] * (len(held) - 1) + [1.0]  # an instant: the value in force
    weights = []
    for k, s in enumerate(held):
        start = t0 if k == 0 else max(t0, s.t)
        end = held[k + 1].t if k + 1 < len(held) else t1
        weights.append(max(0.0, min(end, t1) - start))
    if not any(weights):
        weights[-1] = 1.0
    return weights


def _busy_mean(held: Sequence[Sample], weights: Sequence[float]) -> float | None:
    """The clock over the samples without GpuIdle, each holding as in the mean."""
    busy = [0.0 if s.reasons & Reason.GPU_IDLE else w for s, w in zip(held, weights, strict=True)]
    return _weighted([s.sm_mhz for s in held], busy) if any(busy) else None


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


def _from_counters(
    slow: Sequence[SlowSample],
    t0: float,
    t1: float,
    own_pids: Iterable[int],
    lag_s: float,
    fast: Sequence[Sample],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not slow:
        return out
    # Energy, interpolated between the reads where the counter changed (the fallback
    # when there are no power samples: see summarize)
    changes = _energy_changes(slow)
    last_read_t = max((s.t for s in slow if s.energy_mj is not None), default=None)
    if changes and last_read_t is not None:
        e0 = _interp_energy(changes, last_read_t, t0)
        e1 = _interp_energy(changes, last_read_t, t1)
        if e0 is not None and e1 is not None:
            out["energy_j"] = max(0.0, e1 - e0) / 1000.0
    # Time under each reason: cumulative ns counters, placed at the driver's refresh time
    # (value_t) where known, linear between refreshes and, past the last one, at the rate
    # of the last refresh interval.
    keys = sorted({k for s in slow for k in s.reason_ns})
    reason_s = {}
    for key in keys:
        pts: list[tuple[float, float]] = []
        for s in slow:
            if key in s.reason_ns:
                at = s.value_t if s.value_t is not None else s.t
                if not pts or at > pts[-1][0]:
                    pts.append((at, float(s.reason_ns[key])))
        a = _counter_at(pts, t0, lag_s, lambda u, v, k=key: _shown(fast, u, v, k))
        b = _counter_at(pts, t1, lag_s, lambda u, v, k=key: _shown(fast, u, v, k))
        if a is not None and b is not None:
            reason_s[key] = min(max(0.0, b - a) / 1e9, t1 - t0)
    if reason_s:
        out["reason_s"] = reason_s
    # Other processes: the read in force at t0 and every read up to one refresh after t1.
    ts = [s.t for s in slow]
    k0 = max(0, bisect.bisect_right(ts, t0) - 1)
    k1 = bisect.bisect_right(ts, t1 + lag_s)
    own = set(own_pids)
    # ... not this process's children; each with the most memory a read gave, and its user
    reads = slow[k0:k1]
    pids = sorted({p for s in reads for p in s.other_pids if p not in own})
    pids = [p for p in pids if not host.descends_from(p, os.getpid())]
    if pids:
        out["other_pids"] = tuple(pids)
        known = [
            [
                m
                for s in reads
                for q, m in zip(s.other_pids, s.other_mib, strict=False)
                if q == p and m is not None
            ]
            for p in pids
        ]
        out["other_mib"] = tuple(max(ms) if ms else None for ms in known)
        out["other_users"] = tuple(host.user_of(p) for p in pids)
    seen = [s.own_present for s in slow[k0:k1] if s.own_present is not None]
    if seen:
        out["own_process"] = any(seen)
    mem_temps = [s.mem_temp_c for s in slow[k0:k1] if s.mem_temp_c is not None]
    if mem_temps:
        out["mem_temp_c_max"] = max(mem_temps)
    return out


def _interp(pts: Sequence[tuple[float, float]], t: float) -> float | None:
    """Piecewise-linear value at t; None outside the points' span."""
    if not pts or t < pts[0][0] or t > pts[-1][0]:
        return None
    k = bisect.bisect_left([p[0] for p in pts], t)
    if pts[k][0] == t:
        return pts[k][1]
    (ta, va), (tb, vb) = pts[k - 1], pts[k]
    return va + (vb - va) * (t - ta) / (tb - ta)


def _shown(fast: Sequence[Sample], a: float, b: float, key: str) -> float:
    """Seconds of [a, b] the samples show a reason the counter `key` measures (each holds
    until the next, the last for ever; before the first, or with none: all of it)."""
    bits = [1 << i for i in range(11) if info(1 << i).counter == key]
    mask = sum(bits) if bits else ~0
    if not fast:
        return max(0.0, b - a)
    total = max(0.0, min(b, fast[0].t) - a)
    for i, s in enumerate(fast):
        end = fast[i + 1].t if i + 1 < len(fast) else float("inf")
        if s.reasons & mask:
            total += max(0.0, min(b, end) - max(a, s.t))
    return total


def _counter_at(
    pts: Sequence[tuple[float, float]], t: float, lag_s: float, shown: Any
) -> float | None:
    """A cumulative ns counter at t: interpolated, or extrapolated up to ~2 refreshes past
    the last point at the last interval's rate (at most 1 ns per ns), growing no more
    than the samples show its reasons since that point."""
    value = _interp(pts, t)
    if value is not None or not pts or t < pts[0][0] or t > pts[-1][0] + 2 * lag_s:
        return value
    if len(pts) < 2:
        return pts[-1][1]
    (ta, va), (tb, vb) = pts[-2], pts[-1]
    rate = min(1e9, max(0.0, (vb - va) / (tb - ta)))
    return min(vb + rate * (t - tb), vb + shown(tb, t) * 1e9)


def _interp_energy(
    changes: Sequence[tuple[float, float]], last_read_t: float, t: float
) -> float | None:
    """Energy (mJ) at t; past the last change (not yet refreshed), at the recent rate."""
    value = _interp(changes, t)
    if value is not None:
        return value
    if changes and changes[-1][0] < t <= last_read_t + DRIVER_REFRESH_S and len(changes) >= 2:
        (ta, va), (tb, vb) = changes[-2], changes[-1]
        return vb + (vb - va) / (tb - ta) * (t - tb)
    return None
