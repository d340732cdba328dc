"""`gpuenv.stable()`: lock if asked and allowed, sample, and judge every measurement.

    with gpuenv.stable(sm=1350, policy="reject") as env:   # lock if asked and allowed
        with env.measure("step") as m:
            train_step()
    print(m.telemetry, m.findings, m.verdict)
    env.results.save("run.jsonl")

A session owns a `Sampler` over its GPUs and, when `sm=`/`mem=` are given and
the process may set clocks, a clock lock (gpuenv.clocks) that it releases in
`finally`. Without permission it observes and says so once. Each measurement
gets per-rep `Window`s, findings (gpuenv.verdict) and a verdict under the
session's policy, and is appended to `output` (JSONL) as soon as it ends, carrying
the telemetry trace since the previous one (gpuenv.telemetry.trace: bounded), so
`gpuenv plot` draws the whole session's clock, power and temperature.

Two modes make a GPU that cannot be locked still give the same number twice:
  - "burst" (default): before each measurement, wait until the GPU is back in
    its cool, uncapped state (no power cap or thermal reason, SM clock back at
    its maximum or inside the lock, temperature near the session's starting
    temperature), at most `ConditionConfig.burst_timeout_s` (gpuenv.conditioning).
  - "sustained": before the first measurement, run a load until the SM clock's
    median and the temperature settle (equilibrium), with a progress line on
    stderr; every measurement is then taken in that hot, steady state.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Literal, ParamSpec

from gpuenv import conditioning
from gpuenv import validate as v
from gpuenv.backend import Backend
from gpuenv.completion import Completion
from gpuenv.conditioning import Condition, ConditionConfig, Conditioner, Wait
from gpuenv.environment import environment_metadata
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.judge import Evidence, Retry, check_policy, judge, read_facts
from gpuenv.phases import Conditioning
from gpuenv.results import Measurement, Results, ResultStore
from gpuenv.telemetry import Sampler, TracePieces
from gpuenv.timebase import Clock
from gpuenv.verdict import DEFAULT_CONFIG, Finding, GpuFacts, VerdictConfig

if TYPE_CHECKING:
    from gpuenv.locking import HeldLock
    from gpuenv.timing.cuda import RegionEvents

log = logging.getLogger(__name__)

MODES = conditioning.CONDITIONS


class ObserveOnlyWarning(UserWarning):
    """stable() was asked to lock clocks but could not: it observes instead."""


class NotRecoveredWarning(UserWarning):
    """burst mode timed out waiting for the GPU to cool down and uncap."""


class Session:
    """What `stable()` returns, made with the same parameters. Attributes: backend, gpus,
    sampler, results, lock, locked, trace (the telemetry trace's pieces:
    gpuenv.telemetry.TracePieces).

    Args:
        sm: the SM clock to lock (1350, (1200, 1500), "max", "base", "sustained"),
            locked only when permitted, else observed (one warning).
        mem: the memory clock to lock, as `sm`.
        gpus: which GPUs to sample (and lock): None = this process's own (LOCAL_RANK's,
            else CUDA_VISIBLE_DEVICES', else Slurm's, else all: `gpuenv.devices.own_gpus`;
            the why is the record's session "gpus_why"), "all" = every GPU (see
            `gpuenv.devices.select_gpus`).
        policy: "annotate" (keep everything, attach findings), "reject" (drop the
            reps a finding touched), "retry" (re-run them after a recovery delay; a
            single `measure` region, which cannot be re-run, is rejected).
        mode: "burst" or "sustained" (the module's docstring).
        backend: the GPU backend (default: `open_backend()`).
        clock: the time the session runs on (default: the backend's clock).
        output: a JSONL file of this session's run alone; each measurement is
            appended as it ends.
        append: write beside the runs `output` already holds (else it is refused).
        period: seconds between telemetry samples, the CLI's `--interval` (default
            `telemetry.DEFAULT_PERIOD_S`).
        config: the verdict's thresholds (`VerdictConfig`).
        mode_config: the conditioning's settings (`ConditionConfig`).
        stable_clocks: treat power capping and clock drift as problems (default:
            True when `sm=` is asked for).
        load: the work sustained mode preconditions with (default: the simulated
            GPU's own heavy load, or the function given to `repeat` / `bench`).
        cuda_events: time `measure` regions with CUDA events too (needs torch
            already imported; the region then synchronizes at its end).
        supervise: a watchdog restores a lock the session took if this process dies.
        progress: where the progress line goes (default: stderr on a terminal).
    """

    def __init__(
        self,
        sm: int | tuple[int, int] | str | None = None,
        mem: int | tuple[int, int] | None = None,
        gpus: str | int | Sequence[str | int] | None = None,
        policy: str = "annotate",
        mode: str = "burst",
        *,
        backend: Backend | None = None,
        clock: Clock | None = None,
        output: str | os.PathLike[str] | None = None,
        append: bool = False,
        period: float | None = None,
        config: VerdictConfig | None = None,
        mode_config: ConditionConfig | None = None,
        stable_clocks: bool | None = None,
        load: Callable[[], object] | None = None,
        cuda_events: bool = False,
        supervise: bool = True,
        progress: IO[str] | None = None,
    ):
        self.policy = check_policy(policy)
        _check_args(period, config, mode_config, load, output, stable_clocks, append)
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}", hint="use mode='burst' or 'sustained'")
        self.mode: Condition = mode
        self.sm, self.mem = sm, mem
        self._gpu_selector = gpus
        self._backend_arg = backend
        self._clock_arg = clock
        self.output = output
        self.append = append
        self.period = period
        config = config or DEFAULT_CONFIG
        wants_stable = (sm is not None) if stable_clocks is None else stable_clocks
        self.config = replace(config, stable_clocks=wants_stable or config.stable_clocks)
        self.mode_config = mode_config or ConditionConfig()
        self.load = load
        self.cuda_events = cuda_events
        self.supervise = supervise
        self.progress = progress
        self._results = Results()
        self.lock: HeldLock | None = None  # when clocks are locked (gpuenv.locking.acquire)
        self.observe_reason: str | None = None
        self.facts: dict[int, GpuFacts] = {}
        self._entered = False
        self._closed = False
        self._owns_backend = False
        self._store: ResultStore | None = None
        self._warned: set[str] = set()

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> Session:
        if self._entered:
            raise GpuenvError(
                "this gpuenv.stable() session was already entered",
                hint="make a new one with gpuenv.stable(...) for each with-block",
            )
        self._entered = True
        try:
            self._open()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    @property
    def locked(self) -> bool:
        return self.lock is not None

    @property
    def results(self) -> Results:
        """The session's measurements, in order (`Results`: `save(path)` writes them). Read
        while the session is open, a `measure` region just ended first gets its energy from
        the driver's power sample after it (a wait of at most POWER_WAIT_S)."""
        if self._entered and not self._closed:
            self._completion.settle(wait=True)
        return self._results

    def _open(self) -> None:
        if self._backend_arg is None:
            from gpuenv.backend import open_backend

            self.backend: Backend = open_backend()
            self._owns_backend = True
        else:
            self.backend = self._backend_arg
        from gpuenv.devices import choose_gpus

        self.gpus, self.gpus_why = choose_gpus(self.backend, self._gpu_selector)
        self.clock: Clock = self._clock_arg or self.backend.clock
        if self.sm is not None or self.mem is not None:
            self._try_lock()
        ranges = self._lock_ranges()
        self.facts = read_facts(self.backend, self.gpus, ranges)
        self.sampler = Sampler(
            self.backend,
            self.gpus,
            period=self.period,
            clock=self.clock,
            lock_ranges=ranges,
            lock_tolerance_mhz=self.config.lock_tolerance_mhz,
        )
        self.trace = TracePieces(self.sampler, self.gpus, self.clock.now())
        # measurements whose energy awaits the driver's power sample after them
        self._completion = Completion(self.sampler, self._results, self.gpus)
        self.sampler.start()
        # what a measurement waits for, and what this session's measurements learn: its own
        self.conditioner = Conditioner(
            self.mode_config, clock=self.clock, lock_tolerance_mhz=self.config.lock_tolerance_mhz
        )
        self.conditioner.rested(self.sampler, self.gpus)
        self.metadata = environment_metadata(
            self.backend, self.gpus, clock=self.clock, extra={"session": self._session_meta()}
        )
        self._results.metadata = self.metadata
        if self.output is not None:
            self._store = ResultStore(self.output, self.metadata, append=self.append)
            self._results.store = self._store
        if self.mode == "sustained" and self._default_load() is not None:
            self.precondition()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            sampler = getattr(self, "sampler", None)
            if sampler is not None:
                if hasattr(self, "_completion"):  # before `output` closes: the file too
                    self._completion.settle(wait=True)
                sampler.stop()
        finally:
            try:
                if self.lock is not None:
                    self.lock.release()
            finally:
                if self._store is not None:
                    self._store.close()
                if self._owns_backend:
                    self.backend.close()

    def _try_lock(self) -> None:
        from gpuenv.errors import LockConflict, NotSupported, PermissionDenied, ReadOnlyError
        from gpuenv.locking import acquire

        try:
            lk = acquire(
                self.sm,
                mem=self.mem,
                gpus=self.gpus,
                backend=self.backend,
                supervise=self.supervise,
            )
            lk.__enter__()
        except (PermissionDenied, ReadOnlyError, NotSupported, LockConflict) as err:
            self._observe(str(err))
            return
        self.lock = lk

    def _observe(self, why: str) -> None:
        self.observe_reason = why
        asked = ", ".join(f"{k}={v!r}" for k, v in (("sm", self.sm), ("mem", self.mem)) if v)
        warnings.warn(
            f"gpuenv.stable({asked}): clocks not locked ({why}); observing instead: every "
            "measurement still carries its clocks, power, temperature and findings",
            ObserveOnlyWarning,
            stacklevel=_user_level(),  # the user's `with gpuenv.stable(...)` line
        )

    def _lock_ranges(self) -> dict[int, tuple[int, int]]:
        """The SM range each GPU is locked to, base clock resolved."""
        from gpuenv.locking import lock_ranges

        return {} if self.lock is None else lock_ranges(self.lock, self.backend)

    def _session_meta(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "mode": self.mode,
            "requested_sm": self.sm,
            "requested_mem": self.mem,
            "gpus_why": self.gpus_why,
            "locked": self.locked,
            "observe_reason": self.observe_reason,
            "lock_ranges_mhz": {str(g): list(r) for g, r in self._lock_ranges().items()},
            "sampler_period_s": self.sampler.period,
            "stable_clocks": self.config.stable_clocks,
        }

    # -- measuring -----------------------------------------------------------------------
    def measure(self, name: str) -> MeasureContext:
        """Time one region: `with env.measure("step") as m: ...`; `m` becomes its Measurement."""
        self._check_open()
        return MeasureContext(self, v.text(name, "name"))

    def repeat(
        self,
        fn: Callable[[], object],
        reps: int = 10,
        *,
        name: str | None = None,
        warmup: int = 0,
    ) -> Measurement:
        """Call `fn` `reps` times, each a host-timed rep with its own window.

        Under policy "retry", affected reps are re-run after recovery delays.
        For GPU work that returns before the GPU finishes, use `bench` (CUDA events).
        """
        self._check_open()
        v.no_arg_callable(fn, "fn")
        reps, warmup = v.integer(reps, "reps", lo=1), v.integer(warmup, "warmup", lo=0)
        label = v.text(name, "name") if name is not None else str(getattr(fn, "__name__", "repeat"))
        self._prepare(self.load or fn)
        for _ in range(warmup):
            fn()

        def run_one() -> tuple[float, tuple[float, float]]:
            t0 = self.sampler.mark()
            fn()
            t1 = self.sampler.mark()
            return t1 - t0, (t0, t1)

        started = self.clock.wall()
        done = [run_one() for _ in range(reps)]
        return self.record(
            label,
            [d[0] for d in done],
            [d[1] for d in done],
            started_at=started,
            rerun=lambda idx: [run_one() for _ in idx],
        )

    def bench(self, fn: Callable[[], object], **kwargs: Any) -> Measurement:
        """The full GPU timing harness (gpuenv.timing.bench) inside this session."""
        self._check_open()
        from gpuenv import timing

        return timing.bench(fn, session=self, **kwargs)

    def record(
        self,
        name: str,
        times_s: Sequence[float],
        intervals: Sequence[tuple[float, float]],
        *,
        timer: str = "host",
        started_at: float | None = None,
        extra: dict[str, Any] | None = None,
        rerun: Callable[[list[int]], list[tuple[float, tuple[float, float]]]] | None = None,
        policy: str | None = None,
        extra_findings: Sequence[Finding] = (),
    ) -> Measurement:
        """Judge and store reps already timed: the hook for harnesses (gpuenv.timing).

        `intervals` are each rep's [t0, t1] on the sampler's clock (`sampler.mark()`).
        `rerun(rep_indices)` re-times those reps (same order) and returns
        (time_s, (t0, t1)) for each: used by the retry policy. Without it, retry
        acts as reject.
        """
        self._check_open()
        return self._record(
            name,
            times_s,
            intervals,
            timer=timer,
            started_at=started_at,
            extra=extra,
            rerun=rerun,
            policy=policy,
            extra_findings=extra_findings,
            settle="wait",
        )

    def _record(
        self,
        name: str,
        times_s: Sequence[float],
        intervals: Sequence[tuple[float, float]],
        *,
        timer: str,
        started_at: float | None,
        extra: dict[str, Any] | None,
        rerun: Callable[[list[int]], list[tuple[float, tuple[float, float]]]] | None,
        policy: str | None,
        extra_findings: Sequence[Finding],
        settle: Literal["wait", "later"],
    ) -> Measurement:
        """`record`; `settle`: "wait" for the driver's power sample after the reps before
        judging them, or "later" (a `measure` region: the session's `Completion` completes
        its energy, and the caller reads it through the session)."""
        policy = check_policy(policy or self.policy)
        times = [float(t) for t in times_s]
        spans = [(float(a), float(b)) for a, b in intervals]
        if len(times) != len(spans) or not times:
            raise ConfigError(
                f"record() needs one interval per rep ({len(times)} times, {len(spans)} intervals)"
            )
        if settle == "wait":  # the windows below then take the power samples after the reps
            self.sampler.await_power(spans, self.gpus)
        retry = Retry(rerun, self.clock, self._recover) if rerun is not None else None
        m = judge(
            name,
            times,
            Evidence.sampled(self.sampler, spans, self.gpus),
            facts=self.facts,
            config=self.config,
            policy=policy,
            retry=retry,
            extra_findings=extra_findings,
            timer=timer,
            started_at=started_at,
            extra=extra,
        )
        self.conditioner.work_ended(max(b for _, b in spans))
        if settle == "later":
            return self._keep(m, later=True)
        return self.keep(m)

    def keep(self, m: Measurement) -> Measurement:
        """Keep a measurement (and append it to `output`): the hook for harnesses. It gets the
        session's telemetry trace since the previous one kept (extra["trace"], "traces").
        No wait for the driver's power sample after it (up to POWER_WAIT_S, 20-45 ms): a
        bench's wall is a figure of its own, and its reps span its bursts and rests, long
        enough for the readings it has (`record` and `repeat` wait: their caller's region
        may be a single short one)."""
        self._check_open()
        return self._keep(m)

    def _keep(self, m: Measurement, *, later: bool = False) -> Measurement:
        """Keep `m` with its trace piece; `later`: its energy may wait for the driver's
        power sample after it, and so does its line in `output` (gpuenv.completion)."""
        piece = self.trace.piece()
        if piece:
            m = replace(m, extra={**m.extra, **piece})
        self._completion.add(m, later=later)  # appended to `output` (results.store)
        return m

    def _check_open(self) -> None:
        if not self._entered or self._closed:
            raise GpuenvError(
                "this session is not open",
                hint="use it inside 'with gpuenv.stable(...) as env:'",
            )

    def _warn_once(self, key: str, text: str, category: type[Warning] = UserWarning) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(text, category, stacklevel=_user_level())

    # -- modes ---------------------------------------------------------------------------
    def _prepare(self, load: Callable[[], object] | None) -> None:
        """Before a measurement: the GPUs put in the session's state by its conditioner (the
        one dispatch: burst waits, sustained preconditions once), and what went wrong said."""
        self._completion.settle(wait=False)  # before a wait: the driver keeps ~2.4 s
        done = self.conditioner.before(
            self.mode,
            self.sampler,
            self.gpus,
            self.facts,
            load=load,
            progress=self._progress_line() if self.mode == "sustained" else None,
        )
        self._completion.settle(wait=False)  # the samples after the last region are out
        if isinstance(done, Wait):
            self._said_wait(done)
        elif isinstance(done, Conditioning):
            self._said_precondition(done)

    def wait_until_recovered(
        self, fn: Callable[..., object] | None = None, *, gpus: Sequence[int] | None = None
    ) -> float:
        """Burst mode: wait until `gpus` (default: every GPU of the session; a bench, the GPU
        its function runs on) are cool and uncapped (gpuenv.conditioning), at most
        `mode_config.burst_timeout_s`; returns seconds waited. With `fn` (a bench of it)
        "cool" is what fn's own temperature slope asks for (`conditioning.temperature`):
        nothing for a function not learned yet or whose time does not rise with the
        temperature, and at most `burst_temp_wait_s` beyond the clock and the cap. A GPU
        still too warm when the wait runs out, but uncapped at its full clock, is no
        warning: the measurement's temperature facts say what that costs fn."""
        which = self.gpus if gpus is None else list(gpus)
        self._completion.settle(wait=False)  # before the wait: the driver keeps ~2.4 s
        done = self.conditioner.wait(self.sampler, which, self.facts, fn=fn)
        self._completion.settle(wait=False)
        self._said_wait(done)
        return done.waited_s

    def _said_wait(self, done: Wait) -> None:
        if done.ready or done.warm_only:
            return
        g = done.pending[0]
        s = self.sampler.latest(g)
        state = f" ({s.sm_mhz} MHz, {s.temp_c:.0f} C)" if s is not None else ""
        self._warn_once(
            "recover",
            f"GPU {g} did not return to its cool, uncapped state within "
            f"{self.mode_config.burst_timeout_s:.0f} s{state}; measuring anyway (findings say why)",
            NotRecoveredWarning,
        )

    def _recover(self) -> None:
        """Before a retry: back to the state this session measures in."""
        if self.mode == "burst":
            self.wait_until_recovered()

    def work_ended(self, t: float) -> None:
        """A harness ran work on the GPU until `t` (sampler clock): burst waits from there."""
        self.conditioner.work_ended(t)

    def _default_load(self) -> Callable[[], object] | None:
        if self.load is not None:
            return self.load
        workload = self.backend.workload  # the simulated GPU's own load
        if workload is None:
            return None
        run_work = workload.run_work
        # 50 ms of heavy work a call at each GPU's own top clock (the model's, where the
        # facts could not read it)
        cycles = {
            g: 0.05 * (self.facts[g].max_sm_mhz or workload.clock_limits(g).max_sm_mhz) * 1e6
            for g in self.gpus
        }

        def sim_load() -> None:
            for g in self.gpus:
                run_work(g, cycles[g], power_intensity=1.0)

        return sim_load

    def precondition(self, load: Callable[[], object] | None = None) -> float:
        """Sustained mode: run `load` until SM clock and temperature reach equilibrium.

        Returns the seconds spent. Prints a progress line on stderr (or `progress`).
        """
        self._check_open()
        load = load or self._default_load()
        if load is None:
            raise ConfigError(
                "mode='sustained' needs a load to precondition the GPU with",
                hint="pass load=fn to gpuenv.stable(), or use env.repeat(fn)/env.bench(fn)",
            )
        start = self.clock.now()
        done = self.conditioner.precondition_with(
            load, self.sampler, self.gpus, progress=self._progress_line()
        )
        self._said_precondition(done)
        return self.clock.now() - start

    def _progress_line(self) -> Callable[[str, bool], None]:
        """Where the sustained precondition says how far it is: one line rewritten on a
        terminal, else a line every 10 s (and the last)."""
        out = self.progress if self.progress is not None else sys.stderr
        tty = bool(getattr(out, "isatty", lambda: False)())
        last_print = [-math.inf]
        start, limit = self.clock.now(), self.mode_config.sustained_timeout_s

        def show(line: str, settled: bool) -> None:
            elapsed = self.clock.now() - start
            if tty or elapsed - last_print[0] >= 10 or settled or elapsed >= limit:
                last_print[0] = elapsed
                out.write(("\r" if tty else "") + "gpuenv: " + line + ("" if tty else "\n"))
                out.flush()

        return show

    def _said_precondition(self, done: Conditioning) -> None:
        out = self.progress if self.progress is not None else sys.stderr
        if getattr(out, "isatty", lambda: False)():
            out.write("\n")
        if not done.steady:
            self._warn_once(
                "sustained",
                "the GPU did not reach equilibrium within "
                f"{self.mode_config.sustained_timeout_s:.0f} s of load; "
                "measuring anyway (clock_drift findings will show the trend)",
            )


class MeasureContext:
    """`with env.measure(name) as m:` times the block; afterwards `m` reads as its Measurement.

    The block is timed on the host (or with CUDA events when the session asks); burst
    mode first waits for the cool, uncapped state, sustained mode preconditions once;
    the session's `record()` then judges the region through gpuenv.judge like every
    other measurement. `m.telemetry`, `m.findings`, `m.verdict`, `m.times_s` ... are the
    Measurement's (`m.measurement` is the record itself). They exist once the block has
    ended.
    """

    def __init__(self, session: Session, name: str):
        self._session = session
        self.name = name
        self._index: int | None = None  # its place in the session's results, once ended
        self._t0 = 0.0
        self._started = 0.0
        self._events: RegionEvents | None = None

    def __enter__(self) -> MeasureContext:
        env = self._session
        if self._index is not None or self._t0:
            raise GpuenvError(f"measure({self.name!r}) was already used; call env.measure() again")
        load = env._default_load()
        env._prepare(load)
        if env.mode == "sustained" and load is None and not env.conditioner.preconditioned:
            env._warn_once(
                "no-load",
                "mode='sustained' has no load to precondition the GPU with before "
                f"measure({self.name!r}): pass load=fn to gpuenv.stable(), or use "
                "env.repeat(fn)/env.bench(fn); measuring as it is",
            )
        if env.cuda_events:
            from gpuenv.timing.cuda import RegionEvents  # torch's one home; it stays lazy

            self._events = RegionEvents()
        self._started = env.clock.wall()
        self._t0 = env.sampler.mark()
        if self._events is not None:
            self._events.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        env = self._session
        timer = "host"
        device_s = None
        if self._events is not None:
            device_s = self._events.stop()
            timer = "cuda_events"
        t1 = env.sampler.mark()
        if exc_type is not None:
            return  # the region failed: nothing to record, the exception propagates
        host_s = t1 - self._t0
        extra = {"host_s": host_s} if device_s is not None else {}
        # no wait for the driver's power sample after the region: the session completes
        # its energy when the sample is out (gpuenv.completion), or when it is read here
        env._record(
            self.name,
            [device_s if device_s is not None else host_s],
            [(self._t0, t1)],
            timer=timer,
            started_at=self._started,
            extra=extra,
            rerun=None,
            policy="reject" if env.policy == "retry" else env.policy,
            extra_findings=(),
            settle="later",
        )
        self._index = len(env._results) - 1

    @property
    def measurement(self) -> Measurement | None:
        """The region's Measurement once the block has ended (None before): its power and
        energy from the driver's power samples (read in an open session, this waits for
        the first after the region, at most ~45 ms, where it is not out yet)."""
        if self._index is None:
            return None
        return self._session._completion.get(self._index)

    def __getattr__(self, attr: str) -> Any:
        index = self.__dict__.get("_index")
        if index is not None and attr in _NO_POWER:  # no wait for what power does not touch
            return getattr(self._session._results[index], attr)
        m = self.measurement if index is not None else None
        if m is None:
            raise AttributeError(
                f"measure({self.__dict__.get('name')!r}) has no {attr!r} yet: read it after "
                "the with-block ends"
            )
        return getattr(m, attr)

    def __str__(self) -> str:
        m = self.measurement
        return str(m) if m else f"<measuring {self.name!r}>"

    def __repr__(self) -> str:
        m = self.measurement
        verdict = m.verdict if m else "running"
        return f"<gpuenv measurement {self.name!r}: {verdict}>"


# What a Measurement holds that its windows' power and energy do not touch: read from a
# `measure` region before its energy is complete, without waiting for it.
_NO_POWER = frozenset(
    {
        "name",
        "times_s",
        "stats",
        "findings",
        "verdict",
        "policy",
        "rejected_reps",
        "retried_reps",
        "gpus",
        "timer",
        "started_at",
        "kept_times_s",
        "median_s",
        "ok",
    }
)


def _user_level() -> int:
    """The `stacklevel` that points a warning raised by the caller at the first line outside
    gpuenv (the user's `with env.measure(...)`, `env.bench(...)`), however deep in gpuenv
    the call that warns sits."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: FrameType | None = sys._getframe(1)  # the caller, which calls warnings.warn
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


_P = ParamSpec("_P")


def _parameters_of(
    cls: Callable[_P, Session],
) -> Callable[[Callable[..., Session]], Callable[_P, Session]]:
    """Give a factory `cls`'s parameter list, for type checkers and help() alike: the
    parameters are written once, on `Session.__init__`."""

    def give(factory: Callable[..., Session]) -> Callable[_P, Session]:
        factory.__signature__ = inspect.signature(cls).replace(  # type: ignore[attr-defined]
            return_annotation="Session"
        )
        return factory

    return give


def _check_args(
    period: Any,
    config: Any,
    mode_config: Any,
    load: Any,
    output: Any,
    stable_clocks: Any,
    append: Any,
) -> None:
    """stable()'s arguments, judged before anything opens (gpuenv.validate)."""
    if period is not None:
        v.sample_period(period, "period")
    if config is not None:
        v.instance(config, "config", VerdictConfig, "a gpuenv.VerdictConfig (or None)")
    if mode_config is not None:
        v.instance(mode_config, "mode_config", ConditionConfig, "a ConditionConfig (or None)")
    if load is not None:
        v.no_arg_callable(load, "load")
    if stable_clocks is not None:
        v.boolean(stable_clocks, "stable_clocks")
    v.results_path(output, "output", append=append)  # one run per file


@_parameters_of(Session)
def stable(*args: Any, **kwargs: Any) -> Session:
    """A measuring session; use it as a context manager.

    Args:
        *args: `Session`'s parameters, in its order (`sm`, `mem`, `gpus`, `policy`,
            `mode`).
        **kwargs: `Session`'s parameters by name: `sm=`, `policy=`, `backend=`,
            `output=`, ... (each described on `Session`).

    Returns:
        The `Session`: `measure`, `repeat`, `record`, `bench` and its `results`.

    Raises:
        ConfigError: an argument out of range, or `output` holding other runs
            without `append`. (A lock that cannot be taken, refused or held by
            another owner, is not an error: the session observes, with one warning.)
    """
    return Session(*args, **kwargs)
