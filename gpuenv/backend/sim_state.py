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
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FORMAT = "gpuenv-sim-state/1"


def default_state_path() -> Path:
    """A per-user file: $XDG_RUNTIME_DIR/gpuenv-sim.json, else /tmp/gpuenv-sim-<uid>.json."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "gpuenv-sim.json"
    return Path("/tmp") / f"gpuenv-sim-{os.getuid()}.json"


class StateFile:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._seen: tuple[int, int, int] | None = None

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> dict[str, Any] | None:
        """The document, or None when there is none (or it is not ours / not JSON)."""
        stat = self._stat()
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            self._seen = stat
            return None
        self._seen = stat
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
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
