"""`rank(candidates)`: which of several functions is fastest, in one GPU state, or which
are tied: what an autotuner needs to choose.

    r = gpuenv.rank({"bm128": k128, "bm256": k256, "bm64": k64})
    r.winner, r.tied            # "bm256", ("bm128", "bm256"): the first of the tie set
    print(r)                    # every candidate's time and margin, and the GPU state

Why not time each candidate once, one after the other (what an autotuner does): each is
then timed in the state the previous ones left. On an H200, triton's `@triton.autotune`
over 8 matmul configs on a rested GPU chose a config 5-6.5% slower than the best in 6 of
6 processes: the configs timed first ran before the power cap that tuning itself brings
on (issue 43). Here every call is a `gpuenv.bench` call under its default conditioning
(each burst begun on a cool, uncapped GPU), and the candidates are timed in rounds,
interleaved, each round starting one candidate later than the one before. Between two
calls the GPU rests as the conditioning's duty rule asks after a burst (as long as the
call's GPU work, at the default's duty of 0.5, counted from its last rep: the host's
judging is rest too): back to back, a ranking's calls would be one long burst that brings
the cap on, and each call after it would wait for it to clear. A call's check for a ready
GPU counts the samples of that rest (`BenchConfig.rested_since`), and its judging waits
for no counter read (`wait_counters`): on an H200 both waited for the sampler process's
pace, 244 and most of 319 ms of a ~1.1 s ranking (benchmarks/autotune_rank.py). A
candidate's calls after its first warm up with `WARM_REPS` call (its set-up is done, the
GPU busy with its rivals). A tuner starts the first call's sampler while it compiles
(`prepare`). A ranking whose first call reads under `TINY_REP_S` (20 us), no mode chosen,
times every call (that one again) by CUPTI (mode "auto"): one call between CUDA events
holds microseconds of their own overhead, at one of two levels for seconds (an H200's
1024^3 mm: 8.62-9.60 us by events, 6.05-6.16 by CUPTI; benchmarks/call_levels.py).

0. A screen, where there are `SCREEN_MIN` candidates or more: each one called once
   (its set-up: not kept), then `SCREEN_CALLS` times, round-robin, each call between CUDA
   events (a device's rep, as a call's reps are, without a call's opening, warmup,
   conditioning and judging: ~17 of an H200 call's ~27 ms). A candidate whose median
   there is more than `SCREEN_FAR` behind the fastest's stops ("far", 0 rounds): of
   Inductor's 20 choices for a 1024^3 mm on an H200, 18 were 26-380% behind by events.
   Its calls last milliseconds, so every candidate meets the same clock; events read a
   few-us kernel's ratios smaller than its device times do (+2.6 us each), so a screen by
   them stops fewer, never more. The duty rule's rest follows it.
1. Round 1 times every candidate left (one short call each). A candidate more than
   `FAR_FIRST` behind the round's fastest stops there, and one more than `FAR` behind in
   each of two rounds after that: far behind, it cannot win.
2. The rest are timed again, round after round, until each one's ratio to the leader
   (the lowest median) is decided from the rounds' pairs (`gpuenv.timing.pair.pair_ratio`:
   the median of the per-round ratios, its order-statistic interval): tied (the interval
   inside 1 +- `tolerance`), slower (the interval above 1 + `tolerance` / 2), or, when
   the budget ends first, slower if it excludes 1 and tied if not. (Waiting for the
   interval to clear 1 + `tolerance` took an H200 3.4 s, 5x plain triton's tuning, to
   set apart three configs 0.8% apart; half the band needs about a third of the rounds,
   and a pair 0.3% apart still ties.) The rounds also end once the winner cannot change
   (`_Ranker._settled`): the first candidate in the order given is the leader or tied
   with it, and none is shown faster than it by more than `tolerance`; the undecided
   ones then end by the budget's rule.
3. `tied` is the leader and those tied with it, in the order given; `winner` is its
   first. The same candidates in the same state so give the same winner, or the same
   declared tie, whichever of the tied ones is a little faster in this process.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpuenv import stats
from gpuenv import validate as v
from gpuenv.conditioning.burst import burst_rest_s
from gpuenv.timebase import REAL_CLOCK, Clock
from gpuenv.timing.config import TINY_REP_S, BenchConfig
from gpuenv.timing.pair import min_pairs, pair_ratio
from gpuenv.units import fmt_s

if TYPE_CHECKING:
    from gpuenv.backend import Backend
    from gpuenv.results import Measurement
    from gpuenv.seams import BenchSession
    from gpuenv.timing.devices import Device

log = logging.getLogger(__name__)
# One call of a round: a short gpuenv.bench (10 ms of reps, a few ms of warmup once the
# function is warm, the default conditioning), timed by CUDA events around each call (the
# default's CUPTI costs a profiler session a call: a few-us ranking alone takes it). A round
# of 8 calls then costs about what triton's do_bench costs for one config (25 ms warmup +
# 100 ms of reps). Like the do_bench drop-in's calls, no before/after clock probe (each rep
# probes its own: 2 x 3 ms of spin on CUDA, 10 of a call's 23.5 ms on the simulated H200,
# benchmarks/rank_cost.py) and no telemetry trace (for `gpuenv plot`: nothing plots these).
RANK_CALL = BenchConfig(
    mode="events",
    budget_s=0.01,
    min_reps=5,
    rel_ci=0.005,
    warmup_max_s=0.05,
    probe_clock=False,
    keep_trace=False,
)
UNWAITED = {"wait_power": False, "wait_counters": False}  # over any config: see rank()
TOLERANCE = 0.005  # candidates within 0.5% of the leader (shown with confidence) are tied
FAR_FIRST = 0.08  # behind the round's fastest by more than this in round 1: stops there
FAR = 0.03  # ...or by more than this in each of two rounds
DEFAULT_BUDGET_S = 5.0  # the longest a ranking runs (its candidates' first round always runs)
MAX_ROUNDS = 30
SCREEN_MIN = 3  # candidates from which a ranking screens them first
SCREEN_CALLS = 5  # each candidate's timed calls in the screen (after one not kept)
SCREEN_FAR = 0.15  # behind the screen's fastest median by more than this: stops there
WAIT_SAID_S = 0.01  # a ranking's calls' waits for a ready GPU its state says, from this
WARM_REPS = 1  # the warmup of a candidate's calls after its first (an "auto" warmup's)

Outcome = Literal["winner", "tied", "slower", "far"]


@dataclass(frozen=True)
class Candidate:
    """One candidate of a `Ranking`: its calls (`measurements`, one per round it ran in),
    `median_s` (the median of their medians), its ratio to the winner (`margin`: 1.03 is
    3% slower) with that ratio's interval from the rounds both ran in (`margin_ci`), and
    how its ranking ended (`outcome`: "winner", "tied", "slower" shown slower than the
    leader, "far" stopped early, far behind). `screen_s`: its calls' times in the screen,
    by CUDA events (empty where none ran); one the screen stopped has no Measurements,
    and its median and margin are the screen's, the median on the others' scale (by
    CUPTI, less the ranking's `events_offset_s`: one column of one clock)."""

    name: str
    measurements: tuple[Any, ...]
    median_s: float
    margin: float
    margin_ci: tuple[float, float]
    outcome: Outcome
    screen_s: tuple[float, ...] = ()

    @property
    def rounds(self) -> int:
        """The rounds it was timed in."""
        return len(self.measurements)

    def to_dict(self) -> dict[str, Any]:
        """What a results file keeps of it (its Measurements are kept on their own)."""
        return {
            "name": self.name,
            "median_s": self.median_s,
            "margin": self.margin,
            "margin_ci": list(self.margin_ci),
            "outcome": self.outcome,
            "rounds": self.rounds,
            "screen_s": list(self.screen_s),
        }

    def ended(self) -> str:
        """How it ended, in words (`ended`)."""
        return ended(self.outcome, self.rounds)


@dataclass(frozen=True)
class RankState:
    """The GPU state the candidates were timed in: the condition bench measured in (and
    why), the SM clock and temperature ranges over every call, the highest mean power of a
    call, the kinds of the findings of any call, and how long its calls waited for a ready
    GPU before their first burst (`waited_s`, summed: after heavy load, for the power cap
    to clear: on an H200 ~0.3 s of a 0.6 s ranking; a rested one waits little or none)."""

    gpu: int | None
    condition: str | None
    condition_why: str | None
    sm_mhz: tuple[float, float] | None
    temp_c: tuple[float, float] | None
    power_w_max: float | None
    findings: tuple[str, ...] = ()
    waited_s: float = 0.0

    def __str__(self) -> str:
        parts = [f"GPU {self.gpu}" if self.gpu is not None else "GPU ?"]
        if self.condition:
            parts.append(f"condition {self.condition}")
        if self.sm_mhz:
            lo, hi = self.sm_mhz
            parts.append(f"SM {lo:.0f} MHz" if lo == hi else f"SM {lo:.0f}-{hi:.0f} MHz")
        if self.temp_c:
            lo, hi = self.temp_c
            parts.append(f"{lo:.0f} C" if lo == hi else f"{lo:.0f}-{hi:.0f} C")
        if self.power_w_max is not None:
            parts.append(f"power up to {self.power_w_max:.0f} W (a call's mean)")
        if self.waited_s >= WAIT_SAID_S:
            parts.append(f"waited {self.waited_s:.2f} s for a ready GPU")
        parts.append(f"findings: {', '.join(self.findings)}" if self.findings else "no findings")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "condition": self.condition,
            "condition_why": self.condition_why,
            "sm_mhz": list(self.sm_mhz) if self.sm_mhz else None,
            "temp_c": list(self.temp_c) if self.temp_c else None,
            "power_w_max": self.power_w_max,
            "findings": list(self.findings),
            "waited_s": self.waited_s,
        }


@dataclass(frozen=True)
class Ranking:
    """What `rank` found; `str()` is a table a person reads, `ranking["name"]` one candidate.

    Attributes:
        winner: the choice: the first of `tied` in the order given.
        tied: the fastest candidate and those not shown to differ from it by more than
            `tolerance`, in the order given (one name: no tie).
        fastest: the candidate with the lowest median.
        candidates: every candidate (`Candidate`: Measurements, margin, outcome), in the
            order given.
        state: the GPU state they were timed in (`RankState`).
        rounds: the rounds run.
        wall_s: the time the ranking took, in seconds (on the GPU's clock: virtual on a
            simulated GPU in tests).
        tolerance: ratios within 1 +- this were a tie.
        confidence: the level of each margin's interval.
        budget_ended: the budget (or the last round) ended before every close candidate
            was decided.
        order: the candidates' names in the order given.
        method: how the calls timed, in words (a call's `extra["method"]`): CUDA events,
            or each call's device time from CUPTI where the first read under `TINY_REP_S`.
        events_offset_s: by CUPTI, the first call's events median less that candidate's
            CUPTI median: what events hold besides (0 by events). `times_s` adds it.
        screen_wall_s: the screen's part of `wall_s` (0: none ran).
    """

    winner: str
    tied: tuple[str, ...]
    fastest: str
    candidates: tuple[Candidate, ...]
    state: RankState
    rounds: int
    wall_s: float
    tolerance: float
    confidence: float
    budget_ended: bool = False
    order: tuple[str, ...] = field(default=())  # the names in the order given
    method: str = ""
    events_offset_s: float = 0.0
    screen_wall_s: float = 0.0

    def __getitem__(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def times_s(self) -> dict[str, float]:
        """Each candidate's time for a tuner that keeps the least: its median, the winner's
        the lowest (another's raised just past it where a tie or the budget left it lower,
        by a part in 10^9: still so in ms), so that the tuner keeps gpuenv's choice. On the
        scale of one call between CUDA events, as a tuner's other timings are (Inductor
        weighs a selection's time against an epilogue's and a fused kernel's, each timed so):
        by CUPTI, every median has `events_offset_s` added."""
        add = self.events_offset_s
        floor = self[self.winner].median_s + add
        return {
            c.name: floor if c.name == self.winner else max(c.median_s + add, floor * (1 + 1e-9))
            for c in self.candidates
        }

    def calls_s(self, name: str) -> list[float]:
        """Candidate `name`'s calls' medians on the scale of `times_s` (`events_offset_s`
        added), or, for one the screen stopped, its calls there (by events already)."""
        c = self[name]
        if not c.measurements:
            return list(c.screen_s)
        return [m.median_s + self.events_offset_s for m in c.measurements]

    @property
    def screened(self) -> tuple[str, ...]:
        """The candidates the screen stopped (no call of their own), in the order given."""
        return tuple(c.name for c in self.candidates if c.screen_s and not c.measurements)

    @property
    def is_tie(self) -> bool:
        """More than one candidate is tied for the best."""
        return len(self.tied) > 1

    def __str__(self) -> str:
        best = self[self.winner]
        if self.is_tie:
            others = ", ".join(n for n in self.tied if n != self.winner)
            head = (
                f"rank: {self.winner} ({fmt_s(best.median_s)}), tied with {others} "
                f"(within {self.tolerance:.1%}): the first of the tie in the order given"
            )
        else:
            head = f"rank: {self.winner} is fastest ({fmt_s(best.median_s)})"
        head += f"; {len(self.candidates)} candidates, {self.rounds} rounds, {self.wall_s:.2f} s"
        if self.screen_wall_s:
            stopped = len(self.screened) or "none"
            head += f" (a screen of {self.screen_wall_s:.2f} s stopped {stopped})"
        if self.budget_ended:
            head += " (the budget ended before every close candidate was decided)"
        lines = [head]
        width = max(len(c.name) for c in self.candidates)
        for c in sorted(self.candidates, key=lambda c: c.margin):
            lo, hi = c.margin_ci
            how = "" if c.name == self.winner else f" ({lo:.4f}-{hi:.4f})"
            lines.append(
                f"  {c.name:<{width}}  {fmt_s(c.median_s):>9}  x{c.margin:.4f}{how}  {c.ended()}"
            )
        lines.append(f"  state: {self.state}")
        if self.method:
            lines.append(f"  timed: {self.method}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The decision as a results file keeps it (JSON types)."""
        return {
            "winner": self.winner,
            "tied": list(self.tied),
            "fastest": self.fastest,
            "candidates": [c.to_dict() for c in self.candidates],
            "state": self.state.to_dict(),
            "rounds": self.rounds,
            "wall_s": self.wall_s,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "budget_ended": self.budget_ended,
            "method": self.method,
            "events_offset_s": self.events_offset_s,
            "screen_wall_s": self.screen_wall_s,
        }


def rank(
    candidates: Mapping[str, Callable[[], Any]],
    config: BenchConfig | None = None,
    *,
    tolerance: float = TOLERANCE,
    confidence: float = 0.95,
    budget_s: float = DEFAULT_BUDGET_S,
    max_rounds: int = MAX_ROUNDS,
    backend: Any = None,
    gpu: int | None = None,
    device: Any = None,
    session: Any = None,
    screen: bool = True,
    **settings: Any,
) -> Ranking:
    """Rank `candidates` (name -> the GPU work of one call, all on one GPU): every one timed
    in the same GPU state, in interleaved rounds of short `gpuenv.bench` calls; returns a
    `Ranking` (see the module docstring for how it decides).

    Args:
        candidates: name -> a function called with no arguments; the order given is the
            order a tie is broken in.
        config: one call's `BenchConfig` (default `RANK_CALL`: 10 ms of reps, timed by
            CUDA events; by CUPTI where the first call reads under `TINY_REP_S` and
            neither `config` nor `mode=` chose the mode).
        tolerance: a ratio to the leader within 1 +- this, shown with confidence, is a tie.
        confidence: the level of each ratio's interval.
        budget_s: the longest the ranking runs after its first round, in seconds.
        max_rounds: the most rounds.
        backend: the GPU backend, as for `gpuenv.bench` (default: opened once).
        gpu: the GPU to time on (default: as for `gpuenv.bench`, the candidates' GPU).
        device: what runs the candidates (tests: a `SimDevice`), as for `gpuenv.bench`.
        session: a `gpuenv.stable()` session that lends its sampler, lock and policy.
        screen: screen `SCREEN_MIN` candidates or more first (False: round 1 times all).
        **settings: `BenchConfig` fields over `config` (`condition=`, `flush_l2=`, ...).

    Returns:
        The `Ranking`: `winner`, `tied`, each candidate's Measurements and margin, the GPU
        state.

    Raises:
        ConfigError: an argument out of range, or candidates that are not a non-empty
            mapping of names to functions that take no arguments.
    """
    fns = v.candidates(candidates, "candidates")
    v.number(tolerance, "tolerance", lo=0, hi=1, hi_open=True, hint="0.005: within 0.5%")
    v.number(confidence, "confidence", lo=0, hi=1, lo_open=True, hi_open=True)
    v.number(budget_s, "budget_s", lo=0, unit="seconds")
    least = min_pairs(confidence)
    max_rounds = v.integer(
        max_rounds,
        "max_rounds",
        lo=least,
        hint=f"a ratio's {confidence:.0%} interval needs {least} rounds; "
        f"the default is {MAX_ROUNDS}",
    )
    # a call waits for no power sample after its reps (up to 45 ms, where a call is ~20 ms)
    # and no counter read (most of its judging on an H200): a ranking reports times; a
    # call's energy and reason times stay estimates where those reads are not in
    cfg = BenchConfig.of(config or RANK_CALL, {**UNWAITED, **settings})
    if session is None and backend is None and device is None:
        from gpuenv.backend import shared_backend

        backend = shared_backend()
    clock = _clock(session, backend, device)
    ranker = _Ranker(fns, cfg, tolerance, confidence, budget_s, max_rounds, clock)
    ranker.tiny_by_cupti = config is None and "mode" not in settings  # no mode chosen
    ranker.screens = bool(screen)
    return ranker.run(dict(backend=backend, gpu=gpu, device=device, session=session))


def prepare(
    config: BenchConfig | None = None,
    *,
    backend: Any = None,
    gpu: int | None = None,
    device: Any = None,
    session: Any = None,
    **settings: Any,
) -> Callable[[], None]:
    """Begin, on a thread, what a ranking's first call waits for in a fresh process: the
    backend, the GPU's facts, the sampler process's start (spawn, imports, NVML's
    start-up), for `gpu`, else the calling thread's CUDA device (where the process has no
    CUDA context yet, none is made here: its own GPU, LOCAL_RANK's where set). A tuner
    calls it, with `rank`'s arguments but the candidates, before it compiles them, and the
    function it returns (which waits for the thread) before `rank`: the start then runs
    during the compiling. Nothing to begin in a session or on a given device (they bring their own),
    or on virtual time. A failure here is only logged: the first call then opens as it
    would have, and says what failed.

    Raises:
        ConfigError: `settings` that `BenchConfig` does not take, as `rank` would.
    """
    # rank's own keywords (tolerance, budget_s, ...) are the ranking's, not a call's
    ranking = set(inspect.signature(rank).parameters) - set(inspect.signature(prepare).parameters)
    calls = {k: value for k, value in settings.items() if k not in ranking}
    cfg = BenchConfig.of(config or RANK_CALL, {**UNWAITED, **calls})
    if session is not None or device is not None or _clock(None, backend, None).virtual:
        return lambda: None
    # imported here, not on the thread: a switch may call this while a module loads
    from gpuenv.backend import shared_backend
    from gpuenv.timing.cuda.events import cuda_ordinal
    from gpuenv.timing.harness import open_ahead

    ordinal = cuda_ordinal()  # the calling thread's CUDA device (None: no CUDA context yet)

    def opening() -> None:
        try:
            open_ahead(cfg, backend if backend is not None else shared_backend(), gpu, ordinal)
        except Exception as err:  # the first call opens again, and reports it
            log.debug("gpuenv.rank: opening ahead failed: %s", err)

    thread = threading.Thread(target=opening, name="gpuenv-rank-open", daemon=True)
    thread.start()
    return thread.join


def unknown_settings(settings: Mapping[str, Any]) -> list[str]:
    """The names in `settings` that neither `rank` nor `BenchConfig` takes, sorted: what a
    tuner's switch (`patch_autotuner(rank=True)`, `patch_inductor(rank=True)`) refuses
    before anything is patched."""
    from dataclasses import fields

    known = {*inspect.signature(rank).parameters, *(f.name for f in fields(BenchConfig))}
    return sorted(set(settings) - known - {"candidates"})


class _Ranker:
    """One ranking: the rounds, what each candidate's calls gave, the decisions."""

    def __init__(
        self,
        fns: dict[str, Callable[[], Any]],
        cfg: BenchConfig,
        tolerance: float,
        confidence: float,
        budget_s: float,
        max_rounds: int,
        clock: Clock,
    ):
        self.fns, self.cfg, self.tol, self.conf = fns, cfg, tolerance, confidence
        self.budget_s, self.max_rounds = budget_s, max_rounds
        self.clock, self.sleep = clock.now, clock.sleep
        # a candidate's later calls: its set-up done and the GPU busy with its rivals, one
        # warmup call is enough (an "auto" warmup of a known function took 4, 1.3 ms a call)
        auto = cfg.warmup == "auto"
        self.warm_cfg = dataclasses.replace(cfg, warmup=WARM_REPS) if auto else cfg
        self.rest_until = -math.inf  # the duty rule's rest after the last call ends here
        self.last_end: float | None = None  # the last call's last rep ended here
        self.order = list(fns)
        self.got: dict[str, list[Any]] = {n: [] for n in fns}  # Measurements, one per round
        self.out: dict[str, Outcome] = {}  # final outcomes of the candidates that stopped
        self.least = min_pairs(confidence)
        self.tiny_by_cupti = False  # a first call under TINY_REP_S: every call by CUPTI
        self.by_events: tuple[str, float] | None = None  # that call: its candidate, median
        self.screens = True  # screen SCREEN_MIN candidates or more first
        self.screen: dict[str, list[float]] = {}  # each candidate's calls there (events)
        self.screen_wall_s = 0.0

    def run(self, where: dict[str, Any]) -> Ranking:
        t0 = self.clock()
        active = self._screen_first(where)
        rounds, ended = 0, False
        while True:
            start = rounds % len(active)
            for name in active[start:] + active[:start]:  # each round one later
                self.got[name].append(self._bench(name, where))
            rounds += 1
            active = self._screen(active, rounds)
            undecided = self._undecided(active)
            if not undecided or self._settled(active):
                break
            if rounds >= self.max_rounds or self.clock() - t0 >= self.budget_s:
                ended = True
                break
        return self._ranking(active, rounds, ended, self.clock() - t0)

    def _bench(self, name: str, where: dict[str, Any], warm: bool = False) -> Any:
        from gpuenv.timing.harness import bench

        wait = self.rest_until - self.clock()
        if wait > 0:
            self.sleep(wait)
        cfg = self.warm_cfg if warm or self.got[name] else self.cfg
        if self.last_end is not None:  # its check for a ready GPU counts the rest's samples
            cfg = dataclasses.replace(cfg, rested_since=self.last_end)
        m = bench(self.fns[name], cfg, name=name, **where)
        # from its last rep's end: the judging since, and this, were rest already
        ends = [w.t1 for w in m.windows]
        self.last_end = max(ends) if ends else self.clock()
        self.rest_until = self.last_end + _rest_after(m, cfg)
        if self.tiny_by_cupti:  # decided by the ranking's first call, once
            self.tiny_by_cupti = False
            median = m.median_s
            if median is not None and median < TINY_REP_S:
                self.by_events = (name, median)
                self.cfg = dataclasses.replace(self.cfg, mode="auto")
                self.warm_cfg = dataclasses.replace(self.warm_cfg, mode="auto")
                # every candidate's calls timed one way: this one again, its set-up done
                return self._bench(name, where, warm=True)
        return m

    def _screen_first(self, where: dict[str, Any]) -> list[str]:
        """The screen (the module docstring's step 0): the candidates within SCREEN_FAR of
        the fastest there, in the order given (all of them where no screen runs)."""
        few = not self.screens or len(self.order) < SCREEN_MIN
        device = None if few else _screen_device(self.cfg, where)
        if device is None:
            return list(self.order)
        t0, n = self.clock(), len(self.order)
        for name in self.order:  # set-up, lazy loading: not kept
            device.rep(self.fns[name])
        got: dict[str, list[float]] = {name: [] for name in self.order}
        for i in range(SCREEN_CALLS):  # each round one later, as the ranking's rounds
            for name in self.order[i % n :] + self.order[: i % n]:
                got[name].append(device.rep(self.fns[name]).time_s)
        medians = {name: stats.median(times) for name, times in got.items()}
        fastest = min(medians.values())
        keep = [name for name in self.order if medians[name] <= fastest * (1 + SCREEN_FAR)]
        self.out.update({name: "far" for name in self.order if name not in keep})
        self.screen = got
        busy = sum(t for times in got.values() for t in times)
        self.rest_until = self.clock() + burst_rest_s(busy, self.cfg.conditioning)
        self.screen_wall_s = self.clock() - t0
        first = keep[0]
        if self.tiny_by_cupti and medians[first] < TINY_REP_S:  # decided here, by events
            self.tiny_by_cupti = False
            self.by_events = (first, medians[first])
            self.cfg = dataclasses.replace(self.cfg, mode="auto")
            self.warm_cfg = dataclasses.replace(self.warm_cfg, mode="auto")
        return keep

    def _median(self, name: str, rounds: slice = slice(None)) -> float:
        return stats.median([m.median_s for m in self.got[name][rounds]])

    def _leader(self, active: list[str]) -> str:
        # every active candidate ran in every round so far: their medians compare
        return min(active, key=lambda n: (self._median(n), self.order.index(n)))

    def _screen(self, active: list[str], rounds: int) -> list[str]:
        """Stop the candidates far behind: FAR_FIRST in round 1, FAR in each of the last
        two rounds (against each round's fastest)."""
        if len(active) == 1:
            return active
        keep = []
        for name in active:
            behind = [
                self.got[name][r].median_s / min(self.got[n][r].median_s for n in active)
                for r in range(max(0, rounds - 2), rounds)
            ]
            far = behind[-1] > 1 + FAR_FIRST or (
                len(behind) == 2 and all(b > 1 + FAR for b in behind)
            )
            if far:
                self.out[name] = "far"
            else:
                keep.append(name)
        return keep

    def _ratio(self, lead: str, name: str) -> tuple[float, tuple[float, float], float]:
        n = min(len(self.got[lead]), len(self.got[name]))
        a = [m.median_s for m in self.got[lead][:n]]
        b = [m.median_s for m in self.got[name][:n]]
        return pair_ratio(a, b, self.conf)

    def _decide(self, lead: str, name: str, final: bool) -> Outcome | None:
        """slower / tied against the leader, or None while undecided."""
        _, (lo, hi), _ = self._ratio(lead, name)
        enough = len(self.got[name]) >= self.least
        if enough and 1 / (1 + self.tol) <= lo and hi <= 1 + self.tol:
            return "tied"
        if enough and lo > 1 + self.tol / 2:  # shown slower by more than half the band
            return "slower"
        if final:
            return "slower" if lo > 1 else "tied"
        return None

    def _undecided(self, active: list[str]) -> list[str]:
        """The close candidates not yet decided; those shown slower stop here."""
        lead = self._leader(active)
        left = []
        for name in list(active):
            if name == lead:
                continue
            outcome = self._decide(lead, name, final=False)
            if outcome == "slower":
                self.out[name] = "slower"
                active.remove(name)
            elif outcome is None:
                left.append(name)
        return left

    def _settled(self, active: list[str]) -> bool:
        """Whether the winner can no longer change, though some candidates are undecided:
        the first of the order given among those still in is the leader or shown tied with
        it, and no candidate is shown faster than it by more than the band (so choosing it
        costs at most `tolerance`). The tie goes to the first in the order given, so the
        undecided ones, later in it, decide only who else is in the tie: they end by the
        budget's rule. On the simulated H200, a candidate 0.49% behind the first (at the
        edge of the 0.5% band) kept a ranking going ~20 rounds where ~8 chose the same."""
        first = min(active, key=self.order.index)
        if len(self.got[first]) < self.least:
            return False
        lead = self._leader(active)
        if first != lead and self._decide(lead, first, final=False) != "tied":
            return False
        for name in active:
            if name != first:
                _, (lo, _), _ = self._ratio(first, name)
                if lo < 1 / (1 + self.tol):  # it may be faster by more than the band
                    return False
        return True

    def _ranking(self, active: list[str], rounds: int, ended: bool, wall_s: float) -> Ranking:
        lead = self._leader(active)
        tied = [lead]
        for name in active:
            if name != lead:
                outcome = self._decide(lead, name, final=True)
                self.out[name] = outcome or "tied"
                if outcome == "tied":
                    tied.append(name)
        tied.sort(key=self.order.index)
        winner = tied[0]
        for name in tied:
            self.out[name] = "winner" if name == winner else "tied"
        cands, offset = [], self._events_offset()
        for name in self.order:
            screen = tuple(self.screen.get(name, ()))
            if name == winner:
                median, margin, ci = self._median(name), 1.0, (1.0, 1.0)
            elif not self.got[name]:  # stopped by the screen: its calls there, by events,
                median = stats.median(screen) - offset  # on the others' scale (CUPTI's)
                margin, ci, _ = pair_ratio(self.screen[winner], screen, self.conf)
            else:
                median = self._median(name)
                margin, ci, _ = self._ratio(winner, name)
            cands.append(
                Candidate(name, tuple(self.got[name]), median, margin, ci, self.out[name], screen)
            )
        return Ranking(
            winner=winner,
            tied=tuple(tied),
            fastest=lead,
            candidates=tuple(cands),
            state=_state([m for ms in self.got.values() for m in ms]),
            rounds=rounds,
            wall_s=wall_s,
            tolerance=self.tol,
            confidence=self.conf,
            budget_ended=ended,
            order=tuple(self.order),
            method=str(self.got[winner][-1].extra.get("method", "")),
            events_offset_s=offset,
            screen_wall_s=self.screen_wall_s,
        )

    def _events_offset(self) -> float:
        """The events call that decided CUPTI, less its candidate's CUPTI median (>= 0)."""
        if self.by_events is None:
            return 0.0
        name, events_s = self.by_events
        return max(0.0, events_s - self._median(name))


def ended(outcome: str, rounds: int) -> str:
    """How a candidate's ranking ended, in words: "far, 1 round", "far, in the screen" (no
    round of its own: the screen stopped it); a Ranking's table and a decision's lines."""
    return f"{outcome}, " + (f"{rounds} round{'s' * (rounds != 1)}" if rounds else "in the screen")


def _state(ms: list[Any]) -> RankState:
    """The GPU state over every call: clock and temperature ranges, the highest power."""
    windows = [w for m in ms for w in m.summary_windows]
    lows = [w.sm_mhz_min for w in windows if w.sm_mhz_min is not None]
    highs = [w.sm_mhz_max for w in windows if w.sm_mhz_max is not None]
    temps = [t for w in windows for t in (w.temp_c_start, w.temp_c_end) if t is not None]
    powers = [w.power_w_mean for w in windows if w.power_w_mean is not None]
    conditioned = [c for c in (m.conditioned for m in ms) if c is not None]
    conditions = sorted({c.condition for c in conditioned})
    first = ms[0] if ms else None
    return RankState(
        gpu=(first.gpus[0] if first is not None and first.gpus else None),
        condition=", ".join(conditions) or None,
        condition_why=conditioned[0].why if conditioned else None,
        sm_mhz=(float(min(lows)), float(max(highs))) if lows and highs else None,
        temp_c=(float(min(temps)), float(max(temps))) if temps else None,
        power_w_max=float(max(powers)) if powers else None,
        findings=tuple(sorted({f.kind for m in ms for f in m.findings})),
        waited_s=sum(b.wait_s for b in (m.first_burst for m in ms) if b is not None),
    )


def _rest_after(m: Measurement, cfg: BenchConfig) -> float:
    """The rest a burst call's last burst asks for before the next call's work (the duty
    rule of `cfg.conditioning`, as between the bursts of one call): back to back, a
    ranking's calls are one long burst, and a heavy kernel brings the cap on within a few
    rounds (on the simulated H200, in 21 calls of a 0.2 ms matmul, then waited 0.5 s for
    it to clear). Nothing in another condition."""
    conditioned, bursts = m.conditioned, m.bursts
    if conditioned is None or conditioned.condition != "burst" or bursts is None:
        return 0.0
    if not bursts.lengths_s:
        return 0.0
    return burst_rest_s(bursts.lengths_s[-1], cfg.conditioning)


def _screen_device(cfg: BenchConfig, where: dict[str, Any]) -> Device | None:
    """What the screen times each call with: the device given, where it times each call
    as called (not a CUDA graph's replay, a sustained chunk, CUPTI's batch), else the one a
    bench call would open, by CUDA events."""
    from gpuenv.seams import session_gpus
    from gpuenv.timing.devices import BackToBack
    from gpuenv.timing.where import open_device

    device = where["device"]
    if device is not None:
        each = device.kind in ("cuda_events", "sim", "host") and not isinstance(device, BackToBack)
        return device if each else None

    session, backend = where["session"], where["backend"]
    gpus: list[int] = []
    clock = None
    if session is not None:
        backend, clock, gpus = session.backend, session.sampler.clock, session_gpus(session)
    events = dataclasses.replace(cfg, mode="events")
    return open_device(events, backend, where["gpu"], gpus, clock)[0]


def _clock(session: BenchSession | None, backend: Backend | None, device: Device | None) -> Clock:
    """The time the GPU lives on (virtual on a simulated GPU in tests), for the budget and
    the rests between calls."""
    if device is not None:
        return device.clock
    if session is not None:
        return session.sampler.clock
    if backend is not None:
        return backend.clock
    return REAL_CLOCK


__all__ = [
    "DEFAULT_BUDGET_S",
    "FAR",
    "FAR_FIRST",
    "MAX_ROUNDS",
    "RANK_CALL",
    "SCREEN_CALLS",
    "SCREEN_FAR",
    "SCREEN_MIN",
    "TOLERANCE",
    "WAIT_SAID_S",
    "WARM_REPS",
    "Candidate",
    "RankState",
    "Ranking",
    "ended",
    "prepare",
    "rank",
    "unknown_settings",
]
