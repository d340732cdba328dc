"""Burst ("cool and uncapped"): wait until the GPU is back in a rested state, and run a
measurement's reps in short bursts with rests between (`Bursts`, the one schedule)."""

from __future__ import annotations

import bisect
import functools
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ, lock_holds
from gpuenv.conditioning.config import DEFAULT, ConditionConfig
from gpuenv.conditioning.memory import Memory
from gpuenv.errors import GpuenvError
from gpuenv.phases import BurstSchedule
from gpuenv.progress import Progress
from gpuenv.reasons import HELD_DOWN, Reason, short_names
from gpuenv.telemetry import DRIVER_REFRESH_S, Sample, SampleSource, Window
from gpuenv.telemetry.reader import host_time
from gpuenv.timebase import Clock
from gpuenv.verdict import GpuFacts


class _Rep(Protocol):
    """What the schedule reads of a rep (gpuenv.timing's Rep): its host edges and clock."""

    @property
    def t0(self) -> float: ...
    @property
    def t1(self) -> float: ...
    @property
    def clock_mhz(self) -> float | None: ...


R = TypeVar("R", bound=_Rep)

# -- burst: cool and uncapped ------------------------------------------------------------


def recovered(
    sampler: SampleSource,
    gpu: int,
    *,
    since: float,
    facts: GpuFacts | None = None,
    idle_temp_c: float | None = None,
    config: ConditionConfig = DEFAULT,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    lookback_s: float = 0.0,
) -> bool:
    """Is GPU `gpu` cool and uncapped, judged by the two newest samples taken after `since`
    (the end of the last work) plus one driver refresh? `lookback_s`: the older of the two
    may be up to that much earlier (a bench's first burst: the sample read just before its
    work began, under the same state), the newest never. No telemetry: nothing to wait
    for."""
    after = since + DRIVER_REFRESH_S
    fresh = sampler.samples(after, None, gpu)
    if not fresh:
        # nothing new yet: wait for it, unless there is no telemetry at all (a gap must
        # not block the measurement)
        return sampler.latest(gpu) is None
    if len(fresh) < 2 and lookback_s > 0:
        fresh = sampler.samples(after - lookback_s, None, gpu)
    newest = fresh[-2:]
    if len(newest) < 2:
        return False
    by_clock = _by_clock(facts, config)
    # "reasons": no held-down reason, and the newest clock back; "clock": both newest clocks
    # back, the cap's bit alone not waited for
    if any(
        held_down(s, facts, config, lock_tolerance_mhz, clock=by_clock or s is newest[-1])
        for s in newest
    ):
        return False
    s = newest[-1]
    idle = config.burst_idle_temp_c if config.burst_idle_temp_c is not None else idle_temp_c
    margin = config.burst_temp_margin_c
    return idle is None or margin is None or s.temp_c <= idle + margin


def _by_clock(facts: GpuFacts | None, config: ConditionConfig) -> bool:
    """burst_ready "clock", on a GPU whose maximum clock (or lock) is known (else the bit is
    all there is to go by)."""
    return (
        config.burst_ready == "clock"
        and facts is not None
        and bool(facts.lock_range_mhz or facts.max_sm_mhz)
    )


def held_down(
    s: Sample,
    facts: GpuFacts | None,
    config: ConditionConfig = DEFAULT,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    *,
    clock: bool = True,
) -> bool:
    """Does sample `s` show the GPU held down: a held-down reason (under burst_ready "clock"
    the SW power cap's bit alone does not count), or (`clock`) the SM clock below its
    maximum or outside the lock while the GPU is not idle?"""
    held = HELD_DOWN & ~Reason.SW_POWER_CAP if _by_clock(facts, config) else HELD_DOWN
    if s.reasons & held:
        return True
    if not clock or s.reasons & Reason.GPU_IDLE or facts is None:
        return False
    rng = facts.lock_range_mhz
    if rng is not None:
        return not lock_holds(s.sm_mhz, rng, lock_tolerance_mhz)
    top = facts.max_sm_mhz
    return top is not None and top > 0 and s.sm_mhz < (1 - config.burst_clock_rel) * top


def window_held(w: Window) -> int:
    """The held-down reasons a rep's telemetry window shows (0: none): the bits that
    would make the judge name the rep in a power_cap or thermal finding."""
    return (w.reasons | w.reasons_start | w.reasons_end) & HELD_DOWN


def wait_until_ready(
    sampler: SampleSource | None,
    gpus: Sequence[int],
    clock: Clock,
    *,
    since: float,
    facts: Mapping[int, GpuFacts] | None = None,
    idle_temp_c: Mapping[int, float] | None = None,
    config: ConditionConfig = DEFAULT,
    min_rest_s: float = 0.0,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    lookback_s: float = 0.0,
) -> tuple[float, bool, list[int]]:
    """Rest at least `min_rest_s`, then wait until every GPU is cool and uncapped, at most
    `config.burst_timeout_s` (`recovered`, with its `lookback_s`). Returns (seconds waited,
    ready, the GPUs still not ready). Without a sampler it only rests."""
    start = clock.now()
    if sampler is None:
        clock.sleep(min_rest_s)
        return clock.now() - start, True, []
    # samples every 25 ms while waiting (the sampler's tick is the driver's 100 ms
    # otherwise): the two fresh samples `recovered` asks for come that soon after the GPU
    # is back; from the rest on, so that they are there when the polls begin
    with sampler.hurry(), Progress() as shown:  # a wait of seconds says what it waits for
        clock.sleep(min_rest_s)
        while True:
            pending = [
                g
                for g in gpus
                if not recovered(
                    sampler,
                    g,
                    since=since,
                    facts=(facts or {}).get(g),
                    idle_temp_c=(idle_temp_c or {}).get(g),
                    config=config,
                    lock_tolerance_mhz=lock_tolerance_mhz,
                    lookback_s=lookback_s,
                )
            ]
            waited = clock.now() - start
            if not pending:
                return waited, True, []
            if waited >= config.burst_timeout_s:
                return waited, False, pending
            shown.update(_waiting(sampler, pending[0], facts, config.burst_timeout_s))
            clock.sleep(config.poll_s)


def _waiting(
    sampler: SampleSource, gpu: int, facts: Mapping[int, GpuFacts] | None, limit_s: float
) -> str:
    """ "gpuenv: waiting for GPU 0 to recover (at most 30 s): clock 1420 -> 1980 MHz, 61 C"."""
    line = f"gpuenv: waiting for GPU {gpu} to recover (at most {limit_s:.0f} s)"
    s, f = sampler.latest(gpu), (facts or {}).get(gpu)
    if s is None:
        return line
    top = f and (f.lock_range_mhz[0] if f.lock_range_mhz else f.max_sm_mhz)
    clk = f"{s.sm_mhz:.0f} -> {top:.0f}" if top else f"{s.sm_mhz:.0f}"
    return f"{line}: clock {clk} MHz, {s.temp_c:.0f} C" + "".join(
        f", {n}" for n in short_names(s.reasons & HELD_DOWN)
    )


def burst_rest_s(burst_s: float, config: ConditionConfig = DEFAULT) -> float:
    """The least rest after a burst that took `burst_s`, for the configured duty cycle."""
    return burst_s * (1 / config.burst_duty - 1)


MAX_CLOCK_REDOS = DEFAULT.burst_clock_redos  # the default's redos a measurement


# A refresh this far into a burst shows the burst's work (the driver's instant power is
# its value at the last refresh, every ~100 ms). The schedule's other thresholds are the
# config's (ConditionConfig: rest_power_frac, unseen_power_frac, heavy_seen_frac,
# unseen_first_s, onset_floor_reps, heavy_run_s).
SEEN_AFTER_S = 0.005


class Bursts:
    """The burst rule for a measurement's reps (condition "burst"): the one schedule of
    gpuenv.bench and the do_bench drop-in, which differ only in their ConditionConfig.

    Reps run in bursts of at most `burst_s`. A burst also ends at once when a rep's
    probed clock falls more than `burst_clock_fall_rel` below the highest this measurement
    saw (the cap coming on: NVML reports it up to a driver refresh later); that rep
    is measured again after a rest that waits for the GPU to recover (at most
    `burst_clock_redos` times a measurement). After each rest, reps whose telemetry
    windows show a held-down reason are dropped too (`burst_window_redos`). Either way
    the burst met the cap, and with `burst_learn` the unbroken work before a rest is held
    to half of what met it (`limit_s`, given where an earlier call learned it). Between
    bursts: with `burst_power_tau_s`, the rest the power model asks for (ConditionConfig),
    else `burst_rest_s`; then the wait `burst_wait` says. `in_bursts_s()` is the time
    measured inside bursts since `start`, less the reps dropped: a budget counted in
    bursts, not wall time.

        bursts = Bursts(sampler, gpu, clock, facts=facts, config=cc, start=t_measure)
        while ...:
            reps.extend(bursts.take([device.rep(fn)]))  # a rep the clock fell under: dropped
            if done and not bursts.finish(reps): break  # a last look at the reps' windows
            if bursts.due(): bursts.between(reps)  # rest; drop the reps the cap touched
    """

    def __init__(
        self,
        sampler: SampleSource | None,
        gpu: int,
        clock: Clock,
        *,
        facts: GpuFacts | None,
        config: ConditionConfig,
        start: float,
        burst_start: float | None = None,
        rested_s: float = 0.0,
        lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
        limit_s: float | None = None,
        memory: Memory | None = None,
        on: Hashable = None,
    ):
        self.sampler, self.gpu, self.clock = sampler, gpu, clock
        # where the power filter was left carries to the next measurement through it
        self.memory = memory if memory is not None else Memory()
        self.facts, self.config, self.tol = facts, config, lock_tolerance_mhz
        self.burst_start = start if burst_start is None else burst_start
        self.origin = self.burst_start - DRIVER_REFRESH_S  # a sample at the start counts
        self.segment = start  # the part of this burst that counts in the budget began
        self.measured_s = 0.0  # closed bursts' share of the budget
        self.peak_mhz = 0.0
        self.bursts: list[float] = []
        # when the work ran (clock time): closed bursts, and where the open one began. A
        # first wait (`rested_s`) after the set-up and warmup splits them from the reps
        # where it was as long as they were (as `rest` ends an unbroken stretch): a 5 ms
        # wait after 30 ms of the MLP block's warmup on an H200 left the cap coming on in
        # the first reps, which read 7-12% slow in 5 of 10 cold drop-in calls
        lead = start - self.burst_start
        first = lead > 0 and rested_s >= lead
        self.spans: list[tuple[float, float]] = (
            [(start - rested_s - lead, start - rested_s)] if first else []
        )
        self.open_from = start if first else self.burst_start
        self.rests = self.waits = self.redos = 0
        self.rest_s = 0.0
        self.fell = False
        self.filt_w: float | None = None  # the modelled filtered power, at `self.burst_start`
        self.power_seen = False  # a reading showed the work's power (`_watts`)
        self.began_rested = False  # the modelled power began near the power at rest
        self.rested_s = rested_s  # the wait before measuring (for a GPU found held down)
        # the learned onset: the longest unbroken work before a rest (None: none known)
        self.limit_s = limit_s if config.burst_learn else None
        # ... and the GPU's (`on`: memory.gpu_key), as any heavy kernel met the cap there
        self.on = on
        self.gpu_onset = self.memory.cap_onset(on) if config.burst_learn else None
        self.learned = False  # this measurement met the cap and lowered `limit_s`
        self.met = False  # this measurement met the cap (a clock fell, or a window showed it)
        self.met_run: float | None = None  # the stretch of work it last met the cap in
        self.heavy = False  # a reading showed the work heavy (heavy_seen_frac of the limit)
        self.runs = [self.open_from]  # where each stretch of unbroken work began
        self.rep_s = 0.0  # the last rep's host time
        self.judged = 0  # reps (of the caller's list) whose windows were looked at
        self.window_redos = 0
        self.redone: Counter[str] = Counter()  # reps dropped, by why
        self.redone_s = 0.0  # ... and their time, not the budget's
        self.gave_up = False  # a wait for the GPU ran out: no more redos
        self.rest_each: list[float] = []  # each rest's length, in order

    def take(self, got: Sequence[R]) -> list[R]:
        """The reps of `got` to keep: a rep whose probed clock fell is dropped (`clock_fell`)."""
        kept = []
        for r in got:
            self.rep_s = r.t1 - r.t0
            if self.clock_fell(r.clock_mhz):
                self.redone["clock fell"] += 1
                self.redone_s += self.rep_s
                self._met(r.t0)
            else:
                kept.append(r)
        return kept

    def opening(self, reps: list[R]) -> bool:
        """Before the first rep: where the unbroken work already run (a first burst begun
        with bench: its set-up, estimate and warmup) is past the onset this function is
        known to meet the cap at (`limit_s`, learned), rest first and wait for readings
        that show whether the cap came on; else its first reps run into the cap (the MLP
        block on an H200: a cold call's 45-55 ms of such work before its first rep, against
        a learned onset of ~10 ms, met the cap at rep 7 or read its first reps 6% slow).
        True where it rested."""
        limit = self._run_limit()
        if limit is None or self.clock.now() - self.runs[-1] <= limit:
            return False
        # the cap may have come on inside that work, and no reading shows it yet: wait for
        # readings taken a driver refresh after it
        self.rest(fresh=True)
        return True

    def clock_fell(self, mhz: float | None) -> bool:
        """A rep's probed clock: True when it fell under the burst (end it; redo the rep)."""
        if mhz is None:
            return False
        if mhz > self.peak_mhz:
            self.peak_mhz = mhz
            return False
        fell = mhz < (1 - self.config.burst_clock_fall_rel) * self.peak_mhz
        if fell and self.redos < self.config.burst_clock_redos:
            self.redos += 1
            self.fell = True
            return True
        return False

    def fit(self, n: int, rep_s: float = 0.0) -> int:
        """How many of `n` reps to run unbroken now: as many as fit in what is left of
        this burst (`burst_s`) and of the unbroken work a known onset allows, at the last
        rep's time (`rep_s` before one ran: the warmup's), at least 1. A device that
        times reps in batches (the CUDA profiler: 10, 20, 40 reps a session) would
        otherwise run past the burst: on an H200, batches of the 2.9 ms MLP block ran
        65-155 ms unbroken against a 25 ms burst, into the power cap, and a cold call
        read 3% slow."""
        per = self.rep_s or rep_s
        if n <= 1 or per <= 0:
            return max(1, n)
        now = self.clock.now()
        room = self.config.burst_s - (now - self.burst_start)
        limit = self._run_limit()
        if limit is not None:
            room = min(room, limit - (now - self.runs[-1]))
        return max(1, min(n, int(room / per)))

    def due(self) -> bool:
        now = self.clock.now()
        if self.fell or now - self.burst_start >= self.config.burst_s:
            return True
        limit = self._run_limit()  # the next rep would take the unbroken work past it
        return limit is not None and now - self.runs[-1] + self.rep_s > limit

    def _run_limit(self) -> float | None:
        """The longest unbroken work before a rest: learned for fn, or a heavy kernel's
        (`heavy_run_s`, at most what the cap's onset on this GPU allowed)."""
        known = [x for x in (self.limit_s, self._heavy_limit()) if x is not None]
        return min(known) if known else None

    def _heavy_limit(self) -> float | None:
        """A heavy kernel's longest unbroken work: the starting bound (`heavy_run_s`), or
        the GPU's onset where a heavy kernel there met the cap sooner; until a reading has
        shown the work's power it may be heavy: the GPU's onset, where one is known. None:
        burst_learn off, or a kernel a reading showed light."""
        if not self.config.burst_learn:
            return None
        if self.heavy:
            known = [x for x in (self.config.heavy_run_s, self.gpu_onset) if x is not None]
            return min(known)
        return self.gpu_onset if not self.power_seen else None

    def _unseen_first_s(self) -> float:
        """From a rested GPU, the work that may run before a reading has shown its power:
        `unseen_first_s`, at most what the cap's onset on this GPU allowed."""
        first = self.config.unseen_first_s
        return min(first, self.gpu_onset) if self.gpu_onset is not None else first

    def in_bursts_s(self) -> float:
        return self.measured_s + (self.clock.now() - self.segment) - self.redone_s

    def between(self, reps: list[R]) -> bool:
        """Rest (`rest`), then drop from `reps` those the telemetry shows held down
        (`look`). True where reps were dropped."""
        dropped = self.look(reps)
        self.fell = self.fell or dropped  # the cap is on: the rest waits for the GPU
        self.rest()
        return self.look(reps) or dropped

    def finish(self, reps: list[R]) -> bool:
        """The measurement would end: a last look at the reps' windows, by the readings
        there are; where this measurement met the cap, or the GPU reads held down now,
        after a wait for readings that cover the last rep. True: reps were dropped, and
        the GPU rested: measure on. Without window redos (burst_window_redos 0: gpuenv.bench
        and stable()) there is nothing to look for: no wait (on an H100 a 1 GiB clone let
        through right after load waited 0.43 s here, for readings it had no use for)."""
        if self.config.burst_window_redos <= 0:
            return False
        if self.look(reps):
            self.rest()
            return True
        if not (self.met or self._held_down()) or self.judged >= len(reps):
            return False  # no wait for a call that met no cap
        self.rest(fresh=True)
        return self.look(reps)

    def look(self, reps: list[R]) -> bool:
        """Drop from `reps` (in place) the reps not looked at yet whose telemetry window
        shows a held-down reason (`window_held`), where the readings cover them (a reading
        one driver refresh after a rep's end has shown what the rep ran under). True
        where reps were dropped (at most `burst_window_redos` times a measurement)."""
        cc, sampler = self.config, self.sampler
        newest = sampler.latest(self.gpu) if sampler is not None else None
        if sampler is None or newest is None or cc.burst_window_redos <= 0:
            return False
        start = self.judged
        ends = [r.t1 for r in reps[start:]]
        n = bisect.bisect_right(ends, newest.t - DRIVER_REFRESH_S)
        if n == 0:
            return False
        self.judged = start + n
        ready = reps[start : start + n]
        sampler.mark()  # an edge read now: the windows need not wait for one
        if not window_held(sampler.window(ready[0].t0, ready[-1].t1, self.gpu)):
            return False
        windows = sampler.windows([(r.t0, r.t1) for r in ready], self.gpu)
        held = [(i, m) for i, w in enumerate(windows) if (m := window_held(w))]
        if not held or self.gave_up or self.window_redos >= cc.burst_window_redos:
            return False
        self.window_redos += 1
        self._met(min(ready[i].t1 for i, _ in held))
        for i, mask in reversed(held):
            r = reps.pop(start + i)
            self.redone_s += r.t1 - r.t0
            for name in short_names(mask):
                self.redone[name] += 1
        self.judged -= len(held)
        return True

    def _met(self, at: float) -> None:
        """The cap met the work at `at`: with burst_learn, hold the unbroken work to half
        of what ran before it (and of the limit so far), never under a few reps."""
        self.met = True
        run = self.runs[max(0, bisect.bisect_right(self.runs, at) - 1)]
        if not self.config.burst_learn or run == self.met_run:
            return  # once a stretch of work: its later reps met the same cap
        self.met_run = run
        onset = max(at - run, 0.0)
        half = min(onset, self.limit_s if self.limit_s is not None else onset) / 2
        self.limit_s = max(half, self.config.onset_floor_reps * self.rep_s)
        self.learned = True
        # the GPU's, for every kernel; not where the work began on a GPU whose power was
        # still up from work before it: then the onset met was partly that work's (a
        # kernel measured right after another tool's 100 ms of matmuls taught the
        # simulated H100 an 11 ms onset, and every kernel after it rested 1:1)
        if self._from_rest():
            self.memory.remember_cap_onset(self.on, self.limit_s)

    def rest(self, *, fresh: bool = False) -> None:
        """End the burst: rest and wait as the config says (`fresh`: wait for readings
        taken a driver refresh after it), then begin the next."""
        cc, now = self.config, self.clock.now()
        burst = now - self.burst_start
        self.bursts.append(burst)
        self.spans.append((self.open_from, now))
        self.open_from = now  # the rest is no work
        self.measured_s += now - self.segment
        rest = self._power_rest(burst) if not self.fell else None
        wait = fresh or self.fell or cc.burst_wait == "fresh" or self._held_down()
        if rest is None:
            rest = burst_rest_s(burst, cc)
        elif rest > 0 and not self.power_seen:
            rest = self._rest_to_refresh(now, rest)
        run = now - self.runs[-1]
        if self._run_limit() is not None:  # a kernel that meets the cap: the duty's rest
            rest = max(rest, burst_rest_s(run, cc))
        if wait:
            self.waits += 1
            _, ready, _ = wait_until_ready(
                self.sampler,
                [self.gpu],
                self.clock,
                since=now,
                facts={self.gpu: self.facts} if self.facts else None,
                config=cc,
                min_rest_s=rest,
                lock_tolerance_mhz=self.tol,
            )
            self.gave_up = self.gave_up or not ready  # held down for good: redo no more
        elif rest > 0:
            self.clock.sleep(rest)
        took = self.clock.now() - now
        self.rest_each.append(took)
        if took > 0:
            self.rests += 1
            self.rest_s += took
        self.fell = False
        self.burst_start = self.segment = self.open_from = self.clock.now()
        if took >= run:  # a rest as long as the work before it ends the unbroken stretch
            self.runs.append(self.burst_start)
        if self.filt_w is not None:  # the filter relaxed toward the power at rest
            low = self._watts()[1]
            self.filt_w = low + (self.filt_w - low) * math.exp(-took / (cc.burst_power_tau_s or 1))

    def _watts(self) -> tuple[float, float]:
        """The heaviest power this measurement's work draws, and the power at rest: the
        highest reading where it shows a light kernel, else unseen_power_frac of the
        limit if that is more: until a reading whose refresh fell inside a burst
        (`_shows_work`) has shown the work, and where one shows it heavy."""
        # this measurement's samples only (a session's sampler holds hours of others)
        samples = self.sampler.samples(self.origin, None, self.gpu) if self.sampler else []
        watts = [s.power_instant_w if s.power_instant_w is not None else s.power_w for s in samples]
        limit = self.facts.power_limit_w if self.facts and self.facts.power_limit_w else 0.0
        heavy = max(watts, default=0.0)
        if not self.power_seen:
            spans, offset = self._work_spans(), self.clock.wall() - self.clock.now()
            self.power_seen = any(self._shows_work(s, spans, offset) for s in samples)
        cc = self.config
        self.heavy = self.power_seen and heavy >= cc.heavy_seen_frac * limit > 0
        if not self.power_seen or heavy >= cc.heavy_seen_frac * limit:
            heavy = max(heavy, cc.unseen_power_frac * limit)
        return heavy, min([*watts, cc.rest_power_frac * limit])

    def _rest_to_refresh(self, now: float, rest: float) -> float:
        """`rest`, lengthened where need be so that the next burst straddles the driver's
        next refresh of the instant power (every DRIVER_REFRESH_S after the last one a
        reading was stamped with): a kernel whose power no reading has shown is taken as
        the heaviest, and rests as one, until a refresh falls inside its work."""
        samples = self.sampler.samples(self.origin, None, self.gpu) if self.sampler else []
        offset = self.clock.wall() - self.clock.now()
        stamps = [host_time(s.driver_ts_us, s.t, offset) for s in samples if s.power_instant_w]
        last = max((a for a in stamps if a is not None), default=None)
        if last is None:
            return rest
        begin = now + rest
        periods = math.ceil((begin + SEEN_AFTER_S - last) / DRIVER_REFRESH_S)
        refresh = last + max(periods, 1) * DRIVER_REFRESH_S
        if refresh <= begin + self.config.burst_s - SEEN_AFTER_S:
            return rest  # the next burst holds it
        return refresh - 2 * SEEN_AFTER_S - now

    def _work_spans(self) -> list[tuple[float, float]]:
        """When this measurement's work ran: the closed bursts and the open one, so far."""
        return [*self.spans, (self.open_from, self.clock.now())]

    def _worked_s(self) -> float:
        """How long this measurement's work has run, set-up and warmup included."""
        return sum(b - a for a, b in self._work_spans())

    @staticmethod
    def _shows_work(s: Sample, spans: list[tuple[float, float]], offset: float) -> bool:
        """Was sample `s`'s power refreshed while the work ran (`spans`; `offset`: wall
        time less clock time)? By the driver's timestamp of the value where it has one,
        else (the 1 s average, or no timestamp) only if the work ran through the whole
        time the value may be from."""
        at = host_time(s.driver_ts_us, s.t, offset)
        if at is not None and s.power_instant_w is not None:
            return any(a + SEEN_AFTER_S <= at <= b for a, b in spans)
        lag = DRIVER_REFRESH_S if s.power_instant_w is not None else 1.0
        return any(a + SEEN_AFTER_S <= s.t - lag and s.t <= b for a, b in spans)

    def _power_rest(self, burst: float) -> float | None:
        """The rest after a burst of `burst` s that keeps the next burst's filtered power
        under the target (ConditionConfig.burst_power_tau_s); None: no model."""
        cc, model = self.config, self._power_model()
        if model is None:
            return None
        tau, limit = model
        heavy, low = self._watts()
        if heavy <= 0:
            return None
        if self.filt_w is None:
            self.filt_w = self._start_filter(low, limit, tau)
        self.filt_w = heavy + (self.filt_w - heavy) * math.exp(-burst / tau)
        target = cc.burst_power_target * limit
        if heavy <= target:
            return 0.0  # light: the filter cannot reach the target
        if not self.power_seen and self.began_rested and self._worked_s() < self._unseen_first_s():
            # from a rested GPU, no refresh can have fallen inside the work yet: one will
            # before the next burst ends (the heaviest kernel's cap engaged 127-178 ms
            # into work from rest on an H200), and a light kernel then rests not at all
            return 0.0
        # the filter may start the next burst at most here to end it under the target
        start_max = heavy - (heavy - target) * math.exp(cc.burst_s / tau)
        if start_max <= low:
            return None  # a burst this heavy and long cannot stay under: the duty rule
        if self.filt_w <= start_max:
            return 0.0
        return tau * math.log((self.filt_w - low) / (start_max - low))

    def _power_model(self) -> tuple[float, float] | None:
        """The power filter's time constant and the GPU's power limit (W); None: no model
        (no time constant set, no limit known, or no sampler to read)."""
        tau = self.config.burst_power_tau_s
        limit = self.facts.power_limit_w if self.facts else None
        if tau is None or not limit or self.sampler is None:
            return None
        return tau, limit

    def _start_filter(self, low: float, limit: float, tau: float) -> float:
        """The modelled filtered power where this measurement's work began: from the 1 s
        average read first, or where the last measurement left it; with whether that was
        near the power at rest (`began_rested`, set)."""
        first = self.sampler.samples(self.origin, None, self.gpu)[:1] if self.sampler else []
        before = max(low, first[0].power_w if first else low)
        left = self._left().get(self._uuid or "")
        if left is not None and first and first[0].t >= left[0]:
            before = max(
                before,
                left[2] + (left[1] - left[2]) * math.exp(-(self.burst_start - left[0]) / tau),
            )
        filt = low + (before - low) * math.exp(-self.rested_s / tau)
        self.began_rested = filt <= low + self.config.rest_power_frac * (limit - low)
        return filt

    def _from_rest(self) -> bool:
        """Did this measurement's work begin on a GPU near its power at rest (the modelled
        filter, `_start_filter`)? True where there is no power model to tell."""
        model = self._power_model()
        if model is None:
            return True
        if self.filt_w is None:
            tau, limit = model
            self.filt_w = self._start_filter(self._watts()[1], limit, tau)
        return self.began_rested

    def _left(self) -> dict[str, tuple[float, float, float]]:
        """Where the GPUs were left, on this measurement's clock (its memory's)."""
        return self.memory.filter_left(self.clock)

    @functools.cached_property
    def _uuid(self) -> str | None:
        """The GPU's UUID (None: no backend to ask), asked once a measurement."""
        backend = self.sampler.backend if self.sampler is not None else None
        try:
            return str(backend.device_info(self.gpu).uuid) if backend is not None else None
        except GpuenvError:
            return None

    def _held_down(self) -> bool:
        latest = self.sampler.latest(self.gpu) if self.sampler is not None else None
        if latest is None:
            return False
        # "reasons": a held-down reason; "clock": that, or the clock itself held down
        return held_down(
            latest, self.facts, self.config, self.tol, clock=_by_clock(self.facts, self.config)
        )

    def summary(self) -> BurstSchedule:
        """What the schedule did, for the Measurement (the measurement ends here)."""
        tau = self.config.burst_power_tau_s
        if self.filt_w is not None and tau:
            heavy, low = self._watts()
            now = self.clock.now()
            end = heavy + (self.filt_w - heavy) * math.exp(-(now - self.burst_start) / tau)
            uuid = self._uuid
            # carried only where a reading showed the work's power (an assumed heavy
            # power would make a light kernel's next call rest for nothing)
            if uuid is not None and self.power_seen:
                self._left()[uuid] = (now, end, low)
        open_s = self.clock.now() - self.burst_start  # none: finish() rested after the last
        return BurstSchedule(
            rests=self.rests,
            bursts=len(self.bursts) + (1 if open_s > 0 or not self.bursts else 0),
            max_s=max([*self.bursts, open_s]),
            rest_s=self.rest_s,
            waits=self.waits,
            clock_redos=self.redos,
            in_bursts_s=self.in_bursts_s(),
            power_seen=self.power_seen if tau else None,
            redone=dict(self.redone),
            limit_s=self.limit_s if self.limit_s is not None or not self.heavy else self.gpu_onset,
            lengths_s=tuple(self.bursts) + ((open_s,) if open_s > 0 else ()),
            rests_s=tuple(self.rest_each),
        )
