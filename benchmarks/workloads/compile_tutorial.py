#!/usr/bin/env python3
"""A torch.compile benchmark written the way torch's compile tutorial writes one, for
`gpuenv run --autotune` to wrap unmodified: an MLP compiled with
`torch.compile(mode="max-autotune")`, eager and compiled inference timed with CUDA events
(the tutorial's `timed`), medians printed. The last line is JSON for scripts and tests.
Nothing here knows about gpuenv.

    python3 benchmarks/workloads/compile_tutorial.py [--iters 10]
"""

import argparse
import json

import numpy as np
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=10, help="timed calls of each (10)")
args = parser.parse_args()


def timed(fn):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    torch.cuda.synchronize()
    return result, start.elapsed_time(end) / 1000


class MLP(nn.Module):
    def __init__(self, width=4096):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def generate_data(b):
    return torch.randn(b, 4096, device="cuda", dtype=torch.float16)


model = MLP().cuda().half().eval()
opt = torch.compile(model, mode="max-autotune")
inp = generate_data(2048)
with torch.no_grad():
    print("eager:", timed(lambda: model(inp))[1])
    print("compile:", timed(lambda: opt(inp))[1])  # compiles and autotunes

eager_times, compile_times = [], []
for _ in range(args.iters):
    inp = generate_data(2048)
    with torch.no_grad():
        _, eager_time = timed(lambda: model(inp))  # noqa: B023
        _, compile_time = timed(lambda: opt(inp))  # noqa: B023
    eager_times.append(eager_time)
    compile_times.append(compile_time)
eager_med = np.median(eager_times)
compile_med = np.median(compile_times)
print(
    f"(eval) eager median: {eager_med}, compile median: {compile_med}, "
    f"speedup: {eager_med / compile_med}x"
)
print(json.dumps({"eager_s": float(eager_med), "compile_s": float(compile_med)}))
