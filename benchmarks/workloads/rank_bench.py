#!/usr/bin/env python3
"""One worker of a multi-GPU job as people write them, for `gpuenv run` to wrap unmodified
(benchmarks/launcher.py starts it under torchrun and friends).

On its LOCAL_RANK's GPU: --calls do_bench calls on an N x N bf16 matmul (a torch Timer's
timeit where triton is absent), then --steps steps of 20 matmuls, each marked with
`gpuenv.region("step")`. No process group (nothing here talks NCCL). Without CUDA (torch's
CPU build, the simulated GPU) it runs on the CPU at a small size. The last line is JSON.
"""

import argparse
import json
import os

import torch

import gpuenv

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=8192)
parser.add_argument("--calls", type=int, default=2)
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

local = int(os.environ.get("LOCAL_RANK", "0"))
if torch.cuda.is_available():
    torch.cuda.set_device(local)
    device, dtype, n = "cuda", torch.bfloat16, args.size
else:
    device, dtype, n = "cpu", torch.float32, min(args.size, 256)
a = torch.randn(n, n, device=device, dtype=dtype)
b = torch.randn(n, n, device=device, dtype=dtype)


def sync() -> None:
    if device == "cuda":
        torch.cuda.synchronize()


try:
    import triton.testing

    def measure() -> float:
        return triton.testing.do_bench(lambda: a @ b)

except ImportError:
    import torch.utils.benchmark as tb

    def measure() -> float:
        return tb.Timer("a @ b", globals={"a": a, "b": b}).timeit(20).median * 1e3


times = [measure() for _ in range(args.calls)]
for _ in range(args.steps):
    with gpuenv.region("step"):
        for _ in range(20):
            a @ b
        sync()
print(json.dumps({"rank": os.environ.get("RANK"), "device": device, "ms": times}))
