"""Issue 22's open question, on a real GPU (read-only): after heavy load, may a burst start
when NVML's SM clock is back near its maximum, or must it wait until the held-down
reasons (power cap) clear, ~0.3 s later on the H100? Reps taken at each moment against
the same kernel's cold reps (after 1 s idle), per kernel and trial.

    GPUENV_READONLY=1 python3 scripts/probe_hot_wait.py [--trials 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from gpuenv.backend import open_backend
from gpuenv.reasons import HELD_DOWN

CLOCK_REL = 0.02  # "back": within 2% of the maximum SM clock (the bench's burst_clock_rel)


def kernels(torch: Any) -> dict[str, Any]:
    bf = torch.bfloat16
    a8, b8 = (torch.randn(8192, 8192, device="cuda", dtype=bf) for _ in range(2))
    a4, b4 = (torch.randn(4096, 4096, device="cuda", dtype=bf) for _ in range(2))
    x, w1, w2 = (torch.randn(*s, device="cuda", dtype=bf)
                 for s in ((8192, 4096), (4096, 16384), (16384, 4096)))  # fmt: skip
    return {"mm8192": lambda: a8 @ b8, "mm4096": lambda: a4 @ b4,
            "mlp": lambda: torch.nn.functional.gelu(x @ w1) @ w2}  # fmt: skip


def reps(torch: Any, fn: Any, n: int, flush: Any) -> list[float]:
    out = []
    for _ in range(n):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3)  # us
    return out


def heat(torch: Any, a: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            _ = a @ a
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    be = open_backend(None, readonly=True)
    gpu = 0
    top = be.clock_limits(gpu).max_sm_mhz
    ks = kernels(torch)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    heavy = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for fn in ks.values():
        reps(torch, fn, 5, flush)
    rows = []
    for name, fn in ks.items():
        for trial in range(args.trials):
            time.sleep(1.0)
            cold = statistics.median(reps(torch, fn, args.reps, flush))
            row: dict[str, Any] = {"kernel": name, "trial": trial, "cold_us": cold}
            for moment in ("clock", "flag"):
                heat(torch, heavy, 1.0)
                t0 = time.monotonic()
                while time.monotonic() - t0 < 3.0:
                    s = be.read_fast(gpu)
                    back = s.sm_mhz >= (1 - CLOCK_REL) * top
                    clear = not s.reasons & HELD_DOWN
                    if (moment == "clock" and back) or (moment == "flag" and back and clear):
                        break
                    time.sleep(0.005)
                waited = time.monotonic() - t0
                s = be.read_fast(gpu)
                hot = statistics.median(reps(torch, fn, args.reps, flush))
                row[f"{moment}_wait_s"] = round(waited, 3)
                row[f"{moment}_us"] = hot
                row[f"{moment}_vs_cold_pct"] = round(100 * (hot / cold - 1), 2)
                row[f"{moment}_reasons_at_start"] = s.reasons
            rows.append(row)
            print(json.dumps(row), flush=True)
    for name in ks:
        mine = [r for r in rows if r["kernel"] == name]
        print(f"{name}: clock-back wait {min(r['clock_wait_s'] for r in mine):.2f}-"
              f"{max(r['clock_wait_s'] for r in mine):.2f} s, vs cold "
              f"{min(r['clock_vs_cold_pct'] for r in mine):+.2f}..."
              f"{max(r['clock_vs_cold_pct'] for r in mine):+.2f}%; flag-clear wait "
              f"{min(r['flag_wait_s'] for r in mine):.2f}-{max(r['flag_wait_s'] for r in mine):.2f}"
              f" s, vs cold {min(r['flag_vs_cold_pct'] for r in mine):+.2f}..."
              f"{max(r['flag_vs_cold_pct'] for r in mine):+.2f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": be.device_info(gpu).name,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
