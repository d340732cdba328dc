"""The records of `gpuenv doctor`: a finding (`Check`), the host facts, what a check reads."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gpuenv._records import JsonRecord
from gpuenv.backend import Backend
from gpuenv.errors import GpuenvError

CheckSeverity = Literal["ok", "info", "warning", "error"]  # a check's, worst last
SEVERITIES: tuple[CheckSeverity, ...] = get_args(CheckSeverity)
DEFAULT_SOCKET = "/run/gpuenv/gpuenv.sock"


@dataclass(frozen=True)
class Check(JsonRecord):
    """One finding of `gpuenv doctor` (`to_dict()`: its fields, for --json)."""

    name: str  # short id: "persistence", "cpu_governor", ...
    severity: CheckSeverity
    message: str  # what is the case, in a sentence
    fix: str | None = None  # what to do about it
    gpu: int | None = None  # NVML index, where the finding is about one GPU


@dataclass
class Host:
    """The host facts the checks read; defaults are this process and machine."""

    euid: int = field(default_factory=os.geteuid)
    pid: int = field(default_factory=os.getpid)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    sysfs: str = "/sys"
    socket: str | None = None  # gpuenv daemon socket; None: GPUENV_SOCKET or DEFAULT_SOCKET
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    loadavg: tuple[float, float, float] | None = field(default_factory=lambda: _loadavg())

    @property
    def socket_path(self) -> str:
        return self.socket or self.env.get("GPUENV_SOCKET", "").strip() or DEFAULT_SOCKET


def _loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


@dataclass
class Context:
    backend: Backend | None  # None: NVML could not be opened (open_error says why)
    gpus: Sequence[int]
    host: Host
    open_error: GpuenvError | None = None
    seen: dict[str, Any] = field(default_factory=dict)  # answers checks share (one daemon hello)


CheckFn = Callable[[Context], Iterable[Check]]


__all__ = ["DEFAULT_SOCKET", "SEVERITIES", "Check", "CheckFn", "CheckSeverity", "Context", "Host"]
