#!/usr/bin/env python3
"""A third-party benchmark as people write them, for `gpuenv run` to wrap unmodified.

triton's do_bench on an 8192 x 8192 bf16 matmul, then LOAD seconds of the same
matmul back to back, then do_bench again: on an H100 the second number comes out
~16% slower (the power cap). The last line is JSON for scripts and tests.
Nothing here knows about gpuenv.

    python3 benchmarks/workloads/do_bench_load.py [--load 10] [--n 8192]
"""

import argparse
import json
import time

import torch
import triton.testing

parser = argparse.ArgumentParser()
parser.add_argument("--load", type=float, default=10.0, help="seconds of load between the two")
parser.add_argument("--n", type=int, default=8192)
args = parser.parse_args()

a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
first = triton.testing.do_bench(lambda: a @ b)
print(f"do_bench before the load: {first:.3f} ms", flush=True)
t0 = time.monotonic()
while time.monotonic() - t0 < args.load:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
second = triton.testing.do_bench(lambda: a @ b)
print(f"do_bench after {args.load:g} s of load: {second:.3f} ms", flush=True)
print(json.dumps({"first_ms": first, "second_ms": second}))
