"""The simulated driver's state file: what a real driver keeps across processes.

One JSON document per simulated machine. Writers take an exclusive `fcntl`
lock on a side file, re-read the document, apply their change and replace the
file atomically (write a temporary file, `os.replace`), so two processes never
lose each other's changes and a reader never sees half a file. Readers do not
lock: they `stat` the file on every call (about a microsecond) and re-load
only when it changed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv.errors import FileError

FORMAT = "gpuenv-sim-state/1"
_MAX_BYTES = 16 << 20  # a few GPUs' settings and counters: a few kB


def default_state_path() -> Path:
    """A per-user file: $XDG_RUNTIME_DIR/gpuenv-sim.json, else /tmp/gpuenv-sim-<uid>.json."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "gpuenv-sim.json"
    return Path("/tmp") / f"gpuenv-sim-{os.getuid()}.json"


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
    temp_c: float | None = None
    temp_t: float | None = None
    clock: str | None = None


@dataclass(frozen=True)
class _Document:
    format: str
    profile: str = ""
    n_gpus: int = 0
    seed: int = 0
    clients: tuple[int, ...] = ()
    gpus: tuple[_GpuEntry, ...] = ()


class StateFile:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._seen: tuple[int, int, int] | None = None
        self._check_place()

    def _check_place(self) -> None:
        """A regular file (or none yet) in a directory that exists: GPUENV_SIM_STATE=/dev/full
        would put a lock file beside a device and replace it (as root); a missing directory
        is not created (gpuenv creates none it was not asked for)."""
        from gpuenv import reader

        where, setting = "the simulated GPU's state", "GPUENV_SIM_STATE"
        if not self.path.name or not self.path.parent.is_dir():
            folder = self.path.parent if self.path.name else self.path
            raise FileError(folder, errno.ENOTDIR if folder.exists() else errno.ENOENT,
                            where=where, setting=setting)  # fmt: skip
        if os.path.lexists(self.path):
            reader.read_bytes(self.path, what=where, setting=setting, max_bytes=_MAX_BYTES)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def changed(self) -> bool:
        """True when the file differs from what this process last read or wrote."""
        return self._stat() != self._seen

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock for a read-modify-write (blocks while another process holds it)."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> dict[str, Any] | None:
        """The document, or None when there is none (or it is not ours / not JSON)."""
        from gpuenv import reader

        stat = self._stat()
        try:
            raw = reader.read_bytes(self.path, what="the simulated GPU's state",
                                    setting="GPUENV_SIM_STATE", max_bytes=_MAX_BYTES,
                                    missing_ok=True)  # fmt: skip
            data = None if raw is None else json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (nor UTF-8): not ours, start afresh
            self._seen = stat
            return None
        if data is None:
            self._seen = stat
            return None
        self._seen = stat
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        # ours, but a value the model cannot take (NaN temperature, clients: 5): one sentence
        reader.check_record(_Document, data, what="the simulated GPU's state", path=self.path,
                            hint="delete it: the simulated GPU starts afresh")  # fmt: skip
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Replace the document atomically. Call under `locked()`."""
        data = {"format": FORMAT, **data}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        # Compact, in one write: json's C encoder does not indent, and the pure-Python one that
        # indent= falls back to cost 2-3x as much on every simulated setting change.
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        try:
            with open(tmp, "wb") as f:
                f.write(text.encode("utf-8"))
            os.replace(tmp, self.path)
        except OSError as err:  # a full disk or a size limit: no half file left, and say where
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise OSError(err.errno, err.strerror, str(self.path)) from err
        self._seen = self._stat()


__all__ = ["FORMAT", "StateFile", "default_state_path"]
