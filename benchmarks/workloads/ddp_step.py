#!/usr/bin/env python3
"""One rank of a data-parallel training step as people write it, for `gpuenv run` to wrap
(benchmarks/collective.py starts it under torchrun): each step is --matmuls N x N bf16
matmuls (the rank's share of the work) then an all-reduce of --mb MB (the gradients), marked
`gpuenv.region("step")`; --warmup steps first, unmarked. NCCL on CUDA. With --wait-for PATH
every rank, once set up, waits for PATH to exist before its first step (benchmarks.collective
preheats a GPU meanwhile, and makes PATH as the preheating ends).

Without CUDA (torch's CPU build) it runs on the simulated GPU of GPUENV_BACKEND=sim: the
matmuls are the simulator's work on its LOCAL_RANK's GPU (1.4 ms each at the top clock,
a heavy kernel's power), the all-reduce a small one through gloo. The last line is JSON.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import gpuenv

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=8192)
parser.add_argument("--matmuls", type=int, default=30)
parser.add_argument("--mb", type=int, default=256)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--wait-for", default="")
args = parser.parse_args()

local = int(os.environ.get("LOCAL_RANK", "0"))
if torch.cuda.is_available():
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    grad = torch.ones(args.mb << 18, device="cuda", dtype=torch.float32)  # MB of fp32

    def work() -> None:
        for _ in range(args.matmuls):
            a @ b

    def sync() -> None:
        torch.cuda.synchronize()

    close = None
else:
    from gpuenv.backend.sim import SimBackend

    dist.init_process_group("gloo")
    sim = SimBackend.from_env()
    cycles = args.matmuls * 1.4e-3 * sim.clock_limits(local).max_sm_mhz * 1e6
    grad = torch.ones(1 << 16)

    def work() -> None:
        sim.run_work(local, cycles, power_intensity=1.0)

    def sync() -> None:
        pass

    close = sim.close


def step() -> None:
    work()
    dist.all_reduce(grad)
    sync()


deadline = time.monotonic() + 300
while args.wait_for and not os.path.exists(args.wait_for) and time.monotonic() < deadline:
    time.sleep(0.01)
dist.barrier()
for _ in range(args.warmup):
    step()
dist.barrier()
times = []
for _ in range(args.steps):
    t = time.perf_counter()
    with gpuenv.region("step"):
        step()
    times.append(time.perf_counter() - t)
if close is not None:
    close()
dist.destroy_process_group()
print(json.dumps({"rank": os.environ.get("RANK"), "step_ms": 1e3 * sorted(times)[len(times) // 2]}))
