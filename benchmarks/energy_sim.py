#!/usr/bin/env python3
"""A region's energy against the simulated GPU's own energy counter: within 2% for regions
of 10 ms to 10 s, or marked `~` where the driver's 20 ms power samples cannot tell?

On the simulated H100 and H200 (their profiles), on virtual time, each region's energy
(its `Window.energy_j`) is set beside the simulator's own counter over the same span
(`sim.truth(0).energy_mj`, read at the work's edges), at several phases of the driver's
power-sample stamps (`--phases`: idle added before, so the stamps fall elsewhere). The
cases, by family:

  lone regions      one `env.measure` region of 10 ms to 10 s from an idle GPU
  burst-mode loops  5 `env.measure` steps of 10 ms to 1 s (burst mode: each begins
                    once the GPU is uncapped)
  back-to-back      12 steps of 10 ms to 1 s with nothing between them (sustained
                    mode), through the power cap's onset, by length band
  gpuenv.bench      a standalone call (its whole span and its last rep), by mode and
                    rep length: bursts of 1-100 ms reps (10 ms to ~34 s), sustained
                    reps of 0.2 s (0.2-10 s)
  Timer             the torch Timer adapter's call (`integrations.torch_record.observe`)
                    of 10 ms to 10 s of 10 ms kernels back to back

A region is right when its energy is within 2% of the counter's, or marked `~` (an
estimate); either way its mean power must lie within 0..its max. The figures of
docs/how-to/telemetry.md's simulated GPU come from here. scripts/sweep_step_energy.py
and scripts/sweep_bench_energy.py print the same cases region by region.

    python -m benchmarks.energy_sim            # every case, both profiles
    python -m benchmarks.energy_sim --quick    # one phase, fewer step lengths
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from benchmarks import runner
from gpuenv.backend.sim import SimBackend
from gpuenv.session import stable
from gpuenv.telemetry import Sampler, Window
from gpuenv.timebase import VirtualClock
from gpuenv.timing import bench
from gpuenv.timing.devices import SimDevice

HEADLINE = "unmarked_over_2pct"
TOL_PCT = 2.0  # an unmarked region may be this far off the counter (issue 44 item 2)
PHASES = [0.0, 0.007, 0.013]  # idle (s) before a case: where the 20 ms stamps fall
LONE_S = [0.01, 0.03, 0.1, 1.0, 10.0]
BURST_LOOP_S = [0.01, 0.03, 0.1, 1.0]
BURST_LOOP_STEPS = 5
STEP_MS = [*range(10, 61), 80, 100, 150, 300, 1000]  # back-to-back steps' lengths
STEPS = 12
# back-to-back steps by length: under 25 ms an estimate by rule; under 40 ms a step may
# hold no whole 20 ms sample interval (its edges' parts come from the samples beside it)
BANDS = [(10, 24), (25, 39), (40, 60), (61, 1000)]
# a bench call: (condition, rep ms, reps); bursts of ~10 ms to ~34 s, sustained reps 0.2 s
BENCH = [
    ("burst", 1, 10),
    ("burst", 3, 10),
    ("burst", 10, 10),
    ("burst", 30, 10),
    ("burst", 100, 10),
    ("burst", 100, 30),
    ("burst", 100, 100),
    ("sustained", 10, 1),
    ("sustained", 10, 5),
    ("sustained", 10, 15),
    ("sustained", 10, 50),
]
TIMER_MS = [10, 30, 100, 300, 1000, 3000, 10000]  # a Timer call's 10 ms kernels back to back
QUICK_MS = [10, 20, 25, 26, 28, 30, 32, 35, 40, 50, 100, 1000]


@dataclass(frozen=True)
class Row:
    """One region against the simulator's counter."""

    err_pct: float  # its energy against the counter's
    marked: bool  # marked `~`: an estimate
    inside: bool  # its mean power within 0..its max
    span_s: float = 0.0

    @property
    def flagged(self) -> bool:
        """Unmarked and further off than `TOL_PCT`: what the goal says no region is."""
        return not self.marked and abs(self.err_pct) > TOL_PCT


def judge(w: Window | None, truth_j: float) -> Row:
    """A region's window against the counter's `truth_j` over its span."""
    assert w is not None and w.energy_j is not None
    mean, high = w.power_w_mean, w.power_w_max
    inside = mean is not None and high is not None and 0 < mean <= high
    err = (w.energy_j / truth_j - 1) * 100
    return Row(err, bool(w.energy_interpolated), inside, w.duration_s)


def _sim(profile: str, idle_s: float) -> SimBackend:
    """A simulated GPU with a context open, after `idle_s` of idle."""
    sim = SimBackend(profile, clock=VirtualClock())
    sim.open_context(0)
    sim.idle(idle_s)
    return sim


def _hz(sim: SimBackend) -> float:
    """SM cycles per second at the top clock."""
    return sim.clock_limits(0).max_sm_mhz * 1e6


def measure_loop(
    profile: str, seconds: float, steps: int, phase_s: float, mode: str = "sustained"
) -> list[Row]:
    """`steps` `env.measure` regions of `seconds` of work each at the top clock, in a
    session of `mode` ("sustained": back to back; "burst": each once the GPU is uncapped),
    after 0.5 s + `phase_s` of idle with a context open; each region judged."""
    sim = SimBackend(profile, clock=VirtualClock())
    got = []
    with stable(backend=sim, mode=mode, progress=io.StringIO()) as env:
        sim.open_context(0)
        sim.idle(0.5 + phase_s)
        for _ in range(steps):
            with env.measure("step") as m:
                e0 = sim.truth(0).energy_mj
                sim.run_work(0, _hz(sim) * seconds)
                e1 = sim.truth(0).energy_mj
            got.append(((e1 - e0) / 1e3, m))
    return [judge(m.telemetry, truth_j) for truth_j, m in got]


def lone_region(profile: str, seconds: float, phase_s: float) -> list[Row]:
    """One region from an idle GPU (0.15 s of idle after the warm-up, as a user's first)."""
    return measure_loop(profile, seconds, 1, phase_s + 0.15, mode="burst")


WAITED: list[float] = []  # virtual seconds each of a call's power-sample waits took


@contextmanager
def _timed_waits() -> Iterator[None]:
    """Within: each `Sampler.await_power`'s virtual time is added to `WAITED`."""
    real = Sampler.await_power

    def wait(self: Sampler, *args: Any, **kwargs: Any) -> bool:
        t = self.clock.now()
        try:
            return real(self, *args, **kwargs)
        finally:
            WAITED.append(self.clock.now() - t)

    WAITED.clear()
    Sampler.await_power = wait  # type: ignore[method-assign]
    try:
        yield
    finally:
        Sampler.await_power = real  # type: ignore[method-assign]


def _kernel(sim: SimBackend, seconds: float, log: dict[float, float]) -> Callable[[], None]:
    """`seconds` of work at the top clock, the simulator's counter logged at each edge."""

    def kernel() -> None:
        log[sim.clock.now()] = sim.truth(0).energy_mj
        sim.run_work(0, seconds * _hz(sim))
        log[sim.clock.now()] = sim.truth(0).energy_mj

    kernel.__name__ = f"k{seconds * 1e3:g}ms"
    return kernel


def _logged(w: Window, log: dict[float, float]) -> Row:
    """A window whose edges are kernel edges, against the counter logged there."""
    return judge(w, (log[w.t1] - log[w.t0]) / 1e3)


@dataclass(frozen=True)
class Call:
    """A bench or Timer call: its whole span, its last rep (a bench's), its waits (ms)."""

    call: Row
    last: Row | None
    wait_ms: float


def bench_case(profile: str, phase_s: float, condition: str, rep_ms: float, reps: int) -> Call:
    """A standalone `gpuenv.bench` call of `reps` reps of `rep_ms` on a cool GPU."""
    sim = _sim(profile, 10.0 + phase_s)
    log: dict[float, float] = {}
    with _timed_waits():
        m = bench(
            _kernel(sim, rep_ms / 1e3, log),
            backend=sim,
            device=SimDevice(sim, 0),
            reps=reps,
            condition=condition,
        )
    assert m.telemetry is not None
    return Call(_logged(m.telemetry, log), _logged(m.windows[-1], log), sum(WAITED) * 1e3)


def timer_case(profile: str, phase_s: float, ms: float) -> Call:
    """The torch Timer adapter's call of `ms` of 10 ms kernels back to back."""
    from gpuenv.integrations.torch_record import observe

    sim = _sim(profile, 10.0 + phase_s)
    log: dict[float, float] = {}
    kernel = _kernel(sim, 0.01, log)
    with _timed_waits():
        _, rec = observe(lambda: [kernel() for _ in range(round(ms / 10))], backend=sim)
    return Call(_logged(Window.from_dict(rec["telemetry"][0]), log), None, sum(WAITED) * 1e3)


def _span(rows: list[Row]) -> str:
    lo, hi = min(r.span_s for r in rows), max(r.span_s for r in rows)
    return _s(lo) if _s(lo) == _s(hi) else f"{_s(lo)}-{_s(hi)}"


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.3g} s"


def _worst(rows: list[Row]) -> str:
    unmarked = [r.err_pct for r in rows if not r.marked]
    if not unmarked:
        return "all marked"
    worst = max(unmarked, key=abs)
    return f"{worst:+.2f}%" + (" !" if abs(worst) > TOL_PCT else "")


def _cells(rows: list[Row]) -> list[str]:
    """A case's cells for one profile: worst unmarked error, marked of all (and how far
    the worst of those read: an estimate, not a figure within 2%), outside."""
    marked = [r.err_pct for r in rows if r.marked]
    outside = sum(not r.inside for r in rows)
    estimates = f"{len(marked)} of {len(rows)}"
    if marked:
        estimates += f" ({max(marked, key=abs):+.1f}%)"
    return [_worst(rows), estimates, str(outside)]


Cases = dict[str, dict[str, list[Row]]]  # case -> profile -> its regions


def _table(family: str, cases: Cases, profiles: list[str]) -> None:
    print(f"\n{family}:\n")
    heads = [
        f"{p.upper()} {h}" for p in profiles for h in ("worst unmarked", "~ (worst)", "outside")
    ]
    print("| case | span | " + " | ".join(heads) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in heads) + " |")
    for case, by_profile in cases.items():
        every = [r for rows in by_profile.values() for r in rows]
        cells = [c for p in profiles for c in _cells(by_profile[p])]
        print(f"| {case} | {_span(every)} | " + " | ".join(cells) + " |")


def _lone(args: argparse.Namespace) -> Cases:
    return {
        _s(s): {p: [r for ph in args.phases for r in lone_region(p, s, ph)] for p in args.profiles}
        for s in LONE_S
    }


def _burst_loops(args: argparse.Namespace) -> Cases:
    return {
        f"{BURST_LOOP_STEPS} x {_s(s)}": {
            p: [
                r
                for ph in args.phases
                for r in measure_loop(p, s, BURST_LOOP_STEPS, ph, mode="burst")
            ]
            for p in args.profiles
        }
        for s in BURST_LOOP_S
    }


def _back_to_back(args: argparse.Namespace) -> Cases:
    out: Cases = {}
    for lo, hi in BANDS:
        lengths = [ms for ms in args.ms if lo <= ms <= hi]
        if not lengths:
            continue
        case = f"{args.steps} x {lo}-{hi} ms ({len(lengths)} lengths)"
        out[case] = {
            p: [
                r
                for ms in lengths
                for ph in args.phases
                for r in measure_loop(p, ms / 1e3, args.steps, ph)
            ]
            for p in args.profiles
        }
    return out


def _bench_calls(args: argparse.Namespace) -> Cases:
    out: Cases = {}
    for condition, rep_ms, reps in BENCH:
        case = f"{condition}, {rep_ms} ms reps" if condition == "burst" else "sustained, 0.2 s reps"
        for p in args.profiles:
            calls = [bench_case(p, ph, condition, rep_ms, reps) for ph in args.phases]
            for part, rows in (
                ("the call", [c.call for c in calls if c.call is not None]),
                ("its last rep", [c.last for c in calls if c.last is not None]),
            ):
                out.setdefault(f"{case}: {part}", {}).setdefault(p, []).extend(rows)
    return out


def _timer_calls(args: argparse.Namespace) -> Cases:
    return {
        _s(ms / 1e3): {p: [timer_case(p, ph, ms).call for ph in args.phases] for p in args.profiles}
        for ms in TIMER_MS
    }


FAMILIES: list[tuple[str, Callable[[argparse.Namespace], Cases]]] = [
    ("lone regions (`env.measure`, from idle)", _lone),
    (f"burst-mode loops ({BURST_LOOP_STEPS} `env.measure` steps)", _burst_loops),
    ("back-to-back steps (sustained mode), by length band", _back_to_back),
    (
        "`gpuenv.bench` calls (the whole call and its last rep), by mode and rep length",
        _bench_calls,
    ),
    ("Timer calls (10 ms kernels back to back)", _timer_calls),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profiles", nargs="+", default=["h100", "h200"])
    parser.add_argument(
        "--phases", nargs="+", type=float, default=PHASES, help="idle (s) added before each case"
    )
    parser.add_argument(
        "--ms", nargs="+", type=float, default=STEP_MS, help="back-to-back steps' lengths"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="steps of a back-to-back loop")


def run(args: argparse.Namespace) -> int:
    print(
        f"Each region's energy against the simulator's own counter, on virtual time, at "
        f"{len(args.phases)} phase(s) of the power-sample stamps. Per case and profile: the "
        f"worst error of a region not marked `~` (`!` past {TOL_PCT:g}%), how many are "
        f"marked `~` of how many (and the worst of those: an estimate, which the 2% goal "
        f"does not cover), and how many had a mean power outside 0..its max. A "
        f"case's length is its work at the top clock; the spans are the judged regions' "
        f"as measured (the power cap slows the longer ones; a bench call's span and its "
        f"last rep's both)."
    )
    summary: list[tuple[str, str, list[Row]]] = []
    for family, cases_of in FAMILIES:
        cases = cases_of(args)
        _table(family, cases, args.profiles)
        for p in args.profiles:
            summary.append((family.split(" (")[0], p, [r for c in cases.values() for r in c[p]]))
    print("\nBy family:\n")
    print("| family | profile | regions | marked ~ | worst unmarked | unmarked over 2% | outside |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for family, p, rows in summary:
        over = sum(r.flagged for r in rows)
        outside = sum(not r.inside for r in rows)
        marked = sum(r.marked for r in rows)
        print(
            f"| {family} | {p.upper()} | {len(rows)} | {marked} | {_worst(rows)} | {over} | "
            f"{outside} |"
        )
    every = [r for *_, rows in summary for r in rows]
    unmarked = [abs(r.err_pct) for r in every if not r.marked]
    over = sum(r.flagged for r in every)
    outside = sum(not r.inside for r in every)
    runner.metric("unmarked_over_2pct", over, "regions", slack=0.0)
    runner.metric("mean_outside_max", outside, "regions", slack=0.0)
    runner.metric("worst_unmarked_pct", max(unmarked, default=0.0), "%", slack=0.5)
    runner.metric("marked_pct", 100 * sum(r.marked for r in every) / len(every), "%", slack=2.0)
    return 1 if over or outside else 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "energy_sim",
            __doc__,
            add_arguments,
            run,
            quick={"phases": [0.0], "ms": QUICK_MS},
            sim_only=True,
            gpu="simulated NVIDIA H100 and H200 (their profiles)",
        )
    )
