"""The driver's power samples -> a region's power: `SampledPower`, the rules that place a
region's energy among the driver's ~20 ms means (each the mean power since the sample
before), its edges and the stretches around it, and say where they cannot (`unsure`,
`after_missing`: the energy is then marked an estimate). `gpuenv.telemetry.summary` asks
it for each region's power segments."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

# The driver's power samples (`Backend.power_samples`, ~20 ms apart) are each the mean power
# since the one before; their stamps jitter (8-45 ms apart on an H200). A region they
# cover takes its energy from them (`SampledPower._sample_segments`). On the H200, three lone
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
# its edge (`SampledPower._one_sided`).
FLAT_REL = 0.025
# The region's power in its two stretches, each from its own side, agree within this share
# of its energy: the powers beside its edges are right (`SampledPower._one_sided`). At 2.5% a
# 27 ms step whose next stretch began with the cap's step down read +2.4%.
AGREE_REL = 0.01
# A region with whole stretches inside is marked an estimate where its edges' parts, in
# stretches that held more than one step (`SampledPower._one_step`), may be off by more than
# this share of its energy together.
SURE_REL = 0.02


class SampledPower:
    """One GPU's power samples [(t, watts)], prepared for many regions (time arrays to
    bisect; each region's segments computed once); `floor_w` the least the GPU drew, as
    far as the samples and the cheap readings show (its idle)."""

    def __init__(self, power: Sequence[tuple[float, float]] = (), *, floor_w: float = 0.0):
        self.sample_t = [t for t, _ in power]
        self.sample_w = [w for _, w in power]
        self.floor_w = floor_w
        self._sampled_at: dict[
            tuple[float, float], tuple[list[tuple[float, float, float]] | None, bool]
        ] = {}

    def segments(self, t0: float, t1: float) -> list[tuple[float, float, float]] | None:
        """`_sample_segments`' segments (computed once a region)."""
        return self._sampled(t0, t1)[0]

    def unsure(self, t0: float, t1: float) -> bool:
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
        (`segments`: at the power before the region, or at that of the last whole
        stretch inside), wrong where the power changed in that stretch (a loop's first or
        last step, the power cap stepping down)."""
        ts = self.sample_t
        k1 = bisect.bisect_left(ts, t1)
        if k1 >= len(ts) or ts[k1] <= t1:
            return False
        return self._after_w(k1) is None


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
