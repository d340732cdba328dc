#!/usr/bin/env python3
"""What NVML's power readings say about a short region of GPU work (read-only).

A region's energy is power integrated over the region. For regions of 10-30 ms gpuenv's
reading runs low, and how to read it right depends on what NVML's numbers are: are the
driver's 20 ms power samples (`nvmlDeviceGetSamples`, TOTAL_POWER_SAMPLES) averages over
the 20 ms before their timestamp, or instants? Is field 186 (instant power) an instant?

For each length (10, 20, 30, 100, 1000 ms of 8192^3 bf16 matmuls after 2 s idle) this
keeps: the energy counter before and after (nvmlDeviceGetTotalEnergyConsumption, read
just before the first kernel is queued and just after the last one finished), the
region's CPU-side start and end (time.monotonic and CLOCK_REALTIME in us, the driver's
timebase), every 20 ms sample from 200 ms before to 300 ms after, and field 186 read
every ~2 ms by a thread. Each length `--trials` times.

    GPUENV_READONLY=1 python3 scripts/probe_power_samples.py --out power_samples.json
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

from gpuenv.backend import open_backend


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default="power_samples.json")
    args = p.parse_args()
    backend = open_backend(None, readonly=True)
    gpu = 0  # CUDA_VISIBLE_DEVICES' first: the probe runs with one GPU visible
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(5):
        _ = a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        _ = a @ b
    torch.cuda.synchronize()
    per_mm = (time.perf_counter() - t0) / 20
    rows = []
    for ms in (10, 20, 30, 100, 1000):
        for trial in range(args.trials):
            time.sleep(2.0)
            instants: list[tuple[int, float | None, float]] = []
            stop = threading.Event()

            def poll(instants: list = instants, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    r = backend.read_fast(gpu)
                    instants.append((time.time_ns() // 1000, r.power_instant_w, r.power_w))
                    time.sleep(0.002)

            th = threading.Thread(target=poll, daemon=True)
            th.start()
            time.sleep(0.2)
            n = max(1, round(ms / 1e3 / per_mm))
            e0 = backend.read_slow(gpu).energy_mj
            start_us = time.time_ns() // 1000
            for _ in range(n):
                _ = a @ b
            torch.cuda.synchronize()
            end_us = time.time_ns() // 1000
            e1 = backend.read_slow(gpu).energy_mj
            time.sleep(0.3)
            stop.set()
            th.join()
            samples = backend.power_samples(gpu, start_us - 400_000)
            row = {
                "ms": ms,
                "trial": trial,
                "kernels": n,
                "start_us": start_us,
                "end_us": end_us,
                "energy_mj": [e0, e1],
                "samples": samples,
                "instants": instants,
            }
            rows.append(row)
            inside = [w for t, w in samples if start_us <= t <= end_us + 20_000]
            print(
                f"{ms} ms #{trial}: region {(end_us - start_us) / 1e3:.1f} ms, counter "
                f"{(e1 - e0) / 1e3 if e0 is not None and e1 is not None else None} J; "
                f"samples in region..+20ms {[round(w) for w in inside]}",
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "per_mm_s": per_mm, "rows": rows}, f)
    backend.close()


if __name__ == "__main__":
    main()
