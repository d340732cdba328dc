#!/usr/bin/env python3
"""Why does a ~6 us kernel read 13% slower right after heavy load, with the SM clock
unchanged? Measure it several ways, cold and hot, side by side, read-only.

For each kernel and round: "cold" after --idle seconds of rest, then each variant;
"hot": before each variant, --heat seconds of back-to-back 8192^3 bf16 matmuls, then
the variant at once. Variants (per-call median of --reps reps):
  events       gpuenv's CudaEvents: L2 flush, spin covering the launch, 1 call a rep
  noflush      the same without the L2 flush
  nospin       the same without the spin (launch latency may land between the events)
  batch10      flush, spin, then 10 calls back to back between one event pair
  graph20      gpuenv's CudaGraph: 20 calls in a CUDA graph a rep
With --bench, gpuenv.bench itself with its default condition (burst: it waits until the
GPU is uncapped): bench (events, 1 call a rep), bench_x10 (a rep is 10 calls back to
back, per call), bench_graph (mode="graph").
With each: NVML SM and memory clock, GPU and memory temperature, power (read-only).

    GPUENV_READONLY=1 python scripts/probe_tiny.py --rounds 3
Prints a markdown table of cold/hot medians and gaps; JSON to $OUT/probe_tiny.json.
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

VARIANTS = ("events", "noflush", "nospin", "batch10", "graph20")
BENCH = ("bench", "bench_x10", "bench_graph")  # gpuenv.bench, default condition (burst)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=6.0)
    p.add_argument("--heat", type=float, default=3.0)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--kernels", default="mm512,relu1m")
    p.add_argument("--bench", action="store_true", help="gpuenv.bench variants only")
    args = p.parse_args()

    import torch

    from gpuenv.backend import open_backend
    from gpuenv.timing import CudaEvents, CudaGraph

    be = open_backend(readonly=True)
    torch.cuda.init()
    a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    x = torch.randn(1 << 20, device="cuda")
    h8a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    h8b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(1024, device="cuda")
    kernels = {"mm512": lambda: a @ b, "relu1m": lambda: torch.relu(x), "add1k": lambda: y + y}
    variants = BENCH if args.bench else VARIANTS

    ev = CudaEvents()
    ev_noflush = CudaEvents(flush_l2=False)
    ev_nospin = CudaEvents(saturate=False)
    gr = CudaGraph(calls=20)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def heat(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                h8a @ h8b
            torch.cuda.synchronize()

    def state() -> dict[str, Any]:
        f = be.read_fast(0)
        return {"sm_mhz": f.sm_mhz, "mem_mhz": f.mem_mhz, "temp_c": f.temp_c,
                "mem_temp_c": getattr(f, "mem_temp_c", None), "power_w": f.power_w,
                "reasons": f.reasons}

    def batch10(fn: Any, n: int) -> list[float]:
        out = []
        for _ in range(n):
            ev._lead_in()
            torch.cuda._sleep(ev.rep_probe_cycles)
            e0.record()
            for _ in range(10):
                fn()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1) / 1e3 / 10)
        return out

    def measure(variant: str, fn: Any) -> float:
        n = args.reps
        if variant in BENCH:
            import gpuenv

            if variant == "bench_x10":
                def ten() -> None:
                    for _ in range(10):
                        fn()
                return float(gpuenv.bench(ten, budget_s=0.5, keep_trace=False).median_s) / 10
            mode = "graph" if variant == "bench_graph" else "events"
            return float(gpuenv.bench(fn, mode=mode, budget_s=0.5, keep_trace=False).median_s)
        if variant == "batch10":
            times = batch10(fn, n)
        elif variant == "graph20":
            times = [r.time_s for r in gr.reps(fn, max(10, n // 10))]
        else:
            dev = {"events": ev, "noflush": ev_noflush, "nospin": ev_nospin}[variant]
            times = [dev.rep(fn).time_s for _ in range(n)]
        return statistics.median(times)

    rows: list[dict[str, Any]] = []
    for name, fn in kernels.items():
        if name not in args.kernels.split(","):
            continue
        for dev in (ev, ev_noflush, ev_nospin):
            dev.prepare(fn)
        gr.prepare(fn)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        for rnd in range(args.rounds):
            time.sleep(args.idle)
            for v in variants:
                rows.append({"kernel": name, "round": rnd, "state": "cold", "variant": v,
                             "per_call_s": measure(v, fn), **state()})
            for v in variants:
                heat(args.heat)
                rows.append({"kernel": name, "round": rnd, "state": "hot", "variant": v,
                             "per_call_s": measure(v, fn), **state()})
            print(f"{name} round {rnd} done", file=sys.stderr, flush=True)

    print("| kernel | variant | cold median us | hot median us | gap | hot runs (us) "
          "| hot SM / mem MHz | hot temp C |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- | --- |")
    for name in kernels:
        for v in variants:
            mine = [r for r in rows if r["kernel"] == name and r["variant"] == v]
            cold = [r for r in mine if r["state"] == "cold"]
            hot = [r for r in mine if r["state"] == "hot"]
            if not cold or not hot:
                continue
            c = statistics.median(r["per_call_s"] for r in cold)
            h = statistics.median(r["per_call_s"] for r in hot)
            print(f"| {name} | {v} | {c * 1e6:.3f} | {h * 1e6:.3f} | {(h - c) / c:+.1%} | "
                  + ", ".join(f"{r['per_call_s'] * 1e6:.2f}" for r in hot)
                  + f" | {hot[-1]['sm_mhz']} / {hot[-1]['mem_mhz']} | {hot[-1]['temp_c']} / "
                  f"{hot[-1]['mem_temp_c']} |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe_tiny.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
