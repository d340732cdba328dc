#!/usr/bin/env python3
"""The job's collective row on a multi-GPU node: does it name the GPU that held a
data-parallel step back?

benchmarks/workloads/ddp_step.py on every GPU under `gpuenv run -o X -- torchrun
--standalone --nproc-per-node N` (one rank a GPU; a step: --matmuls 8192 bf16 matmuls, then
an NCCL all-reduce of --mb MB), twice:

  control    all GPUs as they are: the row should name no GPU (or say why it named one)
  preheated  one GPU (--preheat-gpu, default the last) heated --preheat-s seconds by a
             separate process running the same matmuls while the ranks start up (torchrun,
             NCCL); they take their first step as it ends: the row should name that GPU,
             with its state, and the others' inferred wait
  shared     (--shared) the same process on that GPU, started as the ranks take their
             first step and running --preheat-s seconds beside them: the row should name
             the GPU another process shared

Reported: the step's time and the ranks' spread, the GPU named, its clock while busy and
power-cap share, the others' clock, the inferred wait, and whether the named GPU is the
preheated one (metric `named_preheated`: 1 or 0). Read-only (GPUENV_READONLY=1); every
process gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1. About a minute on 4 H100s.

    GPUENV_READONLY=1 python -m benchmarks.collective              # the GPUs here
    python -m benchmarks.collective --sim --quick --out -           # 4 simulated GPUs, CPU torch
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env, finish_within
from benchmarks.launcher import SAFE_ENV, gpu_count

WORKLOAD = ROOT / "benchmarks" / "workloads" / "ddp_step.py"
TIMEOUT_S = 150  # per job: a hung rank costs one run, not the call
# the preheater: the same matmuls, back to back, for the given seconds on its one GPU
PREHEAT = """
import sys, time
import torch
seconds, n = float(sys.argv[1]), int(sys.argv[2])
if torch.cuda.is_available():
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
else:
    from gpuenv.backend.sim import SimBackend
    sim = SimBackend.from_env()
    gpu = int(sys.argv[3])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sim.run_work(gpu, 0.05 * sim.clock_limits(gpu).max_sm_mhz * 1e6, power_intensity=1.0)
    sim.close()
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=0, help="ranks (default: every GPU)")
    parser.add_argument("--n", type=int, default=8192, help="matmul size")
    parser.add_argument("--matmuls", type=int, default=30, help="matmuls a step")
    parser.add_argument("--mb", type=int, default=256, help="all-reduce size, MB")
    parser.add_argument("--steps", type=int, default=40, help="marked steps")
    parser.add_argument("--warmup", type=int, default=10, help="unmarked steps first")
    parser.add_argument("--preheat-gpu", type=int, default=-1, help="default: the last GPU")
    parser.add_argument("--preheat-s", type=float, default=8.0)
    parser.add_argument(
        "--shared", action="store_true", help="also a run with that GPU shared during the steps"
    )


def gpu_uuid(index: int) -> str:
    """The NVML GPU's UUID: the preheater picks it by UUID, whatever CUDA's order."""
    from gpuenv.backend import open_backend

    backend = open_backend(None, readonly=True)
    try:
        return backend.device_info(index).uuid
    finally:
        backend.close()


def preheat(
    gpu: int, seconds: float, n: int, env: dict[str, str], sim: bool, go: Path | None = None
) -> float:
    """Heat one GPU with a separate process; its wall time. With `go`: make it once the
    process has its GPU (then it runs beside the ranks' steps, not before them)."""
    env = dict(env)
    if not sim:
        env["CUDA_VISIBLE_DEVICES"] = gpu_uuid(gpu)
    t0 = time.perf_counter()
    heater = subprocess.Popen(
        [sys.executable, "-c", PREHEAT, str(seconds), str(n), str(gpu)], env=env
    )
    try:
        if go is not None:
            time.sleep(min(5.0, seconds / 4))  # its start-up (CUDA, the first matmul)
            go.touch()
        if heater.wait(timeout=seconds + 120) != 0:
            raise RuntimeError(f"the preheater exited {heater.returncode}")
    finally:
        if heater.poll() is None:
            heater.kill()
    return time.perf_counter() - t0


def torchrun_path() -> str:
    """torchrun beside this Python (a virtual environment not activated), else on PATH."""
    here = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return here or shutil.which("torchrun") or "torchrun"


def job(
    n: int,
    args: argparse.Namespace,
    env: dict[str, str],
    heat: int | None = None,
    beside: bool = False,
) -> dict[str, Any]:
    """One wrapped torchrun of ddp_step.py (GPU `heat` preheated while the ranks start, or
    with `beside` heated while they step): the collective step kind, and the summary."""
    from gpuenv.results import load_run
    from gpuenv.run.collective import collective_steps

    tmp = Path(tempfile.mkdtemp(prefix="gpuenv-collective-"))
    out, go = tmp / "run.jsonl", tmp / "go"
    argv = [*GPUENV, "run", "-o", str(out), "--", torchrun_path(), "--standalone"]
    argv += ["--nproc-per-node", str(n), str(WORKLOAD), "--size", str(args.n)]
    argv += ["--matmuls", str(args.matmuls), "--mb", str(args.mb)]
    argv += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--wait-for", str(go)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:  # the ranks start up meanwhile, and wait for `go`
        heat_s = (
            0.0
            if heat is None
            else preheat(heat, args.preheat_s, args.n, env, args.sim, go if beside else None)
        )
    finally:
        go.touch()
    done = finish_within(proc, TIMEOUT_S)
    if done is None:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    stderr = done[1]
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(stderr[-3000:])
        return {"error": f"exit {proc.returncode}", "wall_s": wall}
    ms = load_run(out).measurements
    steps = collective_steps([(m.extra["rank"], m) for m in ms if "rank" in m.extra])
    shutil.rmtree(tmp, ignore_errors=True)
    if len(steps) != 1:
        return {"error": f"{len(steps)} kinds of step, not 1", "wall_s": wall}
    text = stderr[stderr.find("  the ranks' steps") :].split("\n  results:")[0]
    return {"step": steps[0], "wall_s": wall, "heat_s": heat_s, "text": text.rstrip()}


def row(name: str, r: dict[str, Any], heated: int | None) -> str:
    if "error" in r:
        return f"| {name} | {r['error']} | | | | | | | |"
    s = r["step"]
    low = s.slowest
    named = "none" if low is None else f"GPU {low.gpu} (rank {low.rank})"
    cap = "-" if low is None else f"{100 * low.capped_frac:.0f}%"
    wait = "-" if s.wait_s is None else f"{s.wait_s * 1e3:.2f} ms ({100 * (s.wait_frac or 0):.0f}%)"
    right = {True: "yes", False: "no"}[(low.gpu if low else None) == heated]
    return (
        f"| {name} | {s.step_s * 1e3:.2f} ms | {s.spread_s * 1e3:.3f} ms | {named} | "
        f"{'-' if low is None else f'{low.sm_mhz:.0f}'} | {cap} | "
        f"{'-' if s.others_mhz is None else f'{s.others_mhz:.0f}'} | {wait} | {right} |"
    )


def _named(r: dict[str, Any], gpu: int) -> bool:
    return "step" in r and r["step"].slowest is not None and r["step"].slowest.gpu == gpu


def run(args: argparse.Namespace) -> int:
    sim = bool(args.sim)
    n = args.gpus or (4 if sim else gpu_count(sim))
    if n < 2:
        print("needs 2 GPUs or more")
        return 1
    heated = args.preheat_gpu if args.preheat_gpu >= 0 else n - 1
    extra = dict(SAFE_ENV)
    tmp = Path(tempfile.mkdtemp(prefix="gpuenv-collective-sim-"))
    if sim:  # a node of its own: nothing another run left in the default state file
        extra.update(GPUENV_BACKEND="sim", GPUENV_SIM_GPUS=str(n))
        extra["GPUENV_SIM_STATE"] = str(tmp / "sim.json")
    os.environ.update(extra)
    env = checkout_env(dict(os.environ, **extra))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# The ranks' step row on {n} GPUs: which GPU held the step back ({when})")
    print(
        f"\n{n} ranks under `gpuenv run -- torchrun`; a step: {args.matmuls} {args.n} bf16 "
        f"matmuls, then an all-reduce of {args.mb} MB; {args.steps} marked steps after "
        f"{args.warmup} unmarked. The preheated run heats GPU {heated} for "
        f"{args.preheat_s:g} s with a separate process while the ranks start up"
        + (
            "; the shared run starts that process as the ranks take their first step.\n"
            if args.shared
            else ".\n"
        )
    )
    print(
        "| run | step (median) | ranks' spread (median) | GPU named | its MHz while busy "
        "| its power-capped share | others' MHz | others' wait (inferred, at most) "
        "| named the heated GPU |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---|")
    control = job(n, args, env)
    print(row("control", control, heated))
    hot = job(n, args, env, heat=heated)
    print(row(f"GPU {heated} preheated", hot, heated))
    runs = [("control", control), (f"GPU {heated} preheated", hot)]
    if args.shared:
        shared = job(n, args, env, heat=heated, beside=True)
        runs.append((f"GPU {heated} shared with another process", shared))
        print(row(runs[-1][0], shared, heated))
        runner.metric("named_shared", float(_named(shared, heated)), better="higher")
    shutil.rmtree(tmp, ignore_errors=True)
    runner.metric("named_preheated", float(_named(hot, heated)), better="higher")
    if "step" in control:
        runner.metric("control_named_none", float(control["step"].slowest is None), better="higher")
    for name, r in runs:
        if "text" in r:
            print(
                f"\n{name} ({r['wall_s']:.0f} s wall, {r['heat_s']:.0f} s of it preheating), "
                "as printed:\n"
            )
            print("```text\n" + r["text"] + "\n```")
            print("\nEach rank's GPU over its steps:\n")
            print("| rank | GPU | MHz while busy | power-capped share | up to C | others on it |")
            print("|---:|---:|---:|---:|---:|---|")
            for g in r["step"].gpus:
                temp = "-" if g.temp_c_max is None else f"{g.temp_c_max:.0f}"
                pids = ", ".join(map(str, g.other_pids)) or "-"
                print(
                    f"| {g.rank} | {g.gpu} | {g.sm_mhz:.0f} | {100 * g.capped_frac:.0f}% | "
                    f"{temp} | {pids} |"
                )
    return 0 if all("step" in r for _, r in runs) else 1


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "collective",
            __doc__,
            add_arguments,
            run,
            quick={"n": 4096, "matmuls": 20, "steps": 20, "warmup": 3, "preheat_s": 4.0},
        )
    )
