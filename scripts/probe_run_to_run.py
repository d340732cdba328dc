"""Issue 22 item 3 on a real GPU (read-only): where does the run-to-run spread come from?

Each call of gpuenv.bench's default measures 10-60 reps, 15-100 ms of GPU time, and its
median's 95% CI is +-0.25%; yet the median moves 0.3-0.9% between calls, cold or hot
(docs/benchmarks/run_to_run.md). If the GPU's state persists over a call (tens to hundreds of ms),
reps inside a call are not independent and the CI understates what moves between calls;
more reps spread over more time would then average over states.

Per round and kernel (rounds interleave the kernels, so drift hits all alike): idle `--idle`
s then a call of 100 reps (`reps=100`, its reps in bursts with rests as the default), idle
then a default call; the same after `--load` s of heavy matmuls. Each call keeps its rep
times and probed rep clocks. Offline: the spread over rounds of the default's median, of
the 100-rep call's median, and of the median of its first 10/20/30/50 reps (the same
call cut short), and the lag-1 autocorrelation of the reps inside a call.

    GPUENV_READONLY=1 python3 scripts/probe_run_to_run.py [--rounds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpuenv
from benchmarks._kernels import GpuEnv, kernels
from benchmarks.speed import spread

KERNELS = ("mm2048", "mm4096", "mm8192", "sdpa", "softmax", "layernorm", "conv", "mlp")
CUTS = (10, 20, 30, 50, 100)


def lag1(xs: list[float]) -> float:
    m = statistics.mean(xs)
    num = sum((a - m) * (b - m) for a, b in itertools.pairwise(xs))
    den = sum((a - m) ** 2 for a in xs)
    return num / den if den > 0 else 0.0


def one(fn, **settings) -> dict:
    t0 = time.monotonic()
    m = gpuenv.bench(fn, **settings)
    clocks = m.extra.get("rep_clock_mhz") or []
    return {
        "s": m.median_s,
        "wall_s": time.monotonic() - t0,
        "times": list(m.times_s),
        "clocks": clocks,
        "rests": m.extra.get("burst_rests"),
        "wait_s": m.extra.get("burst_first_wait_s"),
    }


def analyse(rows: dict) -> dict:
    out = {}
    for name, states in rows.items():
        res = {}
        for state, calls in states.items():
            d = {"default": spread([c["s"] for c in calls["default"]])}
            long = calls["r100"]
            for n in CUTS:
                d[f"first{n}"] = spread([statistics.median(c["times"][:n]) for c in long])
            d["lag1"] = statistics.median(lag1(c["times"]) for c in long)
            d["reps_default"] = [len(c["times"]) for c in calls["default"]]
            d["clock_default"] = [
                round(statistics.median([x for x in c["clocks"] if x]), 1)
                for c in calls["default"]
                if any(c["clocks"])
            ]
            d["us_default"] = [round(c["s"] * 1e6, 2) for c in calls["default"]]
            d["us_r100"] = [round(c["s"] * 1e6, 2) for c in long]
            d["wall_r100"] = statistics.median(c["wall_s"] for c in long)
            d["wall_default"] = statistics.median(c["wall_s"] for c in calls["default"])
            res[state] = d
        out[name] = res
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle", type=float, default=1.0)
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--deadline", type=float, default=420.0)
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    ks = kernels(torch)
    env = GpuEnv(torch, ks["mm8192"])
    names = args.kernels.split(",")
    for n in names:  # first calls: set-up
        gpuenv.bench(ks[n])
    rows = {n: {s: {"default": [], "r100": []} for s in ("cold", "hot")} for n in names}
    start = time.monotonic()
    for r in range(args.rounds):
        if time.monotonic() - start > args.deadline:
            print(f"# deadline: stopped before round {r + 1}", flush=True)
            break
        for n in names:
            for state in ("cold", "hot"):
                order = ("default", "r100") if r % 2 == 0 else ("r100", "default")
                for how in order:
                    env.idle(args.idle) if state == "cold" else env.load(args.load)
                    got = one(ks[n]) if how == "default" else one(ks[n], reps=100)
                    rows[n][state][how].append(got)
        print(f"# round {r + 1} done at {time.monotonic() - start:.0f} s", flush=True)
    res = analyse(rows)
    for n, states in res.items():
        for state, d in states.items():
            cuts = " ".join(f"{k[5:]}:{d[k]:.2%}" for k in d if k.startswith("first"))
            print(
                f"{n:9s} {state:4s} default {d['default']:.2%} | r100 first {cuts} | "
                f"lag1 {d['lag1']:+.2f} | us {d['us_default']} vs {d['us_r100']} | "
                f"clk {d['clock_default']} | wall {d['wall_default']:.3f}/{d['wall_r100']:.3f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "analysis": res}, f)


if __name__ == "__main__":
    main()
