"""A crash-safe record of what gpuenv changed, so it can always be put back.

NVML cannot say whether clocks are locked (there is no getter), so what gpuenv
sets and what was there before must be remembered by gpuenv. Before any
setting changes, one JSON file per GPU (named by UUID) records the original
state, what the lock applies, and who owns it. Files are written to a
temporary name, fsynced, renamed over the old one and the directory fsynced,
so a crash leaves either the old record or the new one, never half of one.
Every read-modify-write happens under one `fcntl.flock` on `<dir>/.lock-private`, so
concurrent gpuenv processes never interleave (the kernel drops the lock when
its holder dies, SIGKILL included).

State directory: `GPUENV_STATE_DIR`, else `/var/lib/gpuenv` when running as
root, else `$XDG_STATE_HOME/gpuenv` (`~/.local/state/gpuenv`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid as uuid_mod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuenv.errors import ConfigError

FORMAT_VERSION = 1
OWNER_KINDS = ("process", "standing", "lease")


def default_state_dir() -> Path:
    """Where journals live: GPUENV_STATE_DIR wins; /var/lib/gpuenv for root; else per user."""
    env = os.environ.get("GPUENV_STATE_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/var/lib/gpuenv")
    xdg = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "gpuenv"


# -- records -----------------------------------------------------------------------


def _pair(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class ClockState:
    """Everything a lock touches, on one GPU.

    NVML has no getter for locked clocks: `locked_sm` / `locked_mem` come from the
    journal, and `locked_known` is False when no journal says (something outside
    gpuenv, such as `nvidia-smi -lgc`, may have locked them).
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
        return cls(
            uuid=str(d["uuid"]),
            locked_sm=_pair(d.get("locked_sm")),
            locked_mem=_pair(d.get("locked_mem")),
            locked_known=bool(d.get("locked_known", False)),
            app_sm_mhz=d.get("app_sm_mhz"),
            app_mem_mhz=d.get("app_mem_mhz"),
            power_limit_w=float(d["power_limit_w"]),
            persistence=d.get("persistence"),
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
        pl = d.get("power_limit_w")
        return cls(
            locked_sm=_pair(d.get("locked_sm")),
            locked_mem=_pair(d.get("locked_mem")),
            app_clocks=_pair(d.get("app_clocks")),
            power_limit_w=None if pl is None else float(pl),
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

    def describe(self) -> str:
        """'pid 4242 (alice: python bench.py, since 2026-11-22 10:00:03)'."""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
        what = f"{self.user}: {self.command}, since {since}"
        if self.kind == "standing":
            return f"a standing lock ({what}; 'gpuenv restore' ends it)"
        if self.kind == "lease":
            return f"a daemon lease, pid {self.pid} ({what})"
        return f"pid {self.pid} ({what})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Owner:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


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
        return cls(
            uuid=str(d["uuid"]),
            index=int(d.get("index", -1)),
            name=str(d.get("name", d["uuid"])),
            backend=str(d.get("backend", "nvml")),
            original=ClockState.from_dict(d["original"]),
            applied=Applied.from_dict(d.get("applied", {})),
            owners=tuple(Owner.from_dict(o) for o in d.get("owners", [])),
            created_at=float(d.get("created_at", 0.0)),
        )


# -- the journal -------------------------------------------------------------------


class _DirLock:
    """flock on `<dir>/.lock-private`, re-entrant within a process (flocks on two fds of one
    process would block each other), exclusive across processes."""

    def __init__(self, path: Path):
        self.path = path
        self._mutex = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._mutex:
            if self._depth == 0:
                fd = _open_private_lock(self.path)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)
                    self._fd = None


def _private_dir(path: Path) -> None:
    """Make the state directory 0700, ours: anyone who can open the lock file can
    flock it and stall every gpuenv lock, release and restore (the daemon's too)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"the state directory {path} belongs to uid {st.st_uid}, not to this user",
            hint="use your own (GPUENV_STATE_DIR), or chown it to the user that runs gpuenv",
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _open_private_lock(path: Path) -> int:
    """Open the lock file (0600), in the directory made private first. Its name is new:
    the `.lock` of older versions was 0644 in a 0755 directory, so anyone may hold it
    open (and flock it) still; nobody but this user could open this one. One that is
    not ours or not 0600 anyway is not trusted: a new file replaces it."""
    _private_dir(path.parent)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return fd
    os.close(fd)
    fresh = path.with_name(f"{path.name}.{os.getpid()}.new")
    os.close(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
    os.replace(fresh, path)
    return os.open(path, flags, 0o600)


_DIR_LOCKS: dict[str, _DirLock] = {}
_DIR_LOCKS_GUARD = threading.Lock()


def _dir_lock(state_dir: Path) -> _DirLock:
    key = str(state_dir.resolve())
    with _DIR_LOCKS_GUARD:
        lock = _DIR_LOCKS.get(key)
        if lock is None:
            lock = _DIR_LOCKS[key] = _DirLock(Path(key) / ".lock-private")
        return lock


class Journal:
    """The per-GPU records in a state directory (see the module docstring).

    Reads need no lock. Anything that decides from a read and then writes must do
    both inside `with journal.locked():`.
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None):
        self.path = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        self._lock = _dir_lock(self.path)

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"

    @contextlib.contextmanager
    def locked(self) -> Iterator[Journal]:
        """Exclusive across processes; re-entrant within this one."""
        with self._lock.hold():
            yield self

    def _file(self, uuid: str) -> Path:
        if not uuid or "/" in uuid or uuid.startswith("."):
            raise ConfigError(f"not a GPU UUID: {uuid!r}")
        return self.path / f"{uuid}.json"

    def get(self, uuid: str) -> JournalEntry | None:
        path = self._file(uuid)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return self._parse(path, text)

    def entries(self) -> list[JournalEntry]:
        if not self.path.is_dir():
            return []
        out = []
        for path in sorted(self.path.glob("*.json")):
            if path.name.startswith("."):
                continue
            try:
                out.append(self._parse(path, path.read_text()))
            except FileNotFoundError:  # removed since the glob
                continue
        return out

    @staticmethod
    def _parse(path: Path, text: str) -> JournalEntry:
        try:
            return JournalEntry.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(
                f"the journal file {path} is damaged ({err})",
                hint="check the GPU's clocks with 'gpuenv status', fix or delete the file",
            ) from err

    def put(self, entry: JournalEntry) -> None:
        """Write one GPU's record atomically (tmp file, fsync, rename, fsync the directory)."""
        with self.locked():
            final = self._file(entry.uuid)
            tmp = self.path / f".{entry.uuid}.json.{os.getpid()}.tmp"
            data = json.dumps(entry.to_dict(), indent=1, sort_keys=True).encode()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            self._fsync_dir()

    def remove(self, uuid: str) -> None:
        """Delete one GPU's record (after its state was put back); no error if absent."""
        with self.locked(), contextlib.suppress(FileNotFoundError):
            self._file(uuid).unlink()
            self._fsync_dir()

    def clean_tmp(self) -> int:
        """Delete temporary files left by writers that died mid-write; returns how many."""
        removed = 0
        with self.locked():
            if not self.path.is_dir():
                return 0
            for tmp in self.path.glob(".*.json.*.tmp"):
                try:
                    pid = int(tmp.name.rsplit(".", 2)[-2])
                except ValueError:
                    pid = -1
                if pid != os.getpid() and not process_alive(pid, None):
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                        removed += 1
        return removed

    def _fsync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    "Applied",
    "ClockState",
    "Journal",
    "JournalEntry",
    "Owner",
    "default_state_dir",
    "process_alive",
    "process_start_time",
]
