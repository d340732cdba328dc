"""The host line of `gpuenv monitor` (nvitop's host panel, in one line): CPU, memory,
swap, load average and uptime, read through psutil.

A benchmark's numbers depend on the host too: a CPU busy with something else slows
the launches, swapping stalls the data loader. `read_host()` never raises: what
psutil cannot say (a container without /proc/loadavg) is None.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

GIB = 1024**3
SWAP_PERIOD_S = 5.0  # swap is read this often (it moves slowly; its read costs the most)


@dataclass(frozen=True)
class HostView:
    cpu_pct: float | None = None  # all cores, since the last read (psutil.cpu_percent)
    cpus: int | None = None
    mem_used_gib: float | None = None
    mem_total_gib: float | None = None
    swap_used_gib: float | None = None
    swap_total_gib: float | None = None
    load: tuple[float, float, float] | None = None  # 1, 5, 15 min
    uptime_s: float | None = None


_primed = False
_fixed: dict[str, float | int | None] = {}  # what does not change while the host runs


def read_host() -> HostView:
    """The host now. The CPU share is since the previous read; the first one measures 0.1 s
    (a share since psutil's import would read 0 % in a snapshot). The CPU count and the
    boot time are read once, swap at most every SWAP_PERIOD_S."""
    global _primed
    try:
        import psutil
    except ImportError:
        return HostView()
    out: dict[str, object] = {}
    with contextlib.suppress(Exception):
        out["cpu_pct"] = float(psutil.cpu_percent(interval=None if _primed else 0.1))
        _primed = True
        if "cpus" not in _fixed:
            _fixed["cpus"] = psutil.cpu_count()
        out["cpus"] = _fixed["cpus"]
    with contextlib.suppress(Exception):
        vm = psutil.virtual_memory()
        out["mem_used_gib"], out["mem_total_gib"] = (vm.total - vm.available) / GIB, vm.total / GIB
    with contextlib.suppress(Exception):
        now = time.monotonic()
        if now - float(_fixed.get("swap_at") or -1e18) >= SWAP_PERIOD_S:
            sw = psutil.swap_memory()  # /proc/meminfo and all of /proc/vmstat: not each frame
            _fixed.update(swap_at=now, swap_used=sw.used / GIB, swap_total=sw.total / GIB)
        out["swap_used_gib"], out["swap_total_gib"] = _fixed["swap_used"], _fixed["swap_total"]
    with contextlib.suppress(Exception):
        one, five, fifteen = psutil.getloadavg()
        out["load"] = (float(one), float(five), float(fifteen))
    with contextlib.suppress(Exception):
        if "boot" not in _fixed:
            _fixed["boot"] = psutil.boot_time()
        out["uptime_s"] = max(0.0, time.time() - float(_fixed["boot"] or 0.0))
    return HostView(**out)  # type: ignore[arg-type]


def _uptime(seconds: float) -> str:
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}d {hours}h" if days else f"{hours}h {rest // 60:02d}m"


def host_segments(h: HostView) -> list[tuple[str, str]]:
    """The host line's parts, most useful first (a narrow terminal keeps the first)."""
    out: list[tuple[str, str]] = [("  host", "dim")]
    if h.cpu_pct is not None:
        style = "warn" if h.cpu_pct >= 90 else ""
        out.append((f"  CPU {h.cpu_pct:.0f}%" + (f" of {h.cpus}" if h.cpus else ""), style))
    if h.mem_used_gib is not None and h.mem_total_gib:
        frac = h.mem_used_gib / h.mem_total_gib
        out.append(
            (
                f"  mem {h.mem_used_gib:.1f}/{h.mem_total_gib:.1f} GiB ({frac:.0%})",
                "warn" if frac >= 0.9 else "",
            )
        )
    if h.swap_total_gib:
        used = h.swap_used_gib or 0.0
        out.append((f"  swap {used:.1f}/{h.swap_total_gib:.1f} GiB", "warn" if used > 0.1 else ""))
    if h.load is not None:
        out.append(("  load " + " ".join(f"{x:.2f}" for x in h.load), ""))
    if h.uptime_s is not None:
        out.append((f"  up {_uptime(h.uptime_s)}", "dim"))
    return out


__all__ = ["HostView", "host_segments", "read_host"]
