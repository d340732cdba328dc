"""What every account may read about root's locks: a notice per GPU beside gpuenvd's socket.

A lock's journal is private to the account that took it (`journal.py`: 0700, since it
holds what will be put back and anyone who could open its lock file could stall every
lock). NVML cannot say whether clocks are locked either, so without more, another
account's `gpuenv status` saw root's lock only as a clock that "looks locked". Each time
root's journal writes a GPU's record, the same record is posted here, readable by every
account, and withdrawn with the record: `<uuid>.json` (0644) in `locks/` of the directory
of gpuenvd's socket (`/run/gpuenv/locks`, a directory of root's; GPUENV_SOCKET moves it,
as it moves the socket). A notice is a courtesy: failing to post one never fails a lock.
It is read only from a place of root's (or the reader's own) that no one else may write,
and only a file of root's (or the reader's) is believed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from gpuenv._files import open_dir, read_open, replace_at
from gpuenv.daemon.auth import DEFAULT_SOCKET
from gpuenv.errors import GpuenvError

NOTICES = "locks"  # the notices' directory, beside gpuenvd's socket
MAX_NOTICE_BYTES = 1 << 20


def notice_dir() -> Path:
    """`locks/` beside gpuenvd's socket: GPUENV_SOCKET's directory, else /run/gpuenv."""
    socket = os.environ.get("GPUENV_SOCKET", "").strip() or DEFAULT_SOCKET
    return Path(os.path.abspath(Path(socket).expanduser())).parent / NOTICES


def _name(uuid: str) -> str | None:
    ok = uuid and "/" not in uuid and not uuid.startswith(".") and "\0" not in uuid
    return f"{uuid}.json" if ok else None


def post(uuid: str, data: bytes) -> None:
    """Post a GPU's journal record (its bytes) for every account to read; root only."""
    name = _name(uuid)
    if os.geteuid() != 0 or name is None:
        return
    place = notice_dir()
    if place.parent != Path(DEFAULT_SOCKET).parent and not place.parent.is_dir():
        return  # as gpuenvd's own rule: a typo in GPUENV_SOCKET grows no tree from '/'
    with contextlib.suppress(OSError, GpuenvError):
        dfd = open_dir(place, create=True, mode=0o755, what="the lock notices")
        try:
            replace_at(dfd, name, data, mode=0o644)  # there to be read, whatever the umask
        finally:
            os.close(dfd)


def withdraw(uuid: str) -> None:
    """Remove a GPU's notice (its record was removed); no error if there is none."""
    name = _name(uuid)
    if os.geteuid() != 0 or name is None:
        return
    with contextlib.suppress(OSError, GpuenvError):
        fd = open_dir(notice_dir(), own=False, what="the lock notices")
        try:
            os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)


def read(uuid: str) -> tuple[Path, bytes] | None:
    """(where, the bytes of) the notice posted for GPU `uuid`, or None: none posted, or one
    in a place or a file that someone other than root or this account could have written."""
    name = _name(uuid)
    if name is None:
        return None
    place = notice_dir()
    try:
        dfd = open_dir(place, own=False, what="the lock notices")
    except (OSError, GpuenvError):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if st.st_uid not in (0, os.geteuid()) or st.st_mode & stat.S_IWOTH:
                return None
            return place / name, read_open(fd, name, MAX_NOTICE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        os.close(dfd)


__all__ = ["NOTICES", "notice_dir", "post", "read", "withdraw"]
