#!/usr/bin/env python3
"""One process of benchmarks/node_concurrent.py: gpuenv.bench on a heavy kernel (an N x N
bf16 matmul) and a tiny one (x.sum() on 64k fp32 floats) on CUDA's device 0, which its
CUDA_VISIBLE_DEVICES makes the GPU it is given. With --ready DIR it first says it is ready
(DIR/ready-<pid>) and waits until --together files are there, so that processes started
together measure together. The last line is JSON: the NVML GPU each bench sampled, its
UUID, CUDA's UUID of its device 0 (None on the simulated GPU), the medians and verdicts.

Without CUDA (torch absent, or its CPU build) it runs on the simulated GPU of
GPUENV_BACKEND=sim: the kernels are the simulator's (1.4 ms and 7.4 us at the top clock) on
the GPU CUDA_VISIBLE_DEVICES names first.
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import gpuenv
from gpuenv.backend import open_backend

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=8192)
parser.add_argument("--budget", type=float, default=4.0)
parser.add_argument("--ready", type=Path)
parser.add_argument("--together", type=int, default=1)
args = parser.parse_args()


def cuda_kernels():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1 << 16, device="cuda", dtype=torch.float32)
    return (lambda: a @ a), (lambda: x.sum())


def cuda_uuid() -> str | None:
    """CUDA's own word for the GPU this process runs on (device 0), to check gpuenv against."""
    import torch

    text = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
    if not text:
        return None
    return text if text.upper().startswith("GPU-") else f"GPU-{text}"


kernels = cuda_kernels()
backend = None
truth = cuda_uuid() if kernels is not None else None
if kernels is None:
    from gpuenv.devices import select_gpus
    from gpuenv.timing import sim_kernel

    backend = open_backend("sim")
    gpu = select_gpus(backend, "cuda:0")[0]
    kernels = (
        sim_kernel(backend, gpu, seconds=1.4e-3),
        sim_kernel(backend, gpu, seconds=7.4e-6, power_intensity=0.05),
    )

if args.ready is not None:  # start together with the others
    (args.ready / f"ready-{os.getpid()}").touch()
    while len(list(args.ready.glob("ready-*"))) < args.together:
        time.sleep(0.01)

out: dict[str, Any] = {}
for name, fn in zip(("heavy", "tiny"), kernels, strict=True):
    m = gpuenv.bench(fn, name=name, budget_s=args.budget, backend=backend)
    out[name] = {"median_s": m.stats.median_s, "verdict": m.verdict, "gpu": m.gpus[0]}
names = open_backend(None, readonly=True) if backend is None else backend
out["uuid"] = names.device_info(out["heavy"]["gpu"]).uuid
out["cuda_uuid"] = truth
names.close()
print(json.dumps(out))
