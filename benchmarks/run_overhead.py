#!/usr/bin/env python3
"""What `gpuenv run` costs: wall time of a short command, bare and wrapped, side by side.

Each command runs as a fresh process, bare and under `gpuenv run -q --`,
interleaved (bare, wrapped, bare, wrapped, ...) so both see the same machine;
the first pair warms the file cache. The checkout is byte-compiled first, as an
installed gpuenv is (`compile_checkout`). `true` is also run under `gpuenv run`
with GPUENV_SAMPLER=process: the sampler process `gpuenv run` used until 2026-11-24.
Also the cost of a region: a Python command entering 20,000 regions, bare
(regions only time themselves) and under `gpuenv run` (each edge is a pipe write
the parent reads).

    python -m benchmarks.run_overhead --sim    # no GPU: the simulated H100 (+ a locked run)
    GPUENV_READONLY=1 python -m benchmarks.run_overhead   # a real GPU, read-only

Prints a markdown table (median and fastest of N runs, and the median overhead).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env

REGIONS = 20_000
REGION_SCRIPT = f"""
import gpuenv
for _ in range({REGIONS}):
    with gpuenv.region("r"):
        pass
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}"
        )
    return elapsed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--runs", type=int, default=15, help="timed runs per command")


def compile_checkout() -> None:
    """Byte-compile gpuenv as `pip install` does: a checkout run with PYTHONDONTWRITEBYTECODE
    (the lent H100's, this machine's) compiled ~100 modules from source on every start,
    ~220 ms of `gpuenv run true` there (and again in a sampler process): not what a user
    of an installed gpuenv pays."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(ROOT / "gpuenv")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run(args: argparse.Namespace) -> int:
    compile_checkout()
    env = checkout_env()
    tmp = tempfile.mkdtemp(prefix="gpuenv-bench-run-")
    gpuenv = list(GPUENV)
    if args.sim:
        gpuenv.append("--sim")
        env["GPUENV_SIM_STATE"] = os.path.join(tmp, "sim.json")
        env["GPUENV_STATE_DIR"] = os.path.join(tmp, "journal")
    readonly = env.get("GPUENV_READONLY", "").strip().lower() in ("1", "true", "yes", "on")
    wrap = [*gpuenv, "run", "-q", "--"]
    py = sys.executable
    true = shutil.which("true") or "/bin/true"
    # the sampler process (GPUENV_SAMPLER=process: gpuenv run's sampler until 2026-11-24),
    # beside the default thread: what it added to the start
    proc = ["env", "GPUENV_SAMPLER=process", *wrap]
    cases: list[tuple[str, list[str], list[tuple[str, list[str]]]]] = [
        ("`true`", [true], [("gpuenv run", wrap), ("gpuenv run, sampler process", proc)]),
        ("`python -c pass`", [py, "-c", "pass"], [("gpuenv run", wrap)]),
        ("`sleep 1`", ["sleep", "1"], [("gpuenv run", wrap)]),
        (f"python, {REGIONS:,} regions", [py, "-c", REGION_SCRIPT], [("gpuenv run", wrap)]),
    ]
    if args.sim and not readonly:  # locking writes: never on a shared real GPU
        locked = [*gpuenv, "run", "-q", "--sm", "1350", "--"]
        cases[1][2].append(("gpuenv run --sm 1350", locked))

    rows = []
    for name, bare, wrappers in cases:
        variants = [("bare", bare)] + [(label, [*w, *bare]) for label, w in wrappers]
        times: dict[str, list[float]] = {label: [] for label, _ in variants}
        for i in range(args.runs + 1):
            for label, argv in variants:
                t = timed(argv, env)
                if i > 0:
                    times[label].append(t)
        base = statistics.median(times["bare"])
        for label, _ in variants:
            med = statistics.median(times[label])
            over = "-" if label == "bare" else f"+{(med - base) * 1e3:.0f} ms"
            if label != "bare":
                key = "".join(ch if ch.isalnum() else "_" for ch in f"{name} {label}")
                runner.metric(
                    "_".join(filter(None, key.split("_"))) + "_overhead_ms",
                    (med - base) * 1e3,
                    "ms",
                    slack=10.0,
                )
            if label != "bare" and "regions" in name:
                over += f" ({(med - base) / REGIONS * 1e6:.1f} us a region)"
            rows.append(
                f"| {name} | {label} | {med * 1e3:.0f} | {min(times[label]) * 1e3:.0f} | {over} |"
            )

    machine = "simulated H100" if args.sim else "real GPU (read-only)" if readonly else "real GPU"
    print(
        f"`gpuenv run` overhead, {args.runs} runs each, interleaved; "
        f"{platform.node()} ({os.cpu_count()} CPUs), {machine}, "
        f"{time.strftime('%Y-%m-%d')}; gpuenv byte-compiled first\n"
    )
    print("| command | how | median ms | fastest ms | overhead (median) |")
    print("| --- | --- | ---: | ---: | --- |")
    print("\n".join(rows))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("run_overhead", __doc__, add_arguments, run, quick={"runs": 5}))
