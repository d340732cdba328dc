"""The `Sampler`: reads every GPU's cheap values each period and the slow counters on
their own grids and at region edges (`mark`), keeps them in ring buffers, and summarises
any [t0, t1] into a `Window`. It reads in a separate process where it can (`process.py`),
else on a thread; on virtual time, on the clock's timer."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from gpuenv.backend import Backend
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.errors import ConfigError, NotSupported
from gpuenv.telemetry.buffers import Buffers, WindowInputs
from gpuenv.telemetry.process import Cursor, SamplerError, SamplerProcess, attach, detach
from gpuenv.telemetry.reader import (
    DEFAULT_ENERGY_PERIOD_S,
    DEFAULT_PROCESS_PERIOD_S,
    DEFAULT_SLOW_PERIOD_S,
    Reader,
)
from gpuenv.telemetry.sampled import SAMPLE_GAP_MAX_S, SAMPLED_MIN_S
from gpuenv.telemetry.samples import DEFAULT_PERIOD_S, HURRY_PERIOD_S, Gap, Sample, SlowSample
from gpuenv.telemetry.summary import summarize_many
from gpuenv.telemetry.window import Window
from gpuenv.timebase import Clock, RealClock, Timer

if TYPE_CHECKING:
    from gpuenv.telemetry.source import SampleSource

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 32768  # samples per GPU in the ring buffer: 55 minutes at 100 ms
# Counter reads a window looks at before its start: energy and reason counters interpolate
# between reads, and the read in force at the start can be a few refreshes old.
SLOW_LOOKBACK_S = 1.0
# How long window() waits, in real time, for the sampler's read at the region's end edge.
EDGE_WAIT_S = 0.5
# The driver's power samples (`Backend.power_samples`) come every ~20 ms, 8-45 ms apart on an
# H200 (docs/h200/power_samples-2026-11-29.json): the one that closes a region is out at
# most this long after its end (`await_power`) ...
POWER_WAIT_S = 0.045
POWER_SAMPLE_S = 0.02  # ... looked for one interval after the newest held
POWER_POLL_S = 0.005  # then this often (a drain: 0.3-0.55 ms per GPU on an H200)
# The driver keeps ~2.4 s of them: a running sampler drains them into its own ring at least
# this often (`_drain_due`), so a window asked for later than that after its region (a
# `measure` region completed at the next one's start, `gpuenv run`'s regions summarised
# every 30 s) still finds them.
POWER_DRAIN_S = 1.0
MODES = ("thread", "process")


def choose_mode(backend: Backend, clock: Clock, asked: str | None = None) -> tuple[str, str]:
    """("thread" | "process", why): how a Sampler of `backend` on `clock` reads.

    A process when another process can open the backend (`spec()`) and time is real,
    else a thread. A simulated GPU stays on a thread: its work lives in the process
    that runs it, so another process would see it idle. `asked` (else GPUENV_SAMPLER)
    overrides where it can.
    """
    env = os.environ.get("GPUENV_SAMPLER", "").strip().lower()
    want = asked if asked is not None else (env or None)
    if want is not None and want not in MODES:
        source = "mode" if asked is not None else "GPUENV_SAMPLER"
        raise ConfigError(f"{source}={want!r} is not a sampler mode", hint="use thread or process")
    if clock.virtual:
        return "thread", "virtual time: reads happen on the clock's timer"
    if want == "thread":
        return "thread", "asked for"
    if not isinstance(clock, RealClock):
        return "thread", "a custom clock: another process cannot share it"
    if backend.spec() is None:
        return "thread", "the backend cannot be opened by another process (no spec)"
    if want == "process":
        return "process", "asked for"
    if backend.capabilities.simulated:
        return "thread", "a simulated GPU is a model: reading it in a thread costs no process"
    return "process", "keeps NVML calls off this process's GIL"


class Sampler:
    """Samples NVML telemetry of `gpus` in the background, into a bounded ring buffer.

    Real time, `mode` "process" (the default where the backend has a `spec()`): a
    sampler process reads the GPUs and writes into shared memory, which this
    process reads only when asked (samples, latest, window): NVML calls never
    take this process's GIL. `mode` "thread" (the default for a simulated GPU, or
    without a spec; also where the process cannot start): a small thread wakes
    every `period` (Event.wait: it never busy-polls). Either reads the cheap values
    of every GPU each period (default: the driver's refresh, 100 ms), every
    `hurry_period` (25 ms) while a caller waits for fresh samples (`hurry()`: the
    conditioning waits), the GPU's processes every `process_period`, the reason
    counters every `slow_period`, the reason counters and processes when `mark()` asks
    for an edge read, and the energy counter at most every `energy_period`, only while
    regions are being marked (`reader.ACTIVE_PERIODS`; its start's read is the baseline).
    GPUENV_SAMPLER=thread|process picks where `mode` is not given. Virtual time (a
    clock with `virtual = True`, as in tests): ticks are `clock.call_every`
    callbacks and edge reads happen synchronously in `mark()`, so results are
    deterministic.

    A failed read never raises: it becomes a `Gap` (see `gaps`), and windows over it
    carry `gap=True`; so does a sampler process that died. `own_pids` are the
    processes whose use of the GPU is expected (default: this one); any other
    becomes a window's `other_pids`. `edge_capacity`: edge reads are kept apart, in
    rings of this many per GPU (`buffers.py`), for a process that marks for others
    (gpuenvd): its memory then stays flat however many windows it is asked for.

        with Sampler(backend, [0]) as sampler:
            t0 = sampler.mark(); work(); t1 = sampler.mark()
            print(sampler.window(t0, t1))

    Args:
        backend: the GPU backend to read.
        gpus: the GPUs to sample, by index.
        period: seconds between cheap reads (default: the driver's refresh, 100 ms).
        hurry_period: the period while a caller waits for fresh samples (`hurry()`).
        slow_period: seconds between reads of the reason counters.
        process_period: seconds between reads of the GPU's processes.
        energy_period: at most this often, the energy counter (while regions run).
        clock: the time it samples on (default: the backend's clock).
        capacity: records kept per GPU in the ring buffer (at least 16).
        own_pids: the processes whose use of the GPU is expected (default: this one).
        watch_processes: read the GPU's processes (other_pids) at all.
        lock_ranges: each GPU's locked SM range, to tell whether the lock held.
        lock_tolerance_mhz: how far outside the locked range the clock may read.
        mode: "process" or "thread" (default: GPUENV_SAMPLER, else as above).
        edge_capacity: edge reads kept apart, this many per GPU (at least 16; None: in
            the rings of every tick), as above.

    Raises:
        ConfigError: no GPU, a period that is not positive, a capacity too small.
    """

    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int],
        *,
        period: float | None = None,
        hurry_period: float = HURRY_PERIOD_S,
        slow_period: float = DEFAULT_SLOW_PERIOD_S,
        process_period: float = DEFAULT_PROCESS_PERIOD_S,
        energy_period: float = DEFAULT_ENERGY_PERIOD_S,
        clock: Clock | None = None,
        capacity: int = DEFAULT_CAPACITY,
        edge_capacity: int | None = None,
        own_pids: Iterable[int] | None = None,
        watch_processes: bool = True,
        lock_ranges: dict[int, tuple[int, int]] | None = None,
        lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
        mode: str | None = None,
    ):
        if not gpus:
            raise ConfigError("the sampler needs at least one GPU", hint="pass gpus=[0] or more")
        period = DEFAULT_PERIOD_S if period is None else float(period)
        if not min(period, hurry_period, slow_period, process_period, energy_period) > 0:
            raise ConfigError(
                f"sampling periods must be positive (period={period}, hurry_period="
                f"{hurry_period}, slow_period="
                f"{slow_period}, process_period={process_period}, energy_period={energy_period})",
                hint=f"the default period is {DEFAULT_PERIOD_S} s",
            )
        if capacity < 16:
            raise ConfigError(f"sampler capacity {capacity} is too small", hint="use 16 or more")
        self.backend = backend
        self.gpus = list(gpus)
        self.period = period
        self.hurry_period = min(period, float(hurry_period))  # never slower than period
        self.slow_period = float(slow_period)
        self.process_period = float(process_period)
        self.energy_period = float(energy_period)
        self.clock: Clock = clock or backend.clock
        self.capacity = capacity
        self.own_pids = set(own_pids) if own_pids is not None else {os.getpid()}
        self.watch_processes = watch_processes
        self.lock_ranges = dict(lock_ranges or {})
        self.lock_tolerance_mhz = lock_tolerance_mhz
        # "thread" | "process" (virtual time counts as "thread"), and why
        self.mode, self.mode_reason = choose_mode(backend, self.clock, mode)
        if edge_capacity is not None and edge_capacity < 16:
            raise ConfigError(
                f"sampler edge_capacity {edge_capacity} is too small", hint="use 16 or more"
            )
        # edge reads in rings of their own (buffers.py): a process that marks for others
        # (gpuenvd's windows) keeps its memory and its history flat however often it marks
        self._buf = Buffers(
            self.gpus, capacity, self.own_pids, edge_capacity=edge_capacity, spacing=period / 2
        )
        self._reader = Reader(
            backend,
            self.gpus,
            self._buf,
            clock=self.clock,
            period=period,
            hurry_period=self.hurry_period,
            slow_period=self.slow_period,
            process_period=self.process_period,
            energy_period=self.energy_period,
            watch_processes=watch_processes,
        )
        self._wake, self._stop = threading.Event(), threading.Event()
        self._edge_requested = self._edge_done = 0
        self._hurry_lock = threading.Lock()
        self._local = threading.local()  # no_edge_wait's flag, per calling thread
        self._thread: threading.Thread | None = None
        self._timer: Timer | None = None
        self._proc: SamplerProcess | None = None
        self._cursor: Cursor | None = None
        self._died: tuple[float, str] | None = None  # the sampler process ended on its own
        self._power_since: dict[int, int] = {}  # the newest driver power stamp brought in
        self._no_power_samples: set[int] = set()  # GPUs whose driver keeps none
        self._power_lock = threading.Lock()  # drains come from the caller and the ticks
        self._power_drained_at = float("-inf")  # the last periodic drain (`_drain_due`)

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None or self._timer is not None or self._proc is not None

    @property
    def ticks(self) -> int:
        return self._proc.ticks if self._proc is not None else self._reader.ticks

    @property
    def hurrying(self) -> int:
        """Callers inside `hurry()` now."""
        return self._reader.hurrying

    @property
    def cpu_time_s(self) -> float:
        """CPU time of the sampler thread or process (real time only)."""
        return self._proc.cpu_time_s if self._proc is not None else self._reader.cpu_time_s

    @property
    def read_times(self) -> dict[str, tuple[int, float, float]] | None:
        """Thread mode: per kind of read (fast, counters, energy, processes), how many this
        sampler made and the wall and CPU seconds they took where it made them; None for a
        sampler process (it keeps them in its own process)."""
        if self._proc is not None:
            return None
        return {k: (int(n), wall, cpu) for k, (n, wall, cpu) in self._reader.read_times.items()}

    @property
    def child_pid(self) -> int | None:
        """The sampler process's pid while there is one."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start sampling (a first reading is taken at once). Refuses a second start."""
        if self.running:
            raise RuntimeError("the sampler is already running")
        self._stop.clear()
        if self.clock.virtual:
            self._reader.periodic_tick()
            self._schedule_virtual()
            return
        if self.mode == "process" and self._start_process():
            return
        self._thread = threading.Thread(target=self._run, name="gpuenv-sampler", daemon=True)
        self._thread.start()

    def _start_process(self) -> bool:
        spec = self.backend.spec()
        options = {
            "period": self.period,
            "hurry_period": self.hurry_period,
            "slow_period": self.slow_period,
            "process_period": self.process_period,
            "energy_period": self.energy_period,
            "watch_processes": self.watch_processes,
        }
        try:
            assert spec is not None
            proc = attach(spec, self.gpus, capacity=self.capacity, options=options)
        except SamplerError as err:
            log.warning("gpuenv: sampling on a thread instead of a process: %s", err)
            self.mode, self.mode_reason = "thread", f"the sampler process failed: {err}"
            return False
        self._cursor = Cursor(proc, since_t=self.clock.now() - SLOW_LOOKBACK_S, gpus=self.gpus)
        self._proc, self._died = proc, None
        if proc.attaches > 1:  # a process already running: fresh counters for this start
            proc.request_edge()
        if self._reader.hurrying > 0:  # started inside a hurry
            proc.hurry(True)
        return True

    def _schedule_virtual(self) -> None:
        """Virtual time: the clock's timer at the current period, first when the next
        periodic tick is due (deterministic: a hurry moves the timer, never adds reads)."""
        if self._timer is not None:
            self._timer.cancel()
        reader, now = self._reader, self.clock.now()
        call_every = self.clock.call_every  # type: ignore[attr-defined]
        self._timer = call_every(
            reader.current_period(),
            self._virtual_tick,
            first_in=max(0.0, reader.next_due() - now),
        )

    def _virtual_tick(self) -> None:
        self._reader.periodic_tick()
        self._drain_due()

    @contextlib.contextmanager
    def hurry(self) -> Iterator[None]:
        """Read the cheap values every `hurry_period` instead of every `period` while inside:
        for a caller that polls for fresh samples (a conditioning wait). Nested and from
        several threads at once: hurried while any is inside. Costs what faster sampling
        costs (see DEFAULT_PERIOD_S), only while waiting."""
        self._hurry(+1)
        try:
            yield
        finally:
            self._hurry(-1)

    @contextlib.contextmanager
    def no_edge_wait(self) -> Iterator[None]:
        """Windows asked for on this thread while inside wait for no counter read at or
        after their end: they are summarized from the reads already in
        (`BenchConfig.wait_counters`)."""
        before = getattr(self._local, "no_edge_wait", False)
        self._local.no_edge_wait = True
        try:
            yield
        finally:
            self._local.no_edge_wait = before

    def _hurry(self, step: int) -> None:
        with self._hurry_lock:
            reader = self._reader
            was = reader.hurrying > 0
            reader.hurrying += step
            now = reader.hurrying > 0
            if now == was:
                return
            if self._proc is not None:
                self._proc.hurry(now)
            elif self._timer is not None:
                self._schedule_virtual()
            elif self._thread is not None and now:
                self._wake.set()  # tick at the hurried period from now on, not next period

    def _run(self) -> None:
        def wait(seconds: float) -> None:
            self._drain_due()
            self._wake.wait(seconds)
            self._wake.clear()

        self._reader.run(self._stop.is_set, wait, self)

    def requested(self) -> int:  # the reader's Edges, thread mode
        return self._edge_requested

    def served(self, n: int) -> None:
        self._edge_done = n

    def stop(self) -> None:
        """Stop sampling; the buffer stays readable. Safe to call twice."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._proc is not None:
            self._pull()
            proc, self._proc, self._cursor = self._proc, None, None
            with self._hurry_lock:
                if self._reader.hurrying > 0:  # a process outlives its Samplers (attach)
                    proc.hurry(False)
            detach(proc)
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

        On the caller's thread this costs a clock read and a memory write, plus a
        one-byte pipe write or an Event.set when no edge read was pending
        (microseconds); the reads happen in the sampler process or thread, at most
        one per EDGE_MIN_INTERVAL_S (marks closer together share one; the process reads
        an earlier mark's cheap values at once: `reader.FAST_EDGE_MIN_INTERVAL_S`). On
        virtual time they happen here.
        """
        t = self.clock.now()
        if self._proc is not None:
            self._proc.request_edge()
        elif self._timer is not None:
            self._reader.tick(edge=True)
        elif self._thread is not None:
            pending = self._edge_requested > self._edge_done
            self._edge_requested += 1
            if not pending:  # wake the thread once, not once per mark of a tight loop
                self._wake.set()
        return t

    def _pull(self) -> None:
        """Process mode: bring in what the sampler process wrote since the last look."""
        proc, cursor = self._proc, self._cursor
        if proc is None or cursor is None:
            return
        cursor.pull(self._buf)
        self._drain_due()  # the sampler process does not read them: this one, when it looks
        if not proc.check() and self._died is None:
            assert proc.died is not None and proc.died_at is not None
            self._died = (proc.died_at, proc.died)
            log.warning("gpuenv: %s; telemetry stops here (a telemetry gap)", proc.died)
            for g in self.gpus:
                self._buf.gap(Gap(proc.died_at, g, "sampler", proc.died))

    @property
    def gaps(self) -> list[Gap]:
        self._pull()
        return self._buf.gaps()

    def samples(
        self, t0: float | None = None, t1: float | None = None, gpu: int | None = None
    ) -> list[Sample]:
        """Cheap samples in [t0, t1] (all when None), of one GPU or all, in time order."""
        gpus = self.gpus if gpu is None else [self._check_gpu(gpu)]
        lo = float("-inf") if t0 is None else t0
        hi = float("inf") if t1 is None else t1
        self._pull()
        out = self._buf.samples(gpus, lo, hi, recent=t0 is not None)
        if gpu is None and len(gpus) > 1:
            out.sort(key=lambda s: (s.t, s.gpu))
        return out

    def slow_samples(
        self, t0: float | None = None, t1: float | None = None, gpu: int | None = None
    ) -> list[SlowSample]:
        gpus = self.gpus if gpu is None else [self._check_gpu(gpu)]
        lo = float("-inf") if t0 is None else t0
        hi = float("inf") if t1 is None else t1
        self._pull()
        return self._buf.slow_samples(gpus, lo, hi)

    def latest(self, gpu: int | None = None) -> Sample | None:
        g = self.gpus[0] if gpu is None else self._check_gpu(gpu)
        self._pull()
        return self._buf.latest(g)

    def window_inputs(self, t0: float, gpu: int | None = None) -> WindowInputs:
        """What windows of one GPU (default: the first) from `t0` on are summarised from,
        copied at once: the cheap samples from t0 and the one in force at t0, the counter
        reads from SLOW_LOOKBACK_S before t0 and three more, the gaps near, and whether
        the ring is full (older samples are gone). Each list in time order.

        Only these are copied out of the ring (a full one holds minutes of samples,
        which cost about a microsecond each to hand out)."""
        g = self.gpus[0] if gpu is None else self._check_gpu(gpu)
        self._pull()
        self._drain_power(g)
        return self._buf.window_inputs(g, t0, SLOW_LOOKBACK_S, max(1.0, self.period))

    def _drain_power(self, gpu: int) -> None:
        """Bring in the driver's power samples of `gpu` newer than the last brought in,
        on the host clock (0.3-0.55 ms on an H200). Read when windows are asked for, and
        at least every POWER_DRAIN_S while the sampler runs (`_drain_due`: on its thread,
        or, for a sampler process, whenever this process reads the sampler): the driver
        keeps ~2.4 s, so a window whose start is older than the last drain before that
        has none for its start, and its power comes from the cheap readings, as without
        them. A GPU without samples is not asked again; a failed read is a gap in them,
        never an error here."""
        with self._power_lock:
            if gpu in self._no_power_samples:
                return
            since = self._power_since.get(gpu, 0)
            try:
                got = self.backend.power_samples(gpu, since)
            except NotSupported:
                self._no_power_samples.add(gpu)
                return
            except Exception as err:  # telemetry never raises into the benchmark
                log.debug("GPU %s: power samples unavailable (%s)", gpu, err)
                return
            if not got:
                return
            offset = self.clock.wall() - self.clock.now()  # driver stamps: us since the epoch
            self._power_since[gpu] = max(ts for ts, _ in got)
            self._buf.power(gpu, [(ts * 1e-6 - offset, float(w)) for ts, w in sorted(got)])

    def _drain_due(self) -> None:
        """Drain every GPU's power samples when POWER_DRAIN_S has passed since the last
        time this did (never raises: a failed read is a gap in them)."""
        now = self.clock.now()
        if now - self._power_drained_at < POWER_DRAIN_S:
            return
        self._power_drained_at = now
        for g in self.gpus:
            self._drain_power(g)

    def power_due(self, spans: Sequence[tuple[float, float]], gpus: Iterable[int]) -> bool:
        """Whether the driver's power sample that closes a span of `spans` is still to come
        on one of `gpus`: the samples are drained now, and those held reach back to the
        span's start but not yet to its end. A window over it asked for now takes its power
        from the cheap readings (an estimate for a short region); once the sample is out,
        from the samples. Never for a GPU whose driver keeps none, a span too short for
        them (`SAMPLED_MIN_S`), or one whose start's sample is gone (the driver keeps
        ~2.4 s)."""
        long_enough = [(a, b) for a, b in spans if b - a >= SAMPLED_MIN_S]
        if not long_enough:
            return False
        for g in gpus:
            self._drain_power(self._check_gpu(g))
            newest = self._buf.power_newest(g)
            if newest is None:
                continue
            # only spans ending after the newest sample's predecessor lack it or the one
            # after it (a bench's thousands of reps are not each looked at)
            late = [(a, b) for a, b in long_enough if b > newest - SAMPLE_GAP_MAX_S]
            if any(self._buf.power_due(g, a, b) for a, b in late):
                return True
        return False

    def await_power(self, spans: Sequence[tuple[float, float]], gpus: Iterable[int]) -> bool:
        """Wait on the sampler's clock while the power sample that closes a span of `spans`
        is still to come on one of `gpus` (`power_due`), at most POWER_WAIT_S after the
        last span's end: it is out by then. Returns whether one was due: windows read
        before the wait read differently now."""
        if not spans:
            return False
        gpus = list(gpus)
        deadline = max(b for _, b in spans) + POWER_WAIT_S
        waited = False
        while self.power_due(spans, gpus):
            waited = True
            now = self.clock.now()
            if now >= deadline:
                break
            newest = [t for g in gpus if (t := self._buf.power_newest(g)) is not None]
            wake = now + POWER_POLL_S
            if newest and min(newest) + POWER_SAMPLE_S > now:
                wake = min(newest) + POWER_SAMPLE_S + 0.001  # just after the next stamp
            self.clock.sleep(min(wake, deadline) - now)
        return waited

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
        fast, slow, gaps, truncated, power = self.window_inputs(lo, g)
        rng = lock_range if lock_range is not None else self.lock_ranges.get(g)
        windows = summarize_many(
            fast,
            slow,
            gaps,
            intervals,
            power=power,
            gpu=g,
            lock_range=rng,
            lock_tolerance_mhz=self.lock_tolerance_mhz,
            own_pids=self.own_pids,
            period=self.period,
            truncated=truncated,
        )
        if self._died is None:
            return windows
        # the death gap lies inside any region it concerns: the region is marked a gap
        return [
            dataclasses.replace(w, gap=True) if self._death_gap(g, w.t0, w.t1) else w
            for w in windows
        ]

    def _death_gap(self, gpu: int, t0: float, t1: float) -> list[Gap]:
        """A region that ends after the sampler process died was not sampled to its end."""
        if self._died is None or t1 < self._died[0]:
            return []
        return [Gap(max(t0, self._died[0]), gpu, "sampler", self._died[1])]

    def _check_gpu(self, gpu: int) -> int:
        if gpu not in self._buf.fast_q:
            raise ConfigError(
                f"GPU {gpu} is not sampled", hint=f"this sampler covers GPUs {self.gpus}"
            )
        return gpu

    def _wait_for_slow_read(self, gpu: int, t1: float) -> None:
        """Real time: wait briefly for a counter read at or after t1 (the end edge)."""
        if t1 > self.clock.now() or getattr(self._local, "no_edge_wait", False):
            return
        if self._proc is not None:
            self._wait_for_process_read(gpu, t1)
            return
        if self._thread is None or "read_slow" in self._reader.unsupported[gpu]:
            return
        deadline = time.monotonic() + EDGE_WAIT_S
        buf = self._buf
        with buf.slow_cond:
            while self._thread is not None:
                last = buf.last_slow_t(gpu)
                if last is not None and last >= t1:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                buf.slow_cond.wait(remaining)

    def _wait_for_process_read(self, gpu: int, t1: float) -> None:
        """The same for the sampler process: look at the ring every millisecond."""
        deadline = time.monotonic() + EDGE_WAIT_S
        while (proc := self._proc) is not None and not proc.no_slow_counters(gpu):
            self._pull()
            last = self._buf.last_slow_t(gpu)
            if (last is not None and last >= t1) or self._died or time.monotonic() > deadline:
                return
            time.sleep(0.001)


if TYPE_CHECKING:

    def _a_sampler_is_a_source(sampler: Sampler) -> SampleSource:
        return sampler  # mypy: Sampler keeps every member SampleSource names
