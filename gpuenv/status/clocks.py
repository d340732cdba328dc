"""`gpuenv status --supported-clocks`: each memory clock and the graphics clocks it supports.

Like `nvidia-smi -q -d SUPPORTED_CLOCKS` (a readable table, here with each run of
evenly spaced clocks written once: "1980-345 MHz in 15 MHz steps") and
`nvidia-smi --query-supported-clocks=mem,gr --format=csv` (one row per pair, the same
field names). These are the clocks `gpuenv lock --sm` accepts; the backend says
which (`Backend.clock_limits`), for the real GPU and the simulated one alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gpuenv.backend import Backend
from gpuenv.errors import GpuenvError
from gpuenv.status.query import GpuReads, QueryField, field

SCHEMA = 1


def _named(name: str, *names: str) -> QueryField:
    """A --query-gpu field under --query-supported-clocks' names (there gpu_name comes first)."""
    return dataclasses.replace(field(name), names=names)


# nvidia-smi --help-query-supported-clocks: its fields, in its order
SUPPORTED_FIELDS: tuple[QueryField, ...] = (
    _named("timestamp", "timestamp"),
    _named("name", "gpu_name", "name"),
    _named("pci.bus_id", "gpu_bus_id", "pci.bus_id"),
    _named("serial", "gpu_serial", "serial"),
    _named("uuid", "gpu_uuid", "uuid"),
    QueryField(
        ("memory", "mem"), "Memory clock of this supported pair.", lambda r: r.pair[0], unit="MHz"
    ),
    QueryField(
        ("graphics", "gr"),
        "Graphics (and SM) clock of this supported pair.",
        lambda r: r.pair[1],
        unit="MHz",
    ),
)


def supported_reads(backend: Backend, gpus: Sequence[int]) -> tuple[list[GpuReads], list[str]]:
    """One reading per supported (memory, graphics) pair of each GPU, in nvidia-smi's order
    (memory clocks, then graphics clocks, each descending); and the GPUs that failed."""
    wall = backend.clock.wall()
    rows: list[GpuReads] = []
    errors: list[str] = []
    for index in gpus:
        reads = GpuReads(backend, index, wall)
        try:
            limits = backend.clock_limits(index)
        except GpuenvError as err:
            errors.append(f"GPU {index}: {err}")
            continue
        for mem in limits.supported_mem_mhz:
            for gr in limits.supported_sm_mhz.get(mem, ()):
                rows.append(reads.with_pair(mem, gr))
    return rows, errors


def supported_clocks(backend: Backend, gpus: Sequence[int]) -> dict[str, Any]:
    """JSON-ready: `{"schema": 1, "gpus": [{"index", "uuid", "name", "clocks": [{"memory_mhz":
    int, "graphics_mhz": [int, ...]}], "error": str | None}]}`, clocks descending."""
    out = []
    for index in gpus:
        entry: dict[str, Any] = {
            "index": index,
            "uuid": None,
            "name": None,
            "clocks": [],
            "error": None,
        }
        try:
            info = backend.device_info(index)
            limits = backend.clock_limits(index)
        except GpuenvError as err:
            out.append({**entry, "error": str(err)})
            continue
        entry.update(uuid=info.uuid, name=info.name)
        entry["clocks"] = [
            {"memory_mhz": mem, "graphics_mhz": list(limits.supported_sm_mhz.get(mem, ()))}
            for mem in limits.supported_mem_mhz
        ]
        out.append(entry)
    return {"schema": SCHEMA, "gpus": out}


def runs(clocks: Sequence[int]) -> list[str]:
    """Descending clocks written compactly: [1980, 1965, ..., 345] -> ["1980-345 MHz in 15 MHz
    steps (110 clocks)"]; clocks that break the step start a new run."""
    out: list[str] = []
    i = 0
    while i < len(clocks):
        j = i + 1
        step = clocks[i] - clocks[j] if j < len(clocks) else 0
        while j < len(clocks) and step > 0 and clocks[j - 1] - clocks[j] == step:
            j += 1
        n = j - i
        if n >= 3:
            out.append(f"{clocks[i]}-{clocks[j - 1]} MHz in {step} MHz steps ({n} clocks)")
        else:
            j = i + 1
            out.append(f"{clocks[i]} MHz")
        i = j
    return out


def format_supported(doc: dict[str, Any]) -> str:
    """The readable table: per GPU, each memory clock and the graphics clocks it supports."""
    lines = []
    for g in doc["gpus"]:
        if g["error"]:
            lines.append(f"GPU {g['index']}: {g['error']}")
            continue
        lines.append(f"GPU {g['index']} ({g['name']}, {g['uuid']}): supported clocks")
        if not g["clocks"]:
            lines.append("  none reported (the GPU or driver does not list them)")
        for c in g["clocks"]:
            graphics = ", ".join(runs(c["graphics_mhz"])) or "none"
            lines.append(f"  memory {c['memory_mhz']} MHz: graphics {graphics}")
    return "\n".join(lines)


__all__ = ["SUPPORTED_FIELDS", "format_supported", "runs", "supported_clocks", "supported_reads"]
