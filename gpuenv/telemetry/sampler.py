"""The `Sampler` thread: reads every GPU's cheap values on each tick and the slow
counters at most every slow period and at region edges (`mark`), keeps them in ring
buffers, and summarises any [t0, t1] into a `Window`."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from gpuenv.backend import Backend
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.errors import ConfigError, NotSupported
from gpuenv.telemetry.samples import DEFAULT_PERIOD_S, Gap, Sample, SlowSample
from gpuenv.telemetry.summary import summarize_many
from gpuenv.telemetry.window import Window
from gpuenv.timebase import Clock, Timer

log = logging.getLogger(__name__)

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
# Counter reads a window looks at before its start: energy and reason counters interpolate
# between reads, and the read in force at the start can be a few refreshes old.
SLOW_LOOKBACK_S = 1.0
# At most one edge read per this interval in real time: a loop of tiny regions marks
# thousands of edges a second, and each edge read is a field batch of ~0.1-0.2 ms.
EDGE_MIN_INTERVAL_S = 0.02
# How long window() waits, in real time, for the sampler's read at the region's end edge.
EDGE_WAIT_S = 0.5


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
        self.clock: Clock = clock or backend.clock
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
        return summarize_many(
            fast, slow, gaps, intervals, gpu=g, lock_range=rng,
            lock_tolerance_mhz=self.lock_tolerance_mhz, own_pids=self.own_pids,
            period=self.period, truncated=truncated,
        )  # fmt: skip

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


def _host_time(driver_ts_us: int | None, t: float, wall_minus_host: float) -> float | None:
    """A driver timestamp (us since the epoch) on the host clock; None if implausible."""
    if not driver_ts_us:
        return None
    at = driver_ts_us * 1e-6 - wall_minus_host
    # a refresh lies in the past, within a few driver periods (else a different time base)
    return at if t - 2.0 <= at <= t + 0.01 else None
