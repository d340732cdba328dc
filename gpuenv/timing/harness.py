"""The harness: `bench(fn)` -- where to run, warmup, conditioning, reps under the stopping
rule; then gpuenv.judge turns the reps and their telemetry into a `Measurement`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

from gpuenv import conditioning, stats
from gpuenv import validate as v
from gpuenv.backend import Backend, open_backend_quietly
from gpuenv.clocks.status import lock_holds
from gpuenv.completion import after_reps, power_due
from gpuenv.conditioning import Conditioner
from gpuenv.conditioning.memory import gpu_key, process_memory
from gpuenv.devices import own_gpus
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.judge import Evidence, Retry, judge, read_facts
from gpuenv.phases import BurstSchedule, Conditioned, FirstBurst, StateProbe, Wall, Warmup
from gpuenv.progress import Progress
from gpuenv.reasons import Reason
from gpuenv.results import Measurement, ResultStore
from gpuenv.seams import BenchSession, session_gpus
from gpuenv.telemetry import DRIVER_REFRESH_S, EDGE_MIN_INTERVAL_S, SampleSource, trace_record
from gpuenv.timebase import Clock
from gpuenv.timing.config import DEFAULT_BUDGET_S, TINY_REP_S, BenchConfig
from gpuenv.timing.cuda import PROFILER_MAX_REPS, nvml_index_of_cuda
from gpuenv.timing.devices import KIND_WORDS, BackToBack, ClockDevice, Device, Rep
from gpuenv.timing.repstats import rep_stats
from gpuenv.timing.stateprobe import (
    burst_limit,
    probe_state,
    remember_burst_limit,
    remember_state,
)
from gpuenv.timing.where import cuda_nvml_index, open_device, safe_index
from gpuenv.verdict import DEFAULT_CONFIG, GpuFacts, Policy, tiny_call
from gpuenv.verdict.number import CiTarget

log = logging.getLogger(__name__)

Measured = Literal["burst", "sustained", "none"]  # the condition bench measures in

WARMUP_WINDOW = 8  # reps whose times and clocks must not trend for warmup to end
WARMUP_MIN_REPS = 3  # the first call is set-up (cuBLAS handles, lazy loading): never enough
WARMUP_REL_TOL = 0.01  # a trend moving times by less than this across the window is steady
WARMUP_KNOWN_WINDOW = 4  # a function warmed up before on this GPU (its conditioner's memory):
# its first-call set-up is done; only the clock's ramp is left
# A first burst begun with the call (from the start) may judge the sample read up to this
# much before the call began as the older of its two, the newest always one taken since:
# while bench marks, the sampler reads every 4 ms (a sampler process) to 20 ms (a thread),
# and a call of a short kernel is a few ms old at its check (on an H200, Inductor's
# do_bench drop-in calls: 6.4 ms of check a call, most of it waiting for a second sample)
READY_LOOKBACK_S = EDGE_MIN_INTERVAL_S


def bench(
    fn: Callable[[], Any],
    config: BenchConfig | None = None,
    *,
    name: str | None = None,
    session: BenchSession | None = None,
    backend: Backend | None = None,
    gpu: int | None = None,
    device: Device | None = None,
    output: str | os.PathLike[str] | None = None,
    append: bool = False,
    progress: bool | Callable[[str], None] = False,
    **settings: Any,
) -> Measurement:
    """Time `fn` on the GPU, with telemetry on every rep; returns a `Measurement`.

    With no options gpuenv picks the safe default (`BenchConfig`'s docstring): a number
    that does not depend on what ran before. The stats of the kept reps are in
    `m.stats` (the median's confidence interval: `m.stats.ci_s`); the warmup and the
    conditioning in `m.warmup`, `m.first_burst`, `m.bursts` and `m.precondition`;
    effective clocks and settings in `m.extra`.

    Args:
        fn: the GPU work of one rep, called with no arguments.
        config: what to do, as a `BenchConfig` (reps, condition, policy, ...).
        name: the measurement's name (default: `fn`'s).
        session: a `gpuenv.stable()` session that lends its sampler, lock, policy
            and mode.
        backend: the GPU backend (default: `open_backend()`).
        gpu: the GPU to time on (default: the session's first, or the current CUDA
            device's).
        device: what runs `fn` (tests: `SimDevice` with `sim_kernel`; default: the
            backend's synthetic workload when it has one, else CUDA through torch).
        output: a JSONL file to write the Measurement to, as a run of its own.
        append: write beside the runs `output` already holds (without it such a
            file is refused before measuring).
        progress: a progress line on stderr (True), or a callable given each line.
        **settings: `BenchConfig`'s fields as keywords (`reps=`, `condition=`,
            `policy=`, ...), over `config`.

    Returns:
        The `Measurement`: per-rep times and telemetry windows, findings, verdict.

    Raises:
        ConfigError: an argument out of range, or `output` holding other runs
            without `append`.
        BackendError: the GPU could not be reached (telemetry gaps are findings,
            not errors).
    """
    v.no_arg_callable(fn, "fn")
    cfg = BenchConfig.of(config, dict(settings))
    if name is not None:
        v.text(name, "name")
    if gpu is not None:
        v.integer(gpu, "gpu", lo=0)
    v.results_path(output, "output", append=append)  # before measuring: refused now
    name = name or getattr(fn, "__name__", None) or "bench"
    name = "bench" if name == "<lambda>" else name
    place = _Place.open(cfg, session, backend, gpu, device)
    try:  # a bench of seconds says on a terminal what it is doing (gpuenv.progress)
        with Progress(f"gpuenv.bench {name}: warming up") as line:
            m = _Run(cfg, place, fn, name, _progress_fn(progress), bool(progress), line).run()
    finally:
        place.close()
    m = dataclasses.replace(m, extra={**m.extra, **Wall.between(place.marks).to_extra()})
    if session is not None:
        session.work_ended(session.sampler.mark())  # burst mode waits from here
        m = session.keep(m)  # with the session's trace; appended to its `output`, if any
    elif output is not None:
        from gpuenv.environment import environment_metadata

        be = place.backend
        meta = environment_metadata(be, [place.gpu], clock=place.clock) if be is not None else {}
        with ResultStore(output, meta, append=append) as store:
            store.append(m)
    return m


def open_ahead(
    cfg: BenchConfig, backend: Backend | None, gpu: int | None, ordinal: int | None = None
) -> None:
    """Open and close what a bench call on `gpu` (else on CUDA's device `ordinal`; None:
    no CUDA context yet, the process's own GPU, LOCAL_RANK's where set) opens but its
    device: the backend's facts, the sampler, so that the next call finds its sampler
    process running (it lingers: process.LINGER_S). No CUDA context is made: a tuner's
    switch opens ahead before its process may have one."""
    backend = open_backend_quietly() if backend is None else backend
    if gpu is None and backend is not None:
        be = backend
        if ordinal is None:
            gpu = safe_index(lambda: own_gpus(be).indices[0])
        else:
            gpu = safe_index(lambda: cuda_nvml_index(be, ordinal))
    _Place.open(cfg, None, backend, gpu, ClockDevice()).close()


@dataclass
class _Place:
    """Where fn runs and who watches: backend, GPU, sampler, device, facts, condition."""

    backend: Backend | None
    gpu: int
    sampler: SampleSource | None
    own_sampler: bool
    device: Device
    facts: dict[int, GpuFacts]
    condition: Measured
    condition_why: str
    policy: Policy
    session: BenchSession | None
    # what the measurement waits for, and what it learned: the session's, else one for
    # this call over the process's memory (gpuenv.conditioning.conditioner)
    conditioner: Conditioner
    opened: float  # clock time just before the sampler started: its samples come after
    # perf_counter at each phase's start, and at the last one's end (phases.Wall)
    marks: list[float] = dataclasses.field(default_factory=list)

    @property
    def clock(self) -> Clock:
        return self.device.clock

    @functools.cached_property
    def identity(self) -> Hashable:
        """This GPU (read once a bench), for what the conditioner's memory keeps between
        calls: its clock and UUID (without a backend, CUDA's device, which names one GPU for
        the process's life)."""
        uuid = None
        if self.backend is not None:
            with contextlib.suppress(GpuenvError):
                uuid = str(self.backend.device_info(self.gpu).uuid)
        if uuid is None:
            torch_device = self.device.device
            uuid = f"cuda {torch_device if torch_device is not None else self.gpu}"
        return gpu_key(self.clock, uuid)

    @classmethod
    def open(
        cls,
        cfg: BenchConfig,
        session: BenchSession | None,
        backend: Backend | None,
        gpu: int | None,
        device: Device | None,
    ) -> _Place:
        t_open = time.perf_counter()
        sampler: SampleSource | None = None
        gpus: list[int] = []
        if session is not None:
            backend, sampler, gpus = session.backend, session.sampler, session_gpus(session)
        elif backend is None:
            backend = open_backend_quietly()
        if device is None:
            clock = sampler.clock if sampler is not None else None
            device, gpu = open_device(cfg, backend, gpu, gpus, clock)
        if gpu is None and backend is not None and device.kind.startswith("cuda"):
            gpu = safe_index(lambda: nvml_index_of_cuda(backend, device.device))
        if gpu is None:
            gpu = gpus[0] if gpus else 0
        if sampler is not None and gpu not in sampler.gpus:
            raise ConfigError(
                f"GPU {gpu} is not sampled by this session (it covers {sampler.gpus})",
                hint="open the session with gpus= including the GPU fn runs on",
            )
        facts, holds = _facts(session, backend, gpu)
        own = sampler is None and backend is not None
        opened = device.clock.now()
        if sampler is None and backend is not None:
            from gpuenv.telemetry import Sampler

            rng = facts[gpu].lock_range_mhz if gpu in facts else None
            sampler = Sampler(
                backend, [gpu], clock=device.clock, lock_ranges={gpu: rng} if rng else None
            )
            sampler.start()
        condition, why = _choose_condition(cfg, session, facts.get(gpu), holds)
        policy = cfg.policy or (session.policy if session is not None else None) or "annotate"
        conditioner = (
            session.conditioner
            if session is not None
            else Conditioner(cfg.conditioning, clock=device.clock, memory=process_memory())
        )
        place = cls(
            backend,
            gpu,
            sampler,
            own,
            device,
            facts,
            condition,
            why,
            policy,
            session,
            conditioner,
            opened,
        )
        place.marks += [t_open, time.perf_counter()]
        return place

    def close(self) -> None:
        if self.own_sampler and self.sampler is not None:
            self.sampler.stop()
        self.marks.append(time.perf_counter())


def _facts(
    session: BenchSession | None, backend: Backend | None, gpu: int
) -> tuple[dict[int, GpuFacts], bool | None]:
    """The session's facts, else read now with the lock gpuenv holds on the GPU if any; and
    whether that lock holds now (None: no lock). The lock is read once."""
    holds = None
    if session is not None and gpu in session.facts:
        facts = {gpu: session.facts[gpu]}
    elif backend is None:
        return {}, None
    else:
        lock_range, holds = _lock_now(backend, gpu)
        facts = read_facts(backend, [gpu], {gpu: lock_range} if lock_range else None)
    rng = facts[gpu].lock_range_mhz
    if session is not None and rng is not None:
        latest = session.sampler.latest(gpu)
        holds = latest is not None and lock_holds(latest.sm_mhz, rng)
    return facts, (holds is True) if rng is not None else None


def _lock_now(backend: Backend, gpu: int) -> tuple[tuple[int, int] | None, bool | None]:
    """The SM range gpuenv's live lock holds GPU `gpu` to, and whether it holds now."""
    try:
        from gpuenv.clocks.status import lock_status

        st = lock_status(backend, gpu)
    except (GpuenvError, OSError, ValueError) as err:
        log.debug("no lock status for GPU %s: %s", gpu, err)
        return None, None
    if not st.locked or st.stale or st.range is None:
        return None, None
    return (int(st.range[0]), int(st.range[1])), st.holds


def _choose_condition(
    cfg: BenchConfig, session: BenchSession | None, facts: GpuFacts | None, holds: bool | None
) -> tuple[Measured, str]:
    """The condition to measure in, and why: the safe default unless one was asked for."""
    if cfg.condition is not None and cfg.condition != "auto":
        return cfg.condition, "asked for"
    rng = facts.lock_range_mhz if facts is not None else None
    if rng is not None:
        text = f"{rng[0]} MHz" if rng[0] == rng[1] else f"{rng[0]}-{rng[1]} MHz"
        if holds:
            return "none", f"clocks locked by gpuenv ({text}) and holding: measured as they are"
        if session is None or session.mode == "burst":
            return "burst", (
                f"clocks locked by gpuenv ({text}) but not holding now: each "
                "burst starts once the clock is back inside the lock"
            )
    if session is not None and session.mode:
        return session.mode, "the session's mode"
    return "burst", "clocks not locked: each burst starts from the cool, uncapped state"


@dataclass
class _Learned:
    """What one bench learns in a step and reads back in a later one: the harness's
    working memory. `Measurement.extra` is what it publishes: written, never read back."""

    warmup_s: float = 0.0  # the warmup's length: a first burst from bench's start holds it
    rep_s: float = 0.0  # the warmup's median rep: how many reps fit a burst before one ran
    from_start: bool = False  # the first burst began with bench (see _Run._first_burst)
    first_wait_s: float = 0.0  # the wait before the first burst: Bursts counts it as a rest
    first_ready: bool = False  # the first burst began on a GPU found ready
    state_free: bool = False  # _probe_state found the GPU's state moves fn's time not
    # ... and how far its reps read from fn's time on a ready GPU, where the reps were then
    # measured in that state, without a wait (the judge weighs the findings by it)
    probe_moved: float | None = None


class _Run:
    """One bench: warmup, conditioning, reps, judging. The steps in the order they run."""

    def __init__(
        self,
        cfg: BenchConfig,
        place: _Place,
        fn: Callable[[], Any],
        name: str,
        say: Callable[[str], None],
        verbose: bool,
        line: Progress,
    ):
        self.cfg, self.place, self.fn, self.name, self.say = cfg, place, fn, name, say
        self.verbose, self.marks = verbose, place.marks
        self.learned = _Learned()
        self.line = line
        self.device = place.device
        self.clock = place.clock
        self.extra: dict[str, Any] = {  # published: the Measurement's, written only
            "mode": cfg.mode,
            **Conditioned(place.condition, place.condition_why, (place.gpu,)).to_extra(),
            "policy": place.policy,
        }

    def mark(self) -> float:
        s = self.place.sampler
        return s.mark() if s is not None else self.clock.now()

    def run(self) -> Measurement:
        cfg, place = self.cfg, self.place
        t_begin, started_at = self.mark(), self.clock.wall()
        # a function warmed up before on this GPU needs only the clock's ramp
        gpu, memory = place.identity, place.conditioner.memory
        known = memory.warmed(self.fn, gpu)
        warm = _warmup(
            self.device,
            self.fn,
            place.sampler,
            place.gpu,
            cfg.warmup,
            cfg.warmup_max_s,
            cfg.warmup_max_reps,
            WARMUP_KNOWN_WINDOW if known else WARMUP_WINDOW,
        )
        self.marks.append(time.perf_counter())
        if warm.steady:
            memory.remember_warmed(self.fn, gpu, warm.median_s)
        self.learned.warmup_s = warm.seconds
        self.learned.rep_s = warm.median_s or 0.0
        self.extra.update(Warmup(warm.reps, warm.seconds, warm.steady, known).to_extra())
        if not warm.steady:
            self.say(
                f"{self.name}: warmup did not settle in {warm.seconds:.1f} s ({warm.reps} reps)"
            )
        self._choose_method()
        clock_before = self.device.probe_clock_mhz() if cfg.probe_clock else None
        self.marks.append(time.perf_counter())
        self._condition()
        self.marks.append(time.perf_counter())
        t_measure = self.mark()
        if place.condition == "sustained":
            self.device = BackToBack(self.device)
        # the power model (burst_power_tau_s: the drop-in) rests by the instant power of each
        # burst: the sampler ticks at its hurried period while such a measurement runs
        model = place.condition == "burst" and cfg.conditioning.burst_power_tau_s is not None
        with (
            place.sampler.hurry()
            if model and place.sampler is not None
            else contextlib.nullcontext()
        ):
            reps, stop = self._measure()
        self.marks.append(time.perf_counter())
        self.mark()  # an edge read after the last rep: its window need not wait for one
        # outside a session, the power sample after the last rep is waited for (after the
        # probe below) where it is not out: gpuenv.completion.after_reps
        waiter = place.sampler if place.session is None and cfg.wait_power else None
        due = waiter is not None and power_due([(r.t0, r.t1) for r in reps], waiter, place.gpu)
        m = self._judge(reps, started_at, stop)
        if place.session is not None and reps:
            first = next((w for w in m.windows if w.gpu == place.gpu), None)
            place.conditioner.learn_temperature(
                self.fn, first.temp_c_start if first else None, m.stats.median_s
            )
        t_end = self.mark()
        clock_after = self.device.probe_clock_mhz() if cfg.probe_clock else None
        rep_clocks = [r.clock_mhz for r in reps if r.clock_mhz]
        # (whether fn is light is judged by the readings' highest power, as it was learned)
        self._remember_state(m, stats.median(rep_clocks) if rep_clocks else clock_after)
        if waiter is not None and (due or m.retried_reps):
            m = after_reps(m, waiter, place.gpu)
        self.extra.update(
            stop_reason=stop,
            measure_s=t_end - t_measure,
            clock_mhz_before=clock_before,
            clock_mhz_after=clock_after,
            **self.device.settings(),
        )
        published, ci = rep_stats(m, reps, cfg, self._rule(), place.facts.get(place.gpu))
        self.extra.update(published)
        # a session's keep() gives the measurement its trace (the samples since the last
        # one kept), which would replace this one
        if cfg.keep_trace and place.sampler is not None and place.session is None:
            self.extra["trace"] = _trace(place.sampler, place.gpu, t_begin, t_end)
        kept = dataclasses.replace(m.stats, ci_s=ci) if ci is not None else m.stats
        self.marks.append(time.perf_counter())
        return dataclasses.replace(m, stats=kept, extra={**m.extra, **self.extra})

    def _choose_method(self) -> None:
        """mode "auto": fn's own time per call, by one method at every size (on CUDA its
        device time from CUPTI), so a number never changes meaning where a kernel's
        estimate crosses a threshold; the L2 state is `flush_l2`'s (flushed before each
        call by default, warm with flush_l2=False). Another mode is the one asked for."""
        if self.cfg.mode == "auto":
            self.device, how = self.device.for_auto(self.fn)
        else:
            self.device.prepare(self.fn)
            how = f"mode={self.cfg.mode!r}: {KIND_WORDS.get(self.device.kind, self.device.kind)}"
        self.extra["method"] = how
        flushed = self.device.flush_l2  # None: a device with no cache
        if flushed is not None:
            self.extra["l2"] = "flushed before each call" if flushed else "warm"

    def _condition(self) -> None:
        place = self.place
        if place.condition == "sustained":

            def chunk(seconds: float) -> float:
                return self.device.run_for(self.fn, seconds)

            show = (
                (lambda line, _settled: self.say(f"{self.name}: {line}")) if self.verbose else None
            )
            cond = place.conditioner.precondition(chunk, place.sampler, [place.gpu], progress=show)
            self.extra.update(cond.to_extra())
        elif place.condition == "burst":
            self.extra.update(self._first_burst().to_extra())

    def _first_burst(self) -> FirstBurst:
        """Wait until the GPU is ready for the first burst (or find no need to)."""
        place, cc = self.place, self.cfg.conditioning
        if place.session is not None:
            t_wait = self.clock.now()
            place.conditioner.work_ended(self.clock.now())  # the warmup was work
            probe = self._probe_state(since=self.clock.now())
            if probe is None or not probe.free:  # for fn's GPU alone, not the session's others
                place.session.wait_until_recovered(self.fn, gpus=[place.gpu])
            waited, ready = self.clock.now() - t_wait, True
            temperature = place.conditioner.temperature_facts(place.sampler, self.fn, place.gpu)
            self.learned.first_wait_s, self.learned.first_ready = waited, ready
            return FirstBurst(waited, ready, state_probe=probe, temperature=temperature)
        # from the start: the warmup is part of the first burst, so the samples since bench
        # began tell whether the GPU is cool (no driver refresh to wait): asked for, or with
        # waits only while the GPU is seen held down (burst_wait "seen", the default) when
        # the warmup was shorter than a burst (it could not cap the GPU itself: what caps
        # it came before bench, and shows in those samples)
        lead = self.learned.warmup_s + self.cfg.burst_lead_s
        from_start = self.cfg.burst_from_start or (cc.burst_wait == "seen" and lead <= cc.burst_s)
        self.learned.from_start = from_start
        opened = place.opened - self.cfg.burst_lead_s  # the lead began the burst
        began = opened if (r := self.cfg.rested_since) is None else min(opened, r)
        since = began - DRIVER_REFRESH_S if from_start else None
        cold = from_start and cc.cold_start_fresh and self._began_idle()
        if cold:
            # heavy work begun on an idle GPU can set off the cap in its first ~50 ms (an
            # MLP block on the H100: reps 1-6 after a 50 ms warmup capped, the clock a step
            # down for the ~0.5 s the cap holds), and the warmup's samples cannot show it
            # yet: wait for samples taken a driver refresh after it
            since = None
        probe = self._probe_state(since=self.clock.now() if since is None else since)
        if probe is not None and probe.free:
            waited, ready = 0.0, True
        else:
            # from the start, the sample read just before the lead began may be the older of
            # the two judged (READY_LOOKBACK_S)
            lookback = READY_LOOKBACK_S if since is not None else 0.0
            waited, ready = self._wait(since=since, lookback_s=lookback)
        self.learned.first_wait_s, self.learned.first_ready = waited, ready
        return FirstBurst(waited, ready, from_start, cold, state_probe=probe)

    def _probe_state(self, since: float) -> StateProbe | None:
        """Need this call not wait for a GPU held down (gpuenv.timing.stateprobe)? `free`
        in what was probed (None: nothing was)."""
        p = self.place
        probe = probe_state(
            self.fn,
            self.device,
            p.sampler,
            p.gpu,
            p.identity,
            p.facts.get(p.gpu),
            self.cfg.conditioning,
            p.conditioner.memory,
            since=since,
            probe_clock=self.cfg.probe_clock,
        )
        self.learned.state_free = probe is not None and probe.free
        self.learned.probe_moved = probe.moved if probe is not None and probe.free else None
        return probe

    def _remember_state(self, m: Measurement, clock_mhz: float | None) -> None:
        p, learned = self.place, self.learned
        if p.condition == "burst":
            remember_state(
                self.fn,
                self.device,
                m,
                p.gpu,
                p.identity,
                p.facts.get(p.gpu),
                clock_mhz,
                self.cfg.conditioning,
                p.conditioner.memory,
                ready=learned.first_ready,
                probed_free=learned.state_free,
            )

    def _began_idle(self) -> bool:
        """Did the first sample of this call find the GPU idle (no context working)?"""
        place = self.place
        if place.sampler is None:
            return False
        first = place.sampler.samples(place.opened - DRIVER_REFRESH_S, None, place.gpu)[:1]
        return bool(first and first[0].reasons & Reason.GPU_IDLE)

    def _wait(self, since: float | None = None, lookback_s: float = 0.0) -> tuple[float, bool]:
        """Wait for fn's GPU by this bench's burst settings (not the temperature: a bench
        outside a session knows no resting temperature; a session's first wait is its own);
        `lookback_s`: `recovered`'s."""
        place = self.place
        since = self.clock.now() if since is None else since
        w = place.conditioner.wait(
            place.sampler,
            [place.gpu],
            place.facts,
            since=since,
            config=self.cfg.conditioning,
            temperature=False,
            lookback_s=lookback_s,
        )
        return w.waited_s, w.ready

    def _rule(self) -> stats.StopRule:
        cfg = self.cfg
        if cfg.budget_s is not None and cfg.budget_s <= 0:
            return stats.StopRule()
        budget = (
            cfg.budget_s
            if cfg.budget_s is not None
            else (math.inf if cfg.reps else DEFAULT_BUDGET_S)
        )
        return stats.StopRule(
            rel_ci=0.0 if cfg.reps is not None else cfg.rel_ci,
            budget_s=budget,
            min_reps=cfg.reps if cfg.reps is not None else min(cfg.min_reps, cfg.max_reps),
            max_reps=cfg.reps if cfg.reps is not None else cfg.max_reps,
            confidence=cfg.confidence,
        )

    def _measure(self) -> tuple[list[Rep], str]:
        """Reps until the stopping rule says stop; in burst mode, in bursts with rests
        between (conditioning.Bursts: the one schedule), the budget counted in them when
        `budget_in_bursts`."""
        batch = self.device.rep_batch  # the profiler's reps come in batches, one session each
        # (10, then 20, then 40: the stopping rule sees the first 10 as before)
        max_reps = PROFILER_MAX_REPS if batch > 1 else None
        rule, clock, place = self._rule(), self.clock, self.place
        start = clock.now()
        bursts = None
        if place.condition == "burst":
            # from the start: the warmup was the first burst's beginning
            learned = self.learned
            lead = learned.warmup_s + self.cfg.burst_lead_s if learned.from_start else 0.0
            bursts = conditioning.Bursts(
                place.sampler,
                place.gpu,
                clock,
                facts=place.facts.get(place.gpu),
                config=self.cfg.conditioning,
                start=start,
                burst_start=start - lead,
                rested_s=learned.first_wait_s,
                limit_s=burst_limit(self.fn, self.device, place.identity, place.conditioner.memory),
                memory=place.conditioner.memory,
                on=place.identity,
            )
        out: list[Rep] = []
        times: list[float] = []
        if bursts is not None:
            bursts.opening(out)  # the work before the first rep already met a known onset
        while True:
            ask = batch if bursts is None else bursts.fit(batch, self.learned.rep_s)
            batched = self.device.rep_batch > 1  # one method: a batch of 1 is still profiled
            got = self.device.reps(self.fn, ask) if batched else [self.device.rep(self.fn)]
            if bursts is not None:  # a rep the clock fell under is measured again
                got = bursts.take(got)
            out.extend(got)
            times.extend(r.time_s for r in got)
            counted = (
                bursts.in_bursts_s()
                if bursts is not None and self.cfg.budget_in_bursts
                else clock.now() - start
            )
            reason = rule.check(times, counted) if times else None
            self.line.update(
                f"gpuenv.bench {self.name}: {len(out)} reps, {counted:.1f} s"
                + (f" of {rule.budget_s:g} s" if math.isfinite(rule.budget_s) else "")
            )
            if reason is None and max_reps is not None and len(out) >= max_reps:
                reason = "max_reps"
            if reason is not None and bursts is not None and bursts.finish(out):
                reason, times = None, [r.time_s for r in out]  # reps the cap touched: again
            if reason is not None:
                done = bursts.summary() if bursts is not None else BurstSchedule(rests=0)
                remember_burst_limit(
                    self.fn, self.device, place.identity, done.limit_s, place.conditioner.memory
                )
                self.extra.update(done.to_extra())
                return out, reason
            if bursts is not None and bursts.due() and bursts.between(out):
                times = [r.time_s for r in out]
            if batch > 1:  # a profiler session costs ~0.2 s: the later ones hold more reps
                batch = min(2 * batch, 4 * self.device.rep_batch, max_reps or batch)

    def _judge(self, reps: list[Rep], started_at: float, stop: str) -> Measurement:
        place, cfg = self.place, self.cfg
        session_config = place.session.config if place.session is not None else None
        config = cfg.verdict_config or session_config or DEFAULT_CONFIG
        if place.condition == "burst" or (
            place.condition == "none" and place.facts.get(place.gpu, GpuFacts()).lock_range_mhz
        ):
            # the condition was chosen to keep these reasons out: seeing one is a warning
            config = dataclasses.replace(config, stable_clocks=True)

        def rerun(idx: list[int]) -> list[tuple[float, tuple[float, float]]]:
            self.say(f"{self.name}: retrying {len(idx)} reps")
            redone = [self.device.reps(self.fn, 1)[0] for _ in idx]
            for i, r in zip(idx, redone, strict=True):
                reps[i] = r
            return [(r.time_s, (r.t0, r.t1)) for r in redone]

        recover = self._wait if place.condition == "burst" else None
        times = [r.time_s for r in reps]
        # one tiny call per event pair (mode "events", the drop-in, or the default where
        # CUPTI is held): say what the number holds, and what would time the kernel alone
        tiny = (
            [
                tiny_call(
                    stats.median(times),
                    TINY_REP_S,
                    len(times),
                    place.gpu,
                    asked_events=self.cfg.mode != "auto",
                )
            ]
            if self.device.kind == "cuda_events"
            and self.device.batch == 1
            and stats.median(times) < TINY_REP_S
            else []
        )
        src = place.sampler  # gpuenv.rank's calls judge with the counter reads already in
        with src.no_edge_wait() if src and not cfg.wait_counters else contextlib.nullcontext():
            evidence = (
                Evidence.sampled(src, [(r.t0, r.t1) for r in reps], [place.gpu])
                if src is not None
                else Evidence.given([], [place.gpu])
            )
            return judge(
                self.name,
                times,
                evidence,
                facts=place.facts,
                config=config,
                policy=place.policy,
                retry=Retry(rerun, self.clock, recover),
                timer=self.device.kind,
                started_at=started_at,
                extra_findings=tiny,
                probe_moved=self.learned.probe_moved,
                target=CiTarget.of(self._rule(), stop),
            )


# -- warmup: reps until rep times and effective clocks stop trending, or a fixed count --


@dataclass(frozen=True)
class _Warmup:
    reps: int
    seconds: float
    steady: bool
    median_s: float | None = None  # of the last few warmup reps: what one call takes now


def _warmup(
    device: Device,
    fn: Callable[[], Any],
    sampler: SampleSource | None,
    gpu: int,
    warmup: str | int,
    max_s: float,
    max_reps: int,
    window_max: int = WARMUP_WINDOW,
) -> _Warmup:
    """Reps until times and clocks stop trending over `window_max` reps (warmup="auto"), or
    a fixed count."""
    clock = device.clock
    start = clock.now()
    if warmup != "auto":
        fixed = [device.rep(fn).time_s for _ in range(int(warmup))]
        return _Warmup(
            int(warmup),
            clock.now() - start,
            True,
            stats.median(fixed[-WARMUP_WINDOW:]) if fixed else None,
        )
    times: list[float] = []
    clocks: list[float | None] = []
    while True:
        rep = device.rep(fn)
        times.append(rep.time_s)
        mhz = rep.clock_mhz
        if mhz is None and sampler is not None:
            latest = sampler.latest(gpu)
            mhz = float(latest.sm_mhz) if latest is not None else None
        clocks.append(mhz)
        n = len(times)
        # long reps: a shorter window (4 reps of a 100 ms kernel already span 0.4 s)
        window = max(4, min(window_max, int(0.2 / max(stats.median(times[-4:]), 1e-9))))
        if n >= max(WARMUP_MIN_REPS, window):
            last = times[-window:]
            cl = [c for c in clocks[-window:] if c is not None]
            if stats.is_steady(last, rel_tol=WARMUP_REL_TOL) and (
                len(cl) < window or stats.is_steady(cl, rel_tol=WARMUP_REL_TOL)
            ):
                return _Warmup(n, clock.now() - start, True, stats.median(last))
        if clock.now() - start >= max_s or n >= max_reps:
            return _Warmup(n, clock.now() - start, False, stats.median(times[-window:]))


def _trace(
    sampler: SampleSource, gpu: int, t0: float, t1: float, max_points: int = 1000
) -> dict[str, Any]:
    """The telemetry over the whole bench (warmup and conditioning included), downsampled,
    for `gpuenv plot`: times are seconds from t0."""
    samples = sampler.samples(t0, t1, gpu)
    step = max(1, math.ceil(len(samples) / max_points))
    return trace_record(samples[::step], t0)


def _progress_fn(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda text: print(text, file=sys.stderr, flush=True)
    return lambda text: log.info(text)
