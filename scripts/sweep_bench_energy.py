#!/usr/bin/env python3
"""The energy and mean power of a standalone `gpuenv.bench` call and of the torch Timer
adapter's call (`integrations.torch_record.observe`) against the simulator's own energy
counter over the same span, on virtual time (no GPU, no torch), printed call by call.

For each profile, mode and length (benchmarks/energy_sim.py's BENCH and TIMER_MS: bursts
of 10 ms to ~34 s of reps with rests between, sustained reps of 0.2 s back to back, Timer
calls of 10 ms to 10 s of a 10 ms kernel), it prints the whole call's error against the
simulator's counter (%) at each phase, whether its energy is marked an estimate (`~`), the
last rep's error, how many mean powers lay outside 0..max, and how long the call waited
for the driver's power sample after it (virtual ms). An error over 2% unmarked is flagged
`!`: the goal is that none is. `python -m benchmarks.energy_sim` keeps the summary of the
same cases for the docs; this prints them one by one.

    python3 scripts/sweep_bench_energy.py                  # h100 and h200, every case
    python3 scripts/sweep_bench_energy.py --profiles h200 --phases 0 0.013
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.energy_sim import (
    BENCH,
    PHASES,
    TIMER_MS,
    Call,
    Row,
    bench_case,
    timer_case,
)


def _cell(r: Row) -> str:
    return f"{r.err_pct:+.1f}{'~' if r.marked else ('!' if r.flagged else '')}"


def _tail(calls: list[Call]) -> str:
    outside = sum(not r.inside for c in calls for r in (c.call, c.last) if r is not None)
    return f"  mean outside max {outside}  wait {max(c.wait_ms for c in calls):4.1f} ms"


def _bad(calls: list[Call]) -> int:
    rows = [r for c in calls for r in (c.call, c.last) if r is not None]
    return sum(r.flagged + (not r.inside) for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", nargs="+", default=["h100", "h200"])
    p.add_argument(
        "--phases", nargs="+", type=float, default=PHASES, help="idle (s) added before the call"
    )
    args = p.parse_args()
    bad = 0
    for profile in args.profiles:
        for condition, rep_ms, reps in BENCH:
            got = [bench_case(profile, ph, condition, rep_ms, reps) for ph in args.phases]
            bad += _bad(got)
            print(
                f"{profile} bench {condition:9s} {rep_ms:4g} ms x{reps:<3d} "
                f"span {got[0].call.span_s:7.3f} s  call "
                + " ".join(_cell(g.call) for g in got)
                + "  last rep "
                + " ".join(_cell(g.last) for g in got if g.last is not None)
                + _tail(got),
                flush=True,
            )
        for ms in TIMER_MS:
            got = [timer_case(profile, ph, ms) for ph in args.phases]
            bad += _bad(got)
            print(
                f"{profile} timer {ms / 1e3:8.2f} s of 10 ms kernels  call "
                + " ".join(_cell(g.call) for g in got)
                + _tail(got),
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
