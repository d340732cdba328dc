#!/usr/bin/env python3
"""Tiny kernels: gpuenv.bench's number against CUPTI's device time, cold and hot, and
after earlier CUDA graph captures (issue 18 item 5). Read-only: nothing is written to
the GPU's settings.

For each kernel under 20 us:
  cupti        the reference, gpuenv.timing.cupti_median_s: torch.profiler (CUPTI), 200
               calls queued back to back behind a spin after 30 warm-up calls, L2 warm;
               the median device time of one call (its kernels summed)
  default      gpuenv.bench(fn) with no options (condition="auto")
  burst        gpuenv.bench(fn, condition="burst")
  graph        gpuenv.bench(fn, mode="graph"): the CUDA-graph method the default used
               before, after this process has captured graphs already
each "cold" (after --idle s of rest) and "hot" (right after --heat s of back-to-back
8192^3 bf16 matmuls). The first graph capture of the process happens before any
default measurement, so a method that depends on capture history shows it.

    GPUENV_READONLY=1 python scripts/probe_tiny_cupti.py --rounds 2
Prints a markdown table; JSON to $OUT/probe_tiny_cupti.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

METHODS = ("cupti", "default", "burst", "graph")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--idle", type=float, default=5.0)
    p.add_argument("--heat", type=float, default=6.0)
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."),
                                                  "probe_tiny_cupti.json"))
    args = p.parse_args()

    import torch

    import gpuenv
    from gpuenv.timing import CudaGraph, cupti_median_s

    torch.cuda.init()
    dev = "cuda"
    a = torch.randn(512, 512, device=dev, dtype=torch.float16)
    b = torch.randn(512, 512, device=dev, dtype=torch.float16)
    x = torch.randn(1 << 20, device=dev)
    y = torch.randn(1024, device=dev)
    ln_in = torch.randn(256, 1024, device=dev, dtype=torch.float16)
    ln = torch.nn.LayerNorm(1024, device=dev, dtype=torch.float16)
    s = torch.randn(4096, 1024, device=dev)
    h8a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    h8b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    kernels = {
        "mm512_fp16": lambda: a @ b,
        "relu_1M": lambda: torch.relu(x),
        "add_1k": lambda: y + y,
        "layernorm_256x1k": lambda: ln(ln_in),
        "sum_4Mf": lambda: s.sum(),
    }

    # the process's first capture happens here, before any measurement of interest
    first = CudaGraph(calls=10)
    first.prepare(lambda: y * 2)

    def heat(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                h8a @ h8b
            torch.cuda.synchronize()

    def measure(method: str, fn: Any) -> tuple[float, float, dict[str, Any]]:
        t = time.perf_counter()
        if method == "cupti":
            v, extra = cupti_median_s(fn), {}
        else:
            kw = {"default": {}, "burst": {"condition": "burst"},
                  "graph": {"mode": "graph"}}[method]
            m = gpuenv.bench(fn, name=method, **kw)
            v = m.stats.median_s
            extra = {"verdict": m.verdict, "findings": [f.kind for f in m.findings],
                     "timer": m.timer, "tiny": m.extra.get("tiny_kernel", {}).get("method"),
                     "reps": len(m.times_s)}
        return v, time.perf_counter() - t, extra

    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for state in ("cold", "hot"):
            for kname, fn in kernels.items():
                for method in METHODS:
                    if state == "cold":
                        torch.cuda.synchronize()
                        time.sleep(args.idle if method == METHODS[0] else 0.5)
                    else:
                        heat(args.heat if method == METHODS[0] else 1.5)
                    v, wall, extra = measure(method, fn)
                    row = {"round": rnd, "state": state, "kernel": kname, "method": method,
                           "median_us": v * 1e6, "wall_s": wall, **extra}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    with open(args.json, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "rows": rows}, f, indent=1)

    print("\n| kernel | CUPTI us | default us (vs CUPTI) | burst us (vs default) | graph us "
          "| default cold vs hot | default wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kname in kernels:
        def med(method: str, state: str | None = None, key: str = "median_us",
                kn: str = kname) -> float:
            vals = [r[key] for r in rows if r["kernel"] == kn and r["method"] == method
                    and (state is None or r["state"] == state)]
            return statistics.median(vals)

        c, d, bu, g = med("cupti"), med("default"), med("burst"), med("graph")
        gap = med("default", "hot") / med("default", "cold") - 1
        print(f"| {kname} | {c:.2f} | {d:.2f} ({d / c - 1:+.1%}) | {bu:.2f} ({bu / d - 1:+.1%})"
              f" | {g:.2f} | {gap:+.2%} | {med('default', key='wall_s'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
