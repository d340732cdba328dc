"""The processes on each GPU for `gpuenv monitor`: pid, user, GPU memory, SM %, command.

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

MIB = 1024 * 1024
MAX_NAMES = 4096  # processes whose names are remembered (the oldest forgotten first)


@dataclass(frozen=True)
class ProcView:
    pid: int
    user: str
    command: str
    used_memory_mib: int | None
    sm_pct: int | None = None  # share of the SM over the last second; None where unknown


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
            user, cmd = p.user, p.command
            if user is None or cmd is None:
                host_user, host_cmd = self._names.lookup(p.pid)
                user, cmd = user or host_user, cmd or host_cmd
            out.append(ProcView(p.pid, user, cmd, p.used_memory_mib, p.sm_pct))
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


def _from_snapshot(s: Any) -> ProcView:
    """One nvitop snapshot as a row; nvitop's N/A (a str) becomes None or '?'."""
    mem = s.gpu_memory if isinstance(s.gpu_memory, int) else None
    sm = s.gpu_sm_utilization if isinstance(s.gpu_sm_utilization, int) else None
    user = s.username if isinstance(s.username, str) and s.username != "N/A" else "?"
    cmd = s.command if isinstance(s.command, str) and s.command != "N/A" else "?"
    return ProcView(int(s.pid), user, cmd, None if mem is None else mem // MIB, sm)


class _HostNames:
    """pid -> (user, command) through psutil, cached: a process's name does not change.

    At most MAX_NAMES processes are remembered: a monitor left running sees every
    process that ever ran on the GPU, most of them gone and never asked about again."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[float, str, str]] = {}

    def lookup(self, pid: int) -> tuple[str, str]:
        import psutil

        try:
            proc = psutil.Process(pid)
            start = proc.create_time()
            hit = self._cache.get(pid)
            if hit and hit[0] == start:
                return hit[1], hit[2]
            with proc.oneshot():
                try:
                    user = proc.username()
                except (psutil.AccessDenied, KeyError):
                    user = "?"
                try:
                    cmd = " ".join(proc.cmdline()) or proc.name()
                except psutil.AccessDenied:
                    cmd = proc.name()
            self._cache.pop(pid, None)  # a reused pid: its entry becomes the newest
            while len(self._cache) >= MAX_NAMES:
                del self._cache[next(iter(self._cache))]
            self._cache[pid] = (start, user, cmd)
            return user, cmd
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._cache.pop(pid, None)
            return "-", "(exited)"
        except psutil.AccessDenied:
            return "?", "?"  # another PID namespace or a hidepid /proc


def shorten_command(command: str, width: int, ellipsis: str = "…") -> str:
    """`command` in `width` cells, cut from the left: the end (script and arguments) says
    what runs, `/usr/bin/python3 /tmp/x/bench.py --size 4096` -> `…/bench.py --size 4096`.

    The cut lands on a word or path boundary (a space or a slash) where there is one.
    """
    if width <= 0:
        return ""
    if len(command) <= width:
        return command
    if width <= len(ellipsis):
        return ellipsis[:width]
    tail = command[len(command) - (width - len(ellipsis)) :]
    cut = min((k for k in (tail.find("/"), tail.find(" ")) if k >= 0), default=-1)
    if 0 <= cut < len(tail) - 1:
        tail = tail[cut:] if tail[cut] == "/" else tail[cut + 1 :]
    return ellipsis + tail


__all__ = ["ProcView", "ProcessReader", "process_reader", "shorten_command"]
