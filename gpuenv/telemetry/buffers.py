"""The `Sampler`'s buffers in this process: bounded rings of records kept as plain tuples.

A full ring holds `capacity` records per GPU and kind (32,768 by default). Kept as
`Sample` and `SlowSample` objects, each record was an object the cyclic garbage
collector tracks: on 2 GPUs a full collection walked some 130,000 of them (~30 ms,
stalling whatever ran then, a lease in gpuenvd). A tuple that holds only numbers,
strings, None and such tuples is untracked by CPython's collector once a young
collection has looked at it, so here a record is its fields in order, and a full ring
costs a full collection only the walk over its deque (~1 ms on 2 GPUs). Readers get
`Sample`, `SlowSample` and `Gap` objects, made when asked for: equal to the ones
kept before, in the same order.

Edge reads (a region's start or end, `Sampler.mark`) come as often as regions are marked,
not as time passes: in gpuenvd, a client's every window. With `edge_capacity`, a read that
comes less than `spacing` after the last one kept in a ring goes to a small ring of its
own instead, merged back in time order for readers: a load of windows then neither grows
the daemon's memory until the time rings are full (tens of MB per GPU) nor pushes the
history out of them.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from gpuenv.backend import SlowReading
from gpuenv.telemetry.samples import FastRecord, Gap, Sample, SlowSample

# t, gpu, energy_mj, counter names, counter values, mem_temp_c, other_pids, edge, value_t,
# own_present, other_mib: a SlowSample whose reason_ns dict is two tuples (a dict stays tracked)
SlowRecord = tuple[
    float,
    int,
    int | None,
    tuple[str, ...],
    tuple[int, ...],
    float | None,
    tuple[int, ...],
    bool,
    float | None,
    bool | None,
    tuple[int | None, ...],
]
GapRecord = tuple[float, int, str, str]  # a Gap's fields


def slow_sample(rec: SlowRecord) -> SlowSample:
    t, gpu, energy, names, values, mem_temp, others, edge, value_t, own, mib = rec
    reasons = dict(zip(names, values, strict=False))  # made together: checking costs a third
    return SlowSample(t, gpu, energy, reasons, mem_temp, others, edge, value_t, own, mib)


class WindowInputs(NamedTuple):
    """What `summarize_many` takes for windows of one GPU (`Sampler.window_inputs`)."""

    fast: list[Sample]
    slow: list[SlowSample]
    gaps: list[Gap]
    truncated: bool  # the cheap ring is full: samples older than its first are gone
    # the driver's power samples (host seconds, watts), each the mean since the one before
    power: Sequence[tuple[float, float]] = ()


class Buffers:
    """Where a `Reader`'s records end up in this process (a `Sink`), and what readers get.

    Every ring is a deque with `maxlen`: the newest `capacity` records, oldest first.
    """

    def __init__(
        self,
        gpus: Sequence[int],
        capacity: int,
        own_pids: set[int],
        *,
        edge_capacity: int | None = None,
        spacing: float = 0.0,
    ):
        self.capacity = capacity
        self.fast_q: dict[int, deque[FastRecord]] = {g: deque(maxlen=capacity) for g in gpus}
        self.slow_q: dict[int, deque[SlowRecord]] = {g: deque(maxlen=capacity) for g in gpus}
        self.gap_q: deque[GapRecord] = deque(maxlen=capacity)
        # the driver's power samples: (host seconds, watts), each the mean since the one
        # before (`Sampler` drains them from the backend; ~2.4 s of them live in the driver)
        self.power_q: dict[int, deque[tuple[float, float]]] = {
            g: deque(maxlen=capacity) for g in gpus
        }
        # the edge reads' own rings (see the module docstring); None: one ring per kind
        self.spacing = spacing if edge_capacity is not None else 0.0
        self.edge_fast_q: dict[int, deque[FastRecord]] | None = None
        self.edge_slow_q: dict[int, deque[SlowRecord]] | None = None
        if edge_capacity is not None:
            self.edge_fast_q = {g: deque(maxlen=edge_capacity) for g in gpus}
            self.edge_slow_q = {g: deque(maxlen=edge_capacity) for g in gpus}
        self.own_pids = own_pids
        self.lock = threading.Lock()
        self.slow_cond = threading.Condition()
        self._names: tuple[str, ...] = ()  # the last counter names: one tuple shared by all

    # -- the Sink side (the reader's thread, or the pull from the sampler process) ----------
    def fast(self, rec: FastRecord) -> None:
        with self.lock:
            _put(self.fast_q[rec[1]], self.edge_fast_q, rec, self.spacing)

    def slow(
        self,
        t: float,
        gpu: int,
        reading: SlowReading | None,
        pids: Mapping[int, int | None] | Collection[int] | None,
        edge: bool,
        value_t: float | None,
    ) -> None:
        """One read: processes other than `own_pids` are the sample's `other_pids`, with
        the memory each holds (`other_mib`, where `pids` maps pid to MiB)."""
        others: tuple[int, ...] = ()
        mib: tuple[int | None, ...] = ()
        own: bool | None = None
        if pids is not None:
            found = set(pids)
            others = tuple(sorted(found - self.own_pids))
            if isinstance(pids, Mapping) and any(pids.get(p) is not None for p in others):
                mib = tuple(pids.get(p) for p in others)
            own = bool(found & self.own_pids)
        if reading is None:  # a process check alone
            rec: SlowRecord = (t, gpu, None, (), (), None, others, edge, None, own, mib)
        else:
            names = tuple(reading.reason_ns)
            if names != self._names:
                self._names = names
            rec = (
                t,
                gpu,
                reading.energy_mj,
                self._names,
                tuple(reading.reason_ns.values()),
                reading.mem_temp_c,
                others,
                edge,
                value_t,
                own,
                mib,
            )
        with self.lock:
            _put(self.slow_q[gpu], self.edge_slow_q if edge else None, rec, self.spacing)

    def power(self, gpu: int, samples: Sequence[tuple[float, float]]) -> None:
        """Driver power samples (host seconds, watts) in time order; those not newer than
        the newest kept are dropped."""
        with self.lock:
            ring = self.power_q[gpu]
            for rec in samples:
                if not ring or rec[0] > ring[-1][0]:
                    ring.append(rec)

    def power_due(self, gpu: int, t0: float, t1: float) -> bool:
        """The driver's power samples held reach back to `t0` but not yet to `t1`: the
        sample that closes [t0, t1] is still to come. So is the one after it where the
        closing one reaches past t1: the part past t1 is placed by the power of the
        interval after it (`SampledPower.segments`, gpuenv.telemetry.sampled)."""
        with self.lock:
            ring = self.power_q[gpu]
            if not ring or ring[0][0] > t0:
                return False
            if ring[-1][0] < t1:
                return True
            # the closing sample has one after it, or ends at t1
            return not (len(ring) < 2 or ring[-2][0] >= t1 or ring[-1][0] == t1)

    def power_newest(self, gpu: int) -> float | None:
        """The newest driver power sample held (host seconds); None: none."""
        with self.lock:
            ring = self.power_q[gpu]
            return ring[-1][0] if ring else None

    def gap(self, gap: Gap) -> None:
        with self.lock:
            self.gap_q.append((gap.t, gap.gpu, gap.op, gap.error))

    def slow_done(self) -> None:
        with self.slow_cond:
            self.slow_cond.notify_all()

    # -- the readers' side -----------------------------------------------------------------
    def samples(self, gpus: Sequence[int], lo: float, hi: float, *, recent: bool) -> list[Sample]:
        """The cheap samples of `gpus` in [lo, hi], GPU after GPU. `recent`: walk back from
        the newest (a trace's pull asks for the last second of a ring that holds minutes)."""
        with self.lock:
            recs = [
                r
                for g in gpus
                for r in (
                    self._since(self.fast_q, self.edge_fast_q, g, lo, 1)
                    if recent
                    else self._all(self.fast_q, self.edge_fast_q, g)
                )
                if lo <= r[0] <= hi
            ]
        return [Sample(*r) for r in recs]

    def slow_samples(self, gpus: Sequence[int], lo: float, hi: float) -> list[SlowSample]:
        with self.lock:
            recs = [
                r
                for g in gpus
                for r in self._all(self.slow_q, self.edge_slow_q, g)
                if lo <= r[0] <= hi
            ]
        return [slow_sample(r) for r in recs]

    def latest(self, gpu: int) -> Sample | None:
        with self.lock:
            rec = _last(self.fast_q[gpu], self.edge_fast_q)
        return Sample(*rec) if rec is not None else None

    def last_slow_t(self, gpu: int) -> float | None:
        """The time of the newest counter read of `gpu`, if any."""
        with self.lock:
            rec = _last(self.slow_q[gpu], self.edge_slow_q)
        return None if rec is None else rec[0]

    def gaps(self, gpu: int | None = None, since: float = float("-inf")) -> list[Gap]:
        with self.lock:
            recs = [r for r in self.gap_q if (gpu is None or r[1] == gpu) and r[0] >= since]
        return [Gap(*r) for r in recs]

    def window_inputs(
        self, gpu: int, lo: float, slow_lookback: float, gap_margin: float
    ) -> WindowInputs:
        """What windows from `lo` on can use: the cheap samples from lo (and one before),
        the counter reads from lo - slow_lookback (and three before), the gaps from
        gap_margin before lo, whether the cheap ring is full (older samples are gone), and
        the driver's power samples from lo (and two before: the baseline and the first
        interval's start)."""
        with self.lock:
            # most windows are recent: walk back from the newest record
            fast = self._since(self.fast_q, self.edge_fast_q, gpu, lo, 1)
            slow = self._since(self.slow_q, self.edge_slow_q, gpu, lo - slow_lookback, 3)
            gaps = [r for r in self.gap_q if r[1] == gpu and r[0] >= lo - gap_margin]
            truncated = len(self.fast_q[gpu]) == self.capacity
            power = _since(self.power_q[gpu], lo, 2)
        return WindowInputs(
            [Sample(*r) for r in fast],
            [slow_sample(r) for r in slow],
            [Gap(*r) for r in gaps],
            truncated,
            power,
        )

    @staticmethod
    def _all(rings: dict[int, deque[Any]], edges: dict[int, deque[Any]] | None, g: int) -> Any:
        """Every record of GPU g, in time order, the edge ring's merged in."""
        if edges is None or not edges[g]:
            return rings[g]
        return list(heapq.merge(rings[g], edges[g], key=_t))

    @staticmethod
    def _since(
        rings: dict[int, deque[Any]],
        edges: dict[int, deque[Any]] | None,
        g: int,
        t: float,
        keep_before: int,
    ) -> list[Any]:
        """`_since` of GPU g's ring, the edge ring's records merged in."""
        if edges is None or not edges[g]:
            return _since(rings[g], t, keep_before)
        both = heapq.merge(
            _since(rings[g], t, keep_before), _since(edges[g], t, keep_before), key=_t
        )
        return _since(deque(both), t, keep_before)


def _t(rec: tuple[Any, ...]) -> float:
    return float(rec[0])


def _put(ring: deque[Any], edges: dict[int, deque[Any]] | None, rec: Any, spacing: float) -> None:
    """Append `rec` to its ring, or to its GPU's edge ring when it comes less than `spacing`
    after the ring's newest record (an edge read between two periodic ones)."""
    if edges is not None and ring and rec[0] - ring[-1][0] < spacing:
        edges[rec[1]].append(rec)
    else:
        ring.append(rec)


def _last(ring: deque[Any], edges: dict[int, deque[Any]] | None) -> Any:
    """The newest record of a GPU, its edge ring's included (`edges` holds it by GPU)."""
    rec = ring[-1] if ring else None
    if edges is not None and rec is not None:
        edge = edges[rec[1]]
        if edge and edge[-1][0] > rec[0]:
            return edge[-1]
    return rec


def _since(buf: deque[Any], t: float, keep_before: int) -> list[Any]:
    """The records of a time-ordered ring from time t on, plus `keep_before` older ones."""
    out = []
    older = 0
    for rec in reversed(buf):
        out.append(rec)
        if rec[0] < t:
            older += 1
            if older >= keep_before:
                break
    out.reverse()
    return out
