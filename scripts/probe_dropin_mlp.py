#!/usr/bin/env python3
"""Why the do_bench drop-in's first reps of the MLP block read slower on an H200 (read-only);
with --tool bench, the same for gpuenv.bench's default (cold calls 5.7-6.5% slow).

tests/integrations/test_triton_gpu.py's MLP test (gelu(X @ W1) @ W2, 8192x4096x16384
bf16) failed there with a drift warning: the first 7 reps 3.05 ms, the rest 2.91 ms.
This runs the test's scenario (a set-up call, 3 s idle, a cold call, 3 s of heavy
matmuls, a hot call) `--trials` times and writes, for each call, every rep's time and
telemetry window (SM clock, power, temperature, reasons), the warmup, the first burst
and the burst schedule: enough to tell a warmup that ended too soon, a clock still
ramping, or a cap onset the schedule did not learn.

    GPUENV_READONLY=1 python3 scripts/probe_dropin_mlp.py --trials 3 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from gpuenv.integrations import triton as gt


def _call(fn: Any, tool: str) -> dict[str, Any]:
    if tool == "bench":
        import gpuenv

        m = gpuenv.bench(fn)
        ms = m.median_s * 1e3
    else:
        ms = gt.do_bench(fn, return_mode="median")
        m = gt.last_measurement()
    return {
        "ms": ms,
        "times_ms": [round(t * 1e3, 4) for t in m.times_s],
        "windows": [
            {
                "sm": w.sm_mhz_mean,
                "sm_min": w.sm_mhz_min,
                "power": w.power_w_max,
                "temp": w.temp_c_end,
                "reasons": w.reasons,
            }
            for w in m.windows
        ],
        "findings": [f"{f.kind}/{f.severity}: {f.message}" for f in m.findings],
        "warmup": m.extra.get("warmup_reps"),
        "warmup_s": m.extra.get("warmup_s"),
        "first": {k: v for k, v in m.extra.items() if k.startswith("burst_first")},
        "schedule": {
            k: m.extra.get(k)
            for k in ("burst_lengths_s", "burst_rests_s", "burst_limit_s", "burst_redone")
        },
        "conditioned": None if m.conditioned is None else str(m.conditioned),
        "plan": m.extra.get("dropin"),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default="probe_dropin_mlp.json")
    p.add_argument(
        "--tool", choices=("dropin", "bench"), default="dropin", help="bench: gpuenv.bench"
    )
    args = p.parse_args()
    x, w1, w2 = (
        torch.randn(*s, device="cuda", dtype=torch.bfloat16)
        for s in ((8192, 4096), (4096, 16384), (16384, 4096))
    )
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def mlp() -> Any:
        return torch.nn.functional.gelu(x @ w1) @ w2

    _call(mlp, args.tool)  # set-up
    rows = []
    for trial in range(args.trials):
        torch.cuda.synchronize()
        time.sleep(3.0)
        cold = _call(mlp, args.tool)
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            for _ in range(8):
                _ = a @ b
            torch.cuda.synchronize()
        hot = _call(mlp, args.tool)
        rows.append({"trial": trial, "cold": cold, "hot": hot})
        for tag, c in (("cold", cold), ("hot", hot)):
            t = c["times_ms"]
            print(
                f"trial {trial} {tag}: {c['ms']:.4f} ms, warmup {c['warmup']} reps; "
                f"first 8 {t[:8]}; last 4 {t[-4:]}; sm {[w['sm'] for w in c['windows'][:8]]}; "
                f"findings {c['findings']}",
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
