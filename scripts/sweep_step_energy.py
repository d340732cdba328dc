#!/usr/bin/env python3
"""Each step's energy in a loop of back-to-back `env.measure` steps against the simulator's
own energy counter, on virtual time (no GPU), printed step by step.

For each profile and step length, a `stable(mode="sustained")` session (nothing waits
between steps) runs `--steps` steps of that many ms of work at the top clock, each in its
own region, and prints, per length, the worst error of an unmarked step against the
simulator's counter (%) and how many are marked an estimate (`~`); with -v every step's.
A step whose error is over 2% and unmarked is flagged `!`: the goal is that none is. The
cases and their judging are benchmarks/energy_sim.py's (`python -m benchmarks.energy_sim`
keeps their summary for the docs); this prints them one by one.

    python3 scripts/sweep_step_energy.py                       # h100 and h200, 10-60 ms
    python3 scripts/sweep_step_energy.py --profiles h100 --ms 26 27 28 29 32 -v
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.energy_sim import PHASES, STEPS, TOL_PCT, measure_loop


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", nargs="+", default=["h100", "h200"])
    p.add_argument("--ms", nargs="+", type=float, default=list(range(10, 61)))
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument(
        "--phases", nargs="+", type=float, default=PHASES, help="idle (s) added before the loop"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="every step's error")
    args = p.parse_args()
    bad = 0
    for profile in args.profiles:
        for ms in args.ms:
            rows = [
                r for ph in args.phases for r in measure_loop(profile, ms / 1e3, args.steps, ph)
            ]
            unmarked = [r.err_pct for r in rows if not r.marked]
            worst = max(unmarked, key=abs) if unmarked else float("nan")
            flagged = sum(r.flagged for r in rows)
            outside = sum(not r.inside for r in rows)
            bad += flagged + outside
            line = (
                f"{profile} {ms:5.1f} ms: worst unmarked {worst:+6.2f}%  "
                f"marked {sum(r.marked for r in rows):2d}/{len(rows)}  "
                f"over {TOL_PCT:g}% unmarked {flagged}  mean outside max {outside}"
            )
            if args.verbose:
                line += "\n   " + " ".join(
                    f"{r.err_pct:+.2f}{'~' if r.marked else ('!' if r.flagged else '')}"
                    for r in rows
                )
            print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
