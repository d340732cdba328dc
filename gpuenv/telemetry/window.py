"""`Window`: what one GPU did over [t0, t1] (summary.py builds it from samples);
`merge_windows` joins the windows of consecutive chunks (a long region is summarised
in chunks) or of separate regions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import from_dict, to_dict
from gpuenv.reasons import COUNTER_NAMES, counter, reason_names
from gpuenv.units import fmt_j, fmt_s


@dataclass(frozen=True)
class Window:
    """What one GPU did over [t0, t1] (host monotonic seconds).

    Clock means are time-weighted: each sample holds until the next one. The power
    mean is too, but each power reading is placed at the driver refresh that took it and
    stands for the time back to the refresh before (it describes the power just before
    it). Values are None where no sample covered the region. `energy_j` comes
    from the energy counter (read at most once a second): its delta between the first and
    last reads inside the region, plus the stretches from the edges to those reads
    from the power samples. For regions shorter than ENERGY_EXACT_MIN_S (10 driver
    refreshes of the counter) or with fewer than two reads inside, it is instead
    the time-weighted power (instantaneous where the GPU reports it) times the
    duration, and `energy_interpolated` marks it as an estimate. `reason_s` is the time spent under
    each cumulative reason counter (REASON_COUNTERS names), interpolated between
    counter reads: exact to the read times, which region edges trigger.

    Attributes:
        gpu: the GPU's index.
        t0: the region's start, host monotonic seconds.
        t1: its end.
        n_samples: samples inside [t0, t1] (the ones just outside are used, not counted).
        sm_mhz_min: the lowest SM clock sampled (what `nvidia-smi`'s clocks.sm reads).
        sm_mhz_mean: the time-weighted mean SM clock.
        sm_mhz_max: the highest SM clock sampled.
        sm_mhz_start: the clock in force when the region began.
        sm_mhz_end: the clock of the last reading covering the region.
        sm_mhz_busy_mean: the mean over the samples without GpuIdle: the clock while
            the GPU had work.
        mem_mhz_mean: the time-weighted mean memory clock.
        power_w_mean: the time-weighted mean power (`nvidia-smi`'s "power.draw").
        power_w_max: the highest power sampled (the mean's readings included).
        energy_j: the energy used over the region, in joules.
        energy_interpolated: `energy_j` is an estimate from power, not the counter.
        temp_c_start: the GPU's temperature when the region began, in C.
        temp_c_end: at its end.
        temp_c_max: the highest over it.
        mem_temp_c_max: the memory's highest temperature (where the GPU reports it).
        reasons: the union of the clock-event reasons bitmasks seen over the region.
        reasons_start: the reasons in force when the region began.
        reasons_end: the reasons of the last reading covering the region.
        reason_s: seconds under each cumulative reason counter.
        lock_held: whether the SM clock stayed in the locked range (None: no lock).
        lock_range_mhz: the locked range it was held to.
        other_pids: other processes seen on the GPU during the region (not this one, nor
            its children).
        other_mib: the most GPU memory each of `other_pids` held, in MiB (None: unknown).
        other_users: the account running each of `other_pids`, where the host shows it.
        own_process: this process held a context on the GPU (None: unknown).
        gap: a read failed during the region: the summary may be incomplete.
        reason_sampled_s: seconds under each bit of the reasons bitmask, from the
            samples (one sample period's resolution; tells SW from HW thermal).
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
    # the time-weighted clock over the samples without GpuIdle: what the clock was while
    # the GPU had work (a long region's mean counts its idle stretches too: 345 MHz on an
    # H100 or H200, 210 MHz on an A100; told apart by the GpuIdle reason, not the clock)
    sm_mhz_busy_mean: float | None = None
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
    other_mib: tuple[int | None, ...] = ()  # GPU memory each held (MiB), in other_pids' order
    other_users: tuple[str | None, ...] = ()  # who runs each, where the host shows it
    own_process: bool | None = None  # this process held a context on it; None: unknown
    gap: bool = False  # a read failed during the region: the summary may be incomplete
    # time under each bit of the reasons bitmask (REASON_NAMES names), from the cheap samples:
    # resolution one sample period, but it separates what the counters lump (SW vs HW thermal)
    reason_sampled_s: dict[str, float] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.t1 - self.t0

    def with_power_of(self, later: Window) -> Window:
        """This window with the power and energy of `later`: the same span summarised
        again once the driver's power sample after it was out (`Sampler.await_power`)."""
        return dataclasses.replace(
            self,
            power_w_mean=later.power_w_mean,
            power_w_max=later.power_w_max,
            energy_j=later.energy_j,
            energy_interpolated=later.energy_interpolated,
        )

    @property
    def reason_names(self) -> list[str]:
        return reason_names(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Window:
        return from_dict(cls, data)

    def without_others(self, expected: Callable[[int], bool]) -> Window:
        """This window less the other processes `expected` says are the owner's own (a
        job's processes, a client and its children), with their memory and users."""
        keep = [k for k, p in enumerate(self.other_pids) if not expected(p)]
        if len(keep) == len(self.other_pids):
            return self

        def pick(values: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(values[k] for k in keep) if len(values) == len(self.other_pids) else ()

        return dataclasses.replace(
            self,
            other_pids=tuple(self.other_pids[k] for k in keep),
            other_mib=pick(self.other_mib),
            other_users=pick(self.other_users),
        )

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
            parts.append(", ".join(f"{_counter_label(k)} {fmt_s(v, 'short')}" for k, v in timed))
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


def _busy_mean(ws: Sequence[Window]) -> float | None:
    """The busy clock of merged windows: each one's weighted by its time not GpuIdle."""
    pairs = [
        (w.sm_mhz_busy_mean, max(w.duration_s - w.reason_sampled_s.get("GpuIdle", 0.0), 0.0))
        for w in ws
        if w.sm_mhz_busy_mean is not None
    ]
    total = sum(t for _, t in pairs)
    if not pairs:
        return None
    if total <= 0:
        return sum(m for m, _ in pairs) / len(pairs)
    return sum(m * t for m, t in pairs) / total


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
        sm_mhz_busy_mean=_busy_mean(ws),
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
        **_others(ws),
        own_process=_any_seen([w.own_process for w in ws]),
        gap=any(w.gap for w in ws),
    )


def _others(ws: Sequence[Window]) -> dict[str, Any]:
    """The other processes of merged windows: each pid once, its most memory, its user."""
    seen: dict[int, tuple[int | None, str | None]] = {}
    for w in ws:
        for k, p in enumerate(w.other_pids):
            m = w.other_mib[k] if k < len(w.other_mib) else None
            u = w.other_users[k] if k < len(w.other_users) else None
            was_m, was_u = seen.get(p, (None, None))
            seen[p] = (m if (m or 0) >= (was_m or 0) and m is not None else was_m, u or was_u)
    pids = sorted(seen)
    if not any(w.other_mib or w.other_users for w in ws):
        return {"other_pids": tuple(pids)}
    return {
        "other_pids": tuple(pids),
        "other_mib": tuple(seen[p][0] for p in pids),
        "other_users": tuple(seen[p][1] for p in pids),
    }


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
