#!/usr/bin/env python3
"""A shared node: does a process in `gpuenv.stable()` on its own GPU wait for, and read
the same as alone, while the node's other GPUs run heavy matmuls?

Each measuring process (benchmarks/workloads/shared_node.py) opens `gpuenv.stable()` and
times six kernels with `env.bench(fn)` (three memory-bound, three heavy), `--calls` times
each. Per GPU g, one after another:
- alone: the process on GPU g (CUDA_VISIBLE_DEVICES=g), the other GPUs idle;
- beside load: the same while every other GPU runs 8192^3 bf16 matmuls (one process each);
- session over all: the process sees every GPU and opens `stable(gpus="all")`, its bench
  on GPU g, the other GPUs loaded as above: the bench must wait for GPU g only.
Then, with `--heat` s of matmuls on a process's own GPU before each of its calls:
- alone, heated: one process on GPU g, the others idle;
- together: one process per GPU at once, each heating its own GPU between its calls;
- torchrun: the same as torchrun ranks (LOCAL_RANK picks the GPU, no CUDA_VISIBLE_DEVICES);
- alone again: the first run repeated, the noise between two processes alone.
Reported: the wall of each `env.bench` call (goal: median <= 1 s, max <= 2 s), the seconds
it spent in its condition phase, NotRecoveredWarnings (goal 0), the GPUs each bench waited
for, and each kernel's number against the same process alone (goal: within 0.3%; the heated
runs against "alone, heated"). Read-only (GPUENV_READONLY=1 in every process); needs 2 or
more CUDA GPUs and torch (about 5 minutes on 2 H200s).

    GPUENV_READONLY=1 python -m benchmarks.node_shared
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import ROOT, checkout_env, finish_within
from benchmarks.launcher import SAFE_ENV, gpu_count

WORKLOAD = ROOT / "benchmarks" / "workloads" / "shared_node.py"
TIMEOUT_S = 150  # per measuring process
WALL_MEDIAN_GOAL_S, WALL_MAX_GOAL_S, SAME_GOAL = 1.0, 2.0, 0.003


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=0, help="GPUs (default: every GPU)")
    parser.add_argument("--calls", type=int, default=2, help="calls per kernel and process")
    parser.add_argument("--heat", type=float, default=1.0, help="own load before a call (s)")


class Node:
    """The processes of one run: environment, a scratch directory, the loaders."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.env = checkout_env(dict(os.environ, **SAFE_ENV))
        self.env.pop("CUDA_VISIBLE_DEVICES", None)
        self.tmp = Path(tempfile.mkdtemp(prefix="gpuenv-node-shared-"))

    def argv(self, *extra: str) -> list[str]:
        return [sys.executable, str(WORKLOAD), "--calls", str(self.args.calls), *extra]

    def measure(self, extra: list[str], visible: str | None) -> dict[str, Any]:
        env = dict(self.env) if visible is None else dict(self.env, CUDA_VISIBLE_DEVICES=visible)
        proc = subprocess.Popen(
            self.argv(*extra), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return self.result(proc)

    def result(self, proc: subprocess.Popen) -> dict[str, Any]:
        done = finish_within(proc, TIMEOUT_S)
        if done is None:
            return {"error": f"timed out after {TIMEOUT_S} s"}
        out, err = done
        if proc.returncode != 0 or not out.strip():
            sys.stderr.write(err[-3000:])
            return {"error": f"exit {proc.returncode}"}
        return dict(json.loads(out.strip().splitlines()[-1]))

    def loaders(self, gpus: list[int]) -> tuple[list[subprocess.Popen], Path]:
        """A loader on each of `gpus`, started and loading when this returns."""
        ready = Path(tempfile.mkdtemp(dir=self.tmp))
        stop = ready / "stop"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKLOAD),
                    "--role",
                    "load",
                    "--ready",
                    str(ready),
                    "--stop",
                    str(stop),
                ],
                env=dict(self.env, CUDA_VISIBLE_DEVICES=str(g)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for g in gpus
        ]
        end = time.monotonic() + 60
        while len(list(ready.glob("loading-*"))) < len(procs) and time.monotonic() < end:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        return procs, stop

    @staticmethod
    def stop(procs: list[subprocess.Popen], stop: Path) -> None:
        stop.touch()
        for p in procs:
            if finish_within(p, 30) is None:
                print(f"(a loader did not stop; killed pid {p.pid})")

    def beside_load(self, g: int, n: int, extra: list[str], visible: str | None) -> dict:
        procs, stop = self.loaders([h for h in range(n) if h != g])
        try:
            return self.measure(extra, visible)
        finally:
            self.stop(procs, stop)

    def together(self, n: int, heat: list[str]) -> list[dict[str, Any]]:
        ready = Path(tempfile.mkdtemp(dir=self.tmp))
        barrier = ["--ready", str(ready), "--together", str(n), *heat]
        procs = [
            subprocess.Popen(
                self.argv(*barrier),
                env=dict(self.env, CUDA_VISIBLE_DEVICES=str(g)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for g in range(n)
        ]
        return [self.result(p) for p in procs]

    def torchrun(self, n: int, heat: list[str]) -> list[dict[str, Any]]:
        ready, results = (Path(tempfile.mkdtemp(dir=self.tmp)) for _ in range(2))
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={n}",
            str(WORKLOAD),
            "--calls",
            str(self.args.calls),
            "--ready",
            str(ready),
            "--together",
            str(n),
            "--json-dir",
            str(results),
            *heat,
        ]
        proc = subprocess.Popen(
            argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        done = finish_within(proc, TIMEOUT_S + 30)
        if done is None or proc.returncode != 0:
            sys.stderr.write("" if done is None else done[1][-3000:])
            return [{"error": "torchrun failed"}]
        got = [json.loads(f.read_text()) for f in sorted(results.glob("*.json"))]
        return sorted(got, key=lambda r: int(r.get("device", 0)))

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def number(r: dict[str, Any], kernel: str) -> float:
    return statistics.median(r["kernels"][kernel]["median_s"])


def rows_of(phase: str, results: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[dict]:
    """One row per process of a phase: walls, waits, warnings, the worst kernel against
    `base` (the same GPU's process alone)."""
    out = []
    for g, (r, a) in enumerate(zip(results, base, strict=False)):
        if "error" in r or "error" in a:
            out.append({"phase": phase, "gpu": g, "error": r.get("error") or a.get("error")})
            continue
        ks = r["kernels"]
        walls = [w for k in ks.values() for w in k["wall_s"]]
        cond = [c for k in ks.values() for c in k["condition_s"] if c is not None]
        moved = {k: number(r, k) / number(a, k) - 1 for k in ks}
        worst = max(moved, key=lambda k: abs(moved[k]))
        out.append(
            {
                "phase": phase,
                "gpu": g,
                "ran_on": sorted({x for k in ks.values() for x in k.get("gpus", [])}),
                "waited_for": sorted({x for k in ks.values() for x in k.get("waited_for", [])}),
                "session": f"{r['session_gpus']} ({r['session_why']})",
                "walls": walls,
                "condition": cond,
                "not_recovered": int(r["not_recovered"]),
                "warnings": sorted({w for k in ks.values() for w in k["warnings"]}),
                "moved": moved,
                "worst": worst,
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print(
            "node_shared needs CUDA GPUs (the simulated node is tested in tests/: "
            "test_session_gpus, test_conditioner)"
        )
        return 2
    n = args.gpus or gpu_count(False)
    if n < 2:
        print(f"node_shared needs 2 or more GPUs; this machine has {n}")
        return 2
    node = Node(args)
    heat = ["--heat", str(args.heat)]
    t0 = time.perf_counter()
    try:
        alone = [node.measure([], str(g)) for g in range(n)]
        beside = [node.beside_load(g, n, [], str(g)) for g in range(n)]
        over_all = [
            node.beside_load(g, n, ["--session", "all", "--device", str(g)], None) for g in range(n)
        ]
        alone_hot = [node.measure(heat, str(g)) for g in range(n)]
        together = node.together(n, heat)
        ranks = node.torchrun(n, heat)
        again = [node.measure([], str(g)) for g in range(n)]
    finally:
        node.close()
    wall = time.perf_counter() - t0
    rows = (
        rows_of("alone again (the noise between processes)", again, alone)
        + rows_of("beside load", beside, alone)
        + rows_of("session over all GPUs, beside load", over_all, alone)
        + rows_of("together, heated", together, alone_hot)
        + rows_of("torchrun ranks, heated", ranks, alone_hot)
    )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {n} GPUs shared: stable() on its own GPU beside the others' load ({when})\n")
    print(
        f"Six kernels, {args.calls} `env.bench` calls each per process; heated runs load their "
        f"own GPU {args.heat:g} s before each call. Number: each kernel's median against the "
        "same GPU's process alone (the heated runs against alone, heated).\n"
    )
    print(
        "| run | GPU | ran on | waited for | bench wall median / max | condition max "
        "| NotRecovered | warnings | worst kernel vs alone |"
    )
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['phase']} | {r['gpu']} | {r['error']} | | | | | | |")
            continue
        print(
            f"| {r['phase']} | {r['gpu']} | {r['ran_on']} | {r['waited_for']} "
            f"| {statistics.median(r['walls']):.2f} / {max(r['walls']):.2f} s "
            f"| {max(r['condition'], default=0):.2f} s | {r['not_recovered']} "
            f"| {', '.join(r['warnings']) or '-'} "
            f"| {r['worst']} {100 * r['moved'][r['worst']]:+.2f}% |"
        )
    print("\nEach kernel against alone (%):\n")
    kernels = next((list(r["moved"]) for r in rows if "moved" in r), [])
    print("| run | GPU | " + " | ".join(kernels) + " |")
    print("| --- | ---: |" + " ---: |" * len(kernels))
    for r in rows:
        if "moved" in r:
            cells = " | ".join(f"{100 * r['moved'][k]:+.2f}" for k in kernels)
            print(f"| {r['phase']} | {r['gpu']} | {cells} |")
    for tag, group in (("alone", alone), ("alone, heated", alone_hot)):
        for g, r in enumerate(group):
            if "error" not in r:
                walls = [w for k in r["kernels"].values() for w in k["wall_s"]]
                print(
                    f"\n{tag}, GPU {g}: bench wall median {statistics.median(walls):.2f} s, "
                    f"max {max(walls):.2f} s; NotRecovered {r['not_recovered']}; session "
                    f"{r['session_gpus']} ({r['session_why']})"
                )
    shared = [r for r in rows if not r["phase"].startswith("alone again")]
    good = [r for r in shared if "error" not in r]
    rc = 0 if len(good) == len(shared) else 1
    if good:
        walls = [w for r in good for w in r["walls"]]
        worst = max(abs(r["moved"][r["worst"]]) for r in good)
        nr = sum(r["not_recovered"] for r in good)
        runner.metric("bench_wall_median_s", statistics.median(walls), "s", slack=0.2)
        runner.metric("bench_wall_max_s", max(walls), "s", slack=0.5)
        runner.metric("not_recovered", nr, "", slack=0.5)
        runner.metric("worst_vs_alone_rel", worst, "", slack=0.002)
        print(
            f"\nShared runs: bench wall median {statistics.median(walls):.2f} s (goal <= "
            f"{WALL_MEDIAN_GOAL_S:g} s), max {max(walls):.2f} s (goal <= {WALL_MAX_GOAL_S:g} s); "
            f"NotRecoveredWarnings {nr} (goal 0); worst kernel against alone {worst:.2%} "
            f"(goal <= {SAME_GOAL:.1%}). Wall {wall:.0f} s."
        )
    return rc


if __name__ == "__main__":
    sys.exit(runner.main("node_shared", __doc__, add_arguments, run, quick={"calls": 1}))
