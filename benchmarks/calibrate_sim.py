#!/usr/bin/env python3
"""Wall time and answers of `gpuenv --sim calibrate`, from fresh and from heated simulated GPUs.

Each run is its own process, `gpuenv --sim calibrate --no-save --json`, with its own
simulator state file (GPUENV_SIM_STATE in a temporary directory), as a user's first
command on a machine would be. A "fresh" run starts from a state file nobody wrote; a
"heated" run starts after another process ran the heavy load on the same simulated
GPU for --heat seconds (of its own virtual time: the state file then holds a hot GPU,
as after an earlier benchmark or calibration).

Prints a Markdown table (start, wall seconds, the result's seconds of load, sustained
and lock clocks) and whether the answers agree. `--source DIR` runs the gpuenv found
in DIR (a checkout of another commit, for a before/after figure); default: this one.

    python -m benchmarks.calibrate_sim --fresh 5 --heated 1
    mkdir /tmp/gpuenv-before && git archive COMMIT gpuenv | tar -x -C /tmp/gpuenv-before
    python -m benchmarks.calibrate_sim --source /tmp/gpuenv-before --fresh 3 --heated 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

from benchmarks import runner
from benchmarks.runner import ROOT

HEAT = """
import sys
from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.timebase import VirtualClock

sim = SimBackend("h100", clock=VirtualClock(), state_file=sys.argv[1])
timing.sim_kernel(sim, 0, seconds=float(sys.argv[2]))()
print(f"{sim.truth(0).temp_c:.1f}")
sim.close()
"""


def _env(source: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    env.update(
        PYTHONPATH=str(source),
        GPUENV_SIM_STATE=str(tmp / "sim.json"),
        GPUENV_STATE_DIR=str(tmp / "state"),
        XDG_RUNTIME_DIR=str(tmp),
    )
    return env


def one_run(source: Path, *, heat_s: float, duration: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="gpuenv-calib-") as name:
        tmp = Path(name)
        env = _env(source, tmp)
        start = "fresh"
        if heat_s > 0:
            hot = subprocess.run(
                [sys.executable, "-c", HEAT, env["GPUENV_SIM_STATE"], str(heat_s)],
                env=env,
                cwd=tmp,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            start = f"heated to {hot} C"
        argv = [
            sys.executable,
            "-m",
            "gpuenv",
            "--sim",
            "calibrate",
            "--no-save",
            "--json",
            "--duration",
            str(duration),
        ]
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"calibrate failed ({done.returncode}):\n{done.stderr}")
    (result,) = json.loads(done.stdout)
    return {"start": start, "wall_s": wall, "exit": done.returncode, **result}


def _which(source: Path) -> str:
    """The gpuenv package the runs import (not the one installed here, which -m would
    find in the working directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = "import gpuenv, os; print(os.path.dirname(gpuenv.__file__))"
        return subprocess.run(
            [sys.executable, "-c", code],
            env=_env(source, Path(tmp)),
            cwd=tmp,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--source", type=Path, default=ROOT, help="the gpuenv checkout to run")
    ap.add_argument("--fresh", type=int, default=5, help="runs from a fresh state file")
    ap.add_argument("--heated", type=int, default=1, help="runs after the GPU was heated")
    ap.add_argument("--heat", type=float, default=120.0, help="seconds of heavy load first")
    ap.add_argument("--duration", type=float, default=180.0, help="calibrate --duration")
    ap.add_argument("--json", action="store_true", help="print the runs as JSON too")


def run(args: argparse.Namespace) -> None:
    runs = [one_run(args.source, heat_s=0.0, duration=args.duration) for _ in range(args.fresh)]
    runs += [
        one_run(args.source, heat_s=args.heat, duration=args.duration) for _ in range(args.heated)
    ]
    print(
        f"# gpuenv --sim calibrate ({_which(args.source)}), {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()}-core {platform.machine()} CPU machine, no GPU, simulated H100"
    )
    print("| run | start | wall s | load s (result) | sustained MHz | lock MHz | exit |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for i, r in enumerate(runs, 1):
        print(
            f"| {i} | {r['start']} | {r['wall_s']:.1f} | {r['seconds']:.1f} | "
            f"{r['sustained_mhz']:.0f} | {r['lock_mhz']} | {r['exit']} |"
        )
    answers = {(r["sustained_mhz"], r["lock_mhz"], r["temp_c"], r["seconds"]) for r in runs}
    print(f"\n{len(answers)} distinct answer(s) over {len(runs)} runs")
    fresh = [cast(float, r["wall_s"]) for r in runs if r["start"] == "fresh"]
    if fresh:
        runner.metric("fresh_wall_s", statistics.median(fresh), "s", slack=0.5)
    if args.json:
        print(json.dumps(runs, indent=2))


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "calibrate_sim",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"fresh": 2, "heated": 1},
        )
    )
