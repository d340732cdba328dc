#!/usr/bin/env python3
"""gpuenv run on a multi-GPU node: which workers' calls are seen, launcher wrapped whole vs
each rank wrapped.

Each form runs benchmarks/workloads/rank_bench.py on every GPU (one worker per GPU, no
process group): 2 do_bench calls on an 8192 bf16 matmul and 3 `gpuenv.region("step")`
steps per worker. Forms:

  whole      gpuenv run -o X -- torchrun --standalone --nproc-per-node N rank_bench.py
  module     gpuenv run -o X -- python -m torch.distributed.run --standalone ... rank_bench.py
  accelerate gpuenv run -o X -- accelerate launch --multi_gpu --num_processes N rank_bench.py
             (where accelerate is installed)
  each rank  torchrun --standalone --nproc-per-node N --no-python gpuenv run --summary rank0
             -o X -- python rank_bench.py

For each: the workers' calls and steps that became measurements, how many of those carry
their own rank's GPU (and its telemetry), the GPUs sampled, the wall time; for `each rank`,
the rows of ranks 1.. in rank 0's table that show telemetry rather than "-". Then
`gpuenv check` on the same GPUs: its table and its wall time (--no-check: not;
--check-only: that alone, kept in launcher-check.json). Read-only
(GPUENV_READONLY=1); every process gets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1.

    GPUENV_READONLY=1 python -m benchmarks.launcher                 # the GPUs here
    python -m benchmarks.launcher --sim --quick --out -             # 4 simulated GPUs, CPU torch
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env

WORKLOAD = ROOT / "benchmarks" / "workloads" / "rank_bench.py"
SAFE_ENV = {
    "GPUENV_READONLY": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TIMEOUT_S = 80  # per form: a hung worker costs one form, not the run
CHECK_TIMEOUT_S = 100  # gpuenv check's own budget is 60 s; with the forms, under 8 minutes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=0, help="workers (default: every GPU)")
    parser.add_argument("--n", type=int, default=8192, help="matmul size")
    parser.add_argument("--calls", type=int, default=2, help="do_bench calls per worker")
    parser.add_argument("--steps", type=int, default=3, help="marked steps per worker")
    parser.add_argument("--no-check", action="store_true", help="skip `gpuenv check`")
    parser.add_argument("--check-only", action="store_true", help="`gpuenv check` alone")


def gpu_count(sim: bool) -> int:
    from gpuenv.backend import open_backend

    backend = open_backend("sim" if sim else None, readonly=True)
    try:
        return backend.device_count()
    finally:
        backend.close()


def forms(n: int, work: list[str]) -> dict[str, tuple[list[str], bool]]:
    """name -> (argv, whether gpuenv wraps the launcher whole)."""
    torchrun = shutil.which("torchrun") or "torchrun"
    launch = ["--standalone", "--nproc-per-node", str(n)]
    out: dict[str, tuple[list[str], bool]] = {
        "whole: gpuenv run -- torchrun": ([torchrun, *launch, *work], True),
        "whole: gpuenv run -- python -m torch.distributed.run": (
            [sys.executable, "-m", "torch.distributed.run", *launch, *work],
            True,
        ),
    }
    accelerate = shutil.which("accelerate")
    if accelerate is not None:
        out["whole: gpuenv run -- accelerate launch"] = (
            [
                accelerate,
                "launch",
                "--multi_gpu",
                "--num_machines",
                "1",
                "--num_processes",
                str(n),
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                *work,
            ],
            True,
        )
    per_rank = [*GPUENV, "run", "--summary", "rank0"]
    out["each rank: torchrun --no-python gpuenv run"] = (
        [torchrun, *launch, "--no-python", *per_rank, "-o", "{out}", "--", sys.executable, *work],
        False,
    )
    return out


def run_form(argv: list[str], whole: bool, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    out = tmp / "run.jsonl"
    argv = [a.replace("{out}", str(out)) for a in argv]
    if whole:
        argv = [*GPUENV, "run", "-o", str(out), "--", *argv]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    except FileNotFoundError as err:  # the launcher itself is not installed (torchrun)
        return {"error": f"not installed: {err.filename}"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        return {"error": f"exit {proc.returncode}", "wall_s": wall}
    return {"wall_s": wall, "stderr": proc.stderr, **seen(tmp, whole)}


def seen(tmp: Path, whole: bool) -> dict[str, Any]:
    """The workers' calls and steps kept, per rank, and whether each has its GPU alone."""
    from gpuenv.results import load_run

    files = [tmp / "run.jsonl"] if whole else sorted(tmp.glob("run.rank*.jsonl"))
    calls = steps = own = 0
    sampled: set[int] = set()
    for path in files:
        ms = load_run(path).measurements
        sampled.update(ms[0].gpus)
        file_rank = None if whole else int(re.findall(r"rank(\d+)", path.name)[-1])
        for m in ms[1:]:
            rank = m.extra.get("rank", file_rank)
            if rank is None:
                continue
            calls += "site" in m.extra
            steps += len(m.times_s) if m.name == "step" else 0
            w = m.summary_windows
            own += len(w) == 1 and w[0].sm_mhz_mean is not None
    return {"calls": calls, "steps": steps, "own_gpu": own, "sampled": len(sampled)}


def other_ranks_rows(stderr: str) -> tuple[int, int]:
    """Rank 0's table: rows of ranks 1.. with SM MHz and power, and all rows of ranks 1.."""
    rows = [ln.split() for ln in stderr.splitlines() if re.match(r"  [1-9]\d* ", ln)]
    # SM MHz is its mean, then its range where it moved ("1452 (1440-1470)"), then power
    told = sum(1 for r in rows if re.search(r" \d+(?: \(\d+-\d+\))? +\d+ W ", " ".join(r) + " "))
    return told, len(rows)


def run(args: argparse.Namespace) -> int:
    sim = bool(args.sim)
    n = args.gpus or (4 if sim else gpu_count(sim))
    extra = dict(SAFE_ENV)
    if sim:
        extra.update(GPUENV_BACKEND="sim", GPUENV_SIM_GPUS=str(n))
    os.environ.update(extra)
    env = checkout_env(dict(os.environ, **extra))
    if args.check_only:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"# gpuenv check on {n} GPUs ({when})")
        return node_check(env)
    work = [
        str(WORKLOAD),
        "--size",
        str(args.n),
        "--calls",
        str(args.calls),
        "--steps",
        str(args.steps),
    ]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    expect_calls, expect_steps = n * args.calls, n * args.steps
    print(f"# gpuenv run on {n} GPUs: launcher wrapped whole vs each rank wrapped ({when})")
    print(
        f"\n{n} workers, each {args.calls} do_bench calls and {args.steps} marked steps "
        f"({expect_calls} calls, {expect_steps} steps in all):\n"
    )
    print(
        "| form | workers' calls seen | steps seen | measurements with their rank's GPU alone "
        "| GPUs sampled | wall |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    rc = 0
    summary_rows, table = None, ""
    for name, (argv, whole) in forms(n, work).items():
        tmp = Path(tempfile.mkdtemp(prefix="gpuenv-launcher-"))
        r = run_form(argv, whole, tmp, env)
        if "error" in r:
            print(f"| {name} | {r['error']} | | | | |")
            rc = 1
            continue
        key = re.sub(r"\W+", "_", name.split(":")[0] + "_" + name.split("--")[-1]).strip("_")
        runner.metric(f"{key}_calls_missed", expect_calls - r["calls"], better="lower")
        print(
            f"| {name} | {r['calls']} of {expect_calls} | {r['steps']} of {expect_steps} | "
            f"{r['own_gpu']} | {r['sampled']} | {r['wall_s']:.1f} s |"
        )
        if not whole:
            told, rows = other_ranks_rows(r["stderr"])
            summary_rows = f"{told} of {rows}"
            table = r["stderr"]
        shutil.rmtree(tmp, ignore_errors=True)
    if summary_rows is not None:
        print(
            f"\nUnder --summary rank0, rank 0's table rows of ranks 1-{n - 1} with their GPU's "
            f"telemetry (SM MHz, power): {summary_rows}. Rank 0's summary as printed:\n"
        )
        print("```text\n" + table.rstrip()[-3000:] + "\n```")
    if not args.no_check:
        rc = max(rc, node_check(env))
    return rc


def node_check(env: dict[str, str]) -> int:
    """`gpuenv check` on the same GPUs: its table and its wall time (exit 1 names a GPU)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [*GPUENV, "check"], env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        print(f"\n`gpuenv check` timed out after {CHECK_TIMEOUT_S} s")
        return 1
    wall = time.perf_counter() - t0
    runner.metric("check_wall_s", wall, "s", slack=5.0)
    print(f"\n`gpuenv check` (exit {proc.returncode}, {wall:.1f} s wall):\n")
    print("```text\n" + (proc.stdout or proc.stderr[-3000:]).rstrip() + "\n```")
    return 0 if proc.returncode in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "launcher",
            __doc__,
            add_arguments,
            run,
            quick={"n": 2048, "calls": 1, "steps": 2},
            variant=lambda args: "check" if args.check_only else "",
        )
    )
