"""The simulated machine as it runs: one per host, shared by every process and account.

A real GPU is one device that every process of the host opens (/dev/nvidia*): a kernel
one account runs heats the chip and pulls the power cap for all, and `nvidia-smi` in
another terminal shows it. The simulated GPU's driver settings are root's to write
(`sim_state.py`); what runs on it is anyone's, so it lives in a second file beside them,
`<state>.run`, that every account may write, as every account may open the device nodes:

  - `procs`: each process that has the simulated driver open (its pid, account and start
    time), and per GPU what it runs there (`sim_gpu.Presence`: contexts, a standing load,
    kernels under a lease it renews while they keep coming). A process that is gone
    counts no more; the last one to leave a GPU without persistence mode de-initialises
    it (`deinit`: the settings generation it saw, `sim_core` reads them as defaults);
  - `gpus`: each GPU's running state (temperature, the power cap's ceiling, counters,
    the readings NVML latched), advanced by whichever process looks next and written
    back at most once a driver update (100 ms), so every process reads the same GPU.
    Only processes on real time share it: a test's virtual clock is its own.

The file is replaced in place under an exclusive `flock` on itself (one file every
account writes cannot be renamed over by another in a sticky directory such as /tmp).
It is made with mode 0666 and reached like every file gpuenv writes as root: through a
checked directory, never through a link, a regular file with one name (a hard link
planted to another file is refused), and a document that is not one (torn by a crash,
or written by hand) is a fresh GPU, never an error: it is a simulation, and nothing
real is set from it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuenv._files import account, open_dir, write_all
from gpuenv.backend.sim_gpu import Presence
from gpuenv.backend.sim_state import LOCK_TIMEOUT_S, flock_within
from gpuenv.errors import ConfigError

FORMAT = "gpuenv-sim-run/1"
MAX_PROCS = 1024  # processes of the host with the simulated driver open, at most
LEASE_NS = 500_000_000  # another process's kernels count as load this long after the last
_MAX_BYTES = 4 << 20


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat): a pid reused is told apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        return int(text[text.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, start: int | None) -> bool:
    """`pid` runs, and is the process that registered (same start time where known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start(pid)
    return start is None or now is None or now == start


def presence_json(p: Presence) -> list[Any]:
    return [p.contexts, p.background, p.work, p.until_ns]


def presence_of(value: Any) -> Presence:
    """A presence from the file (ValueError/TypeError when it is not one)."""
    contexts, background, work, until = value
    for x in (background, work):
        if not (isinstance(x, (int, float)) and 0.0 <= x <= 2.0):
            raise ValueError(f"load {x!r} out of range")
    return Presence(
        int(contexts), float(background), float(work), None if until is None else int(until)
    )


class RunFile:
    """`<state>.run`: the running machine every process of the host shares (module docstring)."""

    def __init__(self, state_path: Path):
        self.path = state_path.with_name(state_path.name + ".run")
        self._fd: int | None = None
        self._pid = os.getpid()
        self._seen: tuple[int, int] | None = None

    def _open(self) -> int:
        """The file, open read-write (made, mode 0666, when missing); reopened after a fork
        (a lock on a shared open file would be the parent's)."""
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        self._fd, self._pid = None, os.getpid()
        dfd = open_dir(self.path.parent, own=None, what="the simulated GPU's state directory")
        try:
            fd = self._open_at(dfd)
        except OSError as err:  # named in full: the CLI says which setting moves it
            raise OSError(err.errno, err.strerror, str(self.path)) from err
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise self._refused("is not a regular file with one name")
        self._fd = fd
        return fd

    def _open_at(self, dfd: int) -> int:
        name = self.path.name
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        for _ in range(3):
            try:
                return os.open(name, flags, dir_fd=dfd)
            except FileNotFoundError:
                pass
            except PermissionError:
                raise self._refused("may not be written by this account") from None
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise self._refused("is a symbolic link") from None
                raise
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dfd)
            except FileExistsError:
                continue  # another process made it first: open that one
            os.fchmod(fd, 0o666)  # every account runs work on the GPU (the umask took some)
            return fd
        raise self._refused("keeps changing")

    def _refused(self, why: str) -> ConfigError:
        owner = ""
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            owner = f" (owned by {account(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o})"
        return ConfigError(
            f"the simulated GPU's running state {self.path}{owner} {why}",
            hint="remove it (a new one is made), or give this simulated machine a state file "
            "of its own: GPUENV_SIM_STATE=PATH",
        )

    def changed(self) -> bool:
        """True when another process wrote since this one last read or wrote (one fstat)."""
        try:
            st = os.fstat(self._open())
        except (OSError, ConfigError):
            return True
        return (st.st_mtime_ns, st.st_size) != self._seen

    @contextlib.contextmanager
    def locked(self, timeout: float = LOCK_TIMEOUT_S) -> Iterator[int]:
        """The file's descriptor under an exclusive lock (held for a read and a write); a
        ConfigError naming its holder when it is not free within `timeout` seconds: every
        account may lock this file, and none may hang the others' processes with it."""
        fd = self._open()
        flock_within(fd, timeout, f"the simulated GPU's running state {self.path}")
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self, fd: int, *, profile: str, n_gpus: int, seed: int) -> dict[str, Any]:
        """The document, or a fresh one when there is none for this machine. Under `locked`."""
        st = os.fstat(fd)
        self._seen = (st.st_mtime_ns, st.st_size)
        fresh: dict[str, Any] = {"procs": {}, "gpus": None, "deinit": None}
        if not 0 < st.st_size <= _MAX_BYTES:
            return fresh
        try:
            data = json.loads(os.pread(fd, st.st_size, 0))
        except (OSError, ValueError, RecursionError):
            return fresh
        if not (
            isinstance(data, dict)
            and data.get("format") == FORMAT
            and (data.get("profile"), data.get("n_gpus"), data.get("seed"))
            == (profile, n_gpus, seed)
            and isinstance(data.get("procs"), dict)
        ):
            return fresh
        return data

    def write(self, fd: int, data: dict[str, Any]) -> None:
        """Replace the document in place. Under `locked`."""
        text = json.dumps({"format": FORMAT, **data}, separators=(",", ":")).encode()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        write_all(fd, text)
        st = os.fstat(fd)
        self._seen = (st.st_mtime_ns, st.st_size)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


def live_procs(procs: dict[str, Any]) -> dict[str, Any]:
    """The registered processes still running (the rest left, or died); at most MAX_PROCS
    of them are looked at (a file written by hand cannot make every call slow)."""
    out = {}
    for key, entry in list(procs.items())[:MAX_PROCS]:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            if alive(int(entry["pid"]), entry.get("start")):
                out[str(key)] = entry
    return out


def presences(procs: dict[str, Any], index: int, mine: str) -> dict[str, Presence]:
    """What each process runs on GPU `index` (entries that are not one are skipped), keyed
    as in `procs`; `mine` (this backend's key) is left for the caller to add as it is now."""
    out = {}
    for key, entry in procs.items():
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            value = entry["gpus"].get(str(index))
            if value is not None and key != mine:
                out[str(key)] = presence_of(value)
    return out


def pid_of(key: str) -> int:
    """The process a `procs` key stands for ("<pid>:<backend>")."""
    return int(key.split(":", 1)[0])


__all__ = [
    "FORMAT",
    "LEASE_NS",
    "RunFile",
    "alive",
    "live_procs",
    "pid_of",
    "presence_json",
    "presence_of",
    "presences",
    "process_start",
]
