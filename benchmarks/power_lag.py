#!/usr/bin/env python3
"""How late does NVML's instant power show a heavy kernel? A read-only probe of what the
drop-in's power model sees: idle, then a step of back-to-back 8192^3 bf16 matmuls, then a
square wave of heavy work and spins (on/off --period), while a thread reads the cheap
values (`read_fast`: instant power, the 1 s average, SM clock, reasons) every 5 ms.

Reported: the step's plateau of instant power, how long after the work began the reading
reached 50% and 90% of its rise, when the SW power cap's bit first showed and the clock
then; for the square wave, the readings' range against the plateau (a reading that
follows the work swings between the two powers; one that averages sits between).
Needs torch and a GPU.

    GPUENV_READONLY=1 python -m benchmarks.power_lag
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

from benchmarks import runner

READ_EVERY_S = 0.005


def _reader(backend: Any, gpu: int, stop: threading.Event, out: list[tuple]) -> None:
    while not stop.is_set():
        r = backend.read_fast(gpu)
        out.append((time.monotonic(), r.power_instant_w, r.power_w, r.sm_mhz, r.reasons))
        stop.wait(READ_EVERY_S)


def _step(torch: Any, mm: Any, seconds: float, per_mm_s: float) -> float:
    """Queue `seconds` of matmuls at once; return the host time the queue began."""
    n = max(1, int(seconds / per_mm_s))
    t0 = time.monotonic()
    for _ in range(n):
        mm()
    torch.cuda.synchronize()
    return t0


def _square(torch: Any, mm: Any, seconds: float, period: float, per_mm_s: float) -> float:
    on = max(1, int(period / 2 / per_mm_s))
    t0 = time.monotonic()
    for _ in range(int(seconds / period)):
        for _ in range(on):
            mm()
        torch.cuda._sleep(int(period / 2 * 1.9e9))  # ~half a period of one SM spinning
    torch.cuda.synchronize()
    return t0


def _reached(during: list[tuple], watts: float, t0: float) -> float | None:
    """ms after t0 of the first reading at or above `watts`."""
    hit = next((s[0] for s in during if s[1] >= watts), None)
    return None if hit is None else (hit - t0) * 1e3


def run(args: argparse.Namespace) -> int:
    import torch

    from gpuenv.backend import open_backend
    from gpuenv.reasons import Reason

    gpu = torch.cuda.current_device()
    backend = open_backend(None, readonly=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)

    def mm() -> None:
        torch.matmul(a, b, out=c)

    for _ in range(3):
        mm()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        mm()
    torch.cuda.synchronize()
    per_mm_s = (time.perf_counter() - t) / 10
    rows = []
    for trial in range(args.trials):
        samples: list[tuple] = []
        stop = threading.Event()
        th = threading.Thread(target=_reader, args=(backend, gpu, stop, samples), daemon=True)
        time.sleep(args.idle)
        th.start()
        time.sleep(0.3)
        t_step = _step(torch, mm, args.step, per_mm_s)
        t_end = time.monotonic()
        time.sleep(0.5)
        t_sq = _square(torch, mm, args.step, args.period, per_mm_s)
        t_sq_end = time.monotonic()
        time.sleep(0.2)
        stop.set()
        th.join()
        before = [s[1] for s in samples if s[0] < t_step and s[1] is not None]
        during = [s for s in samples if t_step <= s[0] <= t_end and s[1] is not None]
        if not before or not during:
            print("no instant power readings", file=sys.stderr)
            return 1
        base = statistics.median(before[-20:])
        plateau = statistics.median([s[1] for s in during if s[0] >= t_step + 0.5 * args.step])
        rise = plateau - base

        cap = next((s for s in during if s[4] & Reason.SW_POWER_CAP), None)
        sq = [s[1] for s in samples if t_sq + 0.3 <= s[0] <= t_sq_end and s[1] is not None]
        r50, r90 = (_reached(during, base + f * rise, t_step) for f in (0.5, 0.9))
        rows.append((trial, base, plateau, r50, r90, cap, t_step, min(sq), max(sq)))
        print(
            f"| {trial} | {base:.0f} | {plateau:.0f} | "
            + (f"{r50:.0f}" if r50 is not None else "-")
            + " | "
            + (f"{r90:.0f}" if r90 is not None else "-")
            + " | "
            + (f"{(cap[0] - t_step) * 1e3:.0f} ms, {cap[3]} MHz" if cap else "never")
            + f" | {min(sq):.0f} - {max(sq):.0f} |"
        )
    print()
    print(
        f"per matmul {per_mm_s * 1e3:.2f} ms; readings every {READ_EVERY_S * 1e3:.0f} ms; "
        f"square wave period {args.period * 1e3:.0f} ms"
    )
    r90s = [r[4] for r in rows if r[4] is not None]
    if r90s:
        runner.metric("instant power 90% rise ms", statistics.median(r90s), "ms", slack=0.5)
    return 0


def _header() -> None:
    print(
        "| trial | idle W | step plateau W | 50% after ms | 90% after ms "
        "| first SW power cap bit | square wave readings W |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")


def _run(args: argparse.Namespace) -> int:
    _header()
    return run(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--idle", type=float, default=3.0, help="idle before each trial, s")
    parser.add_argument("--step", type=float, default=1.0, help="heavy step and wave, s")
    parser.add_argument("--period", type=float, default=0.06, help="square wave period, s")


if __name__ == "__main__":
    sys.exit(runner.main("power_lag", __doc__, add_arguments, _run, quick={"trials": 1}))
