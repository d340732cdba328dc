#!/usr/bin/env python3
"""What `pytest --gpuenv` adds inside a pytest-benchmark round, side by side.

A trivial function's rounds, with and without --gpuenv.

One benchmark, `benchmark.pedantic(noop, rounds=ROUNDS, iterations=1)`, so a round is one
call between two timer reads and anything the plugin did inside a round would show whole
in the round's time. Each configuration runs as a fresh pytest process, interleaved
(plain, --gpuenv, [--gpuenv of another checkout], plain, ...) so all see the same
machine; the first repeat warms the file cache and is dropped. The statistic per run is
the median and the minimum of its rounds; per configuration, the median of the runs'
medians, the fastest minimum, and the median over repeats of (this - plain) in the same
repeat.

    python -m benchmarks.pytest_plugin --sim                   # no GPU: the simulated H100
    python -m benchmarks.pytest_plugin --sim --old /work/main  # beside another checkout
    GPUENV_READONLY=1 python -m benchmarks.pytest_plugin       # a real GPU, read-only

Read-only: the plugin opens the backend read-only and never writes a GPU setting.
Prints a markdown table (kept in benchmarks/results/pytest_plugin[-sim].json).
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
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import ROOT

TEST = """
def noop():
    pass

def test_noop(benchmark):
    benchmark.pedantic(noop, rounds={rounds}, iterations=1)
"""


def run_once(where: Path, checkout: Path, gpuenv: bool, env: dict[str, str]) -> dict[str, Any]:
    out = where / "bench.json"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "error",
        f"--benchmark-json={out}",
        "test_noop.py",
    ]
    if gpuenv:
        argv.insert(3, "--gpuenv")
    # the checkout first; what else is on PYTHONPATH (the device's wheels) stays
    run_env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")])),
    }
    proc = subprocess.run(argv, cwd=where, env=run_env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
    bench = json.loads(out.read_text())["benchmarks"][0]
    stats = bench["stats"]
    info = bench["extra_info"].get("gpuenv", {})
    return {
        "median_ns": stats["median"] * 1e9,
        "min_ns": stats["min"] * 1e9,
        "rounds": stats["rounds"],
        "verdict": info.get("verdict", info.get("error", "-")),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=15, help="runs of each configuration")
    parser.add_argument("--rounds", type=int, default=20_000, help="rounds a run")
    parser.add_argument("--old", type=Path, help="another checkout's plugin, beside this one")


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.sim:
        env["GPUENV_BACKEND"] = "sim"
        env.setdefault("GPUENV_SIM_STATE", "none")
    configs = [("plain", ROOT, False), ("--gpuenv", ROOT, True)]
    if args.old:
        configs.append((f"--gpuenv ({args.old})", args.old.resolve(), True))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in configs}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "test_noop.py").write_text(TEST.format(rounds=args.rounds))
        for rep in range(args.repeats + 1):
            order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
            for name, checkout, gpuenv in order:
                result = run_once(where, checkout, gpuenv, env)
                if rep:  # the first repeat warms the file cache
                    runs[name].append(result)
    print(
        f"{args.repeats} runs each of {args.rounds:,} rounds of a no-op "
        f"(pedantic, iterations=1); {platform.node()}, "
        f"{'simulated H100' if args.sim else 'NVML'}\n"
    )
    print("\n".join(table(runs)))
    return 0


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The markdown table of the runs of each configuration ("plain" first), by name."""
    lines = [
        "| configuration | median round (ns) | fastest round (ns) | vs plain, median of "
        "paired diffs (ns) | verdict |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    plain = runs["plain"]
    for name, rs in runs.items():
        diffs = [r["median_ns"] - p["median_ns"] for r, p in zip(rs, plain, strict=True)]
        verdicts = sorted({str(r["verdict"]) for r in rs})
        if name == "--gpuenv":
            runner.metric("gpuenv_minus_plain_round_ns", statistics.median(diffs), "ns", slack=20.0)
        lines.append(
            f"| {name} | {statistics.median(r['median_ns'] for r in rs):.1f} | "
            f"{min(r['min_ns'] for r in rs):.1f} | "
            f"{'-' if name == 'plain' else f'{statistics.median(diffs):+.1f}'} | "
            f"{', '.join(verdicts)} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "pytest_plugin", __doc__, add_arguments, run, quick={"repeats": 3, "rounds": 2000}
        )
    )
