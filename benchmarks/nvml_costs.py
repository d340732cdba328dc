#!/usr/bin/env python3
"""What each NVML read the sampler makes costs, and how often the driver refreshes its value.

Every call the sampler makes (and the batched alternatives) is timed alone on this
thread with no load running: p50 and p99 wall time and mean CPU time of one call.
Each field value carries the driver's timestamp of its last refresh: polled every
5 ms for 2 s, the median step between distinct timestamps is how often the driver
refreshes that value (reading it more often reads the same value again). The
energy counter is read both ways (`nvmlDeviceGetTotalEnergyConsumption` and field
83 in a field batch) to see whether the batch gives the same counter for less.

Read-only (GPUENV_READONLY=1 on a shared GPU): nothing is written.

    GPUENV_READONLY=1 python -m benchmarks.nvml_costs
    python -m benchmarks.nvml_costs --sim   # the simulated H100's backend reads only
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from benchmarks.sampler_overhead import call_cost
from gpuenv.backend import Backend, open_backend

SLOW = tuple(range(74, 83))  # reason counters 74-81 and memory temperature 82
ENERGY_FIELD = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
INSTANT, AVERAGE = 186, 185  # power, mW


def backend_reads(backend: Backend, g: int) -> list[tuple[str, Callable[[], Any], int]]:
    """The Backend protocol's reads: what the sampler calls (the sim models the same)."""
    return [
        ("read_fast() (all cheap values)", lambda: backend.read_fast(g), 2000),
        (
            "read_slow(energy=False) (reason counters, memory temperature)",
            lambda: backend.read_slow(g, energy=False),
            500,
        ),
        ("read_slow(energy=True)", lambda: backend.read_slow(g, energy=True), 200),
        ("processes()", lambda: backend.processes(g), 500),
    ]


def nvml_calls(nv: Any, h: Any) -> list[tuple[str, Callable[[], Any], int]]:
    """Each raw call, and the field batches that could replace several."""
    temp = nv.nvmlDeviceGetTemperature
    reasons = nv.nvmlDeviceGetCurrentClocksEventReasons

    def fields(ids: tuple[int, ...]) -> Callable[[], Any]:
        return lambda: nv.nvmlDeviceGetFieldValues(h, list(ids))

    return [
        (
            "nvmlDeviceGetClockInfo(SM)",
            lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            2000,
        ),
        (
            "nvmlDeviceGetClockInfo(MEM)",
            lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            2000,
        ),
        ("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h), 2000),
        ("nvmlDeviceGetTemperature(GPU)", lambda: temp(h, nv.NVML_TEMPERATURE_GPU), 2000),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: reasons(h), 2000),
        ("fields [186] (instant power)", fields((INSTANT,)), 2000),
        ("fields [185, 186] (average and instant power)", fields((AVERAGE, INSTANT)), 2000),
        ("fields [74] (time under power cap)", fields((74,)), 1000),
        ("fields 74-82 (reason counters, memory temperature)", fields(SLOW), 500),
        ("fields [83] (energy)", fields((ENERGY_FIELD,)), 200),
        ("fields 74-83 (counters, memory temperature, energy)", fields((*SLOW, ENERGY_FIELD)), 200),
        (
            "nvmlDeviceGetTotalEnergyConsumption",
            lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
            200,
        ),
        (
            "nvmlDeviceGetComputeRunningProcesses",
            lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
            500,
        ),
        (
            "nvmlDeviceGetGraphicsRunningProcesses",
            lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(h),
            500,
        ),
    ]


def refresh_ms(nv: Any, h: Any, ids: tuple[int, ...], seconds: float = 2.0) -> dict[int, float]:
    """Median ms between the driver's distinct timestamps of each field, polled every 5 ms."""
    seen: dict[int, list[int]] = {f: [] for f in ids}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for e in nv.nvmlDeviceGetFieldValues(h, list(ids)):
            ts = int(e.timestamp)
            if (
                e.nvmlReturn == nv.NVML_SUCCESS
                and ts
                and (not seen[e.fieldId] or seen[e.fieldId][-1] != ts)
            ):
                seen[int(e.fieldId)].append(ts)
        time.sleep(0.005)
    out = {}
    for f, stamps in seen.items():
        steps = [(b - a) / 1e3 for a, b in itertools.pairwise(stamps)]
        out[f] = statistics.median(steps) if steps else float("nan")
    return out


def energy_agrees(nv: Any, h: Any) -> str:
    """Field 83 beside the API's counter, read back to back (mJ)."""
    api = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    entry = nv.nvmlDeviceGetFieldValues(h, [ENERGY_FIELD])[0]
    if entry.nvmlReturn != nv.NVML_SUCCESS:
        return f"field 83 not answered (NVML return {entry.nvmlReturn})"
    field = int(entry.value.ullVal)
    return f"nvmlDeviceGetTotalEnergyConsumption {api} mJ, field 83 {field} mJ read just after"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to read")


def run(args: argparse.Namespace) -> int:
    backend = open_backend()
    rows = [(label, *call_cost(fn, n)) for label, fn, n in backend_reads(backend, args.gpu)]
    notes: list[str] = []
    if not backend.capabilities.simulated:
        import pynvml as nv  # the raw calls, beside the backend's own reads

        h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
        for label, fn, n in nvml_calls(nv, h):
            try:
                rows.append((label, *call_cost(fn, n)))
            except nv.NVMLError as err:
                notes.append(f"{label}: {err}")
        ids = (*SLOW, ENERGY_FIELD, AVERAGE, INSTANT)
        refresh = refresh_ms(nv, h, ids)
        notes.append(
            "driver refresh (median ms between distinct timestamps, polled every "
            "5 ms for 2 s): " + ", ".join(f"field {f}: {v:.0f}" for f, v in refresh.items())
        )
        notes.append(energy_agrees(nv, h))
    backend.close()
    for label, p50, _p99, _cpu in rows:
        slug = "_".join("".join(c if c.isalnum() else " " for c in label).split()).lower()
        runner.metric(f"{slug}_p50_us"[:80], p50, "us", slack=20.0)
    print(f"One call of each read, this thread, no load; GPU {args.gpu}.\n")
    print("| read | p50 us | p99 us | CPU us |")
    print("| --- | ---: | ---: | ---: |")
    for label, p50, p99, cpu in rows:
        print(f"| {label} | {p50:.1f} | {p99:.1f} | {cpu:.1f} |")
    if notes:
        print("\n" + "\n\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("nvml_costs", __doc__, add_arguments, run, quick={}))
