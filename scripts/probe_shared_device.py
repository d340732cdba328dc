"""Issue 22 item 3 on a real GPU (read-only): is what moves between calls each call's own
set-up?

scripts/probe_back_to_back.py: calls of gpuenv.bench back to back, at one temperature and
with no idle between them, still move 0.4-1.2% (attention, conv, the 4096 matmul) while
each call's median is within +-0.25%. Every call builds its timing device afresh: a new
L2 flush buffer (2x the L2, from the caching allocator; each rep zeroes it, leaving
its lines dirty in L2 for fn's first accesses to evict) and new events. Here, per kernel
and round, `--calls` default calls (a device each) beside `--calls` calls that share one
device (`device=`: one flush buffer for all), alternating, with each default call's flush
buffer address.

    GPUENV_READONLY=1 python3 scripts/probe_shared_device.py [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpuenv
from benchmarks._kernels import kernels
from benchmarks.speed import spread
from gpuenv.timing import cuda

KERNELS = ("mm2048", "mm4096", "mm8192", "sdpa", "softmax", "layernorm", "conv", "mlp")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    ks = kernels(torch)
    flush: list[int] = []
    original = cuda.CudaEvents.__init__

    def seen_init(self, *aa, **kw):
        original(self, *aa, **kw)
        if self._flush_buf is not None:
            flush.append(self._flush_buf.data_ptr())

    cuda.CudaEvents.__init__ = seen_init  # type: ignore[method-assign]
    for n in KERNELS:
        gpuenv.bench(ks[n])
    shared = {n: cuda.cuda_device("events") for n in KERNELS}
    rows = []
    for r in range(args.rounds):
        for n in KERNELS:
            fresh, one, ptrs = [], [], []
            for _ in range(args.calls):
                flush.clear()
                fresh.append(gpuenv.bench(ks[n]).median_s)
                ptrs.append(flush[-1] if flush else None)
                one.append(gpuenv.bench(ks[n], device=shared[n]).median_s)
            rows.append({"round": r, "kernel": n, "fresh": fresh, "shared": one, "ptrs": ptrs})
            print(
                f"{r} {n:9s} fresh {spread(fresh):.2%} {[round(x * 1e6, 2) for x in fresh]} "
                f"{sorted({hex(p or 0) for p in ptrs})} | shared {spread(one):.2%} "
                f"{[round(x * 1e6, 2) for x in one]}",
                flush=True,
            )
    for n in KERNELS:
        mine = [x for x in rows if x["kernel"] == n]
        f = [v for x in mine for v in x["fresh"]]
        s = [v for x in mine for v in x["shared"]]
        print(f"{n:9s} all rounds: fresh device {spread(f):.2%}, shared device {spread(s):.2%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
