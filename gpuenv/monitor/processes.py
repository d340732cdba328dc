"""The processes on each GPU for `gpuenv monitor`: pid, type, user, GPU memory, SM %,
%CPU, %MEM, TIME and command, sorted and filtered as nvitop's process panel does.

On a real GPU they come from nvitop's process API (`nvitop.Device(i).processes()`
and `GpuProcess.take_snapshots`, as nvitop's own process panel reads them: NVML's
process list, per-process SM utilization over the last second, and the host's
user and command line). nvitop is imported here alone, and only on the first read.

A simulated GPU is a model that no NVML can see: its processes come through the
backend (`Backend.processes`), which names the processes it stands for and gives
their SM shares; the host names the real ones (the monitor's own context, say)
through psutil.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.backend import Backend
from gpuenv.errors import BackendError
from gpuenv.table import cut, display_width

MIB = 1024 * 1024
MAX_NAMES = 4096  # processes whose names are remembered (the oldest forgotten first)


@dataclass(frozen=True)
class ProcView:
    pid: int
    user: str
    command: str  # from its start, as nvitop shows it (clean_command)
    used_memory_mib: int | None
    sm_pct: int | None = None  # share of the SM over the last second; None where unknown
    kind: str = "C"  # nvitop's TYPE: C compute, G graphics, C+G both
    cpu_pct: float | None = None  # host CPU, % of one core (psutil's cpu_percent)
    mem_pct: float | None = None  # host memory, % of the machine's (psutil's memory_percent)
    time_s: float | None = None  # how long it has run


# nvitop's sort keys (its `,` `.` order) that the monitor has: key -> (name, value)
SORT_KEYS: dict[str, tuple[str, Callable[[ProcView], Any]]] = {
    "pid": ("PID", lambda p: p.pid),
    "user": ("USER", lambda p: p.user),
    "gpu_memory": ("GPU MEM", lambda p: p.used_memory_mib or -1),
    "sm_utilization": ("SM", lambda p: p.sm_pct if p.sm_pct is not None else -1),
    "cpu_percent": ("%CPU", lambda p: p.cpu_pct if p.cpu_pct is not None else -1.0),
    "memory_percent": ("%MEM", lambda p: p.mem_pct if p.mem_pct is not None else -1.0),
    "time": ("TIME", lambda p: p.time_s if p.time_s is not None else -1.0),
}
KINDS = ("all", "C", "G")  # the `f` key's filter: every process, compute ones, graphics ones
KIND_NAMES = {"all": "all processes", "C": "compute (C) only", "G": "graphics (G) only"}


def arrange(
    procs: tuple[ProcView, ...],
    sort: str = "pid",
    reverse: bool = False,
    kind: str = "all",
    users: tuple[str, ...] = (),
    pids: tuple[int, ...] = (),
) -> tuple[ProcView, ...]:
    """`procs` filtered (by kind: "C" keeps C and C+G; by user; by pid) and sorted by a
    SORT_KEYS key; ties in pid order."""
    kept = [
        p
        for p in procs
        if (kind == "all" or kind in p.kind.split("+"))
        and (not users or p.user in users)
        and (not pids or p.pid in pids)
    ]
    kept.sort(key=lambda p: p.pid)
    kept.sort(key=SORT_KEYS[sort][1], reverse=reverse)
    return tuple(kept)


def clean_command(args: list[str] | tuple[str, ...] | str) -> str:
    """A command line as one short line from its start: the program's own name (not its
    path), and a `python3 -c` script (several lines, or long) as `...`, as nvitop shows it:
    `/usr/bin/python3 -c "import torch\n..."` -> `python3 -c ...`."""
    if isinstance(args, str):
        return " ".join(args.split())
    if not args:
        return ""
    out = [args[0].rsplit("/", 1)[-1]]
    for k, arg in enumerate(args[1:], 1):
        inline = args[k - 1] == "-c" and ("\n" in arg or len(arg) > 40)
        out.append("..." if inline else " ".join(arg.split()))
    return " ".join(out)


ProcessReader = Callable[[int], "tuple[ProcView, ...]"]


def process_reader(backend: Backend) -> ProcessReader:
    """How the monitor reads GPU `i`'s processes: `reader(i) -> ProcViews` sorted by pid."""
    if backend.capabilities.simulated:
        return BackendProcesses(backend)
    return NvitopProcesses()


class BackendProcesses:
    """The backend's own process list (a model's), named through psutil where it does not."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._names = _HostNames()

    def __call__(self, index: int) -> tuple[ProcView, ...]:
        out = []
        for p in sorted(self.backend.processes(index), key=lambda p: p.pid):
            kind = "G" if p.kind == "graphics" else "C"
            if p.user is not None and p.command is not None:  # the model names it: no host pid
                out.append(ProcView(p.pid, p.user, p.command, p.used_memory_mib, p.sm_pct, kind))
                continue
            host = self._names.lookup(p.pid)
            out.append(
                ProcView(
                    p.pid,
                    p.user or host.user,
                    p.command or host.command,
                    p.used_memory_mib,
                    p.sm_pct,
                    kind,
                    host.cpu_pct,
                    host.mem_pct,
                    host.time_s,
                )
            )
        return tuple(out)


class NvitopProcesses:
    """nvitop's view of a real GPU's processes (NVML index = nvitop's physical index)."""

    def __init__(self) -> None:
        self._devices: dict[int, Any] = {}

    def __call__(self, index: int) -> tuple[ProcView, ...]:
        try:
            from nvitop import Device, GpuProcess

            dev = self._devices.get(index)
            if dev is None:
                dev = self._devices[index] = Device(index)
            snaps = GpuProcess.take_snapshots(dev.processes().values(), failsafe=True)
        except Exception as err:  # nvitop's NVML and host errors, whatever their class
            raise BackendError(f"nvitop could not list the processes: {err}", gpu=index) from err
        return tuple(sorted((_from_snapshot(s) for s in snaps), key=lambda p: p.pid))


def _number(value: Any) -> float | None:
    """nvitop's value, or None for its N/A (a str)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _from_snapshot(s: Any) -> ProcView:
    """One nvitop snapshot as a row; nvitop's N/A (a str) becomes None or '?'."""
    mem = s.gpu_memory if isinstance(s.gpu_memory, int) else None
    sm = s.gpu_sm_utilization if isinstance(s.gpu_sm_utilization, int) else None
    user = s.username if isinstance(s.username, str) and s.username != "N/A" else "?"
    cmdline = getattr(s, "cmdline", None)
    if isinstance(cmdline, (list, tuple)) and cmdline:
        cmd = clean_command(list(cmdline))
    else:
        cmd = clean_command(s.command) if isinstance(s.command, str) and s.command != "N/A" else "?"
    kind = getattr(s, "type", "C")
    running: Any = getattr(s, "running_time", None)
    mem_pct = getattr(s, "memory_percent", getattr(s, "host_memory_percent", None))
    return ProcView(
        int(s.pid),
        user,
        cmd,
        None if mem is None else mem // MIB,
        sm,
        kind if isinstance(kind, str) and kind in ("C", "G", "C+G") else "C",
        _number(getattr(s, "cpu_percent", None)),
        _number(mem_pct),
        running.total_seconds() if hasattr(running, "total_seconds") else None,
    )


@dataclass(frozen=True)
class HostProcess:
    user: str
    command: str
    cpu_pct: float | None = None
    mem_pct: float | None = None
    time_s: float | None = None


class _HostNames:
    """pid -> what the host says of it (user, command, %CPU, %MEM, TIME) through psutil.

    The psutil.Process is kept (cpu_percent measures since the last call on the same
    object) for at most MAX_NAMES processes: a monitor left running sees every process
    that ever ran on the GPU, most of them gone and never asked about again."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[float, Any, str, str]] = {}

    def lookup(self, pid: int) -> HostProcess:
        import time

        import psutil

        try:
            hit = self._cache.get(pid)
            proc = hit[1] if hit is not None else psutil.Process(pid)
            start = proc.create_time()
            if hit is None or hit[0] != start:  # new, or a reused pid
                proc = psutil.Process(pid)
                hit = (start, proc, *self._names(proc))
                self._cache.pop(pid, None)
                while len(self._cache) >= MAX_NAMES:
                    del self._cache[next(iter(self._cache))]
                self._cache[pid] = hit
            with proc.oneshot():
                cpu, mem = proc.cpu_percent(), proc.memory_percent()
            return HostProcess(hit[2], hit[3], cpu, mem, max(0.0, time.time() - start))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._cache.pop(pid, None)
            return HostProcess("-", "(exited)")
        except psutil.AccessDenied:
            return HostProcess("?", "?")  # another PID namespace or a hidepid /proc

    @staticmethod
    def _names(proc: Any) -> tuple[str, str]:
        import psutil

        with proc.oneshot():
            try:
                user = proc.username()
            except (psutil.AccessDenied, KeyError):
                user = "?"
            try:
                cmd = clean_command(proc.cmdline()) or proc.name()
            except psutil.AccessDenied:
                cmd = proc.name()
        return user, cmd


def shorten_command(command: str, width: int, ellipsis: str = "…") -> str:
    """`command` in `width` display columns, from its start (as nvitop and ps show it): the program
    and its first arguments, cut at a word boundary where there is one, then `ellipsis`."""
    if width <= 0:
        return ""
    if display_width(command) <= width:
        return command
    if width <= display_width(ellipsis):
        return cut(ellipsis, width)
    head = cut(command, width - display_width(ellipsis))
    at = head.rfind(" ")
    if at >= max(1, len(head) // 2):
        head = head[:at]
    return head + ellipsis


__all__ = [
    "KINDS",
    "KIND_NAMES",
    "SORT_KEYS",
    "HostProcess",
    "ProcView",
    "ProcessReader",
    "arrange",
    "clean_command",
    "process_reader",
    "shorten_command",
]
