"""One snapshot of each GPU's state, for `gpuenv status` (and anything else that shows it).

`snapshot()` returns a JSON-ready dict whose shape is stable (key "schema"
says which version); `format_table()` renders it as a compact table. Reads
only: nothing here imports torch or nvitop, and the cost is a handful of NVML
calls per GPU.

Schema 1 (`gpuenv status --json`):

    {"schema": 1, "backend": "nvml" | "sim", "driver_version": str,
     "time": float,        # when it was read: seconds since the epoch (UTC)
     "timestamp": str,     # the same as ISO 8601 with the zone ("2026-11-24T18:30:00.123+00:00")
     "readonly": bool,     # GPUENV_READONLY=1 or --dry-run: gpuenv refuses every write

     "gpus": [{
        "index": int, "uuid": str, "name": str, "pci_bus_id": str,
        "sm_mhz": int, "sm_max_mhz": int, "mem_mhz": int, "mem_max_mhz": int,
        "lock": {"state": "locked" | "none" | "unknown",   # none: no gpuenv lock
                 "sm_mhz": [min, max] | null, "mem_mhz": [min, max] | null,
                 "holds": bool | null,      # SM clock inside the locked range now
                 "owners": [str], "stale": bool, "text": str,
                 "pinned": bool},           # none, yet the clock looks locked (text: why)
        "app_clocks": {"sm_mhz", "mem_mhz", "default_sm_mhz", "default_mem_mhz"},
        "power_w": float, "power_limit_w": float | null, "power_default_w": float | null,
        "temp_c": float, "slowdown_c": float | null,
        "reasons": int, "reason_names": [str],
        "persistence": bool | null, "mig_mode": bool | null,
        "processes": int | null,
        "error": str | null}]}

Values the GPU does not support are null. A GPU that fails as a whole (lost,
timed out) keeps "index" and says why in "error"; its other keys are null.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpuenv.backend import Backend, reason_names
from gpuenv.errors import GpuenvError, NotSupported, PermissionDenied
from gpuenv.table import render

SCHEMA = 1
T = TypeVar("T")

GPU_KEYS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "sm_mhz",
    "sm_max_mhz",
    "mem_mhz",
    "mem_max_mhz",
    "lock",
    "app_clocks",
    "power_w",
    "power_limit_w",
    "power_default_w",
    "temp_c",
    "slowdown_c",
    "reasons",
    "reason_names",
    "persistence",
    "mig_mode",
    "processes",
    "error",
)


def snapshot(
    backend: Backend, gpus: Sequence[int], *, readonly: bool | None = None
) -> dict[str, Any]:
    """State of `gpus` (NVML indices) now: see the module docstring for the shape.

    `readonly`: whether gpuenv refuses writes here (GPUENV_READONLY, --dry-run);
    None takes the backend's own flag.
    """
    driver = _optional(backend.driver_version)
    wall = backend.clock.wall()
    return {
        "schema": SCHEMA,
        "backend": backend.name,
        "driver_version": driver,
        "time": round(wall, 3),
        "timestamp": datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(
            timespec="milliseconds"
        ),
        "readonly": bool(getattr(backend, "readonly", False)) if readonly is None else readonly,
        "gpus": [gpu_status(backend, index) for index in gpus],
    }


def gpu_status(backend: Backend, index: int) -> dict[str, Any]:
    """One GPU's entry of `snapshot()`. Errors of the whole GPU land in "error"."""
    try:
        return _gpu_status(backend, index)
    except GpuenvError as err:
        entry: dict[str, Any] = dict.fromkeys(GPU_KEYS)
        entry.update(index=index, error=str(err))
        return entry


def _gpu_status(backend: Backend, index: int) -> dict[str, Any]:
    info = backend.device_info(index)
    fast = backend.read_fast(index)
    limits = backend.clock_limits(index)
    power = _optional(lambda: backend.power_limits(index))
    thresholds = _optional(lambda: backend.thresholds(index))
    app = _optional(lambda: backend.app_clocks(index))
    procs = _optional(lambda: backend.processes(index))
    return {
        "index": index,
        "uuid": info.uuid,
        "name": info.name,
        "pci_bus_id": info.pci_bus_id,
        "sm_mhz": fast.sm_mhz,
        "sm_max_mhz": limits.max_sm_mhz,
        "mem_mhz": fast.mem_mhz,
        "mem_max_mhz": limits.max_mem_mhz,
        "lock": lock_info(backend, index),
        "app_clocks": {
            "sm_mhz": app.sm_mhz if app else None,
            "mem_mhz": app.mem_mhz if app else None,
            "default_sm_mhz": limits.default_app_sm_mhz,
            "default_mem_mhz": limits.default_app_mem_mhz,
        },
        "power_w": round(fast.power_w, 2),
        "power_limit_w": power.limit_w if power else None,
        "power_default_w": power.default_w if power else None,
        "temp_c": fast.temp_c,
        "slowdown_c": thresholds.slowdown_c if thresholds else None,
        "reasons": fast.reasons,
        "reason_names": reason_names(fast.reasons),
        "persistence": _optional(lambda: backend.persistence_mode(index)),
        "mig_mode": info.mig_mode,
        "processes": len(procs) if procs is not None else None,
        "error": None,
    }


def lock_info(backend: Backend, index: int) -> dict[str, Any]:
    """gpuenv's lock on GPU `index`: range, owners, and whether it holds right now.

    NVML cannot be asked whether clocks are locked (there is no getter): only
    gpuenv's journal knows, so a lock set with nvidia-smi shows as "none", and
    "unknown" means the journal could not be read.
    """
    unknown: dict[str, Any] = {
        "state": "unknown",
        "sm_mhz": None,
        "mem_mhz": None,
        "holds": None,
        "owners": [],
        "stale": False,
        "text": "unknown",
        "pinned": False,
    }
    from gpuenv.clocks import lock_status
    from gpuenv.locking import lock_view

    try:
        view = lock_view(backend, index)  # a gpuenvd serving this GPU is the authority
        if view is not None:
            return view
        st = lock_status(backend, index, check_pinned=True)
    except (GpuenvError, OSError) as err:
        return {**unknown, "text": f"unknown: {err}"}
    if not st.locked:
        return {**unknown, "state": "none", "text": st.describe(), "pinned": st.pinned}
    mem = st.applied.locked_mem if st.applied is not None else None
    info = {
        "state": "locked",
        "sm_mhz": list(st.range) if st.range else None,
        "mem_mhz": list(mem) if mem else None,
        "holds": st.holds,
        "owners": list(st.owners) or ([st.owner] if st.owner else []),
        "stale": st.stale,
        "text": st.describe(),
    }
    return _without_dead_daemons(backend, index, info, st.applied)


def _without_dead_daemons(
    backend: Backend, index: int, info: dict[str, Any], applied: Any
) -> dict[str, Any]:
    """A gpuenvd lease ends with its daemon, whatever became of its client: while the daemon
    is down, its leases are shown as gone (the clocks stay locked until gpuenvd starts again
    and restores them, or 'gpuenv restore'), not as held."""
    from gpuenv.clocks import describe_target
    from gpuenv.clocks.journal import Applied, Journal

    try:
        entry = Journal().get(backend.device_info(index).uuid)
    except (GpuenvError, OSError):
        return info
    gone = [o for o in (entry.owners if entry else ()) if o.kind == "lease"]
    gone = [o for o in gone if not o.watchdog_alive()]
    if not gone or entry is None:
        return info
    dead = {o.describe() for o in gone}
    owners = [o for o in info["owners"] if o not in dead and "which has ended" not in o]
    daemon = gone[0].watchdog_pid
    text = f"a gpuenvd lease whose daemon (pid {daemon}) is gone"
    if owners:
        return {**info, "owners": owners, "text": f"{info['text']}; also {text}"}
    target = describe_target(applied or Applied())
    return {
        **info,
        "owners": [],
        "stale": True,
        "text": f"locked ({target}) by {text}: gpuenvd puts it back when it "
        "starts again, or run 'gpuenv restore'",
    }


def _optional(read: Callable[[], T]) -> T | None:
    """A value the GPU may not offer (or not to this user): None instead of an error."""
    try:
        return read()
    except (NotSupported, PermissionDenied):
        return None


# -- the human view -----------------------------------------------------------------------


def _pair(now: object, limit: object) -> str:
    def show(v: object) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.0f}"
        return str(v)

    return f"{show(now)}/{show(limit)}"


def _lock_text(lock: dict[str, Any] | None) -> str:
    if not lock or lock["state"] == "unknown":
        return "?"
    if lock["state"] == "none":
        return "no (pinned?)" if lock.get("pinned") else "no"
    parts = []
    if lock["sm_mhz"]:
        lo, hi = lock["sm_mhz"]
        parts.append(f"{lo}" if lo == hi else f"{lo}-{hi}")
    if lock["mem_mhz"]:
        lo, hi = lock["mem_mhz"]
        parts.append(f"mem {lo}" if lo == hi else f"mem {lo}-{hi}")
    text = " ".join(parts) or "yes"
    if lock["stale"]:
        return text + " (stale)"
    if lock["holds"] is False:
        return text + " (not held)"
    return text


def format_table(snap: dict[str, Any]) -> str:
    """A compact table: one row per GPU (`gpuenv status`)."""
    header = (
        "GPU",
        "NAME",
        "SM MHz",
        "MEM MHz",
        "LOCK",
        "POWER W",
        "TEMP C",
        "PERS",
        "PROCS",
        "REASONS",
        "UUID",
    )
    rows: list[tuple[str, ...]] = []
    errors: list[str] = []
    for g in snap["gpus"]:
        if g.get("error"):
            errors.append(f"GPU {g['index']}: {g['error']}")
            rows.append((str(g["index"]), "(error)", *("-",) * 8, "-"))
            continue
        pers = g["persistence"]
        rows.append(
            (
                str(g["index"]),
                g["name"],
                _pair(g["sm_mhz"], g["sm_max_mhz"]),
                _pair(g["mem_mhz"], g["mem_max_mhz"]),
                _lock_text(g["lock"]),
                _pair(g["power_w"], g["power_limit_w"]),
                _pair(g["temp_c"], g["slowdown_c"]),
                "-" if pers is None else ("on" if pers else "off"),
                "-" if g["processes"] is None else str(g["processes"]),
                ",".join(g["reason_names"]) or "none",
                g["uuid"],
            )
        )
    n = len(snap["gpus"])
    plural = "s" if n != 1 else ""
    title = f"{snap['backend']} backend, driver {snap['driver_version'] or '?'}, {n} GPU{plural}"
    if snap.get("readonly"):
        title += " (read-only)"
    # numbers that line up on the right: the index, the process count
    lines = [title, *render(rows, header=header, right={0, 8})]
    lines += [
        f"GPU {g['index']}: {g['lock']['text']}"
        for g in snap["gpus"]
        if g.get("lock")
        and (g["lock"]["state"] != "none" or g["lock"].get("pinned"))
        and g["lock"]["text"] != "unknown"
    ]
    lines += errors
    return "\n".join(lines)
