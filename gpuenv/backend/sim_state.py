"""The simulated driver's settings: what a real driver keeps for every process of the host.

One JSON document per simulated machine, one machine per host (default
/tmp/gpuenv-sim.json), as a real GPU's settings are the driver's, not a process's or an
account's: locked clocks, application clocks, power limit and persistence mode, and a
`generation` counted up at every change. Only a privileged process writes it (root, as
on a real GPU: `SimCore` refuses the others, who go through gpuenvd), and every account
reads it; what runs on the GPU is anyone's and lives beside it (`sim_host.py`).

Writers take an exclusive `fcntl` lock on a side file, re-read the document, apply
their change and replace the file atomically (write a temporary file, `os.replace`),
so two processes never lose each other's changes and a reader never sees half a file.
Readers do not lock: they `stat` the file on every call (about a microsecond) and
re-load only when it changed.

Root writes it in /tmp, so it gets care against other accounts (`gpuenv._files`): the
directory is reached without following a link planted on the way, the temporary file's
name is random and made with O_EXCL | O_NOFOLLOW (a link planted under a guessed name is
never followed), the file and its lock are opened with O_NOFOLLOW, a lock file another
account (not root) owns is replaced by one of ours where the directory allows, and the
lock is waited for at most LOCK_TIMEOUT_S: then an error names who holds it. A document
is believed only when root or the directory's owner wrote it: in /tmp any account may
leave a file under the name, and a settings file an ordinary account planted there is
not the driver's (a machine in a directory of one's own is that account's to set).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv._files import create_temp, open_dir, read_open, write_all
from gpuenv.errors import ConfigError, FileError

FORMAT = "gpuenv-sim-state/2"
LOCK_TIMEOUT_S = 5.0  # a read-modify-write holds it for milliseconds
_LOCK_POLL_S = 0.005  # the longest wait between tries for a busy lock ...
_LOCK_FIRST_POLL_S = 0.0002  # ... the first: a holder keeps it under a millisecond, and a
# first wait of 5 ms made the wrapped process's exchange at a step's start, met by
# `gpuenv run`'s sampler reading that edge, 5.7 ms instead of 0.6 (one in eight)
_MAX_BYTES = 16 << 20  # a few GPUs' settings and counters: a few kB


def default_state_path() -> Path:
    """The host's simulated machine, shared by every process and account, as /dev/nvidia* is."""
    return Path("/tmp") / "gpuenv-sim.json"


def lock_holders(fd: int) -> list[str]:
    """Who holds a lock on the file open as `fd` ("pid 123 (user)"), from /proc/locks."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    with contextlib.suppress(OSError), open("/proc/locks", encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[5] == key and fields[4].isdigit():
                out.append(_describe_pid(int(fields[4])))
    return out


def flock_within(fd: int, timeout: float, what: str) -> None:
    """An exclusive `flock` on `fd`, or a ConfigError naming its holders when it is not free
    within `timeout` seconds: a file other accounts may lock must not let them hang us."""
    deadline = time.monotonic() + timeout
    poll = _LOCK_FIRST_POLL_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holders = ", ".join(lock_holders(fd)) or "another process"
                raise ConfigError(
                    f"{what} is held by {holders}: not free within {timeout:g} s, "
                    "so nothing was changed",
                    hint="stop that process, or give this simulated machine its own state "
                    "file (GPUENV_SIM_STATE=PATH in a directory of your own)",
                ) from None
            time.sleep(poll)
            poll = min(poll * 2, _LOCK_POLL_S)


def _describe_pid(pid: int) -> str:
    import pwd

    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        return f"pid {pid} ({pwd.getpwuid(uid).pw_name})"
    except (OSError, KeyError):
        return f"pid {pid}"


def _read_trusted(dfd: int, name: str) -> bytes:
    """The file's bytes when root or the directory's owner wrote it (else PermissionError)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    try:
        owner = os.fstat(fd).st_uid
        if owner not in (0, os.fstat(dfd).st_uid):
            raise PermissionError(errno.EPERM, "not written by root", name)
        return read_open(fd, name, limit=_MAX_BYTES)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _GpuEntry:
    """One simulated GPU's entry, as `sim_core` writes it: the schema `read` checks."""

    uuid: str = ""
    locked_sm: tuple[int, int] | None = None
    locked_mem: tuple[int, int] | None = None
    app_sm: int | None = None
    app_mem: int | None = None
    power_limit_w: float | None = None
    persistence: bool | None = None


@dataclass(frozen=True)
class _Document:
    format: str
    profile: str = ""
    n_gpus: int = 0
    seed: int = 0
    generation: int = 0
    gpus: tuple[_GpuEntry, ...] = ()


def check_place(path: str | os.PathLike[str]) -> None:
    """A regular file (or none yet) in a directory that exists: GPUENV_SIM_STATE=/dev/full
    would put a lock file beside a device and replace it (as root); a missing directory
    is not created (gpuenv creates none it was not asked for)."""
    from gpuenv import reader

    path = Path(os.path.abspath(path))
    where, setting = "the simulated GPU's state", "GPUENV_SIM_STATE"
    if not path.name or not path.parent.is_dir():
        folder = path.parent if path.name else path
        raise FileError(
            folder,
            errno.ENOTDIR if folder.exists() else errno.ENOENT,
            where=where,
            setting=setting,
        )
    if os.path.lexists(path):
        reader.read_bytes(path, what=where, setting=setting, max_bytes=_MAX_BYTES)


class StateFile:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(os.path.abspath(path))
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._seen: tuple[int, int, int] | None = None
        check_place(self.path)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def changed(self) -> bool:
        """True when the file differs from what this process last read or wrote."""
        return self._stat() != self._seen

    def _dir(self) -> int:
        """The state file's directory, reached safely (made when missing)."""
        return open_dir(
            self.path.parent,
            create=True,
            mode=0o755,
            own=None,
            what="the simulated GPU's state directory",
        )

    def _open_lock(self, dfd: int) -> int:
        """The lock file, ours (a lock file of another account could be held by it forever:
        a new one of ours replaces it where the directory lets us)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        name = self.lock_path.name
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
        st = os.fstat(fd)
        if st.st_uid in (0, os.geteuid()):  # (root's 0666 one: shared on purpose)
            return fd
        with contextlib.suppress(OSError):
            tfd, tmp = create_temp(dfd, name)
            os.close(tfd)
            try:
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError:
                os.unlink(tmp, dir_fd=dfd)
                raise
            os.close(fd)
            fd = os.open(name, flags, 0o600, dir_fd=dfd)
        return fd

    @contextlib.contextmanager
    def locked(self, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Exclusive lock for a read-modify-write; ConfigError naming its holder when it is
        not free within `timeout` seconds (no other account can hang this process)."""
        try:
            dfd = self._dir()
            try:
                fd = self._open_lock(dfd)
            finally:
                os.close(dfd)
        except OSError as err:  # named in full: the CLI says which setting moves it
            where = self.lock_path if err.filename == self.lock_path.name else err.filename
            raise OSError(err.errno, err.strerror, str(where or self.lock_path)) from err
        try:
            flock_within(fd, timeout, f"the simulated GPU's state lock {self.lock_path}")
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def read(self) -> dict[str, Any] | None:
        """The document, or None when there is none (or it is not ours / not JSON, or a
        link)."""
        from gpuenv import reader

        stat = self._stat()
        self._seen = stat
        try:
            dfd = open_dir(self.path.parent, own=None)
        except (FileNotFoundError, ConfigError):
            return None
        try:
            data = json.loads(_read_trusted(dfd, self.path.name))
        except (OSError, ValueError, RecursionError):  # not JSON (nor UTF-8): not ours
            return None
        finally:
            os.close(dfd)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        # ours, but a value the model cannot take (NaN temperature, clients: 5): one sentence
        reader.check_record(
            _Document,
            data,
            what="the simulated GPU's state",
            path=self.path,
            hint="delete it: the simulated GPU starts afresh",
        )
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Replace the document atomically. Call under `locked()`."""
        data = {"format": FORMAT, **data}
        # Compact, in one write: json's C encoder does not indent, and the pure-Python one that
        # indent= falls back to cost 2-3x as much on every simulated setting change.
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        dfd = self._dir()
        tmp = None
        try:
            fd, tmp = create_temp(dfd, self.path.name, 0o644)
            try:
                write_all(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
            os.replace(tmp, self.path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as err:  # a full disk or a size limit: no half file left, and say where
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
            raise OSError(err.errno, err.strerror, str(self.path)) from err
        finally:
            os.close(dfd)
        self._seen = self._stat()


__all__ = [
    "FORMAT",
    "LOCK_TIMEOUT_S",
    "StateFile",
    "default_state_path",
    "flock_within",
    "lock_holders",
]
