#!/usr/bin/env python3
"""Every GPU of a node measured at once: do N processes, one per GPU, each running
gpuenv.bench, get the numbers one process alone on each GPU gets?

benchmarks/workloads/gpu_bench.py (gpuenv.bench on an 8192 bf16 matmul and on x.sum() of
64k floats, --budget s each) runs first alone on each GPU in turn, then on every GPU at
once (the processes wait for each other before measuring). Each process is given its GPU
through CUDA_VISIBLE_DEVICES in an order of its own: alone, by indices rotated so its GPU
comes first ("2,3,0,1"); together, by UUIDs in that order; each must sample the GPU it
ran on (CUDA's UUID of its device 0, checked against the UUID of the GPU gpuenv sampled:
column "sampled right"). Rows are GPUs by UUID. Reported per GPU: both medians and the ratio
together / alone (the goal: heavy within 0.5%, tiny within 2%), and the verdicts. Read-only
(GPUENV_READONLY=1); about 1.5 minutes on 4 H100s.

    GPUENV_READONLY=1 python -m benchmarks.node_concurrent           # the GPUs here
    python -m benchmarks.node_concurrent --sim --quick --out -       # 4 simulated GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import ROOT, checkout_env, finish_within
from benchmarks.launcher import SAFE_ENV, gpu_count

WORKLOAD = ROOT / "benchmarks" / "workloads" / "gpu_bench.py"
TIMEOUT_S = 120  # per process
HEAVY_GOAL, TINY_GOAL = 0.005, 0.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=0, help="GPUs (default: every GPU)")
    parser.add_argument("--n", type=int, default=8192, help="matmul size")
    parser.add_argument("--budget", type=float, default=4.0, help="gpuenv.bench's budget_s")


def uuids(sim: bool) -> list[str]:
    from gpuenv.backend import open_backend

    backend = open_backend("sim" if sim else None, readonly=True)
    try:
        return [backend.device_info(i).uuid for i in range(backend.device_count())]
    finally:
        backend.close()


def visible(gpu: int, names: list[str]) -> str:
    """CUDA_VISIBLE_DEVICES with `gpu` first, then the others rotated after it."""
    order = names[gpu:] + names[:gpu]
    return ",".join(order)


def start(
    gpu_env: str, args: argparse.Namespace, env: dict[str, str], ready: Path | None, together: int
) -> subprocess.Popen:
    argv = [sys.executable, str(WORKLOAD), "--size", str(args.n), "--budget", str(args.budget)]
    if ready is not None:
        argv += ["--ready", str(ready), "--together", str(together)]
    return subprocess.Popen(
        argv,
        env=dict(env, CUDA_VISIBLE_DEVICES=gpu_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> dict[str, Any]:
    done = finish_within(proc, TIMEOUT_S)
    if done is None:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    out, err = done
    if proc.returncode != 0:
        sys.stderr.write(err[-2000:])
        return {"error": f"exit {proc.returncode}"}
    return dict(json.loads(out.strip().splitlines()[-1]))


def alone(n: int, names: list[str], args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    """One process on each GPU in turn, given its GPU by CUDA indices."""
    index_names = [str(i) for i in range(len(names))]
    return [finish(start(visible(g, index_names), args, env, None, 1)) for g in range(n)]


def together(n: int, names: list[str], args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    """A process on every GPU at once, each given its GPU by UUIDs."""
    ready = Path(tempfile.mkdtemp(prefix="gpuenv-node-"))
    procs = [start(visible(g, names), args, env, ready, n) for g in range(n)]
    out = [finish(p) for p in procs]
    for f in ready.iterdir():
        f.unlink()
    ready.rmdir()
    return out


def ratio(a: dict[str, Any], b: dict[str, Any], kernel: str) -> float | None:
    if "error" in a or "error" in b:
        return None
    return float(b[kernel]["median_s"]) / float(a[kernel]["median_s"])


def right(r: dict[str, Any], expect: str) -> bool:
    """Both benches sampled the GPU the process ran on: CUDA's UUID of its device 0 where
    CUDA answers (the simulated GPU has none: the UUID it was given first)."""
    same = r["heavy"]["gpu"] == r["tiny"]["gpu"]
    want = r.get("cuda_uuid") or expect
    return same and str(r["uuid"]).lower() == str(want).lower()


def row(uuid: str, a: dict[str, Any], b: dict[str, Any]) -> tuple[str, dict]:
    """One GPU's row (by UUID): alone and together, and whether each sampled that GPU."""
    if "error" in a or "error" in b:
        return f"| {uuid[:12]}... | {a.get('error', '')} {b.get('error', '')} | | | | | | | |", {}
    ok = a.get("right") and b.get("right")
    h, t = ratio(a, b, "heavy"), ratio(a, b, "tiny")
    verdicts = "/".join(r[k]["verdict"] for r in (a, b) for k in ("heavy", "tiny"))
    text = (
        f"| {a['heavy']['gpu']} | {uuid[:12]}... {'yes' if ok else 'NO'} "
        f"| {a['heavy']['median_s'] * 1e3:.4f} ms | {b['heavy']['median_s'] * 1e3:.4f} ms "
        f"| {h:.4f} | {a['tiny']['median_s'] * 1e6:.2f} us | {b['tiny']['median_s'] * 1e6:.2f} us "
        f"| {t:.4f} | {verdicts} |"
    )
    return text, {"right": ok, "heavy": h, "tiny": t}


def by_gpu(results: list[dict[str, Any]], given: list[str]) -> dict[str, dict[str, Any]]:
    """Each process's result under the UUID of the GPU it sampled (its given one on error),
    marked with whether that is the GPU it ran on."""
    out = {}
    for r, expect in zip(results, given, strict=True):
        if "error" in r:
            out[expect] = r
            continue
        out[str(r["uuid"])] = dict(r, right=right(r, expect))
    return out


def run(args: argparse.Namespace) -> int:
    sim = bool(args.sim)
    extra = dict(SAFE_ENV)
    state = Path(tempfile.mkdtemp(prefix="gpuenv-node-sim-"))
    if sim:  # a node of its own
        extra.update(GPUENV_BACKEND="sim", GPUENV_SIM_GPUS=str(args.gpus or 4))
        extra["GPUENV_SIM_STATE"] = str(state / "sim.json")
    os.environ.update(extra)
    env = checkout_env(dict(os.environ, **extra))
    names = uuids(sim)
    n = args.gpus or (4 if sim else gpu_count(sim))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {n} GPUs measured at once vs one at a time ({when})")
    print(
        f"\ngpuenv.bench (budget {args.budget:g} s) on an {args.n} bf16 matmul (heavy) and "
        "x.sum() of 64k fp32 floats (tiny): one process alone on each GPU in turn, then one "
        "process on every GPU at once. Ratio: together / alone (goal: heavy within "
        f"{HEAVY_GOAL:.1%}, tiny within {TINY_GOAL:.0%}).\n"
    )
    t0 = time.perf_counter()
    first = alone(n, names, args, env)
    second = together(n, names, args, env)
    wall = time.perf_counter() - t0
    print(
        "| GPU | UUID, sampled right | heavy alone | heavy together | ratio | tiny alone "
        "| tiny together | ratio | verdicts (alone heavy/tiny, together heavy/tiny) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    # CUDA's index g (alone) is the GPU CUDA calls g, which need not be NVML's g: by UUID
    first_by, second_by = by_gpu(first, names[:n]), by_gpu(second, names[:n])
    got = []
    for uuid in names[:n]:
        missing = {"error": "no process sampled it"}
        text, r = row(uuid, first_by.get(uuid, missing), second_by.get(uuid, missing))
        print(text)
        got.append(r)
    ok = [r for r in got if r]
    rc = 0 if len(ok) == n and all(r["right"] for r in ok) else 1
    if ok:
        worst_h = max(abs(r["heavy"] - 1) for r in ok)
        worst_t = max(abs(r["tiny"] - 1) for r in ok)
        runner.metric("heavy_worst_rel", worst_h, better="lower", slack=0.002)
        runner.metric("tiny_worst_rel", worst_t, better="lower", slack=0.01)
        print(
            f"\nWorst GPU: heavy {worst_h:.2%} ({'within' if worst_h <= HEAVY_GOAL else 'over'} "
            f"{HEAVY_GOAL:.1%}), tiny {worst_t:.2%} "
            f"({'within' if worst_t <= TINY_GOAL else 'over'} {TINY_GOAL:.0%}); every process "
            f"sampled the GPU it was given: {'yes' if rc == 0 else 'NO'}. Wall {wall:.0f} s."
        )
    for f in state.iterdir():
        f.unlink()
    state.rmdir()
    return rc


if __name__ == "__main__":
    sys.exit(runner.main("node_concurrent", __doc__, add_arguments, run, quick={"budget": 1.0}))
