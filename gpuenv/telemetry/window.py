"""`Window`: what one GPU did over [t0, t1]; `summarize` builds it from samples,
`merge_windows` joins the windows of consecutive chunks (a long region is summarised
in chunks) or of separate regions."""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import from_dict, to_dict
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ, lock_holds
from gpuenv.reasons import COUNTER_NAMES, Reason, counter, reason_names
from gpuenv.telemetry.samples import DEFAULT_PERIOD_S, DRIVER_REFRESH_S, Gap, Sample, SlowSample
from gpuenv.units import fmt_j, fmt_s

# The energy counter moves in ~100 ms steps, so the delta over a region is exact only to
# about one step at each edge: below 10 steps (10% or worse) the power samples give the
# energy, and it is marked estimated. So is a region with fewer than two counter reads.
ENERGY_EXACT_MIN_S = 1.0


@dataclass(frozen=True)
class Window:
    """What one GPU did over [t0, t1] (host monotonic seconds).

    Clock and power means are time-weighted: each sample holds until the next
    one. Values are None where no sample covered the region. `energy_j` comes
    from the energy counter (read once a second): its delta between the first and
    last reads inside the region, plus the stretches from the edges to those reads
    from the power samples. For regions shorter than ENERGY_EXACT_MIN_S (10 driver
    refreshes of the counter) or with fewer than two reads inside, it is instead
    the time-weighted power (instantaneous where the GPU reports it) times the
    duration, and `energy_interpolated` marks it as an estimate. `reason_s` is the time spent under
    each cumulative reason counter (REASON_COUNTERS names), interpolated between
    counter reads: exact to the read times, which region edges trigger.
    """

    gpu: int
    t0: float
    t1: float
    n_samples: int  # samples inside [t0, t1] (the ones just outside are used but not counted)
    sm_mhz_min: float | None = None
    sm_mhz_mean: float | None = None
    sm_mhz_max: float | None = None
    sm_mhz_start: float | None = None  # the clock in force when the region began
    sm_mhz_end: float | None = None
    mem_mhz_mean: float | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    energy_j: float | None = None
    energy_interpolated: bool = False
    temp_c_start: float | None = None
    temp_c_end: float | None = None
    temp_c_max: float | None = None
    mem_temp_c_max: float | None = None
    reasons: int = 0  # union of reasons bitmasks seen over the region
    reasons_start: int = 0  # reasons in force when the region began
    reasons_end: int = 0  # reasons of the last reading covering the region
    reason_s: dict[str, float] = field(default_factory=dict)
    lock_held: bool | None = None  # None: no lock asked for
    lock_range_mhz: tuple[int, int] | None = None
    other_pids: tuple[int, ...] = ()  # other processes seen on the GPU during the region
    own_process: bool | None = None  # this process held a context on it; None: unknown
    gap: bool = False  # a read failed during the region: the summary may be incomplete
    # time under each bit of the reasons bitmask (REASON_NAMES names), from the cheap samples:
    # resolution one sample period, but it separates what the counters lump (SW vs HW thermal)
    reason_sampled_s: dict[str, float] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.t1 - self.t0

    @property
    def reason_names(self) -> list[str]:
        return reason_names(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Window:
        return from_dict(cls, data)

    def summary(self) -> str:
        """One line a person reads: clock, power, energy, temperature, reasons."""
        parts = [f"GPU {self.gpu} {fmt_s(self.duration_s, 'short')}"]
        if self.sm_mhz_mean is not None:
            if self.sm_mhz_min == self.sm_mhz_max:
                parts.append(f"SM {self.sm_mhz_mean:.0f} MHz")
            else:
                parts.append(
                    f"SM {self.sm_mhz_mean:.0f} MHz ({self.sm_mhz_min:.0f}-{self.sm_mhz_max:.0f})"
                )
        if self.power_w_mean is not None:
            parts.append(f"{self.power_w_mean:.0f} W (max {self.power_w_max:.0f})")
        if self.energy_j is not None:
            parts.append(fmt_j(self.energy_j, approx=self.energy_interpolated, kj_from=math.inf))
        if self.temp_c_start is not None:
            parts.append(f"{self.temp_c_start:.0f}->{self.temp_c_end:.0f} C")
        names = self.reason_names
        parts.append("reasons: " + (", ".join(names) if names else "none"))
        timed = [(k, v) for k, v in self.reason_s.items() if v > 0]
        if timed:
            order = list(COUNTER_NAMES)
            timed.sort(key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
            parts.append(
                ", ".join(f"{_counter_label(k)} {fmt_s(v, 'short')}" for k, v in timed)
            )
        if self.lock_held is not None:
            parts.append("lock held" if self.lock_held else "lock NOT held")
        if self.other_pids:
            parts.append("other processes: " + ", ".join(map(str, self.other_pids)))
        if self.gap:
            parts.append("telemetry gap")
        return "; ".join(parts)

    def __str__(self) -> str:
        return self.summary()


def _counter_label(name: str) -> str:
    try:
        return counter(name).label
    except KeyError:
        return name


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
    if lock_range is not None:
        values["lock_range_mhz"] = (int(lock_range[0]), int(lock_range[1]))

    values.update(_from_counters(slow, t0, t1, own_pids, lag_s))
    counted = _counter_energy_j(slow, fast, times, t0, t1)
    if counted is not None and t1 - t0 >= ENERGY_EXACT_MIN_S:
        values["energy_j"] = counted
    elif values.get("power_w_mean") is not None:
        # within a few counter steps, or with fewer than two counter reads inside, the
        # power samples (instantaneous where the GPU gives it) place the energy better
        # than a counter that moves every ~100 ms and is read once a second
        values["energy_j"] = values["power_w_mean"] * (t1 - t0)
        values["energy_interpolated"] = True
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
        sm_mhz_start=float(first.sm_mhz),
        sm_mhz_end=float(last.sm_mhz),
        mem_mhz_mean=_weighted([s.mem_mhz for s in held], weights),
        power_w_mean=_weighted([_power(s) for s in held], weights),
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
    slow: Sequence[SlowSample], fast: Sequence[Sample], times: Sequence[float], t0: float,
    t1: float,
) -> float | None:
    """Energy (J) over [t0, t1]: the counter's delta between the first and the last read
    inside the region that show a new value, plus the energy of the stretches from t0 to
    the first and from the last to t1, from the power samples (time-weighted). None with
    fewer than two such reads, or without power samples for a stretch."""
    inside = [c for c in _energy_changes(slow) if t0 <= c[0] <= t1]
    if len(inside) < 2:
        return None
    (ta, ea), (tb, eb) = inside[0], inside[-1]
    fill = 0.0
    for a, b in ((t0, ta), (tb, t1)):
        if b <= a:
            continue
        i0, i1 = bisect.bisect_right(times, a), bisect.bisect_right(times, b)
        held = ([fast[i0 - 1]] if i0 > 0 else []) + list(fast[i0:i1])
        if not held:
            return None
        fill += _weighted([_power(s) for s in held], _hold_weights(held, a, b)) * (b - a)
    return max(0.0, eb - ea) / 1000.0 + fill


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


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


def _from_counters(
    slow: Sequence[SlowSample], t0: float, t1: float, own_pids: Iterable[int], lag_s: float
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
        a, b = _counter_at(pts, t0, lag_s), _counter_at(pts, t1, lag_s)
        if a is not None and b is not None:
            reason_s[key] = min(max(0.0, b - a) / 1e9, t1 - t0)
    if reason_s:
        out["reason_s"] = reason_s
    # Other processes: the read in force at t0 and every read up to one refresh after t1.
    ts = [s.t for s in slow]
    k0 = max(0, bisect.bisect_right(ts, t0) - 1)
    k1 = bisect.bisect_right(ts, t1 + lag_s)
    own = set(own_pids)
    pids = sorted({p for s in slow[k0:k1] for p in s.other_pids if p not in own})
    if pids:
        out["other_pids"] = tuple(pids)
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


def _counter_at(pts: Sequence[tuple[float, float]], t: float, lag_s: float) -> float | None:
    """A cumulative ns counter at t: interpolated, or extrapolated up to ~2 refreshes past
    the last point at the last interval's rate (at most 1 ns per ns)."""
    value = _interp(pts, t)
    if value is not None or not pts or t < pts[0][0] or t > pts[-1][0] + 2 * lag_s:
        return value
    if len(pts) < 2:
        return pts[-1][1]
    (ta, va), (tb, vb) = pts[-2], pts[-1]
    rate = min(1e9, max(0.0, (vb - va) / (tb - ta)))
    return vb + rate * (t - tb)


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


def merge_windows(windows: Sequence[Window]) -> Window:
    """One Window from consecutive (or separate) ones of the same GPU.

    Means are weighted by each window's duration; energy and the times under
    reasons add up; min/max/union over all; start values from the first, end
    values (clock, temperature, reasons) from the last. t0/t1 span from the first
    to the last window. `own_process` is True if this process was seen in any of
    them, as `summarize` decides it for one window.
    """
    if not windows:
        raise ValueError("nothing to merge")
    if len(windows) == 1:
        return windows[0]
    ws = list(windows)
    c = _Chunks(ws)
    energies = [w.energy_j for w in ws]
    held = [w.lock_held for w in ws if w.lock_held is not None]
    union = 0
    for w in ws:
        union |= w.reasons
    return dataclasses.replace(
        ws[0],
        t0=ws[0].t0,
        t1=ws[-1].t1,
        n_samples=sum(w.n_samples for w in ws),
        sm_mhz_min=c.pick(min, "sm_mhz_min"),
        sm_mhz_mean=c.mean("sm_mhz_mean"),
        sm_mhz_max=c.pick(max, "sm_mhz_max"),
        sm_mhz_start=c.first("sm_mhz_start"),
        sm_mhz_end=c.last("sm_mhz_end"),
        mem_mhz_mean=c.mean("mem_mhz_mean"),
        power_w_mean=c.mean("power_w_mean"),
        power_w_max=c.pick(max, "power_w_max"),
        energy_j=None
        if all(e is None for e in energies)
        else sum(e for e in energies if e is not None),
        energy_interpolated=any(w.energy_interpolated for w in ws) or None in energies,
        temp_c_start=c.first("temp_c_start"),
        temp_c_end=c.last("temp_c_end"),
        temp_c_max=c.pick(max, "temp_c_max"),
        mem_temp_c_max=c.pick(max, "mem_temp_c_max"),
        reasons=union,
        reasons_start=ws[0].reasons_start,
        reasons_end=ws[-1].reasons_end,
        reason_s=c.add("reason_s"),
        reason_sampled_s=c.add("reason_sampled_s"),
        lock_held=None if not held else all(held),
        lock_range_mhz=c.first("lock_range_mhz"),
        other_pids=tuple(sorted({p for w in ws for p in w.other_pids})),
        own_process=_any_seen([w.own_process for w in ws]),
        gap=any(w.gap for w in ws),
    )


class _Chunks:
    """The values of one field over the windows being merged, combined one way or another."""

    def __init__(self, ws: list[Window]):
        self.ws = ws
        self.dur = [max(0.0, w.duration_s) for w in ws]

    def present(self, attr: str) -> list[tuple[float, float]]:
        return [
            (getattr(w, attr), d)
            for w, d in zip(self.ws, self.dur, strict=True)
            if getattr(w, attr) is not None
        ]

    def mean(self, attr: str) -> float | None:
        vals = self.present(attr)
        if not vals:
            return None
        total = sum(d for _, d in vals)
        if total <= 0:
            return sum(v for v, _ in vals) / len(vals)
        return sum(v * d for v, d in vals) / total

    def pick(self, fn: Any, attr: str) -> Any:
        vals = [v for v, _ in self.present(attr)]
        return fn(vals) if vals else None

    def first(self, attr: str) -> Any:
        return next((getattr(w, attr) for w in self.ws if getattr(w, attr) is not None), None)

    def last(self, attr: str) -> Any:
        return next(
            (getattr(w, attr) for w in reversed(self.ws) if getattr(w, attr) is not None), None
        )

    def add(self, attr: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for w in self.ws:
            for k, v in getattr(w, attr).items():
                out[k] = out.get(k, 0.0) + v
        return out


def _any_seen(values: Sequence[bool | None]) -> bool | None:
    """True if any is True; None if none is known."""
    known = [v for v in values if v is not None]
    return any(known) if known else None
