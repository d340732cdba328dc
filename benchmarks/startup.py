#!/usr/bin/env python3
"""Start-up time of `gpuenv --help` and `gpuenv status`, beside `nvidia-smi` and `nvitop --once`.

Each command runs as a fresh process (what a user waits for), once to warm the
file cache, then N times; the table gives the median and the fastest run.

    python -m benchmarks.startup            # real GPU: gpuenv, nvidia-smi, nvitop
    python -m benchmarks.startup --sim      # no GPU: gpuenv on the simulated H100

gpuenv runs through `python -c "from gpuenv.cli import main; main()"`, which is
what the `gpuenv` console script does, so the figures hold whether or not the
package is installed. Goals (issue 2): --help <= 0.25 s, status <= 0.35 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env

GOALS = {"gpuenv --help": 0.25, "gpuenv status": 0.35, "gpuenv --sim status": 0.35}


def time_command(argv: list[str], runs: int, env: dict[str, str]) -> tuple[list[float], int]:
    times = []
    rc = 0
    for i in range(runs + 1):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, check=False)
        elapsed = time.perf_counter() - t0
        rc = proc.returncode
        if i > 0:  # the first run warms the file cache
            times.append(elapsed)
    return times, rc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--runs", type=int, default=15, help="timed runs per command")


def run(args: argparse.Namespace) -> int:
    env = checkout_env()
    gpuenv = list(GPUENV)
    commands: list[tuple[str, list[str]]] = [("gpuenv --help", [*gpuenv, "--help"])]
    if args.sim:
        env["GPUENV_SIM_STATE"] = "none"
        commands.append(("gpuenv --sim status", [*gpuenv, "--sim", "status"]))
    else:
        commands.append(("gpuenv status", [*gpuenv, "status"]))
    smi = shutil.which("nvidia-smi")
    if smi:
        commands.append(("nvidia-smi", [smi]))
    try:
        import importlib.util

        have_nvitop = importlib.util.find_spec("nvitop") is not None
    except ImportError:
        have_nvitop = False
    if have_nvitop and not args.sim:
        commands.append(("nvitop --once", [sys.executable, "-m", "nvitop", "--once"]))

    rows = []
    for name, argv in commands:
        times, rc = time_command(argv, args.runs, env)
        goal = GOALS.get(name)
        median = statistics.median(times)
        verdict = "-" if goal is None else ("yes" if median <= goal else "NO")
        runner.metric(
            name.replace("gpuenv ", "").replace(" ", "_").strip("-_"), median, "s", slack=0.02
        )
        note = "" if rc == 0 else f" (exit {rc})"
        rows.append(
            f"| `{name}`{note} | {median:.3f} | {min(times):.3f} | "
            f"{'-' if goal is None else f'<= {goal:.2f}'} | {verdict} |"
        )

    if smi:
        gpu = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False).stdout
        machine = gpu.strip().splitlines()[0] if gpu.strip() else "nvidia-smi found no GPU"
    else:
        machine = "no GPU (gpuenv on the simulated H100)" if args.sim else "no GPU, no nvidia-smi"
    print(f"Start-up, median of {args.runs} runs after one warm-up, seconds.")
    print(
        f"{time.strftime('%Y-%m-%d')}, {machine}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}."
    )
    print()
    print("| command | median s | fastest s | goal s | met |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("startup", __doc__, add_arguments, run, quick={"runs": 5}))
