"""A ranking right after heavy load: wait for a ready GPU (the default), or rank in the
capped state (`condition="none"`)?

Issue 43 asks a tuner's wall with gpuenv to be at most 1.5x the tuner's own, rested or hot.
Hot, gpuenv.rank's calls begin on a cool, uncapped GPU: after heavy load the first waits
for the power cap to clear (on an H200, 0.3-0.45 s against an Inductor selection's 0.21 s
of plain benchmarking: docs/benchmarks/inductor_rank.md), while a plain tuner times its
candidates under the cap. Passing `condition="none"` skips the wait: every candidate is
still interleaved in one state, the capped one. Here on the simulated H200 (virtual time,
each case of rank_cost.py's kernels ~0.2 ms a call), per ranking seed: one ranking rested,
and two right after `--hot-s` of heavy load, with the default and with condition="none",
each on a fresh GPU. Per variant: the decisions made, how often the best (margin 0) was
chosen or in the tie, and the ranking's wall, rounds and wait for a ready GPU, medians.

    python -m benchmarks.rank_hot [--rankings 10] [--cases close,h200,inductor]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from typing import Any

from benchmarks import runner
from benchmarks.rank_cost import CASES, _backend, _candidates, _device

VARIANTS = ("rested", "hot, the default (waits for a ready GPU)", 'hot, condition="none"')


def rank_one(variant: str, case: str, seed: int, args: argparse.Namespace) -> Any:
    """One ranking of `case` on a fresh simulated GPU, rested or after heavy load."""
    import gpuenv

    be = _backend(args.gpu_profile, 10.0)
    try:
        if variant != "rested":  # heavy load right before: the power cap on
            hz = be.clock_limits(0).max_sm_mhz * 1e6
            be.run_work(0, args.hot_s * hz, power_intensity=1.0)
        cands = _candidates(be, CASES[case], seed, args.noise)
        extra = {"condition": "none"} if "none" in variant else {}
        return gpuenv.rank(cands, backend=be, device=_device(be, 20e-6), **extra)
    finally:
        be.close()


def run(args: argparse.Namespace) -> int:
    os.environ["GPUENV_SIM_PROFILE"] = args.gpu_profile  # the runner names the GPU by it
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        print(f"unknown cases {unknown}: use some of {', '.join(CASES)}", file=sys.stderr)
        return 2
    print(
        f"Simulated {args.gpu_profile}, virtual time; {args.rankings} rankings a variant, "
        f"{args.noise:.1%} noise a call; hot: {args.hot_s:g} s of heavy load before."
    )
    print()
    print(
        "| case | variant | decisions (most common's share) | best chosen or tied "
        "| wall (median) | rounds (median) | waited for a ready GPU (median) |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for case in cases:
        best = f"+{min(CASES[case]):.2%}"
        walls: dict[str, float] = {}
        for variant in VARIANTS:
            rs = [rank_one(variant, case, i, args) for i in range(args.rankings)]
            made = Counter(r.tied if len(r.tied) > 1 else (r.winner,) for r in rs)
            share = made.most_common(1)[0][1] / len(rs)
            right = sum(best in r.tied for r in rs)
            walls[variant] = statistics.median(r.wall_s for r in rs)
            print(
                f"| {case} | {variant} | {len(made)} ({share:.0%}) | {right} of {len(rs)} "
                f"| {walls[variant]:.2f} s | {statistics.median(r.rounds for r in rs):g} "
                f"| {statistics.median(r.state.waited_s for r in rs) * 1e3:.0f} ms |"
            )
            key = variant.split(",")[0] + (" none" if "none" in variant else "")
            runner.metric(f"{case} {key}: wall", walls[variant], "s", slack=0.05)
        hot, none = walls[VARIANTS[1]], walls[VARIANTS[2]]
        print(f'| {case} | condition="none" against the default, hot | | | {none / hot:.2f}x | | |')
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rankings", type=int, default=10, help="rankings a variant (10)")
    parser.add_argument("--cases", default=",".join(CASES), help="rank_cost's cases (all)")
    parser.add_argument("--hot-s", type=float, default=7.0, help="heavy load before (7)")
    parser.add_argument("--noise", type=float, default=0.01, help="a call's noise (0.01)")
    parser.add_argument("--gpu-profile", default="h200", help="the simulated GPU (h200)")


if __name__ == "__main__":
    sys.exit(
        runner.main("rank_hot", __doc__, add_arguments, run, quick={"rankings": 2}, sim_only=True)
    )
