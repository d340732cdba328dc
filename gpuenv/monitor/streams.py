"""`gpuenv monitor --json / --csv`: one record per GPU and tick, like `nvidia-smi dmon`."""

from __future__ import annotations

import csv
import io
import json
import time
from typing import IO, Any

from gpuenv.monitor.model import GpuView, MonitorModel
from gpuenv.reasons import reason_names

STREAM_FIELDS = (
    "time",
    "gpu",
    "uuid",
    "sm_mhz",
    "max_sm_mhz",
    "mem_mhz",
    "power_w",
    "power_limit_w",
    "temp_c",
    "slowdown_c",
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_mib",
    "mem_total_mib",
    "reasons",
    "reason_names",
    "locked_sm_mhz",
    "lock_holds",
    "n_processes",
    "pstate",
    "fan_pct",
    "ecc_errors",
    "error",
)


def stream_record(v: GpuView) -> dict[str, Any]:
    """One flat record per GPU per tick (the --json / --csv line)."""
    lock = v.lock
    locked = list(lock.locked_sm) if lock and lock.locked_sm else None
    stamp = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(v.wall)) + f".{int(v.wall % 1 * 1000):03d}Z"
    )
    return {
        "time": stamp,
        "gpu": v.index,
        "uuid": v.uuid or None,
        "sm_mhz": v.sm_mhz,
        "max_sm_mhz": v.max_sm_mhz,
        "mem_mhz": v.mem_mhz,
        "power_w": None if v.power_w is None else round(v.power_w, 2),
        "power_limit_w": v.power_limit_w,
        "temp_c": v.temp_c,
        "slowdown_c": v.slowdown_c,
        "util_gpu_pct": v.util_gpu,
        "util_mem_pct": v.util_mem,
        "mem_used_mib": v.mem_used_mib,
        "mem_total_mib": v.mem_total_mib,
        "reasons": f"{v.reasons:#x}",
        "reason_names": reason_names(v.reasons),
        "locked_sm_mhz": locked,
        "lock_holds": lock.holds if lock else None,
        "n_processes": len(v.processes),
        "pstate": v.pstate,
        "fan_pct": v.fan_pct,
        "ecc_errors": v.ecc_errors,
        "error": v.error,
    }


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return "|".join(str(x) for x in value)
    return value


def stream(
    model: MonitorModel,
    out: IO[str],
    *,
    fmt: str,
    interval_s: float,
    count: int | None = None,
    duration_s: float | None = None,
) -> int:
    """Print one line per GPU per tick until `count` ticks or `duration_s` pass; returns ticks.

    Ticks keep to a fixed schedule (no drift). Each tick is flushed, so a pipe or
    a log file sees it at once.
    """
    clock = model.clock
    start = clock.now()
    writer = None
    buf = io.StringIO()
    if fmt == "csv":
        writer = csv.DictWriter(buf, fieldnames=STREAM_FIELDS, lineterminator="\n")
        writer.writeheader()
    ticks = 0
    while True:
        for v in model.update():
            rec = stream_record(v)
            if writer is not None:
                writer.writerow({k: _csv_value(x) for k, x in rec.items()})
            else:
                buf.write(json.dumps(rec, separators=(",", ":")) + "\n")
        out.write(buf.getvalue())
        out.flush()
        buf.seek(0)
        buf.truncate()
        ticks += 1
        if count is not None and ticks >= count:
            return ticks
        due = start + ticks * interval_s
        if duration_s is not None and due - start > duration_s + 1e-9:
            return ticks
        clock.sleep(max(0.0, due - clock.now()))


__all__ = ["STREAM_FIELDS", "stream", "stream_record"]
