"""After heavy load: may a burst start once the SM clock is back, or only once the cap clears?

Issue 22's open question, on a real GPU (read-only): after 1 s of 8192^3 matmuls, 10
flushed reps of each kernel started (a) when NVML's SM clock is back within 2% of its
maximum and (b) when, in addition, the held-down reasons (power cap) have cleared, ~0.3 s
later on the H100; each against the same kernel's cold reps (after 1 s idle), per kernel
and trial. (b) runs second in each trial, after a second second of load.

    GPUENV_READONLY=1 python -m benchmarks.hot_wait [--trials 5] [--data PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from benchmarks import runner
from benchmarks._kernels import GpuEnv
from gpuenv.backend import open_backend
from gpuenv.reasons import HELD_DOWN

CLOCK_REL = 0.02  # "back": within 2% of the maximum SM clock (the bench's burst_clock_rel)


def kernels(torch: Any) -> dict[str, Any]:
    bf = torch.bfloat16
    a8, b8 = (torch.randn(8192, 8192, device="cuda", dtype=bf) for _ in range(2))
    a4, b4 = (torch.randn(4096, 4096, device="cuda", dtype=bf) for _ in range(2))
    x, w1, w2 = (
        torch.randn(*s, device="cuda", dtype=bf)
        for s in ((8192, 4096), (4096, 16384), (16384, 4096))
    )
    return {
        "mm8192": lambda: a8 @ b8,
        "mm4096": lambda: a4 @ b4,
        "mlp": lambda: torch.nn.functional.gelu(x @ w1) @ w2,
    }


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


LABELS = {"mm8192": "8192^3 bf16 matmul", "mm4096": "4096^3 bf16 matmul", "mlp": "MLP block"}


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Per kernel: the waits and the hot reps against cold at each moment (range over the
    trials), and in how many trials the power-cap bit was still set at moment (a)."""

    def span(mine: list[dict[str, Any]], key: str, fmt: str) -> str:
        lo, hi = min(r[key] for r in mine), max(r[key] for r in mine)
        return f"{lo:{fmt}}..{hi:{fmt}}"

    lines = [
        "| kernel | wait (a) clock back | (a) vs cold | wait (b) reasons clear | (b) vs cold "
        "| (a) with a held-down reason |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in dict.fromkeys(r["kernel"] for r in rows):
        mine = [r for r in rows if r["kernel"] == name]
        cold = statistics.median(r["cold_us"] for r in mine)
        size = f"{cold / 1e3:.2f} ms" if cold >= 1e3 else f"{cold:.0f} us"
        held = sum(bool(r["clock_reasons_at_start"] & HELD_DOWN) for r in mine)
        lines.append(
            f"| {LABELS.get(name, name)} ({size}) | {span(mine, 'clock_wait_s', '.2f')} s "
            f"| {span(mine, 'clock_vs_cold_pct', '+.2f')}% "
            f"| {span(mine, 'flag_wait_s', '.2f')} s "
            f"| {span(mine, 'flag_vs_cold_pct', '+.2f')}% "
            f"| {held} of {len(mine)} |"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=3, help="trials per kernel")
    parser.add_argument("--reps", type=int, default=10, help="reps at each moment")
    parser.add_argument("--data", default=None, help="where to keep every trial (JSON)")


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print(
            "the power cap's timing is the real GPU's: --sim has nothing to measure",
            file=sys.stderr,
        )
        return 2
    import torch

    be = open_backend(None, readonly=True)
    gpu = 0
    top = be.clock_limits(gpu).max_sm_mhz
    ks = kernels(torch)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    heavy = GpuEnv(torch, lambda: a @ a)
    for fn in ks.values():
        reps(torch, fn, 5, flush)
    rows = []
    for name, fn in ks.items():
        for trial in range(args.trials):
            time.sleep(1.0)
            cold = statistics.median(reps(torch, fn, args.reps, flush))
            row: dict[str, Any] = {"kernel": name, "trial": trial, "cold_us": cold}
            for moment in ("clock", "flag"):
                heavy.load(1.0)
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
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(
        f"{args.trials} trials per kernel, {args.reps} flushed reps at each moment; (a) "
        f"within {CLOCK_REL:.0%} of {top} MHz, (b) and no held-down reason:\n"
    )
    print("\n".join(table(rows)))
    runner.metric(
        "worst_flag_vs_cold_pct", max(abs(r["flag_vs_cold_pct"]) for r in rows), "%", slack=2.0
    )
    if args.data:
        with open(args.data, "w") as f:
            json.dump(
                {
                    "gpu": be.device_info(gpu).name,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("hot_wait", __doc__, add_arguments, run, quick={"trials": 1}))
