"""Issue 22 item 3 on a real GPU (read-only): does the run-to-run drift follow temperature?

scripts/probe_run_to_run.py found that more reps in a call do not shrink the spread
between calls (100 reps spread as much as 10), and that heavy kernels got slower round
after round (the 8192 matmul 1385.7 -> 1390.1 us over 5 minutes, the MLP 2908 -> 2917 us)
with NVML's clock at 1980 MHz and nothing capped: a state that lasts minutes. Here the
chip's temperature is set apart on purpose: rounds alternate `--heat` s of heavy matmuls
(then `--idle` s) with `--rest` s of idle, then each kernel is measured cold (idle
`--idle` s, a default gpuenv.bench call). Per call: the median, the GPU temperature over
the call (its summary window), the probed clock. Offline: per kernel the least-squares
slope of the median against temperature (% per C), and the spread within each kind of
round (same history, same temperature band).

    GPUENV_READONLY=1 python3 scripts/probe_temperature.py [--rounds 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpuenv
from benchmarks._kernels import GpuEnv, kernels

KERNELS = ("mm2048", "mm4096", "mm8192", "sdpa", "softmax", "layernorm", "conv", "mlp")


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--heat", type=float, default=20.0)
    ap.add_argument("--rest", type=float, default=30.0)
    ap.add_argument("--idle", type=float, default=1.0)
    ap.add_argument("--deadline", type=float, default=420.0)
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    ks = kernels(torch)
    env = GpuEnv(torch, ks["mm8192"])
    names = args.kernels.split(",")
    for n in names:
        gpuenv.bench(ks[n])
    rows = []
    start = time.monotonic()
    for r in range(args.rounds):
        if time.monotonic() - start > args.deadline:
            print(f"# deadline: stopped before round {r + 1}", flush=True)
            break
        kind = "heated" if r % 2 == 0 else "rested"
        env.load(args.heat) if kind == "heated" else env.idle(args.rest)
        for n in names:
            env.idle(args.idle)
            m = gpuenv.bench(ks[n])
            w = m.summary_windows[0] if m.summary_windows else None
            temp = (w.temp_c_start + w.temp_c_end) / 2 if w is not None else None
            rows.append(
                {
                    "round": r,
                    "kind": kind,
                    "kernel": n,
                    "s": m.median_s,
                    "temp_c": temp,
                    "clock_mhz": m.extra.get("rep_clock_mhz_median"),
                    "sm_mhz": w.sm_mhz_mean if w is not None else None,
                    "power_w": w.power_w_mean if w is not None else None,
                    "findings": sorted({f.kind for f in m.findings}),
                }
            )
            x = rows[-1]
            print(
                f"{r} {kind:6s} {n:9s} {x['s'] * 1e6:9.2f} us  {temp:5.1f} C  "
                f"probe {x['clock_mhz']:.0f}  nvml {x['sm_mhz']:.0f}  {x['power_w']:.0f} W  "
                f"{x['findings']}",
                flush=True,
            )
    out = {}
    for n in names:
        mine = [x for x in rows if x["kernel"] == n and x["temp_c"] is not None]
        if len(mine) < 2:
            continue
        med = statistics.median(x["s"] for x in mine)
        k = slope([x["temp_c"] for x in mine], [x["s"] / med for x in mine])
        by = {kind: [x["s"] for x in mine if x["kind"] == kind] for kind in ("heated", "rested")}
        out[n] = {
            "pct_per_c": 100 * k,
            "spread_all": spread([x["s"] for x in mine]),
            "spread_heated": spread(by["heated"]),
            "spread_rested": spread(by["rested"]),
            "temps": [round(x["temp_c"], 1) for x in mine],
        }
        o = out[n]
        print(
            f"{n:9s} {o['pct_per_c']:+.3f} %/C  spread all {o['spread_all']:.2%}  heated "
            f"{o['spread_heated']:.2%}  rested {o['spread_rested']:.2%}  temps {o['temps']}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "analysis": out, "args": vars(args)}, f)


if __name__ == "__main__":
    main()
