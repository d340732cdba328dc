#!/usr/bin/env python3
"""One process of benchmarks/node_shared.py, on a real CUDA GPU (read-only).

--role measure: `with gpuenv.stable(...) as env:` then `env.bench(fn)` on six kernels
(benchmarks.session_wait's: three memory-bound, three heavy), `--calls` times each, round
robin. The bench runs on CUDA's current device: 0 (the GPU CUDA_VISIBLE_DEVICES gives this
process), `--device K`, or torchrun's LOCAL_RANK (set as torchrun's tutorials do). With
`--heat S`, S seconds of 8192^3 bf16 matmuls on this process's GPU come before each call,
so that a process beside it measures while this one loads. `--session all` opens the
session over every GPU of the host (`gpus="all"`) rather than the process's own. The last
line is JSON (DIR/<pid>.json with --json-dir): per kernel each call's median, the bench
call's wall, the seconds it spent in its condition phase, its warnings; the session's GPUs
and why; the NotRecoveredWarnings.

--role load: 8192^3 bf16 matmuls on CUDA's device 0 until --stop exists (it touches --ready
after its first round, so the measuring process starts under load).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from benchmarks._kernels import GpuEnv

parser = argparse.ArgumentParser()
parser.add_argument("--role", choices=("measure", "load"), default="measure")
parser.add_argument("--calls", type=int, default=2)
parser.add_argument("--heat", type=float, default=0.0)
parser.add_argument("--session", choices=("own", "all"), default="own")
parser.add_argument("--device", type=int, default=None)
parser.add_argument("--ready", type=Path)
parser.add_argument("--together", type=int, default=1)
parser.add_argument("--stop", type=Path)
parser.add_argument("--json-dir", type=Path, help="write the JSON to DIR/<pid>.json")
args = parser.parse_args()


def heavy() -> Any:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return lambda: a @ b


def wait_together() -> None:
    if args.ready is None:
        return
    (args.ready / f"ready-{os.getpid()}").touch()
    while len(list(args.ready.glob("ready-*"))) < args.together:
        time.sleep(0.01)


def loader() -> None:
    gpu = GpuEnv(torch, heavy())
    gpu.load(0.5)
    if args.ready is not None:
        (args.ready / f"loading-{os.getpid()}").touch()
    while args.stop is None or not args.stop.exists():
        gpu.load(0.2)


def measure() -> dict[str, Any]:
    import gpuenv
    from benchmarks.session_wait import state_kernels
    from gpuenv.session import NotRecoveredWarning

    rank = os.environ.get("LOCAL_RANK")
    device = args.device if args.device is not None else int(rank) if rank else 0
    torch.cuda.set_device(device)
    kernels = state_kernels(torch)
    own = GpuEnv(torch, kernels["mm8192"])  # the heat before each call
    out: dict[str, Any] = {
        name: {"median_s": [], "wall_s": [], "condition_s": [], "warnings": []} for name in kernels
    }
    wait_together()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gpuenv.stable(**({"gpus": "all"} if args.session == "all" else {})) as env:
            for _ in range(args.calls):
                for name, fn in kernels.items():
                    if args.heat > 0:
                        own.load(args.heat)
                    t0 = time.perf_counter()
                    m = env.bench(fn, name=name)
                    wall = time.perf_counter() - t0
                    row = out[name]
                    row["median_s"].append(m.median_s)
                    row["wall_s"].append(wall)
                    row["condition_s"].append(m.wall.seconds("condition") if m.wall else None)
                    row["warnings"] += [
                        f.kind for f in m.findings if f.severity in ("warning", "error")
                    ]
                    row["gpus"] = list(m.gpus)
                    row["waited_for"] = [] if m.conditioned is None else list(m.conditioned.gpus)
            gpus, why = list(env.gpus), env.gpus_why
    not_recovered = sum(issubclass(w.category, NotRecoveredWarning) for w in caught)
    return {
        "kernels": out,
        "session_gpus": gpus,
        "session_why": why,
        "device": device,
        "not_recovered": not_recovered,
        "other_warnings": sorted(
            {
                str(w.message)[:160]
                for w in caught
                if not issubclass(w.category, NotRecoveredWarning)
            }
        ),
    }


if args.role == "load":
    loader()
elif args.json_dir is not None:  # torchrun's ranks share one stdout
    (args.json_dir / f"{os.getpid()}.json").write_text(json.dumps(measure()))
else:
    print(json.dumps(measure()))
