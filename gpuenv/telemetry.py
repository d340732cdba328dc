"""Telemetry during timed regions: Sample records, the Sampler, Window summaries.

The sampler reads the cheap values (clocks, power, temperature, reasons: ~2 us
each on an H100) on every tick, and the slow cumulative counters (energy ~3 ms,
time under each reason ~0.1-0.2 ms) at most every `slow_period` and at region
edges, always on its own thread in real time. A region's `Window` summarises
the samples that cover it, including the ones just before and after it.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import from_dict, to_dict
from gpuenv.backend import Backend
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ, lock_holds
from gpuenv.errors import ConfigError, NotSupported
from gpuenv.reasons import COUNTER_NAMES, Reason, counter, reason_names
from gpuenv.timebase import REAL_CLOCK, Clock, Timer
from gpuenv.units import fmt_j, fmt_s

log = logging.getLogger(__name__)

# The driver refreshes SM/memory clock, power and the reasons bitmask about every
# 100 ms, temperature every ~200 ms, and the energy counter every ~100 ms (GPU_FACTS.md).
DRIVER_REFRESH_S = 0.1
# Four samples per driver refresh: every change is seen within 25 ms of the driver making
# it, so an episode of one refresh period is never missed and its start is placed to a
# quarter of a period. Sampling faster buys nothing (the values have not changed), and
# never polling without sleeping matters more: a no-sleep poller made a launch-bound loop
# 3.8x slower through the GIL. At ~2 us a read, one tick costs ~15 us per GPU.
DEFAULT_PERIOD_S = 0.025
# The time under each reason (a 0.1-0.2 ms field batch) refreshes about every 100 ms:
# read it that often, plus at region edges, so reason times are exact at the edges.
DEFAULT_SLOW_PERIOD_S = 0.1
# The energy counter costs ~3 ms of driver time and ~4 ms of CPU a read on the lent H100:
# read every 100 ms it made a launch-bound loop 1-2% slower (docs/benchmarks.md). So it is
# read once a second and never at edges: a region's energy is the counter's delta between
# the first and last reads inside it, plus the stretches from its edges to those reads
# from the power samples (see `_counter_energy_j`).
DEFAULT_ENERGY_PERIOD_S = 1.0
# Which processes use the GPU (10-100 us a read; milliseconds on some systems): twice per
# driver period, so another process present for one period is always seen.
DEFAULT_PROCESS_PERIOD_S = 0.05
DEFAULT_CAPACITY = 32768  # samples per GPU in the ring buffer: 13.6 minutes at 25 ms
# The energy counter moves in ~100 ms steps, so the delta over a region is exact only to
# about one step at each edge: below 10 steps (10% or worse) the power samples give the
# energy, and it is marked estimated. So is a region with fewer than two counter reads.
ENERGY_EXACT_MIN_S = 1.0
# Counter reads a window looks at before its start: energy and reason counters interpolate
# between reads, and the read in force at the start can be a few refreshes old.
SLOW_LOOKBACK_S = 1.0
# At most one edge read per this interval in real time: a loop of tiny regions marks
# thousands of edges a second, and each edge read is a field batch of ~0.1-0.2 ms.
EDGE_MIN_INTERVAL_S = 0.02
# How long window() waits, in real time, for the sampler's read at the region's end edge.
EDGE_WAIT_S = 0.5


@dataclass(frozen=True, slots=True)
class Sample:
    """One cheap reading of one GPU (`nvidia-smi dmon -s pc`)."""

    t: float  # host monotonic seconds (clock.now()) when the reading was taken
    gpu: int  # NVML index
    sm_mhz: int
    mem_mhz: int
    power_w: float  # nvmlDeviceGetPowerUsage: a 1 s average on Ampere and newer
    temp_c: float
    reasons: int  # clock-event reasons bitmask
    driver_ts_us: int | None = None  # the driver's timestamp of the value, where NVML gives one
    power_instant_w: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return from_dict(cls, data)


@dataclass(frozen=True)
class SlowSample:
    """One read of the cumulative counters (energy, time under each reason) and/or of the
    processes on the GPU; a process check alone has energy_mj None and reason_ns {}."""

    t: float
    gpu: int
    energy_mj: int | None  # since driver load
    reason_ns: dict[str, int]  # REASON_COUNTERS name -> cumulative ns
    mem_temp_c: float | None = None
    other_pids: tuple[int, ...] = ()  # processes on the GPU other than this one
    edge: bool = False  # read because a region started or ended
    # when the driver refreshed these counters, on the host clock (from driver_ts_us); the
    # counters refresh every ~100 ms, so this can be up to that long before `t`
    value_t: float | None = None
    own_present: bool | None = None  # this process (own_pids) held a context; None: not read

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlowSample:
        return from_dict(cls, data)


@dataclass(frozen=True)
class Gap:
    """A read that failed: the sampler records it and carries on."""

    t: float
    gpu: int
    op: str  # "read_fast" | "read_slow" | "processes"
    error: str  # str() of the exception, one line

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gap:
        return from_dict(cls, data)


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


class Sampler:
    """Samples NVML telemetry of `gpus` in the background, into a bounded ring buffer.

    Real time: a small thread wakes every `period` (Event.wait: it never busy-polls)
    and reads the cheap values of every GPU; it reads the reason counters every
    `slow_period`, the energy counter every `energy_period`, the GPU's processes
    every `process_period`, and the reason counters and processes when `mark()` asks
    for an edge read. Virtual time (a clock with
    `virtual = True`, as in tests): ticks are `clock.call_every` callbacks and edge reads
    happen synchronously in `mark()`, so results are deterministic.

    A failed read never raises: it becomes a `Gap` (see `gaps`), and windows over it
    carry `gap=True`. `own_pids` are the processes whose use of the GPU is expected
    (default: this one); any other becomes a window's `other_pids`.

        with Sampler(backend, [0]) as sampler:
            t0 = sampler.mark(); work(); t1 = sampler.mark()
            print(sampler.window(t0, t1))
    """

    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int],
        *,
        period: float | None = None,
        slow_period: float = DEFAULT_SLOW_PERIOD_S,
        process_period: float = DEFAULT_PROCESS_PERIOD_S,
        energy_period: float = DEFAULT_ENERGY_PERIOD_S,
        clock: Clock | None = None,
        capacity: int = DEFAULT_CAPACITY,
        own_pids: Iterable[int] | None = None,
        watch_processes: bool = True,
        lock_ranges: dict[int, tuple[int, int]] | None = None,
        lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    ):
        if not gpus:
            raise ConfigError("the sampler needs at least one GPU", hint="pass gpus=[0] or more")
        period = DEFAULT_PERIOD_S if period is None else float(period)
        if not min(period, slow_period, process_period, energy_period) > 0:
            raise ConfigError(
                f"sampling periods must be positive (period={period}, slow_period="
                f"{slow_period}, process_period={process_period}, energy_period={energy_period})",
                hint=f"the default period is {DEFAULT_PERIOD_S} s",
            )
        if capacity < 16:
            raise ConfigError(f"sampler capacity {capacity} is too small", hint="use 16 or more")
        self.backend = backend
        self.gpus = list(gpus)
        self.period = period
        self.slow_period = float(slow_period)
        self.process_period = float(process_period)
        self.energy_period = float(energy_period)
        self.clock: Clock = clock or getattr(backend, "clock", None) or REAL_CLOCK
        self.capacity = capacity
        self.own_pids = set(own_pids) if own_pids is not None else {os.getpid()}
        self.watch_processes = watch_processes
        self.lock_ranges = dict(lock_ranges or {})
        self.lock_tolerance_mhz = lock_tolerance_mhz
        self.ticks = 0
        self.cpu_time_s = 0.0  # CPU time of the sampler thread (real time only)
        self._fast: dict[int, deque[Sample]] = {g: deque(maxlen=capacity) for g in self.gpus}
        self._slow: dict[int, deque[SlowSample]] = {g: deque(maxlen=capacity) for g in self.gpus}
        self._gaps: deque[Gap] = deque(maxlen=capacity)
        self._unsupported: dict[int, set[str]] = {g: set() for g in self.gpus}
        self._buf_lock = threading.Lock()
        self._slow_cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._edge_requested = 0
        self._edge_done = 0
        self._next_slow_t = float("-inf")
        self._next_proc_t = float("-inf")
        self._next_energy_t = float("-inf")
        self._thread: threading.Thread | None = None
        self._timer: Timer | None = None

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None or self._timer is not None

    def start(self) -> None:
        """Start sampling (a first reading is taken at once). Refuses a second start."""
        if self.running:
            raise RuntimeError("the sampler is already running")
        self._stop.clear()
        if self.clock.virtual:
            self._tick(edge=True)
            call_every = self.clock.call_every  # type: ignore[attr-defined]
            self._timer = call_every(self.period, self._tick)
            return
        self._thread = threading.Thread(target=self._run, name="gpuenv-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; the buffer stays readable. Safe to call twice."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=5.0)

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the caller's side -------------------------------------------------------------
    def mark(self) -> float:
        """Timestamp a region edge (clock.now()) and ask for an edge read of the counters.

        On the caller's thread this costs a clock read and at most an Event.set
        (microseconds); the reads happen on the sampler's thread, at most one per
        EDGE_MIN_INTERVAL_S (marks closer together share one). On virtual time
        they happen here.
        """
        t = self.clock.now()
        if self._timer is not None:
            self._tick(edge=True)
        elif self._thread is not None:
            pending = self._edge_requested > self._edge_done
            self._edge_requested += 1
            if not pending:  # wake the thread once, not once per mark of a tight loop
                self._wake.set()
        return t

    @property
    def gaps(self) -> list[Gap]:
        with self._buf_lock:
            return list(self._gaps)

    def samples(
        self, t0: float | None = None, t1: float | None = None, gpu: int | None = None
    ) -> list[Sample]:
        """Cheap samples in [t0, t1] (all when None), of one GPU or all, in time order."""
        gpus = self.gpus if gpu is None else [self._check_gpu(gpu)]
        lo = float("-inf") if t0 is None else t0
        hi = float("inf") if t1 is None else t1
        with self._buf_lock:
            out = [s for g in gpus for s in self._fast[g] if lo <= s.t <= hi]
        if gpu is None and len(gpus) > 1:
            out.sort(key=lambda s: (s.t, s.gpu))
        return out

    def slow_samples(
        self, t0: float | None = None, t1: float | None = None, gpu: int | None = None
    ) -> list[SlowSample]:
        gpus = self.gpus if gpu is None else [self._check_gpu(gpu)]
        lo = float("-inf") if t0 is None else t0
        hi = float("inf") if t1 is None else t1
        with self._buf_lock:
            return [s for g in gpus for s in self._slow[g] if lo <= s.t <= hi]

    def latest(self, gpu: int | None = None) -> Sample | None:
        g = self.gpus[0] if gpu is None else self._check_gpu(gpu)
        with self._buf_lock:
            return self._fast[g][-1] if self._fast[g] else None

    def window(
        self,
        t0: float,
        t1: float,
        gpu: int | None = None,
        *,
        lock_range: tuple[int, int] | None = None,
    ) -> Window:
        """Summary of one GPU (default: the first) over [t0, t1]; see `Window`."""
        return self.windows([(t0, t1)], gpu, lock_range=lock_range)[0]

    def windows(
        self,
        intervals: Sequence[tuple[float, float]],
        gpu: int | None = None,
        *,
        lock_range: tuple[int, int] | None = None,
    ) -> list[Window]:
        """`window()` for many intervals of one GPU, from one copy of the buffer."""
        g = self.gpus[0] if gpu is None else self._check_gpu(gpu)
        for t0, t1 in intervals:
            if t1 < t0:
                raise ConfigError(f"window end {t1} is before its start {t0}")
        if intervals:
            self._wait_for_slow_read(g, max(t1 for _, t1 in intervals))
        lo = min((t0 for t0, _ in intervals), default=0.0)
        with self._buf_lock:
            # copy only what the windows can use: most windows are recent, so walk back
            # from the newest sample (a full buffer holds minutes of samples)
            fast = _since(self._fast[g], lo, keep_before=1)
            slow = _since(self._slow[g], lo - SLOW_LOOKBACK_S, keep_before=3)
            gaps = [x for x in self._gaps if x.gpu == g and x.t >= lo - 1.0]
            truncated = len(self._fast[g]) == self.capacity
        rng = lock_range if lock_range is not None else self.lock_ranges.get(g)
        return [
            summarize(
                fast,
                slow,
                gaps,
                t0,
                t1,
                gpu=g,
                lock_range=rng,
                lock_tolerance_mhz=self.lock_tolerance_mhz,
                own_pids=self.own_pids,
                period=self.period,
                truncated=truncated,
            )
            for t0, t1 in intervals
        ]

    def _check_gpu(self, gpu: int) -> int:
        if gpu not in self._fast:
            raise ConfigError(
                f"GPU {gpu} is not sampled", hint=f"this sampler covers GPUs {self.gpus}"
            )
        return gpu

    def _wait_for_slow_read(self, gpu: int, t1: float) -> None:
        """Real time: wait briefly for a counter read at or after t1 (the end edge)."""
        if self._thread is None or "read_slow" in self._unsupported[gpu]:
            return
        if t1 > self.clock.now():
            return
        deadline = time.monotonic() + EDGE_WAIT_S
        with self._slow_cond:
            while self._thread is not None:
                slow = self._slow[gpu]
                if slow and slow[-1].t >= t1:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._slow_cond.wait(remaining)

    # -- the sampler's side ------------------------------------------------------------
    def _run(self) -> None:
        cpu0 = time.thread_time()
        next_due = self.clock.now()
        last_edge = float("-inf")
        while not self._stop.is_set():
            try:
                now = self.clock.now()
                requested = self._edge_requested
                edge = requested > self._edge_done and now - last_edge >= EDGE_MIN_INTERVAL_S
                if edge or now >= next_due:
                    self._tick(edge=edge)
                    if edge:
                        self._edge_done = requested
                        last_edge = now
                    if now >= next_due:
                        next_due += self.period
                        if next_due <= now:  # fell behind (a stalled read): skip, do not burst
                            next_due = now + self.period
            except Exception as err:  # never let the thread die
                self._gap(self.clock.now(), self.gpus[0], "sampler", err)
            self.cpu_time_s = time.thread_time() - cpu0
            wake_at = next_due
            if self._edge_requested > self._edge_done:  # an edge read waits its turn
                wake_at = min(wake_at, last_edge + EDGE_MIN_INTERVAL_S)
            self._wake.wait(max(0.0, wake_at - self.clock.now()))
            self._wake.clear()

    def _tick(self, edge: bool = False) -> None:
        self.ticks += 1
        backend = self.backend
        for g in self.gpus:
            t = self.clock.now()
            try:
                r = backend.read_fast(g)
            except Exception as err:
                self._gap(t, g, "read_fast", err)
                continue
            sample = Sample(
                t, g, r.sm_mhz, r.mem_mhz, r.power_w, r.temp_c, r.reasons,
                r.driver_ts_us, r.power_instant_w,
            )  # fmt: skip
            with self._buf_lock:
                self._fast[g].append(sample)
        # the slow reads keep a fixed grid that edge reads do not shift, so the gap
        # between two periodic reads never exceeds their period
        t = self.clock.now()
        counters = t >= self._next_slow_t - 1e-9
        if counters:
            self._next_slow_t = _next_on_grid(self._next_slow_t, self.slow_period, t)
        procs = self.watch_processes and t >= self._next_proc_t - 1e-9
        if procs:
            self._next_proc_t = _next_on_grid(self._next_proc_t, self.process_period, t)
        energy = t >= self._next_energy_t - 1e-9
        if energy:
            self._next_energy_t = _next_on_grid(self._next_energy_t, self.energy_period, t)
        if edge or counters or procs or energy:
            self._read_slow(edge, counters=edge or counters or energy, energy=energy,
                            procs=self.watch_processes and (edge or procs))

    def _read_slow(self, edge: bool, *, counters: bool, energy: bool, procs: bool) -> None:
        for g in self.gpus:
            skip = self._unsupported[g]
            t = self.clock.now()
            r = None
            if counters and "read_slow" not in skip:
                try:
                    r = self.backend.read_slow(g, energy=energy)
                except NotSupported as err:
                    skip.add("read_slow")
                    log.info("GPU %s: slow counters unavailable (%s); no energy or reason times",
                             g, err)
                except Exception as err:
                    self._gap(t, g, "read_slow", err)
            others: tuple[int, ...] = ()
            own: bool | None = None
            read_procs = procs and "processes" not in skip
            if read_procs:
                try:
                    pids = {p.pid for p in self.backend.processes(g)}
                    others = tuple(sorted(pids - self.own_pids))
                    own = bool(pids & self.own_pids)
                except NotSupported:
                    skip.add("processes")
                    read_procs = False
                except Exception as err:
                    self._gap(t, g, "processes", err)
                    read_procs = False
            if r is None and not read_procs:
                continue
            if r is None:  # a process check alone
                slow = SlowSample(t, g, None, {}, None, others, edge, own_present=own)
            else:
                value_t = _host_time(r.driver_ts_us, t, self.clock.wall() - t)
                slow = SlowSample(
                    t, g, r.energy_mj, dict(r.reason_ns), r.mem_temp_c, others, edge, value_t,
                    own,
                )
            with self._buf_lock:
                self._slow[g].append(slow)
        with self._slow_cond:
            self._slow_cond.notify_all()

    def _gap(self, t: float, gpu: int, op: str, err: BaseException) -> None:
        text = " ".join(str(err).split()) or type(err).__name__
        with self._buf_lock:
            self._gaps.append(Gap(t, gpu, op, text))


# -- summaries -------------------------------------------------------------------------


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
    values: dict[str, Any] = {}
    if held:
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


def _since(buf: deque[Any], t: float, keep_before: int) -> list[Any]:
    """The items of a time-ordered buffer from time t on, plus `keep_before` older ones."""
    out = []
    older = 0
    for item in reversed(buf):
        out.append(item)
        if item.t < t:
            older += 1
            if older >= keep_before:
                break
    out.reverse()
    return out


def _next_on_grid(due: float, period: float, now: float) -> float:
    """The first point of the grid due + k*period after now (the grid starts at now)."""
    if due == float("-inf"):
        return now + period
    while due <= now + 1e-9:
        due += period
    return due


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


def _host_time(driver_ts_us: int | None, t: float, wall_minus_host: float) -> float | None:
    """A driver timestamp (us since the epoch) on the host clock; None if implausible."""
    if not driver_ts_us:
        return None
    at = driver_ts_us * 1e-6 - wall_minus_host
    # a refresh lies in the past, within a few driver periods (else a different time base)
    return at if t - 2.0 <= at <= t + 0.01 else None


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
