#!/usr/bin/env python3
"""Each step's energy in a loop of back-to-back `env.measure` steps against the simulator's
own energy counter, on virtual time (no GPU; issue 44 item 2).

For each profile and step length, a `stable(mode="sustained")` session (nothing waits
between steps) runs `--steps` steps of that many ms of work at the top clock, each in its
own region, and prints, per step, its error against the simulator's counter (%) and
whether its energy is marked an estimate (`~`). A step whose error is over `--tol` and
unmarked is flagged `!`: the goal is that none is.

    python3 scripts/sweep_step_energy.py                       # h100 and h200, 10-60 ms
    python3 scripts/sweep_step_energy.py --profiles h100 --ms 26 27 28 29 32 -v
"""

from __future__ import annotations

import argparse
import io
import sys

from gpuenv.backend.sim import SimBackend
from gpuenv.session import stable
from gpuenv.timebase import VirtualClock

HZ = {"h100": 1980e6, "h200": 1980e6}  # SM cycles per second at the top clock


def sweep(profile: str, ms: float, steps: int, phase_s: float) -> list[tuple[float, bool, bool]]:
    """[(error %, marked ~, mean within min..max)] of each step of one loop."""
    sim = SimBackend(profile, clock=VirtualClock())
    out = []
    with stable(backend=sim, mode="sustained", progress=io.StringIO()) as env:
        sim.open_context(0)
        sim.idle(0.5 + phase_s)
        got = []
        for _ in range(steps):
            with env.measure("step") as m:
                e0 = sim.truth(0).energy_mj
                sim.run_work(0, HZ[profile] * ms / 1e3)
                e1 = sim.truth(0).energy_mj
            got.append(((e1 - e0) / 1e3, m))
    for truth_j, m in got:
        w = m.telemetry
        err = (w.energy_j / truth_j - 1) * 100
        inside = 0 < w.power_w_mean <= w.power_w_max
        out.append((err, bool(w.energy_interpolated), inside))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", nargs="+", default=["h100", "h200"])
    p.add_argument("--ms", nargs="+", type=float, default=list(range(10, 61)))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument(
        "--phases",
        nargs="+",
        type=float,
        default=[0.0, 0.007, 0.013],
        help="idle (s) added before the loop: where the stamps fall",
    )
    p.add_argument("--tol", type=float, default=2.0, help="%% an unmarked step may be off")
    p.add_argument("-v", "--verbose", action="store_true", help="every step's error")
    args = p.parse_args()
    bad = 0
    for profile in args.profiles:
        for ms in args.ms:
            errs: list[tuple[float, bool, bool]] = []
            for phase in args.phases:
                errs += sweep(profile, ms, args.steps, phase)
            unmarked = [e for e, marked, _ in errs if not marked]
            worst = max(unmarked, key=abs) if unmarked else float("nan")
            flagged = sum(1 for e, marked, _ in errs if not marked and abs(e) > args.tol)
            outside = sum(1 for *_, ok in errs if not ok)
            bad += flagged + outside
            line = (
                f"{profile} {ms:5.1f} ms: worst unmarked {worst:+6.2f}%  "
                f"marked {sum(m for _, m, _ in errs):2d}/{len(errs)}  "
                f"over {args.tol:g}% unmarked {flagged}  mean outside max {outside}"
            )
            if args.verbose:
                line += "\n   " + " ".join(
                    f"{e:+.2f}{'~' if m else ('!' if abs(e) > args.tol else '')}"
                    for e, m, _ in errs
                )
            print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
