"""What the journal records: each GPU's original state (`ClockState`), what a lock
applies (`Applied`), who holds it (`Owner`), and the three together (`JournalEntry`).

`from_dict` of each is strict: a field of the wrong type raises ValueError, TypeError
or KeyError, which the journal reports as a damaged record (never a half-understood
one put back on a GPU).
"""

from __future__ import annotations

import math
import os
import time
import uuid as uuid_mod
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuenv.errors import ConfigError

FORMAT_VERSION = 2  # 2: each record carries a checksum of its content
OWNER_KINDS = ("process", "standing", "lease")


def _pair(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"expected [min, max], got {value!r}")
    return (_int(value[0]), _int(value[1]))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {value!r}")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _num(value: Any) -> float:
    # finite too: a NaN power limit in a record would be written back to the GPU on restore
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a finite number, got {value!r}")
    try:
        x = float(value)  # 10**400, an int JSON allows, overflows here
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise TypeError(f"expected a finite number, got {value!r:.40}")
    return x


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what}: expected an object, got {value!r}")
    return value


@dataclass(frozen=True)
class ClockState:
    """Everything a lock touches, on one GPU.

    NVML has no getter for locked clocks: `locked_sm` / `locked_mem` come from the
    journal, and `locked_known` is False when no journal says (something outside
    gpuenv, such as `nvidia-smi -lgc`, may have locked them).

    Attributes:
        uuid: the GPU's UUID.
        locked_sm: the locked SM range in MHz, or None (the base clock's symbolic
            range where it was locked to base).
        locked_mem: the locked memory range in MHz, or None.
        locked_known: whether a journal says what is locked.
        app_sm_mhz: the application SM clock (`nvidia-smi -ac`'s), or None.
        app_mem_mhz: the application memory clock, or None.
        power_limit_w: the power limit in force, in watts (`nvidia-smi -pl`).
        persistence: persistence mode (`nvidia-smi -pm`), or None where unknown.
    """

    uuid: str
    locked_sm: tuple[int, int] | None  # MHz; (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP) = base clock
    locked_mem: tuple[int, int] | None
    locked_known: bool
    app_sm_mhz: int | None
    app_mem_mhz: int | None
    power_limit_w: float
    persistence: bool | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClockState:
        d = _dict(d, "original")
        persistence = d.get("persistence")
        if persistence is not None and not isinstance(persistence, bool):
            raise TypeError(f"persistence: expected true/false, got {persistence!r}")
        return cls(
            uuid=str(d["uuid"]),
            locked_sm=_pair(d.get("locked_sm")),
            locked_mem=_pair(d.get("locked_mem")),
            locked_known=bool(d.get("locked_known", False)),
            app_sm_mhz=_opt_int(d.get("app_sm_mhz")),
            app_mem_mhz=_opt_int(d.get("app_mem_mhz")),
            power_limit_w=_num(d["power_limit_w"]),
            persistence=persistence,
        )


@dataclass(frozen=True)
class Applied:
    """What a lock sets on one GPU; None leaves that setting alone."""

    locked_sm: tuple[int, int] | None = None  # MHz, or (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)
    locked_mem: tuple[int, int] | None = None
    app_clocks: tuple[int, int] | None = None  # (mem_mhz, sm_mhz): fallback without locked clocks
    power_limit_w: float | None = None

    def empty(self) -> bool:
        return self == Applied()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Applied:
        d = _dict(d, "applied")
        pl = d.get("power_limit_w")
        return cls(
            locked_sm=_pair(d.get("locked_sm")),
            locked_mem=_pair(d.get("locked_mem")),
            app_clocks=_pair(d.get("app_clocks")),
            power_limit_w=None if pl is None else _num(pl),
        )


def process_start_time(pid: int) -> float | None:
    """When `pid` started (seconds since the epoch), to tell a live owner from a reused pid."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return None


def process_alive(pid: int | None, start: float | None) -> bool:
    """True if `pid` runs and is the same process that started at `start` (not a reused pid).

    A zombie counts as dead: it will never release anything.
    """
    if pid is None or pid <= 0:
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return start is None or abs(proc.create_time() - start) <= 0.05
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:  # another user's live process
        return True


@dataclass(frozen=True)
class Owner:
    """Who holds a lock. `token` is unique per lock, so one process can hold several."""

    token: str
    kind: str  # "process" | "standing" | "lease"
    pid: int
    pid_start: float | None
    uid: int
    user: str
    command: str
    started_at: float  # seconds since the epoch
    request: str  # what it asked for, e.g. "SM 1350 MHz"
    watchdog_pid: int | None = None
    watchdog_start: float | None = None

    @classmethod
    def current(
        cls, *, kind: str = "process", request: str = "", command: str | None = None
    ) -> Owner:
        """An owner record for this process."""
        if kind not in OWNER_KINDS:
            raise ConfigError(
                f"unknown owner kind {kind!r}", hint=f"use one of {', '.join(OWNER_KINDS)}"
            )
        pid = os.getpid()
        return cls(
            token=uuid_mod.uuid4().hex,
            kind=kind,
            pid=pid,
            pid_start=process_start_time(pid),
            uid=os.getuid(),
            user=_user_name(),
            command=command if command is not None else _command_line(),
            started_at=time.time(),
            request=request,
        )

    def alive(self) -> bool:
        """Standing: until 'gpuenv restore'; others: while their process or watchdog runs."""
        if self.kind == "standing":
            return True
        return process_alive(self.pid, self.pid_start) or self.watchdog_alive()

    def owner_alive(self) -> bool:
        return self.kind == "standing" or process_alive(self.pid, self.pid_start)

    def watchdog_alive(self) -> bool:
        return process_alive(self.watchdog_pid, self.watchdog_start)

    @property
    def since(self) -> str:
        """When it took the lock, as a person reads it: '2026-11-22 10:00:03'."""
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))

    def describe(self) -> str:
        """'pid 4242 (alice: python bench.py, since 2026-11-22 10:00:03)'."""
        what = f"{self.user}: {self.command}, since {self.since}"
        if self.kind == "standing":
            return f"a standing lock ({what}; 'gpuenv restore' ends it)"
        if self.kind == "lease":
            return f"a daemon lease, pid {self.pid} ({what})"
        return f"pid {self.pid} ({what})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Owner:
        d = _dict(d, "owner")
        start, dog_start = d.get("pid_start"), d.get("watchdog_start")
        return cls(
            token=str(d["token"]),
            kind=str(d["kind"]),
            pid=_int(d["pid"]),
            pid_start=None if start is None else _num(start),
            uid=_int(d.get("uid", -1)),
            user=str(d.get("user", "?")),
            command=str(d.get("command", "?")),
            started_at=_num(d.get("started_at", 0.0)),
            request=str(d.get("request", "")),
            watchdog_pid=_opt_int(d.get("watchdog_pid")),
            watchdog_start=None if dog_start is None else _num(dog_start),
        )


@dataclass(frozen=True)
class JournalEntry:
    """One GPU's record: the state to put back, what was applied, and who holds it."""

    uuid: str
    index: int  # NVML index when written (informational: the UUID is the key)
    name: str  # "GPU 0 (NVIDIA H100 80GB HBM3)"
    backend: str  # "nvml" | "sim": a sim journal never restores a real GPU
    original: ClockState
    applied: Applied
    owners: tuple[Owner, ...] = ()
    created_at: float = field(default_factory=time.time)

    def owner(self, token: str) -> Owner | None:
        return next((o for o in self.owners if o.token == token), None)

    def with_owners(self, owners: tuple[Owner, ...] | list[Owner]) -> JournalEntry:
        return replace(self, owners=tuple(owners))

    def live_owners(self) -> list[Owner]:
        return [o for o in self.owners if o.alive()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "uuid": self.uuid,
            "index": self.index,
            "name": self.name,
            "backend": self.backend,
            "original": self.original.to_dict(),
            "applied": self.applied.to_dict(),
            "owners": [o.to_dict() for o in self.owners],
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JournalEntry:
        d = _dict(d, "record")
        owners = d.get("owners", [])
        if not isinstance(owners, list):
            raise TypeError(f"owners: expected a list, got {owners!r}")
        return cls(
            uuid=str(d["uuid"]),
            index=_int(d.get("index", -1)),
            name=str(d.get("name", d["uuid"])),
            backend=str(d.get("backend", "nvml")),
            original=ClockState.from_dict(d["original"]),
            applied=Applied.from_dict(d.get("applied", {})),
            owners=tuple(Owner.from_dict(o) for o in owners),
            created_at=_num(d.get("created_at", 0.0)),
        )


def _user_name() -> str:
    import pwd

    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    sudo_user = os.environ.get("SUDO_USER")
    if uid == 0 and sudo_user:
        name = f"{sudo_user} via sudo"
    return name


def _command_line(limit: int = 120) -> str:
    import shlex
    import sys

    argv = list(sys.argv) or ["python"]
    if argv[0].endswith("__main__.py") or argv[0] == "-c":
        argv = [Path(sys.executable).name, *argv]
    else:
        argv[0] = Path(argv[0]).name
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "FORMAT_VERSION",
    "Applied",
    "ClockState",
    "JournalEntry",
    "Owner",
    "process_alive",
    "process_start_time",
]
