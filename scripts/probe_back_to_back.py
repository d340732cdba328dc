"""Issue 22 item 3 on a real GPU (read-only): do calls of gpuenv.bench agree better when the
GPU never idles between them?

benchmarks.run_to_run: mid-size kernels (attention, conv, softmax, the 4096 matmul) move
0.3-1% between calls whatever the temperature, and 100 reps in a call move as much as
10 (scripts/probe_run_to_run.py). Each of those calls came after 1 s idle, where the GPU
drops to its idle clock and ramps again. Here, per kernel and round: `--calls` calls back
to back (no idle), then `--calls` calls each after `--idle` s idle. Per group the spread
(max - min) / median of the medians, each call's probed clock and temperature.

    GPUENV_READONLY=1 python3 scripts/probe_back_to_back.py [--rounds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpuenv
from benchmarks._kernels import GpuEnv, kernels
from benchmarks.speed import spread

KERNELS = ("mm2048", "mm4096", "mm8192", "sdpa", "softmax", "layernorm", "conv", "mlp")


def call(fn) -> dict:
    m = gpuenv.bench(fn)
    w = m.summary_windows[0] if m.summary_windows else None
    return {
        "s": m.median_s,
        "clock_mhz": m.extra.get("rep_clock_mhz_median"),
        "temp_c": w.temp_c_start if w is not None else None,
        "reps": len(m.times_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--idle", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    ks = kernels(torch)
    env = GpuEnv(torch, ks["mm8192"])
    for n in KERNELS:
        gpuenv.bench(ks[n])
    rows = []
    for r in range(args.rounds):
        for n in KERNELS:
            env.idle(args.idle)
            b2b = [call(ks[n]) for _ in range(args.calls)]
            idled = []
            for _ in range(args.calls):
                env.idle(args.idle)
                idled.append(call(ks[n]))
            rows.append({"round": r, "kernel": n, "b2b": b2b, "idled": idled})
            print(
                f"{r} {n:9s} back to back {spread([c['s'] for c in b2b]):.2%} "
                f"{[round(c['s'] * 1e6, 2) for c in b2b]} clk "
                f"{[round(c['clock_mhz']) for c in b2b]} | after idle "
                f"{spread([c['s'] for c in idled]):.2%} "
                f"{[round(c['s'] * 1e6, 2) for c in idled]} clk "
                f"{[round(c['clock_mhz']) for c in idled]} "
                f"{[c['temp_c'] for c in idled]} C",
                flush=True,
            )
    for n in KERNELS:
        mine = [x for x in rows if x["kernel"] == n]
        b = [c["s"] for x in mine for c in x["b2b"]]
        i = [c["s"] for x in mine for c in x["idled"]]
        print(f"{n:9s} all rounds: back to back {spread(b):.2%}, after idle {spread(i):.2%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
