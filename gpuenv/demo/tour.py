"""`gpuenv demo`: why the same kernel, measured twice, gives two different numbers.

Two tours:

  - `sim_tour`: on a simulated GPU running on virtual time (so minutes of
    simulated load take a second; printing is paced for people to follow): the
    idle clock, a CUDA context boosting it, a kernel timed cold, a sustained
    load meeting the power cap as the chip heats, the same kernel timed hot.
    Then the kernel measured cold and hot four ways: naively (do_bench-like),
    with `gpuenv.bench` in burst and in sustained mode, and with clocks locked
    (the simulated GPU allows it; restored afterwards), in one table that says
    why the numbers differ. Every number comes from the simulator's model.
  - `real_tour`: on a real GPU, through a read-only backend (no setting is
    changed, clocks are never locked): the GPU's state now; with torch and CUDA,
    an 8192x8192 bf16 matmul measured cold and hot, naively and with gpuenv in
    burst mode, with the same kind of table; without torch, a few seconds of
    telemetry instead. Then what `gpuenv doctor` thinks.

The measuring itself is in measure.py.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuenv.backend import (
    REASON_GPU_IDLE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    Backend,
    FastReading,
    reason_names,
)
from gpuenv.errors import ConfigError, GpuenvError

if TYPE_CHECKING:
    from gpuenv.backend.sim import SimBackend

Out = Callable[[str], None]

# A matmul-like kernel: SM-bound cycles plus memory-bound cycles, sized so that it
# takes ~1.37 ms at 1980 MHz like an 8192^3 bf16 matmul measured on an H100
# (docs/explanation/what-gpus-do.md).
KERNEL_SM_CYCLES = 1.138e6
KERNEL_MEM_CYCLES = 2.08e6
SIM_LOAD_S = 30.0  # simulated: cheap on virtual time
SIM_REST_S = 10.0
REAL_LOAD_S = 15.0  # real seconds of matmuls before the hot measurements
REAL_REST_S = 5.0  # do_bench on an H100 after 4-5 s idle reads the uncapped time
WIDTH = 88  # explanations wrap here: a terminal, and the docs page quoting them, show it
ALIKE = 0.02  # cold and hot within this are "alike"


def _reasons(mask: int) -> str:
    return ", ".join(reason_names(mask)) or "none"


def _row(t: float, r: FastReading) -> str:
    return (
        f"  {t:5.1f} s   SM {r.sm_mhz:4d} MHz   {r.power_w:5.0f} W   {r.temp_c:3.0f} C   "
        f"reasons: {_reasons(r.reasons)}"
    )


class _Pacer:
    """Prints with a pause after each line, so a person can follow (0: no pause)."""

    def __init__(self, out: Out, pace: float):
        self.out = out
        self.pace = pace

    def __call__(self, text: str = "", pause: float = 1.0) -> None:
        self.out(text)
        if self.pace > 0 and text:
            time.sleep(self.pace * pause)


# -- the simulated GPU -------------------------------------------------------------------


def sim_tour(
    out: Out = print,
    *,
    pace: float = 0.3,
    profile: str = "h100",
    seconds: float = SIM_LOAD_S,
    rest_s: float = SIM_REST_S,
    lock_sm: int | None = None,
    backend: SimBackend | None = None,
) -> dict:
    """The whole story on a simulated GPU. Returns the numbers it printed (for tests).

    `lock_sm`: the clock to lock at (default: the one `gpuenv calibrate` finds).
    `backend`: a SimBackend on virtual time to tour (the caller keeps and closes it);
    by default a fresh in-memory one of `profile` (it never touches the state file).
    """
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    sim = backend if backend is not None else SimBackend(profile, clock=VirtualClock())
    try:
        story = _sim_story(sim, _Pacer(out, pace), seconds)
        return {**story, **_sim_ways(sim, _Pacer(out, pace), seconds, rest_s, lock_sm)}
    finally:
        if backend is None:
            sim.close()


def _sim_story(sim: Any, say: _Pacer, seconds: float) -> dict:
    clock = sim.clock
    info = sim.device_info(0)
    limits = sim.clock_limits(0)
    power = sim.power_limits(0)

    def kernel() -> float:
        return float(sim.run_work(0, KERNEL_SM_CYCLES, mem_cycles=KERNEL_MEM_CYCLES)) * 1e3

    t0 = clock.now()
    say(f"gpuenv demo on a simulated {info.name} (virtual time; the model's numbers)")
    say()
    say("1. No CUDA context yet: the driver parks the clock and says why (GpuIdle).")
    idle = sim.read_fast(0)
    say(_row(clock.now() - t0, idle))
    say()
    say("2. A process creates a CUDA context: the clock boosts to its maximum.")
    sim.open_context(0)
    sim.idle(0.3)
    boosted = sim.read_fast(0)
    say(_row(clock.now() - t0, boosted))
    cold = kernel()
    say(f"   One matmul-like kernel takes {cold:.2f} ms now.", pause=2)
    say()
    say(f"3. The same kernel back to back for {seconds:.0f} s:")
    start = clock.now()
    marks: list[float] = [1, 2, 3, 5, 10, 15, 20, 25, 30, 45, 60]
    marks = [m for m in marks if m < seconds] + [seconds]
    rows: list[tuple[float, FastReading]] = []
    for mark in marks:
        while clock.now() - start < mark:
            mhz = sim.read_fast(0).sm_mhz or limits.max_sm_mhz
            sim.run_work(0, mhz * 1e6 * min(0.5, mark - (clock.now() - start)))
        r = sim.read_fast(0)
        rows.append((clock.now() - start, r))
        say(_row(clock.now() - t0, r))
    hot = kernel()
    last = rows[-1][1]
    seen = 0
    for _, r in rows:
        seen |= r.reasons
    if seen & REASON_SW_POWER_CAP:
        say(
            f"   Power met the {power.limit_w:.0f} W cap, so the driver lowered the clock "
            "(SwPowerCap); the hotter"
        )
        say("   the chip, the more power it leaks, so the capped clock crept further down.")
    if seen & (REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN):
        say("   The chip reached its temperature limit, so the driver slowed it down (thermal).")
    if not seen & ~REASON_GPU_IDLE:
        say("   Nothing held the clock down this time.")
    slower = (hot / cold - 1) * 100
    say()
    say(f"4. The same kernel, timed again right now: {hot:.2f} ms ({slower:+.0f}%).", pause=2)
    say(
        "   Same code, same GPU: only the GPU's state changed. The clock went from "
        f"{boosted.sm_mhz} to"
    )
    say(
        f"   {last.sm_mhz} MHz ({_reasons(seen & ~REASON_GPU_IDLE)}) while the chip went from "
        f"{boosted.temp_c:.0f} to {last.temp_c:.0f} C. A benchmark"
    )
    say("   that runs first looks fast; one that runs after another looks slow.", pause=2)
    return {
        "idle_mhz": idle.sm_mhz,
        "boost_mhz": boosted.sm_mhz,
        "cold_ms": cold,
        "hot_ms": hot,
        "load_rows": [(t, r.sm_mhz, r.power_w, r.temp_c, r.reasons) for t, r in rows],
    }


def _settings(sim: Any) -> tuple:
    """Everything a lock may change, as the simulated driver really holds it."""
    t = sim.truth(0)
    return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w, t.persistence)


def _sim_ways(sim: Any, say: _Pacer, seconds: float, rest_s: float, lock_sm: int | None) -> dict:
    from gpuenv.clocks.calibration import calibrate
    from gpuenv.demo.measure import SimRig, cold_and_hot, format_table, gpuenv_way, naive
    from gpuenv.telemetry import Sampler

    rig = SimRig(
        sim, 0, sm_cycles=KERNEL_SM_CYCLES, mem_cycles=KERNEL_MEM_CYCLES, what="the kernel"
    )
    say()
    say(f"5. The same kernel measured four ways, each cold (after {rest_s:.0f} s of rest) and hot")
    say(f"   (right after {seconds:.0f} s of it back to back):")
    watch = Sampler(sim, [0], clock=sim.clock)  # gpuenv's eyes on every way, naive included
    watch.start()
    try:
        rows = cold_and_hot(
            rig,
            {
                "naive (do_bench-like)": naive,
                "gpuenv burst": gpuenv_way("burst"),
                # sustained reps are 0.2 s of calls back to back: room for 10 of them
                "gpuenv sustained": gpuenv_way("sustained", budget_s=2.5),
            },
            watch,
            rest_s=rest_s,
            load_s=seconds,
        )
        why = "the clock you asked for"
        if lock_sm is None:  # the clock a sustained load holds, less a step: as a user would
            cal = calibrate(sim, [0], save=False)[0]
            limits = sim.clock_limits(0)
            lock_sm = cal.lock_mhz or limits.base_sm_mhz or limits.max_sm_mhz
            if cal.lock_mhz is not None and cal.sustained_mhz is not None:
                why = (
                    f"the clock 'gpuenv calibrate' found a sustained load can hold (under "
                    f"load the GPU settled at {cal.sustained_mhz:.0f} MHz)"
                )
        before = _settings(sim)
        locked, lock_text = _locked_row(sim, rig, watch, lock_sm, rest_s, seconds)
        restored = _settings(sim) == before
    finally:
        watch.stop()
    rows.append(locked)
    say()
    for line in format_table(rows):
        say("   " + line, pause=0.3)
    say()
    after = (
        "the GPU's settings are back as they were"
        if restored
        else "the GPU's settings are NOT as before: a bug, please report it"
    )
    note = f"{lock_text}: {after}. Locking a real GPU needs root or 'gpuenv daemon'."
    for line in _explain(rows, why, note):
        say(line, pause=0.5)
    say()
    say("What gpuenv does about it:")
    say("  gpuenv calibrate             find the clock a sustained load holds on your GPU")
    say("  gpuenv lock --sm sustained   lock it; 'gpuenv restore' puts back what was there")
    say("  gpuenv.bench(fn)             time with telemetry on every rep: in bursts from the")
    say("                               uncapped state by default (as is when your lock holds);")
    say("                               condition='sustained' for the number a long job sees")
    say("  gpuenv status / doctor       see the state, and what in this machine skews numbers")
    return {"ways": rows, "restored": restored, "lock_sm": lock_sm}


def _locked_row(
    sim: Any, rig: Any, watch: Any, sm: int | str, rest_s: float, load_s: float
) -> tuple[Any, str]:
    """The locked way: `gpuenv.lock` on the simulated GPU, released (restored) on exit."""
    import tempfile

    from gpuenv import clocks
    from gpuenv.clocks.journal import Journal
    from gpuenv.demo.measure import cold_and_hot, gpuenv_way

    # The demo's own journal: its in-memory GPU must never appear in the user's.
    with (
        tempfile.TemporaryDirectory(prefix="gpuenv-demo-") as state,
        clocks.local_lock(sm, gpus=[0], backend=sim, journal=Journal(state), supervise=False) as lk,
    ):
        applied = lk.plan.gpus[0].applied
        if applied.locked_sm is not None:
            lo, hi = (int(v) for v in applied.locked_sm)
            how = "gpuenv.lock() locked it and then released it"
        else:  # a GPU without locked clocks: application clocks, from the next context on
            assert applied.app_clocks is not None
            lo = hi = int(applied.app_clocks[1])
            sim.close_context(0)
            sim.open_context(0)
            how = (
                "gpuenv.lock() set it as application clocks (this GPU has no locked clocks) "
                "and then released it"
            )
        name = f"locked at {lo} MHz" if lo == hi else f"locked at {lo}-{hi} MHz"
        [row] = cold_and_hot(
            rig,
            {name: gpuenv_way("none", lock_range=(lo, hi))},
            watch,
            rest_s=rest_s,
            load_s=load_s,
        )
    return row, how


def _para(label: str, text: str) -> list[str]:
    """`   label: text`, wrapped under itself at a width a terminal shows."""
    head = f"   {label}: "
    text = text.replace(" MHz", "\0MHz")  # never wrap between a number and its unit
    return [
        line.replace("\0", " ")
        for line in textwrap.wrap(
            text, width=WIDTH, initial_indent=head, subsequent_indent=" " * len(head)
        )
    ]


def _alike(row: Any) -> str:
    gap = f"{row.gap:+.1%}"
    if abs(row.gap) < ALIKE:
        return f"cold or hot alike ({gap})"
    return f"yet hot differs by {gap}: see what gpuenv saw"


def _explain(rows: Sequence[Any], lock_why: str = "", lock_note: str = "") -> list[str]:
    """A few sentences per way, from its numbers and findings."""
    from gpuenv.demo.measure import cause, saw_both

    lines = []
    for r in rows:
        c, h = r.cold.sm_mhz, r.hot.sm_mhz
        if r.way.startswith("naive"):
            why = cause(r.hot)
            if r.gap >= ALIKE and why and c is not None and h is not None:
                text = (
                    f"{r.gap:+.1%} hot, because {why} pulled the SM clock from {c:.0f} to "
                    f"{h:.0f} MHz."
                )
            elif abs(r.gap) < ALIKE:
                text = f"cold or hot alike here ({r.gap:+.1%})."
            else:
                text = f"{r.gap:+.1%} hot: see what gpuenv saw."
            if saw_both(r) != "nothing":
                text += (
                    " The naive tool reports only the number; gpuenv's sampler, watching "
                    "from the side, saw what the GPU did."
                )
            lines += _para("naive", text)
        elif r.way == "gpuenv burst":
            at = f" at {h:.0f} MHz" if h is not None else ""
            lines += _para(
                "burst",
                "short bursts, each started once the GPU is uncapped and "
                f"ended before the driver cuts the clock: the kernel{at}, "
                f"{_alike(r)}.",
            )
        elif r.way == "gpuenv sustained":
            cold, hot = r.cold.precondition, r.hot.precondition
            pre = (
                f" ({cold.seconds:.0f} s from cold, {hot.seconds:.0f} s from hot)"
                if cold is not None and hot is not None
                else ""
            )
            lines += _para(
                "sustained",
                f"the kernel runs until the GPU reaches equilibrium{pre}, "
                f"then is measured: the number a long job sees, {_alike(r)}.",
            )
        elif r.way.startswith("locked"):
            held = "lock held" in r.cold.notes and "lock held" in r.hot.notes
            if held:
                what = f": the same number whatever ran before ({r.gap:+.1%})."
            else:
                what = (
                    f", but the lock did not hold ({r.gap:+.1%}): "
                    f"{cause(r.hot) or 'something'} pulled the clock below it; lock a lower "
                    "clock ('gpuenv calibrate' finds one)."
                )
            lines += _para("locked", f"{lock_why or 'a locked clock'}{what} {lock_note}".rstrip())
    return lines


# -- a real GPU (read-only) --------------------------------------------------------------


def real_tour(
    backend: Backend,
    gpus: Sequence[int],
    out: Out = print,
    *,
    pace: float = 0.3,
    seconds: float = 3.0,
    load_s: float = REAL_LOAD_S,
    rest_s: float = REAL_REST_S,
    make_rig: Callable[[Backend, int], Any] | None = None,
) -> dict:
    """Read-only: the GPUs' state now, the kernel measured cold and hot (with torch and
    CUDA) or `seconds` of telemetry (without), and doctor's findings.

    `make_rig(backend, gpu)` makes what runs the kernel (default: `TorchRig`, an
    8192x8192 bf16 matmul); a ConfigError, RuntimeError or OSError from it (no torch, no
    CUDA, a CUDA error) falls back to the telemetry tour and says why.
    """
    from gpuenv.demo.measure import TorchRig
    from gpuenv.status import format_table, snapshot

    say = _Pacer(out, pace)
    say("gpuenv demo on this machine's GPU (read-only: nothing is changed)")
    say()
    say("1. The state of each GPU now (gpuenv status):")
    snap = snapshot(backend, gpus)
    for line in format_table(snap).splitlines():
        say("   " + line, pause=0.2)
    say()
    index = gpus[0]
    result: dict[str, Any] = {"gpus": list(gpus), "readings": 0, "ways": [], "why_not": None}
    try:
        rig = (make_rig or TorchRig)(backend, index)
    except (ConfigError, RuntimeError, OSError) as err:  # CUDA errors: RuntimeError
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        result["why_not"] = why
        result["readings"] = _watch(backend, index, say, seconds)
        say()
        say(f"   To measure a kernel here, cold and hot: {why}")
    else:
        try:
            result["ways"] = _measure_real(rig, say, load_s, rest_s)
        except RuntimeError as err:  # a CUDA error mid-tour: say so, finish the tour
            why = (str(err).strip().splitlines() or [""])[0]
            result["why_not"] = f"{type(err).__name__}: {why}"
            say(f"   The measurement failed ({result['why_not']}).")
    say()
    _doctor(backend, gpus, say, result)
    say()
    say("The whole story on a simulated GPU, locked clocks included (nothing here is touched):")
    say("  gpuenv demo --sim")
    return result


def _watch(backend: Backend, index: int, say: _Pacer, seconds: float) -> int:
    limits = backend.clock_limits(index)
    say(f"2. GPU {index} over {seconds:g} s, read every 100 ms (as gpuenv samples during a run):")
    readings: list[FastReading] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            readings.append(backend.read_fast(index))
        except GpuenvError as err:
            say(f"   a read failed ({err}); gpuenv records such gaps instead of stopping")
        time.sleep(0.1)
    if readings:
        sm = [r.sm_mhz for r in readings]
        seen = 0
        for r in readings:
            seen |= r.reasons
        say(
            f"   SM clock {min(sm)}-{max(sm)} MHz (max {limits.max_sm_mhz}), power "
            f"{min(r.power_w for r in readings):.0f}-{max(r.power_w for r in readings):.0f} W, "
            f"temperature {min(r.temp_c for r in readings):.0f}-"
            f"{max(r.temp_c for r in readings):.0f} C, reasons seen: {_reasons(seen)}"
        )
        if seen & REASON_GPU_IDLE:
            say(
                "   GpuIdle: no process holds a CUDA context, so the clock is parked; the first "
                "kernel of a benchmark runs before it has boosted."
            )
    return len(readings)


def _measure_real(rig: Any, say: _Pacer, load_s: float, rest_s: float) -> list[Any]:
    from gpuenv.demo.measure import cold_and_hot, describe_load, format_table, gpuenv_way, naive
    from gpuenv.telemetry import Sampler

    what = f"{rig.what[0].upper()}{rig.what[1:]}"
    for line in textwrap.wrap(
        f"2. {what} on GPU {rig.gpu}, cold (after {rest_s:.0f} s at rest) and hot (right after "
        f"{load_s:.0f} s of them back to back), the naive way and with gpuenv.bench in burst "
        "mode. Clocks are not locked: this tour is read-only.",
        width=WIDTH,
        subsequent_indent="   ",
    ):
        say(line)
    watch = Sampler(rig.backend, [rig.gpu], clock=rig.clock)
    watch.start()
    try:
        rows = cold_and_hot(
            rig,
            {
                "naive (do_bench-like)": naive,
                "gpuenv burst": gpuenv_way("burst", budget_s=1.5, warmup_max_s=2.0),
            },
            watch,
            rest_s=rest_s,
            load_s=load_s,
            shared=True,
            progress=lambda text: say("   " + text, pause=0.2),
        )
    finally:
        watch.stop()
    say()
    say("3. The same kernel, cold and hot:")
    for line in format_table(rows):
        say("   " + line, pause=0.3)
    say()
    for line in _explain(rows):
        say(line, pause=0.5)
    if rows and rows[0].load is not None:
        for line in _para("during the load", describe_load(rows[0].load) + "."):
            say(line)
    say("   Clocks were not locked (read-only); 'gpuenv demo --sim' shows a locked clock too.")
    return rows


def _doctor(backend: Backend, gpus: Sequence[int], say: _Pacer, result: dict) -> None:
    from gpuenv.doctor import diagnose

    checks = diagnose(backend, gpus)
    worth = [c for c in checks if c.severity in ("warning", "error")]
    things = f"{len(worth)} thing{'s' if len(worth) != 1 else ''}"
    say(f"{'4' if result['ways'] else '3'}. gpuenv doctor: {things} that can skew numbers here")
    for c in worth:
        say(f"   - {c.message}", pause=0.5)
    result["warnings"] = len(worth)
