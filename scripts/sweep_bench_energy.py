#!/usr/bin/env python3
"""The energy and mean power of a standalone `gpuenv.bench` call and of the torch Timer
adapter's call (`integrations.torch_record.observe`) against the simulator's own energy
counter over the same span, on virtual time (no GPU, no torch; issue 44 item 2).

For each profile, mode and length, a bench of `reps` reps of a kernel of `rep_ms`
(burst: 10 ms to ~10 s of reps, in bursts with rests between; sustained: reps of 0.2 s
back to back) and a Timer call of that many ms of the kernel back to back print the
whole call's error against the simulator's counter (%), whether its energy is marked an
estimate (`~`), whether its mean power lies within 0..max, the last rep's error, and how
long the call waited for the driver's power sample after it (virtual ms). An error over
`--tol` unmarked is flagged `!`: the goal is that none is.

    python3 scripts/sweep_bench_energy.py                  # h100 and h200, every case
    python3 scripts/sweep_bench_energy.py --profiles h200 --phases 0 0.013
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gpuenv.backend.sim import SimBackend
from gpuenv.telemetry import Sampler, Window
from gpuenv.timebase import VirtualClock
from gpuenv.timing import bench
from gpuenv.timing.devices import SimDevice

# (condition, rep ms, reps): burst spans of ~10 ms to ~10 s of reps; sustained reps of 0.2 s
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
TIMER_MS = [10, 30, 100, 300, 1000, 3000, 10000]  # a Timer call's kernels back to back

WAITED: list[float] = []  # virtual seconds each await_power took


def _timed_wait(real: Callable[..., bool]) -> Callable[..., bool]:
    def wait(self: Sampler, *args: object, **kwargs: object) -> bool:
        t = self.clock.now()
        try:
            return real(self, *args, **kwargs)
        finally:
            WAITED.append(self.clock.now() - t)

    return wait


Sampler.await_power = _timed_wait(Sampler.await_power)  # type: ignore[method-assign]


def _sim(profile: str, phase_s: float) -> SimBackend:
    sim = SimBackend(profile, clock=VirtualClock())
    sim.open_context(0)
    sim.idle(10.0 + phase_s)
    return sim


def _kernel(sim: SimBackend, seconds: float, log: dict[float, float]) -> Callable[[], None]:
    """`seconds` of work at the top clock, the simulator's counter logged at each edge."""
    hz = sim.clock_limits(0).max_sm_mhz * 1e6

    def kernel() -> None:
        log[sim.clock.now()] = sim.truth(0).energy_mj
        sim.run_work(0, seconds * hz)
        log[sim.clock.now()] = sim.truth(0).energy_mj

    kernel.__name__ = f"k{seconds * 1e3:g}ms"
    return kernel


def _row(w: Window, log: dict[float, float]) -> tuple[float, bool, bool]:
    """(error %, marked ~, mean within 0..max) of one window against the counter."""
    truth_j = (log[w.t1] - log[w.t0]) / 1e3
    assert w.energy_j is not None and w.power_w_mean is not None and w.power_w_max is not None
    inside = 0 < w.power_w_mean <= w.power_w_max
    return (w.energy_j / truth_j - 1) * 100, bool(w.energy_interpolated), inside


def bench_case(profile: str, phase: float, condition: str, rep_ms: float, reps: int) -> dict:
    sim = _sim(profile, phase)
    log: dict[float, float] = {}
    WAITED.clear()
    m = bench(
        _kernel(sim, rep_ms / 1e3, log),
        backend=sim,
        device=SimDevice(sim, 0),
        reps=reps,
        condition=condition,
    )
    w = m.telemetry
    assert w is not None
    err, marked, inside = _row(w, log)
    last, last_marked, _ = _row(m.windows[-1], log)
    return {
        "span_s": w.duration_s,
        "err": err,
        "marked": marked,
        "inside": inside,
        "last": last,
        "last_marked": last_marked,
        "wait_ms": sum(WAITED) * 1e3,
    }


def timer_case(profile: str, phase: float, ms: float) -> dict:
    from gpuenv.integrations.torch_record import observe

    sim = _sim(profile, phase)
    log: dict[float, float] = {}
    kernel = _kernel(sim, 0.01, log)
    WAITED.clear()
    _, rec = observe(lambda: [kernel() for _ in range(round(ms / 10))], backend=sim)
    w = Window.from_dict(rec["telemetry"][0])
    err, marked, inside = _row(w, log)
    return {
        "span_s": w.duration_s,
        "err": err,
        "marked": marked,
        "inside": inside,
        "wait_ms": sum(WAITED) * 1e3,
    }


def _cell(err: float, marked: bool, tol: float) -> str:
    return f"{err:+.1f}{'~' if marked else ('!' if abs(err) > tol else '')}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", nargs="+", default=["h100", "h200"])
    p.add_argument(
        "--phases",
        nargs="+",
        type=float,
        default=[0.0, 0.007, 0.013],
        help="idle (s) added before the call: where the stamps fall",
    )
    p.add_argument("--tol", type=float, default=2.0, help="%% an unmarked call may be off")
    args = p.parse_args()
    bad = 0
    for profile in args.profiles:
        for condition, rep_ms, reps in BENCH:
            got = [bench_case(profile, ph, condition, rep_ms, reps) for ph in args.phases]
            bad += sum(
                (not g["marked"] and abs(g["err"]) > args.tol)
                + (not g["last_marked"] and abs(g["last"]) > args.tol)
                + (not g["inside"])
                for g in got
            )
            print(
                f"{profile} bench {condition:9s} {rep_ms:4g} ms x{reps:<3d} "
                f"span {got[0]['span_s']:7.3f} s  call "
                + " ".join(_cell(g["err"], g["marked"], args.tol) for g in got)
                + "  last rep "
                + " ".join(_cell(g["last"], g["last_marked"], args.tol) for g in got)
                + f"  mean outside max {sum(not g['inside'] for g in got)}"
                + f"  wait {max(g['wait_ms'] for g in got):4.1f} ms",
                flush=True,
            )
        for ms in TIMER_MS:
            got = [timer_case(profile, ph, ms) for ph in args.phases]
            bad += sum(
                (not g["marked"] and abs(g["err"]) > args.tol) + (not g["inside"]) for g in got
            )
            print(
                f"{profile} timer {ms / 1e3:8.2f} s of 10 ms kernels  call "
                + " ".join(_cell(g["err"], g["marked"], args.tol) for g in got)
                + f"  mean outside max {sum(not g['inside'] for g in got)}"
                + f"  wait {max(g['wait_ms'] for g in got):4.1f} ms",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
