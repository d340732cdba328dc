#!/usr/bin/env python3
"""How often the `drift` / `bimodal` findings (gpuenv.stats.levels) fire on plain noise,
and how often they catch a 4% step, a 3% linear trend and a 3.20 / 3.55 split.

Noise families (relative to a steady level): normal at 1%, 3% and 5%; lognormal at 4%;
0.5% normal with 5% of reps 5-50% slower (preemption); an exponential slow tail (2%);
1% normal read in 1% steps (a coarse timer); AR(1) wander (phi 0.5, 1%). Shapes: the
step at a random rep in the middle half, the trend end to end, 35% of reps in the upper
mode; each with 0.2%, 0.5% or 1% normal noise. Pure Python, seeded: the same table every
run. Prints markdown; the shares are kept in the results (`series`).

    python -m benchmarks.levels
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable

from benchmarks import runner
from gpuenv.stats import levels

SIZES = (10, 20, 33, 50, 100, 300, 1000)


def families(rng: random.Random) -> dict[str, Callable[[int], list[float]]]:
    def ar1(n: int) -> list[float]:
        x, out = 0.0, []
        for _ in range(n):
            x = 0.5 * x + rng.gauss(0, 0.01)
            out.append(1 + x)
        return out

    return {
        "normal 1%": lambda n: [1 + rng.gauss(0, 0.01) for _ in range(n)],
        "normal 3%": lambda n: [1 + rng.gauss(0, 0.03) for _ in range(n)],
        "normal 5%": lambda n: [1 + rng.gauss(0, 0.05) for _ in range(n)],
        "lognormal 4%": lambda n: [math.exp(rng.gauss(0, 0.04)) for _ in range(n)],
        "0.5% + 5% outliers": lambda n: [
            (1 + rng.gauss(0, 0.005)) * (1 + rng.uniform(0.05, 0.5) if rng.random() < 0.05 else 1)
            for _ in range(n)
        ],
        "slow tail (exp 2%)": lambda n: [1 + rng.expovariate(50) for _ in range(n)],
        "1% in 1% steps": lambda n: [1 + round(rng.gauss(0, 0.01), 2) for _ in range(n)],
        "AR(1) 0.5, 1%": ar1,
    }


def shapes(rng: random.Random, n: int, sd: float) -> dict[str, list[float]]:
    base = [1 + rng.gauss(0, sd) for _ in range(n)]
    at = rng.randint(n // 4, 3 * n // 4)
    return {
        "step 4%": [x * (1.04 if i >= at else 1) for i, x in enumerate(base)],
        "trend 3%": [x * (1 + 0.03 * i / (n - 1)) for i, x in enumerate(base)],
        "split 3.20/3.55": [x * (3.55 if rng.random() < 0.35 else 3.2) for x in base],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=18, help="the random seed (18: the kept table)")
    parser.add_argument(
        "--trials",
        type=int,
        default=400,
        help="noise series per size up to n=100 (a quarter above)",
    )


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    noise: dict[str, dict[int, float]] = {}
    for name, make in families(rng).items():
        noise[name] = {}
        for n in SIZES:
            trials = args.trials if n <= 100 else max(1, args.trials // 4)
            noise[name][n] = sum(levels(make(n)) is not None for _ in range(trials)) / trials
    caught: dict[str, dict[str, dict[int, float]]] = {}
    for sd in (0.002, 0.005, 0.01):
        for n in SIZES:
            for _ in range(100):
                for shape, xs in shapes(rng, n, sd).items():
                    cell = caught.setdefault(shape, {}).setdefault(f"{sd:.1%}", {})
                    found = levels(xs)
                    cell[n] = cell.get(n, 0.0) + (found is not None) / 100
    head = "| | " + " | ".join(f"n={n}" for n in SIZES) + " |"
    rule = "| --- |" + " ---: |" * len(SIZES)
    print("Fired on plain noise (share of series):\n\n" + head + "\n" + rule)
    for name, row in noise.items():
        print(f"| {name} | " + " | ".join(f"{row[n]:.1%}" for n in SIZES) + " |")
    print("\nCaught (share of series), by the noise on top:\n\n" + head + "\n" + rule)
    for shape, by_sd in caught.items():
        for noise_sd, row in by_sd.items():
            cells = " | ".join(f"{row[n]:.0%}" for n in SIZES)
            print(f"| {shape}, {noise_sd} noise | {cells} |")
    runner.metric("fired_on_normal_1pct_n100", noise["normal 1%"][100], "share", slack=0.01)
    runner.metric(
        "caught_step_4pct_0.5pct_n50",
        caught["step 4%"]["0.5%"][50],
        "share",
        better="higher",
        slack=0.02,
    )
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("levels", __doc__, add_arguments, run, quick={"trials": 40}, gpu=False))
