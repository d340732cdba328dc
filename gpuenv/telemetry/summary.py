"""Samples -> `Window`: `summarize` (one region) and `summarize_many` (many regions of
one GPU from the same samples: a bench's reps). The samples are prepared once (time
arrays, the energy counter's changes, each reason counter's points), so each region
costs a few bisects and its arithmetic; a do_bench call summarises ~1,000 reps."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Sequence
from typing import Any

from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.reasons import COUNTERS, info
from gpuenv.telemetry import host
from gpuenv.telemetry.counters import Counters
from gpuenv.telemetry.held import Held, power_of
from gpuenv.telemetry.sampled import SAMPLED_EXACT_MIN_S, SAMPLED_MIN_S, SampledPower
from gpuenv.telemetry.samples import DEFAULT_PERIOD_S, DRIVER_REFRESH_S, Gap, Sample, SlowSample
from gpuenv.telemetry.window import Window

# The energy counter moves in ~100 ms steps, so the delta over a region is exact only to
# about one step at each edge: below 10 steps (10% or worse) the power samples give the
# energy, and it is marked estimated. So is a region with fewer than two counter reads.
ENERGY_EXACT_MIN_S = 1.0

# The bits of the reasons mask each cumulative counter measures; "below app/base clocks"
# has none of its own: any reason may hold the clock below them.
_COUNTER_BITS: dict[str, int] = {
    c.name: sum(b for b in (1 << i for i in range(11)) if info(b).counter == c.name) or ~0
    for c in COUNTERS
}


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
    also counts for min/max, reasons and the end temperature. `power`: the driver's
    power samples (host seconds, watts; `Backend.power_samples`), each the mean since
    the one before: where they cover the region, its power and energy come from them.
    """
    return summarize_many(
        fast,
        slow,
        gaps,
        [(t0, t1)],
        gpu=gpu,
        lock_range=lock_range,
        lock_tolerance_mhz=lock_tolerance_mhz,
        own_pids=own_pids,
        period=period,
        lag_s=lag_s,
        truncated=truncated,
        power=power,
    )[0]


def summarize_many(
    fast: Sequence[Sample],
    slow: Sequence[SlowSample],
    gaps: Sequence[Gap],
    spans: Sequence[tuple[float, float]],
    *,
    gpu: int,
    lock_range: tuple[int, int] | None = None,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    own_pids: Iterable[int] = (),
    period: float = DEFAULT_PERIOD_S,
    lag_s: float = DRIVER_REFRESH_S,
    truncated: bool = False,
    power: Sequence[tuple[float, float]] = (),
) -> list[Window]:
    """`summarize` for each (t0, t1) of `spans` (any order, overlaps allowed), from
    samples prepared once: the same Windows, at a fraction of the cost."""
    streams = _Streams(fast, slow, gaps, lag_s, power)
    own = set(own_pids)
    rng = (int(lock_range[0]), int(lock_range[1])) if lock_range is not None else None
    out = []
    for t0, t1 in spans:
        values = streams.from_samples(t0, t1, lock_range, lock_tolerance_mhz)
        values.update(streams.power(t0, t1, values.get("power_w_max")))
        if rng is not None:
            values["lock_range_mhz"] = rng
        gap = streams.gap_near(t0 - period, t1 + period) or (
            truncated and (not fast or fast[0].t > t0)
        )
        values.update(streams.from_counters(t0, t1, own))
        counted = streams.counter_energy_j(t0, t1) if t1 - t0 >= ENERGY_EXACT_MIN_S else None
        if counted is not None:
            values["energy_j"] = counted
        elif values.get("power_w_mean") is not None:
            # within a few counter steps, or with fewer than two counter reads inside, the
            # power samples place the energy better than a counter that moves every
            # ~100 ms and is read once a second: the driver's means where they cover the
            # region (an estimate below SAMPLED_EXACT_MIN_S), else the readings
            values["energy_j"] = values["power_w_mean"] * (t1 - t0)
            values["energy_interpolated"] = (
                t1 - t0 < SAMPLED_EXACT_MIN_S
                or streams.sampled.segments(t0, t1) is None
                or streams.sampled.after_missing(t0, t1)
                or streams.sampled.unsure(t0, t1)
            )
        elif "energy_j" in values:  # no power samples: the counter interpolated across reads
            values["energy_interpolated"] = True
        out.append(Window(gpu=gpu, t0=t0, t1=t1, gap=gap, **values))
    return out


class _Streams:
    """One GPU's samples, prepared for summarising many regions: time arrays to bisect,
    the energy counter's changes, and each reason counter's points and end rate."""

    def __init__(
        self,
        fast: Sequence[Sample],
        slow: Sequence[SlowSample],
        gaps: Sequence[Gap],
        lag_s: float,
        power: Sequence[tuple[float, float]] = (),
    ):
        self.fast, self.slow, self.lag_s = fast, slow, lag_s
        self.times = [s.t for s in fast]
        self.slow_t = [s.t for s in slow]
        self.gap_t = sorted(x.t for x in gaps)
        self.changes = _energy_changes(slow)
        self.change_t = [t for t, _ in self.changes]
        self.change_e = [e for _, e in self.changes]
        # the counter's values at the driver refreshes that set them, where known
        self.refreshed = _energy_changes(slow, refreshed=True)
        self.refreshed_t = [t for t, _ in self.refreshed]
        self.refresh_t, self.refresh_w = _power_readings(fast)
        # the least the GPU drew, as far as the samples and readings show
        self.sampled = SampledPower(
            power, floor_w=min([*(w for _, w in power), *self.refresh_w], default=0.0)
        )
        self.last_read_t = max((s.t for s in slow if s.energy_mj is not None), default=None)
        self.counters = Counters(slow, lag_s)
        self._held: dict[tuple[int, int, bool], Held] = {}
        self._seen: dict[tuple[int, int], dict[str, Any]] = {}
        self._under: dict[str, list[float]] = {}  # counter key -> running seconds under it

    def gap_near(self, lo: float, hi: float) -> bool:
        k = bisect.bisect_left(self.gap_t, lo)
        return k < len(self.gap_t) and self.gap_t[k] <= hi

    def from_samples(
        self, t0: float, t1: float, lock_range: tuple[int, int] | None, lock_tolerance_mhz: float
    ) -> dict[str, Any]:
        """What the cheap samples say: the sample in force at t0 and those inside hold
        over the region; the reading just after it (within lag_s) covers it too."""
        fast, times = self.fast, self.times
        i0 = bisect.bisect_right(times, t0)  # fast[:i0] have t <= t0
        i1 = bisect.bisect_right(times, t1)  # fast[i0:i1] are inside (t0, t1]
        has_after = i1 < len(fast) and fast[i1].t - t1 <= self.lag_s
        key = (i0, i1, has_after)
        held = self._held.get(key)
        if held is None:  # consecutive reps between two ticks share their samples
            held = self._held[key] = Held(fast, i0, i1, has_after, lock_range, lock_tolerance_mhz)
        return held.values(t0, t1)

    def power(self, t0: float, t1: float, sampled_max: float | None) -> dict[str, Any]:
        """The mean and highest power over [t0, t1] from the driver's power readings, each
        placed at the refresh that took it and standing for the time back to the refresh
        before (`_power_segments`); {} without readings."""
        sampled = self.sampled.segments(t0, t1)
        segments = sampled if sampled is not None else self._reading_segments(t0, t1)
        if not segments:
            return {}
        span = sum(b - a for a, b, _ in segments)
        mean = sum((b - a) * w for a, b, w in segments) / span if span > 0 else segments[-1][2]
        if sampled is None:
            high = max(w for _, _, w in segments)
        else:  # a sliver of a sample's interval (under SAMPLED_MIN_S) is no reading: the
            # rest of its energy over a few ms (an H200's 19.5 ms region read 1.5 kW on its
            # last 2.5 ms, whose sample held the power-down after it too)
            high = max([mean] + [w for a, b, w in segments if b - a >= SAMPLED_MIN_S])
        return {
            "power_w_mean": mean,
            "power_w_max": high if sampled_max is None else max(high, sampled_max),
        }

    def _power_segments(self, t0: float, t1: float) -> list[tuple[float, float, float]]:
        """[(a, b, watts)] covering [t0, t1]: the driver's power samples where they cover
        it (`SampledPower.segments`), else its cheap readings. A cheap power reading is taken at
        a refresh and describes the time just before it (the simulated H100: its last
        10 ms; a real one shows a step 27-74 ms late), so each reading refreshed inside the
        region stands for the time back to the refresh before, and the last one for the
        rest up to t1. A region with no refresh inside takes the first reading after it
        (within one refresh), else the one in force: the best there is, an estimate.
        Holding the reading in force at t0 over the region instead (as before 2026-11-28)
        gave a 100 ms kernel from idle the idle power, a tenth of its own."""
        sampled = self.sampled.segments(t0, t1)
        return sampled if sampled is not None else self._reading_segments(t0, t1)

    def _reading_segments(self, t0: float, t1: float) -> list[tuple[float, float, float]]:
        """`_power_segments` from the cheap readings alone."""
        ts, ws = self.refresh_t, self.refresh_w
        lo, hi = bisect.bisect_right(ts, t0), bisect.bisect_right(ts, t1)
        if hi > lo:
            out, prev = [], t0
            for k in range(lo, hi):
                out.append((prev, ts[k], ws[k]))
                prev = ts[k]
            if prev < t1:
                out.append((prev, t1, ws[hi - 1]))
            return out
        if hi < len(ts) and ts[hi] - t1 <= self.lag_s:
            return [(t0, t1, ws[hi])]
        return [(t0, t1, ws[lo - 1])] if lo > 0 else []

    def power_j(self, a: float, b: float, t0: float, t1: float) -> float | None:
        """Energy (J) over [a, b], a stretch of the region [t0, t1], from its power
        readings (`_power_segments`); None without readings."""
        segments = self._power_segments(t0, t1)
        if not segments:
            return None
        return sum(max(0.0, min(b, y) - max(a, x)) * w for x, y, w in segments)

    def from_counters(self, t0: float, t1: float, own: set[int]) -> dict[str, Any]:
        """What the slow reads say: energy interpolated between the counter's changes (the
        fallback without power samples), time under each reason, other processes."""
        out: dict[str, Any] = {}
        slow = self.slow
        if not slow:
            return out
        if self.changes and self.last_read_t is not None:
            e0, e1 = self._energy_at(t0), self._energy_at(t1)
            if e0 is not None and e1 is not None:
                out["energy_j"] = max(0.0, e1 - e0) / 1000.0
        reason_s = self.counters.reason_s(t0, t1, self.sampled_s)
        if reason_s:
            out["reason_s"] = reason_s
        # Other processes: the read in force at t0 and every read up to one refresh after t1.
        k0 = max(0, bisect.bisect_right(self.slow_t, t0) - 1)
        k1 = bisect.bisect_right(self.slow_t, t1 + self.lag_s)
        seen = self._seen.get((k0, k1))
        if seen is None:  # consecutive reps between two reads share them
            seen = self._seen[(k0, k1)] = _seen(slow[k0:k1], own)
        out.update(seen)
        return out

    def sampled_s(self, a: float, b: float, key: str) -> float:
        """Seconds of [a, b] in which the cheap samples show a reason the counter `key`
        measures, each sample holding until the next (before the first sample: all of
        it). From running sums built once a key: each region costs two bisects."""
        if b <= a or not self.fast:
            return max(0.0, b - a)
        sums = self._under.get(key)
        if sums is None:
            mask, total, sums = _COUNTER_BITS.get(key, ~0), 0.0, []
            for i, sample in enumerate(self.fast):
                sums.append(total)
                if i + 1 < len(self.fast) and sample.reasons & mask:
                    total += self.times[i + 1] - sample.t
            self._under[key] = sums
        return self._under_to(b, key, sums) - self._under_to(a, key, sums)

    def _under_to(self, t: float, key: str, sums: list[float]) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return t - self.times[0]  # negative: before the samples, counted as under
        held = bool(self.fast[i].reasons & _COUNTER_BITS.get(key, ~0))
        return sums[i] + (t - self.times[i] if held else 0.0)

    def _energy_at(self, t: float) -> float | None:
        """Energy (mJ) at t; past the last change (not yet refreshed), at the recent rate."""
        changes = self.changes
        value = _interp(self.change_t, self.change_e, t)
        if value is not None:
            return value
        assert self.last_read_t is not None
        if changes[-1][0] < t <= self.last_read_t + DRIVER_REFRESH_S and len(changes) >= 2:
            (ta, va), (tb, vb) = changes[-2], changes[-1]
            return vb + (vb - va) / (tb - ta) * (t - tb)
        return None

    def counter_energy_j(self, t0: float, t1: float) -> float | None:
        """Energy (J) over [t0, t1]: the counter's delta between the first and the last
        value refreshed inside the region (placed at its refresh where the driver says
        when, else at the read that first showed it), plus the stretches from t0 to the
        first and from the last to t1 from the power readings (`power_j`). None with fewer
        than two such values, or without power readings."""
        lo = bisect.bisect_left(self.refreshed_t, t0)
        hi = bisect.bisect_right(self.refreshed_t, t1)
        if hi - lo < 2:
            return None
        (ta, ea), (tb, eb) = self.refreshed[lo], self.refreshed[hi - 1]
        fill = 0.0
        for a, b in ((t0, ta), (tb, t1)):
            if b <= a:
                continue
            part = self.power_j(a, b, t0, t1)
            if part is None:
                return None
            fill += part
        return max(0.0, eb - ea) / 1000.0 + fill


def _interp(ts: list[float], vs: list[float], t: float) -> float | None:
    """Piecewise-linear value at t; None outside the points' span."""
    if not ts or t < ts[0] or t > ts[-1]:
        return None
    k = bisect.bisect_left(ts, t)
    if ts[k] == t:
        return vs[k]
    ta, va, tb, vb = ts[k - 1], vs[k - 1], ts[k], vs[k]
    return va + (vb - va) * (t - ta) / (tb - ta)


def _seen(reads: Sequence[SlowSample], own: set[int]) -> dict[str, Any]:
    """What a region's slow reads saw: other processes (not this one's children: a
    DataLoader worker or a subprocess it started is the benchmark's own), the most GPU memory
    each held and its user where the host shows it; this process; the memory temperature."""
    out: dict[str, Any] = {}
    mib: dict[int, int | None] = {}
    for s in reads:
        for k, p in enumerate(s.other_pids):
            m = s.other_mib[k] if k < len(s.other_mib) else None
            if p not in own and (p not in mib or (m or 0) > (mib[p] or 0)):
                mib[p] = m if m is not None else mib.get(p)
    pids = [p for p in sorted(mib) if not host.descends_from(p, os.getpid())]
    if pids:
        out["other_pids"] = tuple(pids)
        out["other_mib"] = tuple(mib[p] for p in pids)
        out["other_users"] = tuple(host.user_of(p) for p in pids)
    seen = [s.own_present for s in reads if s.own_present is not None]
    if seen:
        out["own_process"] = any(seen)
    mem_temps = [s.mem_temp_c for s in reads if s.mem_temp_c is not None]
    if mem_temps:
        out["mem_temp_c_max"] = max(mem_temps)
    return out


def _energy_changes(
    slow: Sequence[SlowSample], *, refreshed: bool = False
) -> list[tuple[float, float]]:
    """(read time, mJ) of each read that shows a new energy value: the counter steps
    every ~100 ms, so the first read showing a value best places when it changed.
    `refreshed`: at the driver's refresh that set the value where the read says when
    (`value_t`), which is when the counter held it exactly."""
    changes: list[tuple[float, float]] = []
    for s in slow:
        if s.energy_mj is None or (changes and s.energy_mj == changes[-1][1]):
            continue
        t = s.value_t if refreshed and s.value_t is not None else s.t
        if changes and t <= changes[-1][0]:  # two values at one instant: the later one
            changes[-1] = (changes[-1][0], float(s.energy_mj))  # stands (no 0-s slope)
        else:
            changes.append((t, float(s.energy_mj)))
    return changes


def _power_readings(fast: Sequence[Sample]) -> tuple[list[float], list[float]]:
    """Each driver refresh's power reading once, at the refresh (host seconds), in time
    order. The driver stamps a reading on its own clock (us since the epoch): its offset
    from the host's is the largest stamp-minus-read-time, reached by the read that came
    soonest after a refresh (every refresh lies at or before the read that saw it). A
    reading without a stamp, or whose stamp would put its refresh over 2 s before the
    read (another time base), is placed at its read."""
    stamps = [s.driver_ts_us * 1e-6 - s.t for s in fast if s.driver_ts_us]
    offset = max(stamps) if stamps else None
    ts: list[float] = []
    ws: list[float] = []
    seen = None
    for s in fast:
        if s.driver_ts_us and offset is not None:
            if s.driver_ts_us == seen:
                continue  # the same refresh read again
            at = s.driver_ts_us * 1e-6 - offset
            at = at if s.t - 2.0 <= at <= s.t else s.t
        else:
            at = s.t
        seen = s.driver_ts_us
        if ts and at <= ts[-1]:
            continue  # (an older refresh read late: the newer one stands)
        ts.append(at)
        ws.append(power_of(s))
    return ts, ws
