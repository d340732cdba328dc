"""A ranking of few-us kernels: timed by CUDA events, or by CUPTI as gpuenv.rank now times
candidates under TINY_REP_S. Which decisions, their regret, and what CUPTI costs the wall.

On an H200 (issue 43, read-only) a ranking's events read cuBLAS's 1024^3 fp16 mm at one
of two levels, 8.62 or 9.60 us, where CUPTI read 6.05-6.16 us (benchmarks/call_levels.py).
Under Inductor's max-autotune a Triton template 6% slower by the careful passes then won
one ranking in 6, and two more declared it tied. gpuenv.rank now times every call of a
ranking whose first call reads under TINY_REP_S by CUPTI (mode "auto"). This ranks, in
one process, alternately by events (`mode="events"`: the ranking before) and by the
default, the same four candidates: the 1024^3 fp16 mm, the same work through another
callable (a tie: the first in the order given is the one choice), and the mm with K 3%
and 6% longer. Each candidate's device time from CUPTI (200 calls, L2 flushed before
each) is the reference for regret, taken before and after the rankings. Per method: the
distinct decisions (goal: one in 95%), regret (goal <= 0.5%), the ranking's wall and a
call's, and what a tuner's times add to the device times (`Ranking.events_offset_s`).
Read-only (GPUENV_READONLY=1); about 1 minute on an H200 at the defaults.

    GPUENV_READONLY=1 python -m benchmarks.rank_tiny [--rankings 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import runner
from benchmarks.autotune_rank import choice_cells, choice_metrics, choices

if TYPE_CHECKING:
    from gpuenv.timing.rank import Ranking

HOWS = ("events", "cupti")  # rank(mode="events"), and rank's default (CUPTI under 20 us)


def candidates(torch: Any) -> dict[str, Any]:
    """name -> one call's work (CUDA), in the order a tie is broken in."""
    half = torch.float16
    out = torch.empty(1024, 1024, device="cuda", dtype=half)
    b = torch.randn(1088, 1024, device="cuda", dtype=half)
    a = torch.randn(1024, 1088, device="cuda", dtype=half)
    a1, b1 = a[:, :1024].contiguous(), b[:1024].contiguous()
    a3, b3 = a[:, :1056].contiguous(), b[:1056].contiguous()
    return {
        "mm K=1024": lambda: torch.mm(a1, b1, out=out),
        "mm K=1024, another callable": lambda: torch.mm(a1, b1, out=out),
        "mm K=1056": lambda: torch.mm(a3, b3, out=out),
        "mm K=1088": lambda: torch.mm(a, b, out=out),
    }


def row(how: str, r: Ranking) -> dict[str, Any]:
    """One ranking as the report reads it."""
    calls = sum(c.rounds for c in r.candidates)
    return {
        "how": how,
        "winner": r.winner,
        "tied": list(r.tied),
        "rounds": r.rounds,
        "calls": calls,
        "wall_s": r.wall_s,
        "method": r.method,
        "events_offset_s": r.events_offset_s,
    }


def report(rows: Sequence[dict[str, Any]], device: dict[str, float]) -> None:
    """Per method: choices against the device times (s), the walls; the metrics."""
    best = min(device, key=device.__getitem__)
    print("| candidate | device time (CUPTI) | against the best |")
    print("| --- | ---: | ---: |")
    for n in sorted(device, key=device.__getitem__):
        print(f"| {n} | {device[n] * 1e6:.2f} us | {device[n] / device[best] - 1:+.2%} |")
    print()
    print(
        "| timed by | rankings | distinct winners | most common (share) | ties declared | "
        "distinct decisions (most common) | regret median | regret max | wall median | "
        "a call (median) | rounds median | events offset median |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    walls = {}
    for how in HOWS:
        mine = [r for r in rows if r["how"] == how]
        if not mine:
            continue
        s = choices(mine, device)
        walls[how] = statistics.median(r["wall_s"] for r in mine)
        per_call = statistics.median(r["wall_s"] / r["calls"] for r in mine)
        rounds = statistics.median(r["rounds"] for r in mine)
        offset = statistics.median(r.get("events_offset_s", 0.0) for r in mine)
        print(
            f"| {how} | {choice_cells(s)} | {walls[how]:.2f} s | {per_call * 1e3:.1f} ms "
            f"| {rounds:g} | {offset * 1e6:.2f} us |"
        )
        if how == "cupti":
            choice_metrics("cupti", s)
    print()
    methods = sorted({r["method"] for r in rows if r["how"] == "cupti"})
    if methods:
        print(f"By the default, the calls timed: {'; '.join(methods)}.")
        print()
    if "events" in walls and "cupti" in walls and walls["events"] > 0:
        ratio = walls["cupti"] / walls["events"]
        print(f"A ranking by CUPTI took {ratio:.2f}x one by events.")
        print()
        runner.metric("ranking wall cupti / events", ratio, "x", slack=0.2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rankings", type=int, default=10, help="rankings per method (10)")


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print("CUPTI and CUDA events are a real GPU's: --sim has nothing", file=sys.stderr)
        return 2
    import torch

    import gpuenv
    from gpuenv.timing.cuda import cupti_median_s

    cands = candidates(torch)

    def device_times() -> dict[str, float]:
        return {n: cupti_median_s(fn, flush_l2=True) for n, fn in cands.items()}

    before = device_times()
    rows = []
    for i in range(args.rankings):
        for how in HOWS if i % 2 == 0 else HOWS[::-1]:  # each method first in half
            r = gpuenv.rank(cands, **({"mode": "events"} if how == "events" else {}))
            rows.append(row(how, r))
    after = device_times()
    device = {n: statistics.median([before[n], after[n]]) for n in cands}
    drift = max(abs(after[n] / before[n] - 1) for n in cands)
    print(f"Device times moved by at most {drift:.2%} from before the rankings to after.")
    print()
    report(rows, device)
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("rank_tiny", __doc__, add_arguments, run, quick={"rankings": 2}))
