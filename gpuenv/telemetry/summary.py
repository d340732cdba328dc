"""Samples -> `Window`: `summarize` (one region) and `summarize_many` (many regions of
one GPU from the same samples: a bench's reps). The samples are prepared once (time
arrays, the energy counter's changes, each reason counter's points), so each region
costs a few bisects and its arithmetic; a do_bench call summarises ~1,000 reps."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterable, Sequence
from typing import Any

from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.reasons import COUNTERS, info
from gpuenv.telemetry import host
from gpuenv.telemetry.counters import Counters
from gpuenv.telemetry.held import Held, power_of
from gpuenv.telemetry.samples import DEFAULT_PERIOD_S, DRIVER_REFRESH_S, Gap, Sample, SlowSample
from gpuenv.telemetry.window import Window

# The energy counter moves in ~100 ms steps, so the delta over a region is exact only to
# about one step at each edge: below 10 steps (10% or worse) the power samples give the
# energy, and it is marked estimated. So is a region with fewer than two counter reads.
ENERGY_EXACT_MIN_S = 1.0
# The driver's power samples (`Backend.power_samples`, ~20 ms apart) are each the mean power
# since the one before; their stamps jitter (8-45 ms apart on an H200). A region they
# cover takes its energy from them (`_Streams._sample_segments`). On the H200, three lone
# regions from idle of each length read (docs/h200/power_samples-2026-11-29.json): 29 ms
# 21.7-22.1 J, 104-109 ms 80-87 J, but 10 ms 1.2-7.4 J and 19.5 ms 9.9-15.4 J: a stamp a
# few ms off moves a region that short wholly into or out of a sample. Shorter than this,
# the energy is still marked an estimate.
SAMPLED_EXACT_MIN_S = 0.025
# A region shorter than this is not resolved by 20 ms means: the rest of a sample's
# interval (another rep's work, in a bench of tiny reps) would be taken for its own.
SAMPLED_MIN_S = 0.005
# Two samples further apart than this have one missing between them (a sample is ~20 ms,
# at most 45 ms apart on the H200): the later one is not the mean over all the time back.
SAMPLE_GAP_MAX_S = 0.05
# The driver's period between power samples. An H200's stamps jitter around it: 28.3 ms then
# 11.8 ms, 33.9 then 10.2 (20 ms windows stamped late), so within a stretch more than this
# off the period, where a step of power lies cannot be placed (`_edge_w`).
SAMPLE_PERIOD_S = 0.02
STAMP_JITTER_S = 0.002
# Two neighbouring stretches whose means are within this of each other drew one level (an
# H200's idle samples: 123.4-125.4 W, 1.6%): the one nearer a region gives the power beside
# its edge (`_Streams._one_sided`).
FLAT_REL = 0.025
# The region's power in its two stretches, each from its own side, agree within this share
# of its energy: the powers beside its edges are right (`_Streams._one_sided`). At 2.5% a
# 27 ms step whose next stretch began with the cap's step down read +2.4%.
AGREE_REL = 0.01
# A region with whole stretches inside is marked an estimate where its edges' parts, in
# stretches that held more than one step (`_Streams._one_step`), may be off by more than
# this share of its energy together.
SURE_REL = 0.02

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
                or streams.sampled_segments(t0, t1) is None
                or streams.after_missing(t0, t1)
                or streams.sampled_unsure(t0, t1)
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
        self.sample_t = [t for t, _ in power]
        self.sample_w = [w for _, w in power]
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
        self.floor_w = min(self.sample_w + self.refresh_w, default=0.0)
        self.last_read_t = max((s.t for s in slow if s.energy_mj is not None), default=None)
        self.counters = Counters(slow, lag_s)
        self._held: dict[tuple[int, int, bool], Held] = {}
        self._sampled_at: dict[
            tuple[float, float], tuple[list[tuple[float, float, float]] | None, bool]
        ] = {}
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
        sampled = self.sampled_segments(t0, t1)
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

    def sampled_segments(self, t0: float, t1: float) -> list[tuple[float, float, float]] | None:
        """`_sampled`'s segments (computed once a region)."""
        return self._sampled(t0, t1)[0]

    def sampled_unsure(self, t0: float, t1: float) -> bool:
        """Whether the samples cover [t0, t1] but cannot tell its energy within ~2%: a
        region with no whole stretch inside whose neighbouring stretches are not each at
        one level (`_one_sided`)."""
        return self._sampled(t0, t1)[1]

    def _sampled(
        self, t0: float, t1: float
    ) -> tuple[list[tuple[float, float, float]] | None, bool]:
        got = self._sampled_at.get((t0, t1))
        if got is None:
            got = self._sampled_at[(t0, t1)] = self._sample_segments(t0, t1)
        return got

    def _sample_segments(
        self, t0: float, t1: float
    ) -> tuple[list[tuple[float, float, float]] | None, bool]:
        """[(a, b, watts)] covering [t0, t1] from the driver's power samples, or None where
        they do not cover it: a sample at or before t0, one at or after t1, none missing
        between (SAMPLE_GAP_MAX_S), and the region not shorter than SAMPLED_MIN_S.

        A sample is the mean power over the time since the one before (an H200: a 10 ms
        kernel of ~700 W from idle read 331-446 W at the next stamp, not idle), so a
        stretch (prev, ts] used w * (ts - prev) joules. A stretch wholly inside is the
        region's. Of an edge stretch (one reaching past t0 or t1):

        - in a region with whole stretches inside, the stretch is taken as the power of the
          stretch beside it outside the region up to one step, then that of the nearest
          whole one inside, the step placed so that the stretch's mean is its own, and the
          part inside is the region's (`_edge_w`): what ran around it does not count (a
          loop's first 100 ms step from idle took in the next step's work, +12% on the
          simulated H100, and its last step the idle after it, -6%), and a step of the
          power cap inside the edge stretch falls where it does. Taking the part inside at
          the nearest whole stretch's power throughout (as before 2026-11-29) read 35-80 ms
          steps in a loop -4.6% .. +4.1% where the cap stepped the power down at a stamp
          (the edge stretch all at the power before it). Where the stretch's stamps are off
          the driver's period (an H200's jitter) or the stretch after the region is not in
          yet, the part is at the nearest whole stretch's power (at most the stretch's
          energy; the latter an estimate, `after_missing`);
        - in a region with none inside, the part before the region is at the power of the
          stretch before it, the part after at the power of the stretch after it
          (`_after_w`: what ran there, idle for a lone region, the next step's work in a
          loop), and the rest is the region's. Taking both at the power before (as before
          2026-11-29) read a loop's first 30 ms step from idle +14.5% (the next step's work
          taken for its own) and its last step up to -14.5% on the simulated H100. Until
          the stretch after is in, the part after is at the power before: an estimate.
          Where the stretches before and after did not draw their power up to the
          region's edges, `_one_sided` reads it otherwise, or marks it.

        The decay after a region (an H200 drew 169, 134, 127 W in the samples after a
        10 ms kernel, then idle: the GPU powering down) is not its."""
        ts, ws = self.sample_t, self.sample_w
        k0 = bisect.bisect_right(ts, t0)  # ts[k0 - 1] <= t0 < ts[k0]
        k1 = bisect.bisect_left(ts, t1)  # ts[k1 - 1] < t1 <= ts[k1]
        if t1 - t0 < SAMPLED_MIN_S or k0 < 1 or k1 >= len(ts):
            return None, False
        if any(ts[k] - ts[k - 1] > SAMPLE_GAP_MAX_S for k in range(k0, k1 + 1)):
            return None, False
        before, after = ws[k0 - 1], self._after_w(k1)
        inside = [k for k in range(k0, k1 + 1) if t0 <= ts[k - 1] and ts[k] <= t1]
        out = []
        for k in range(k0, k1 + 1):
            a, b = ts[k - 1], ts[k]
            lo, hi = max(a, t0), min(b, t1)
            if hi <= lo:
                continue
            if a >= t0 and b <= t1:  # a whole stretch inside: the region's
                out.append((lo, hi, ws[k]))
                continue
            energy = ws[k] * (b - a)
            if inside:
                # an edge of a region with a whole stretch inside: between the power of the
                # stretch on its outside and that of the nearest whole one inside
                far = before if a < t0 else after
                near = ws[inside[0]] if a < t0 else ws[inside[-1]]
                w = _edge_w(ws[k], b - a, hi - lo, far, near)
                # where the step cannot be placed, at the region's power in the nearest whole
                # stretch, at most the edge stretch's energy
                out.append((lo, hi, min(near, energy / (hi - lo)) if w is None else w))
                continue
            # the part before t0 at the power of the stretch before, the part after t1 at
            # the power of the stretch after (until it is in, the power before)
            post = (before if after is None else after) if b > t1 else before
            outside = before * (lo - a) + post * (b - hi)
            # no less than the lower of the powers around the region (an H200's 10 ms
            # region whose work fell mostly into the next sample, stamps jittering, read
            # below idle); not of those around the part: a start stretch's part floored at
            # the power before the region held a power cap's step down inside it at the
            # power before (+7.5% on a 28 ms step of a loop, simulated H100)
            floor = min(before, before if after is None else after)
            out.append((lo, hi, max(floor, (energy - outside) / (hi - lo))))
        if not inside and k1 == k0 + 1:
            return self._one_sided(k0, t0, t1, out)
        return out, self._edges_unsure(k0, k1, t0, t1, inside, out)

    def _edges_unsure(
        self,
        k0: int,
        k1: int,
        t0: float,
        t1: float,
        inside: list[int],
        out: list[tuple[float, float, float]],
    ) -> bool:
        """Whether a region with whole stretches `inside` (its segments `out`) may be off by
        more than SURE_REL: its edge stretches that held more than one step
        (`_one_step`), their energy above idle placed anywhere in them (`_edge_slack`)."""
        ts = self.sample_t
        slack = 0.0
        for k, start, edge in ((k0, True, ts[k0 - 1] < t0), (k1, False, ts[k1] > t1)):
            known = start or self._after_w(k1) is not None  # else marked: `after_missing`
            if edge and known and not self._one_step(k, inside, start):
                slack += self._edge_slack(k)
        return slack > SURE_REL * sum((hi - lo) * w for lo, hi, w in out)

    def _one_step(self, k: int, inside: list[int], start: bool) -> bool:
        """Whether edge stretch k of a region with whole stretches `inside` held at most one
        step, as `_edge_w` takes it: the means from two stretches outside to two whole ones
        inside (those there are) go one way, up or down, or stay (within FLAT_REL). A
        bench's span of bursts and rests does not: its power went work, rest, work within
        20 ms of an edge, and the step placed by the means put 10 ms of a burst's work at
        the rest's power (a 58 ms span of 3 ms reps read -8.0% on the simulated H100)."""
        ws, n = self.sample_w, len(self.sample_w)
        if start:
            outer = [j for j in (k - 2, k - 1) if j >= 0]
            seq = [ws[j] for j in (*outer, k, *inside[:2])]
        else:
            outer = [j for j in (k + 2, k + 1) if j < n]
            seq = [ws[j] for j in (*outer, k, *inside[-2:][::-1])]
        up = down = False
        for x, y in itertools.pairwise(seq):
            if not _near(x, y):
                up, down = up or y > x, down or y < x
        return not (up and down)

    def _edge_slack(self, k: int) -> float:
        """How far apart the joules of edge stretch k's part inside the region may lie where
        the stretch held more than one step: its energy above the least the GPU drew (its
        idle) may be all inside or all outside. A stretch's mean is no bound on its power:
        one that held a burst's 3 ms reps and a rest read 832 W, its work ~1080 W."""
        span = self.sample_t[k] - self.sample_t[k - 1]
        return max(0.0, self.sample_w[k] - self.floor_w) * span

    def _level(self, k: int, beyond: int) -> bool | None:
        """Whether stretch k (a region's neighbour) drew one level throughout, as far as
        the stretch `beyond` it (away from the region) tells: their means within
        FLAT_REL. None where that stretch is not in (or one is missing between)."""
        ts, ws = self.sample_t, self.sample_w
        if not (0 <= beyond < len(ts) and 0 <= k < len(ts)):
            return None
        if abs(ts[max(k, beyond)] - ts[min(k, beyond)]) > SAMPLE_GAP_MAX_S:
            return None
        return _near(ws[k], ws[beyond])

    def _one_sided(
        self, k0: int, t0: float, t1: float, both: list[tuple[float, float, float]]
    ) -> tuple[list[tuple[float, float, float]], bool]:
        """A region across two stretches (a, m] and (m, b], none whole inside, its parts
        outside taken at the powers of the stretches before and after it (`both`).

        That is right where each of those drew its level up to the region's edge. Then the
        region's power in (a, m] and in (m, b] agree. Where they do not (within
        AGREE_REL of its energy), one of them did not: a loop's first step from idle (the
        stretch before the next step held the idle and the work), its second-to-last step
        (the stretch after the last one held the work and the idle), the power cap stepping
        down at a stamp. Both together read 26-32 ms steps of such loops up to +11% on the
        simulated H100 (+15.6% on its H200 profile), unmarked. Then, in order:

        - (a, m] and (m, b] within FLAT_REL of each other: one level throughout, the
          region's (the loop went on at one power across its edges);
        - else the side whose neighbour drew one level as far as the stretch beyond it
          tells (`_level`), the other's not: the region at one power, from that side's
          stretch alone, where the region holds at least half of it (`_usable`): a lone
          region on an H200, the power decaying after it over 40-60 ms (224, 142, 127 W
          after a 30 ms region), read 810-837 W from both, 747-758 W so;
        - else, where one stretch is at the region's power from the other side's stretch,
          that power: the level stepped at the stamp on its far side (the cap's step down
          at the stamp before a loop's last 25 ms step: -2.8% from both);
        - else `both`, marked: the samples cannot tell."""
        ts, ws = self.sample_t, self.sample_w
        a, m, b = ts[k0 - 1], ts[k0], ts[k0 + 1]
        after = self._after_w(k0 + 1)
        if after is None:
            return both, False  # a guess, marked by `after_missing`
        first = (ws[k0] * (m - a) - ws[k0 - 1] * (t0 - a)) / (m - t0)
        second = (ws[k0 + 1] * (b - m) - after * (b - t1)) / (t1 - m)
        joules = sum((hi - lo) * w for lo, hi, w in both)
        if abs(first - second) * min(m - t0, t1 - m) <= AGREE_REL * joules:
            return both, False
        if _near(ws[k0], ws[k0 + 1]):
            level = (ws[k0] * (m - a) + ws[k0 + 1] * (b - m)) / (b - a)
            return [(t0, m, level), (m, t1, level)], False
        flat_before, flat_after = self._level(k0 - 1, k0 - 2), self._level(k0 + 2, k0 + 3)
        use_first, use_second = self._usable(k0, m - t0), self._usable(k0 + 1, t1 - m)
        one = None
        if flat_before and flat_after is False and use_first:
            one = first
        elif flat_after and flat_before is False and use_second:
            one = second
        elif _near(second, ws[k0]) and use_second:
            one = second  # (a, m] drew the region's power throughout: it stepped at a
        elif _near(first, ws[k0 + 1]) and use_first:
            one = first  # ... (m, b] did: it stepped at b
        if one is None:
            return both, True
        return [(t0, m, max(0.0, one)), (m, t1, max(0.0, one))], False

    def _usable(self, k: int, part: float) -> bool:
        """Whether stretch k alone can give a region's power: `part` (the region's share of
        it) at least half of it, and its stamps no closer than the driver's period (a
        short stretch follows a late stamp: an H200's 28.3 ms then 11.8 ms) nor more than
        half a period further apart. An H200's 30 ms region from idle whose start stretch
        was 23.4 ms long read 752 W from it alone, its two others 758 and 747 W from
        stretches on the period."""
        span = self.sample_t[k] - self.sample_t[k - 1]
        fits = SAMPLE_PERIOD_S - STAMP_JITTER_S <= span <= 1.5 * SAMPLE_PERIOD_S
        return fits and part >= span / 2

    def _after_w(self, k1: int) -> float | None:
        """The mean power of the stretch after the one that closes a region (the sample
        after ts[k1]); None while it is not in, or one is missing between."""
        ts = self.sample_t
        if k1 + 1 >= len(ts) or ts[k1 + 1] - ts[k1] > SAMPLE_GAP_MAX_S:
            return None
        return self.sample_w[k1 + 1]

    def after_missing(self, t0: float, t1: float) -> bool:
        """Whether the samples cover [t0, t1], the last one reaching past t1, and the
        stretch after it not yet in: the part of the last stretch inside is then a guess
        (`sampled_segments`: at the power before the region, or at that of the last whole
        stretch inside), wrong where the power changed in that stretch (a loop's first or
        last step, the power cap stepping down)."""
        ts = self.sample_t
        k1 = bisect.bisect_left(ts, t1)
        if k1 >= len(ts) or ts[k1] <= t1:
            return False
        return self._after_w(k1) is None

    def _power_segments(self, t0: float, t1: float) -> list[tuple[float, float, float]]:
        """[(a, b, watts)] covering [t0, t1]: the driver's power samples where they cover
        it (`sampled_segments`), else its cheap readings. A cheap power reading is taken at
        a refresh and describes the time just before it (the simulated H100: its last
        10 ms; a real one shows a step 27-74 ms late), so each reading refreshed inside the
        region stands for the time back to the refresh before, and the last one for the
        rest up to t1. A region with no refresh inside takes the first reading after it
        (within one refresh), else the one in force: the best there is, an estimate.
        Holding the reading in force at t0 over the region instead (as before 2026-11-28)
        gave a 100 ms kernel from idle the idle power, a tenth of its own."""
        sampled = self.sampled_segments(t0, t1)
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


def _edge_w(mean: float, span: float, part: float, far: float | None, near: float) -> float | None:
    """The power of the `part` seconds of a sample stretch (`span` seconds at `mean` watts)
    on the region's side of its edge, where the stretch on the other side drew `far` and the
    nearest whole one inside the region `near`.

    The stretch is taken as `far` up to one step and `near` after it (a power cap's step
    down, a region's start from idle, its end into idle), placed so that the stretch's
    mean is its own; the part is what of it lies inside. A stretch whose mean does not lie
    between the two (one level throughout, the chip's heating moving it a little; a spike)
    is at its own mean throughout. None where the step cannot be placed: `far` not in yet,
    or the stretch's stamps off the driver's period (SAMPLE_PERIOD_S, an H200's jitter).
    """
    if far is None or abs(span - SAMPLE_PERIOD_S) > STAMP_JITTER_S:
        return None
    if far == near or not min(far, near) < mean < max(far, near):
        return mean
    far_s = span * (mean - near) / (far - near)  # how long it drew `far`, from the outside
    far_in = max(0.0, far_s - (span - part))  # of which inside the region
    return (far_in * far + (part - far_in) * near) / part


def _near(x: float, y: float) -> bool:
    """Whether two powers are one level (within FLAT_REL)."""
    return abs(x - y) <= FLAT_REL * max(abs(x), abs(y))
