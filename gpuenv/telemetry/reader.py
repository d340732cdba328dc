"""What the sampler reads and when: the cheap values of every GPU on each tick, the slow
counters on their own grids and at region edges, and the loop that paces it. One `Reader`
serves both samplers: the thread in this process (records go to the `Sampler`'s buffers)
and the sampler process (records go to the shared-memory ring, `ring.py`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from gpuenv.backend import Backend, SlowReading
from gpuenv.errors import NotSupported
from gpuenv.telemetry.samples import FastRecord, Gap
from gpuenv.timebase import Clock

log = logging.getLogger(__name__)

# The time under each reason and the memory temperature (fields 74-82): one field batch of
# 0.63 ms p50 / 1.4 ms p99 on the lent H100 (benchmarks/nvml_costs.py), 6.3 ms of driver
# time a second when read every 100 ms. Read at every region edge (the reason times of a
# region are the counters' deltas between its edges) and once a second, marked or not: a
# door that judges spans after the fact (stable().record, the torch Timer, pytest's
# rounds, `gpuenv run`'s chunks) marks no edge, and its windows interpolate between these.
DEFAULT_SLOW_PERIOD_S = 1.0
# The energy counter costs ~3 ms of driver time and ~4 ms of CPU a read on the lent H100:
# read every 100 ms it made a launch-bound loop 1-2% slower
# (docs/benchmarks/sampler_overhead.md). So it is read at most once per this period: at
# the first region edge or tick a period after the last read, and only while regions are
# being marked (see ACTIVE_PERIODS). A region's energy is the counter's delta between the
# first and last reads inside it, plus the stretches from its edges to those reads from
# the power samples (`_counter_energy_j`).
DEFAULT_ENERGY_PERIOD_S = 1.0
# The energy counter is cumulative: a region's share is its delta between reads at or near
# its edges, and reads in its middle add nothing. So its periodic reads run only within
# this many of its periods after the last region edge (`mark()`), which is long enough
# that a region whose start edge came too soon after the last energy read still gets a
# read inside within one period; a sampler no one marks reads it only at its start (the
# baseline): energy over spans given after the fact comes from the power samples.
ACTIVE_PERIODS = 2.0
# Which processes use the GPU (10-100 us a read; milliseconds on some systems): with every
# tick at the default period (the driver's 100 ms; the process list is no faster while a
# wait hurries the tick), so another process present for two periods is always seen.
DEFAULT_PROCESS_PERIOD_S = 0.1
# At most one edge read per this interval in real time: a loop of tiny regions marks
# thousands of edges a second, and each edge read is a field batch of ~0.6 ms.
EDGE_MIN_INTERVAL_S = 0.02
# In the sampler process (`Reader(fast_edges=True)`), an edge asked for sooner than that
# gets the cheap values at once, at most one read per this interval (read_fast: ~15 us),
# and its counters on their turn. A burst measurement's check for a ready GPU waits for two
# fresh samples after it began (its warmup's edges); with the process shared by a loop of
# calls, the edge read it asked for came up to EDGE_MIN_INTERVAL_S late: 16 of a ranking
# call's ~42 ms on the simulated H200 under a sampler process, 6 ms with these reads
# (benchmarks/rank_cost.py). Not on a thread: each wake of a sampler thread under a
# launch-bound loop costs the loop ~0.5 ms of the GIL (docs/how-to/telemetry.md).
FAST_EDGE_MIN_INTERVAL_S = 0.004
# A periodic tick this late (a fraction of its period) starts the grid afresh from itself:
# a hurry that begins long after the last tick reads at once and a hurried period later,
# never twice within a few ms; a thread's usual wake-up latency keeps the grid.
LATE_FRAC = 0.1


class Sink(Protocol):
    """Where a `Reader` puts what it read."""

    def fast(self, rec: FastRecord) -> None:
        """One cheap reading: a Sample's fields in order (`Sample(*rec)`)."""
        ...

    def slow(
        self,
        t: float,
        gpu: int,
        reading: SlowReading | None,
        pids: Mapping[int, int | None] | Collection[int] | None,
        edge: bool,
        value_t: float | None,
    ) -> None:
        """A counter read (`reading`) and/or a process check (`pids`: every process on the
        GPU, each to the GPU memory it holds in MiB where known; None when not read)."""
        ...

    def gap(self, gap: Gap) -> None: ...

    def slow_done(self) -> None:
        """A round of slow reads (all GPUs) is in: wake whoever waits for one."""
        ...


class Edges(Protocol):
    """Edge reads asked for (`mark()`) and served, counted."""

    def requested(self) -> int: ...
    def served(self, n: int) -> None: ...


class Reader:
    """Reads `gpus` of `backend` into `sink`: `tick()` once, or `run()` paced on the clock.

    A failed read never raises: it becomes a `Gap`. A read the GPU does not support
    (NotSupported) is not tried again.
    """

    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int],
        sink: Sink,
        *,
        clock: Clock,
        period: float,
        hurry_period: float | None = None,
        slow_period: float = DEFAULT_SLOW_PERIOD_S,
        process_period: float = DEFAULT_PROCESS_PERIOD_S,
        energy_period: float = DEFAULT_ENERGY_PERIOD_S,
        watch_processes: bool = True,
        fast_edges: bool = False,
    ):
        self.backend = backend
        self.fast_edges = fast_edges  # FAST_EDGE_MIN_INTERVAL_S's reads (the process's)
        self.gpus = list(gpus)
        self.sink = sink
        self.clock = clock
        self.period = period
        # the period while `hurrying` (callers waiting for fresh samples): never slower
        self.hurry_period = period if hurry_period is None else min(period, hurry_period)
        self.hurrying = 0
        self.slow_period = slow_period
        self.process_period = process_period
        self.energy_period = energy_period
        self.watch_processes = watch_processes
        self.ticks = 0
        self.cpu_time_s = 0.0  # CPU time of the thread that runs `run()`
        # per kind of read ("fast", "counters", "energy", "processes"): [reads, wall seconds,
        # CPU seconds of this thread] spent in the backend's call, failed ones included; what
        # the reads cost where the sampler makes them (benchmarks/sampler_overhead.py)
        self.read_times: dict[str, list[float]] = {
            k: [0, 0.0, 0.0] for k in ("fast", "counters", "energy", "processes")
        }
        self.unsupported: dict[int, set[str]] = {g: set() for g in self.gpus}
        self._next_slow_t = float("-inf")
        self._next_proc_t = float("-inf")
        self._last_energy_t = float("-inf")
        self._last_edge_t = float("-inf")  # the last mark()'s edge read, not the start's
        self._last_due = float("-inf")  # when the last periodic tick was due

    def current_period(self) -> float:
        return self.hurry_period if self.hurrying > 0 else self.period

    def next_due(self) -> float:
        """When the next periodic tick is due: one current period after the last one was,
        so a hurry that begins long after it ticks at once and one that begins just after
        waits the rest of a hurried period (never two reads back to back)."""
        return self._last_due + self.current_period()

    def periodic_tick(self) -> None:
        """A periodic tick, at its due time (virtual time: the clock's timer)."""
        self._last_due = self.clock.now()
        self.tick(start=self.ticks == 0)

    def run(self, stopped: Callable[[], bool], wait: Callable[[float], None], edges: Edges) -> None:
        """Tick every period (the hurried one while `hurrying`) and serve edge reads until
        `stopped()`; `wait(s)` sleeps up to s seconds, returning early when woken (a new
        edge request, a hurry, or a stop)."""
        cpu0 = time.thread_time()
        last_edge = last_fast = float("-inf")
        done = fast_done = 0
        while not stopped():
            try:
                now = self.clock.now()
                due = self.next_due()
                requested = edges.requested()
                edge = requested > done and now - last_edge >= EDGE_MIN_INTERVAL_S
                if edge or now >= due:
                    self.tick(edge=edge, start=self.ticks == 0)
                    last_fast, fast_done = now, requested
                    if edge:
                        done = requested
                        edges.served(done)
                        last_edge = now
                    if now >= due:  # on the grid, unless late (a hurry that began past a
                        # hurried period, a stalled read): then it restarts here, no burst
                        late = now - due > LATE_FRAC * self.current_period()
                        self._last_due = now if late else due
                elif (
                    self.fast_edges
                    and requested > fast_done
                    and now - last_fast >= FAST_EDGE_MIN_INTERVAL_S
                ):
                    self.read_fast_now()  # the edge's cheap values now, its counters later
                    last_fast, fast_done = now, requested
            except Exception as err:  # never let the loop die
                self.gap(self.clock.now(), self.gpus[0], "sampler", err)
            self.cpu_time_s = time.thread_time() - cpu0
            wake_at = self.next_due()
            if edges.requested() > done:  # an edge read waits its turn
                wake_at = min(wake_at, last_edge + EDGE_MIN_INTERVAL_S)
                if self.fast_edges:  # and meanwhile the cheap values of edges asked for
                    # since: a wake-up is asked for only when no edge read is pending, so
                    # look for them at the fast pace (read at once when due: no spin)
                    fresh = edges.requested() > fast_done
                    base = last_fast if fresh else self.clock.now()
                    wake_at = min(wake_at, base + FAST_EDGE_MIN_INTERVAL_S)
            wait(max(0.0, wake_at - self.clock.now()))

    def read_fast_now(self) -> None:
        """The cheap values of every GPU, into the sink (a tick's first part)."""
        for g in self.gpus:
            t = self.clock.now()
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                r = self.backend.read_fast(g)
            except Exception as err:
                self.gap(t, g, "read_fast", err)
                continue
            finally:
                self._timed("fast", w0, c0)
            self.sink.fast(
                (
                    t,
                    g,
                    r.sm_mhz,
                    r.mem_mhz,
                    r.power_w,
                    r.temp_c,
                    r.reasons,
                    r.driver_ts_us,
                    r.power_instant_w,
                )
            )

    def tick(self, edge: bool = False, start: bool = False) -> None:
        """Read the cheap values of every GPU, and the slow reads that are due; `edge`: a
        region edge (`mark()`) asked for this read; `start`: the sampler's first read (all
        counters, the baseline, without counting as a region edge)."""
        self.ticks += 1
        self.read_fast_now()
        t = self.clock.now()
        if edge and not start:
            self._last_edge_t = t
        edge = edge or start
        # the counters keep a fixed grid that edge reads do not shift, so the gap between
        # two periodic reads never exceeds their period; the energy counter is read only
        # while regions are being marked (ACTIVE_PERIODS)
        since_edge = t - self._last_edge_t
        counters = t >= self._next_slow_t - 1e-9
        if counters:
            self._next_slow_t = _next_on_grid(self._next_slow_t, self.slow_period, t)
        procs = self.watch_processes and t >= self._next_proc_t - 1e-9
        if procs:
            self._next_proc_t = _next_on_grid(self._next_proc_t, self.process_period, t)
        energy = t - self._last_energy_t >= self.energy_period - 1e-9 and (
            edge or since_edge <= ACTIVE_PERIODS * self.energy_period
        )
        if energy:
            self._last_energy_t = t
        if edge or counters or procs or energy:
            self._read_slow(
                edge,
                counters=edge or counters or energy,
                energy=energy,
                procs=self.watch_processes and (edge or procs),
            )

    def _read_slow(self, edge: bool, *, counters: bool, energy: bool, procs: bool) -> None:
        for g in self.gpus:
            skip = self.unsupported[g]
            t = self.clock.now()
            r = None
            if counters and "read_slow" not in skip:
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    r = self.backend.read_slow(g, energy=energy)
                except NotSupported as err:
                    skip.add("read_slow")
                    log.info(
                        "GPU %s: slow counters unavailable (%s); no energy or reason times", g, err
                    )
                except Exception as err:
                    self.gap(t, g, "read_slow", err)
                finally:
                    self._timed("energy" if energy else "counters", w0, c0)
            pids: dict[int, int | None] | None = None
            if procs and "processes" not in skip:
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    pids = {p.pid: p.used_memory_mib for p in self.backend.processes(g)}
                except NotSupported:
                    skip.add("processes")
                except Exception as err:
                    self.gap(t, g, "processes", err)
                finally:
                    self._timed("processes", w0, c0)
            if r is None and pids is None:
                continue
            value_t = None if r is None else host_time(r.driver_ts_us, t, self.clock.wall() - t)
            self.sink.slow(t, g, r, pids, edge, value_t)
        self.sink.slow_done()

    def _timed(self, kind: str, wall0: float, cpu0: float) -> None:
        times = self.read_times[kind]
        times[0] += 1
        times[1] += time.perf_counter() - wall0
        times[2] += time.thread_time() - cpu0

    def gap(self, t: float, gpu: int, op: str, err: BaseException) -> None:
        text = " ".join(str(err).split()) or type(err).__name__
        self.sink.gap(Gap(t, gpu, op, text))


def _next_on_grid(due: float, period: float, now: float) -> float:
    """The first point of the grid due + k*period after now (the grid starts at now)."""
    if due == float("-inf"):
        return now + period
    while due <= now + 1e-9:
        due += period
    return due


def host_time(driver_ts_us: int | None, t: float, wall_minus_host: float) -> float | None:
    """A driver timestamp (us since the epoch) on the host clock; None if implausible."""
    if not driver_ts_us:
        return None
    at = driver_ts_us * 1e-6 - wall_minus_host
    # a refresh lies in the past, within a few driver periods (else a different time base)
    return at if t - 2.0 <= at <= t + 0.01 else None
