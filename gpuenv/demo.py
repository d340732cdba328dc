"""`gpuenv demo`: why the same kernel, measured twice, gives two different numbers.

Two tours, both read-only:

  - `sim_tour`: on a simulated GPU running on virtual time (so 45 simulated
    seconds take milliseconds; printing is paced for people to follow): the idle
    clock, a CUDA context boosting it, a kernel timed cold, a sustained load
    meeting the power cap as the chip heats, the same kernel timed hot, and the
    recovery after a rest. Every number comes from the simulator's model.
  - `real_tour`: on a real GPU, through a read-only backend: what state the GPU is
    in now, a few seconds of telemetry, and what `gpuenv doctor` thinks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

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
from gpuenv.errors import GpuenvError

Out = Callable[[str], None]

# A matmul-like kernel: SM-bound cycles plus memory-bound cycles, sized so that it
# takes ~1.37 ms at 1980 MHz like an 8192^3 bf16 matmul on an H100 (GPU_FACTS.md).
KERNEL_SM_CYCLES = 1.138e6
KERNEL_MEM_CYCLES = 2.08e6


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


def sim_tour(
    out: Out = print, *, pace: float = 0.3, profile: str = "h100", seconds: float = 30.0
) -> dict:
    """The whole story on a simulated GPU. Returns the numbers it printed (for tests)."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    say = _Pacer(out, pace)
    clock = VirtualClock()
    sim = SimBackend(profile, clock=clock)  # in memory: touches no state file
    try:
        info = sim.device_info(0)
        limits = sim.clock_limits(0)
        power = sim.power_limits(0)

        def kernel() -> float:
            return sim.run_work(0, KERNEL_SM_CYCLES, mem_cycles=KERNEL_MEM_CYCLES) * 1e3

        t0 = clock.now()
        say(f"gpuenv demo on a simulated {info.name} (virtual time; every number is the model's)")
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
            say(
                "   The chip reached its temperature limit, so the driver slowed it down (thermal)."
            )
        if not seen & ~REASON_GPU_IDLE:
            say("   Nothing held the clock down this time.")
        slower = (hot / cold - 1) * 100
        say()
        say(f"4. The same kernel, timed again right now: {hot:.2f} ms ({slower:+.0f}%).", pause=2)
        say(
            f"   Same code, same GPU: only the GPU's state changed. The clock went from "
            f"{boosted.sm_mhz} to {last.sm_mhz} MHz"
        )
        say(
            f"   ({_reasons(seen & ~REASON_GPU_IDLE)}) while the chip went from "
            f"{boosted.temp_c:.0f} to {last.temp_c:.0f} C. A benchmark that runs"
        )
        say("   first looks fast; one that runs after another looks slow.", pause=2)
        say()
        sim.idle(5.0)
        rested_reading = sim.read_fast(0)
        rested = kernel()
        say("5. Five seconds of rest: the cap lets go and the clock comes back.")
        say(_row(clock.now() - t0, rested_reading))
        say(f"   The kernel takes {rested:.2f} ms again.", pause=2)
        say()
        say("What gpuenv does about it:")
        say("  gpuenv lock --sm 1350     lock a clock the sustained load can hold, restore after")
        say("  gpuenv status / doctor    see the state, and what in this machine will skew numbers")
        say("  gpuenv.stable(...)        attach clocks, power, temperature and reasons to every")
        say("                            measurement, and flag the ones a ramp or a cap touched")
        return {
            "idle_mhz": idle.sm_mhz,
            "boost_mhz": boosted.sm_mhz,
            "cold_ms": cold,
            "hot_ms": hot,
            "rested_ms": rested,
            "rows": [(t, r.sm_mhz, r.power_w, r.temp_c, r.reasons) for t, r in rows],
        }
    finally:
        sim.close()


def real_tour(
    backend: Backend,
    gpus: Sequence[int],
    out: Out = print,
    *,
    pace: float = 0.3,
    seconds: float = 3.0,
) -> dict:
    """Read-only: the GPUs' state now, a few seconds of telemetry, and doctor's findings."""
    from gpuenv.doctor import diagnose
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
    limits = backend.clock_limits(index)
    say(f"2. GPU {index} over {seconds:.0f} s, read every 100 ms (as gpuenv samples during a run):")
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
        if seen & 0x1:
            say(
                "   GpuIdle: no process holds a CUDA context, so the clock is parked; the first "
                "kernel of a benchmark runs before it has boosted."
            )
    say()
    checks = diagnose(backend, gpus)
    worth = [c for c in checks if c.severity in ("warning", "error")]
    things = f"{len(worth)} thing{'s' if len(worth) != 1 else ''}"
    say(f"3. gpuenv doctor: {things} that can skew numbers here")
    for c in worth:
        say(f"   - {c.message}", pause=0.5)
    say()
    say("To see what a sustained load does to the clock (without touching this GPU):")
    say("  gpuenv demo --sim")
    return {"gpus": list(gpus), "readings": len(readings), "warnings": len(worth)}
