#!/usr/bin/env python3
"""`gpuenv plot` of a big session file (~30 MB, 9,000 measurements), beside an earlier tree.

The file: a `gpuenv.stable()` session of `--base` measurements on the simulated H100
(virtual time), repeated with its times shifted until it holds `--measurements` (what a
long session writes: each measurement with its windows and its piece of the trace).
Each tree plots it as a fresh process (`gpuenv plot FILE -o FILE.png`: what a user
waits for); this checkout's time is then split into its phases in this process (read;
figure, matplotlib's import included, about 1 s of it; render and save). The earlier
tree is `git archive`d from `--before` (default: the commit before issue 23's plot work).
Goal (issue 23): under 10 s for the 30 MB file.

    python -m benchmarks.plot_big                  # 9,000 measurements, beside 2187591
    python -m benchmarks.plot_big --quick          # 1,500, the earlier tree too
    python -m benchmarks.plot_big --before ''      # this checkout only
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks import runner
from benchmarks.checkout import ENTRY, ROOT

GOAL_S = 10.0
BEFORE = "2187591"  # main before issue 23's plot work: plot took 161 s on a 30 MB file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--measurements",
        type=int,
        default=9000,
        help="measurements in the file (9,000: about 30 MB)",
    )
    parser.add_argument(
        "--base",
        type=int,
        default=300,
        help="measurements the session really takes (the rest are copies)",
    )
    parser.add_argument(
        "--before",
        default=BEFORE,
        help="the earlier commit to time beside this checkout ('' for none)",
    )
    parser.add_argument("--keep", help="write the file here (default: a temporary directory)")


def session_file(path: Path, base: int, total: int) -> None:
    """A session of `base` measurements on the simulated H100, repeated to `total`."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.session import stable
    from gpuenv.timebase import VirtualClock

    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(5)
    raw = path.with_suffix(".base.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with stable(backend=sim, output=str(raw), mode="burst") as env:
            for k in range(base):
                with env.measure(f"step {k % 12}"):  # 12 names; every 7th a light one
                    sim.run_work(0, 0.05 * 1980e6, power_intensity=0.3 if k % 7 == 0 else 1.0)
    lines = raw.read_text().splitlines()
    raw.unlink()
    head, records = lines[0], [json.loads(line) for line in lines[1:]]
    span = (
        max(w["t1"] for r in records for w in r["windows"])
        - min(w["t0"] for r in records for w in r["windows"])
        + 0.05
    )
    with path.open("w") as out:
        out.write(head + "\n")
        for k in range(total):
            record = copy.deepcopy(records[k % len(records)])
            _shift(record, (k // len(records)) * span)
            out.write(json.dumps(record, separators=(",", ":")) + "\n")


def _shift(record: dict, by: float) -> None:
    for w in [*record["windows"], *record["summary_windows"]]:
        w["t0"] += by
        w["t1"] += by
    trace = record.get("extra", {}).get("trace")
    if isinstance(trace, dict):
        trace["t0"] += by
    if isinstance(record.get("started_at"), (int, float)):
        record["started_at"] += by


def earlier_tree(rev: str, where: Path) -> Path:
    """`rev`'s gpuenv package unpacked under `where`."""
    blob = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "gpuenv"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(where, filter="data")
    return where


def time_plot(tree: Path, data: Path, image: Path) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    argv = [sys.executable, "-c", ENTRY, "plot", str(data), "-o", str(image)]
    proc = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    return time.perf_counter() - t0, proc.returncode, proc.stderr.strip()[-200:]


def phases(data: Path, image: Path) -> dict[str, float]:
    """This checkout's plot split: read the file, build the figure, save it."""
    from gpuenv.plot import _save, run_figure
    from gpuenv.results import load_run

    t0 = time.perf_counter()
    run = load_run(data)
    t1 = time.perf_counter()
    fig = run_figure(run)
    t2 = time.perf_counter()
    _save(fig, str(image))  # matplotlib renders the figure here
    t3 = time.perf_counter()
    return {"read": t1 - t0, "figure": t2 - t1, "render and save": t3 - t2}


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="gpuenv-plot-big-") as tmp:
        data = Path(args.keep) if args.keep else Path(tmp) / "session.jsonl"
        session_file(data, args.base, args.measurements)
        size_mb = data.stat().st_size / 1e6
        print(
            f"A session file of {args.measurements:,} measurements ({size_mb:.1f} MB; "
            f"{args.base} measured on the simulated H100, the rest copies shifted in time)."
        )
        print()
        print("| tree | `gpuenv plot` (s) | exit | goal < 10 s |")
        print("| --- | ---: | ---: | --- |")
        trees = [("this checkout", ROOT)]
        if args.before:
            trees.append((f"before ({args.before})", earlier_tree(args.before, Path(tmp) / "old")))
        took: dict[str, float] = {}
        for label, tree in trees:
            seconds, rc, err = time_plot(tree, data, Path(tmp) / f"{len(took)}.png")
            took[label] = seconds
            ok = "yes" if seconds < GOAL_S and rc == 0 else "NO"
            print(f"| {label} | {seconds:.1f} | {rc} | {ok} |")
            if rc:
                print(f"\n{label} failed: {err}\n", file=sys.stderr)
        runner.metric("plot_s", took["this checkout"], "s", slack=1.0)
        print()
        split = phases(data, Path(tmp) / "phases.png")
        print("| this checkout, phase | s |")
        print("| --- | ---: |")
        for name, seconds in split.items():
            print(f"| {name} | {seconds:.2f} |")
            runner.metric(f"{name.split()[0]}_s", seconds, "s", slack=0.5)
        if len(took) == 2:
            before = took[trees[1][0]]
            ratio = before / took["this checkout"]
            print(f"\nThe same file on the same machine, one run each: {ratio:.0f}x faster.")
    return 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "plot_big", __doc__, add_arguments, run, sim_only=True, quick={"measurements": 1500}
        )
    )
