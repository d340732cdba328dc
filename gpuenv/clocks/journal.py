"""A crash-safe record of what gpuenv changed, so it can always be put back.

NVML cannot say whether clocks are locked (there is no getter), so what gpuenv
sets and what was there before must be remembered by gpuenv. Before any
setting changes, one JSON file per GPU (named by UUID) records the original
state, what the lock applies, and who owns it (`records.py`).

How a record survives a crash, a full disk and an editor:
  - written to a temporary name, every byte checked (`os.write` may write less;
    a file-size limit or a full disk then fails the lock before any setting
    changes), fsynced, renamed over the old record, the directory fsynced: a
    crash leaves the old record or the new one, never half of one;
  - each record carries a SHA-256 of its content: an edited value is reported as
    damage, never put back on the GPU;
  - each record is written twice, `<uuid>.json` and `<uuid>.json.bak`, one after
    the other: when one is damaged or deleted the other still holds the original
    state, until a restore is confirmed and both are removed (the copy first);
  - a third copy, `original/<uuid>.json`, is written with the first record of a lock
    and never rewritten while it lasts: the state before the lock, kept in a directory
    of its own, where a damaged, edited or deleted pair of copies (`rm GPU-*`, an editor
    run on both) does not reach. When both copies cannot be read, it is the record
    (`lookup` says so); it is removed last when the record is (a crash in between
    leaves it to be put back again: the same values);
  - each GPU's files are judged alone: a damaged record of GPU 1 is reported for
    GPU 1 (`JournalDamaged`) and never stops GPU 0 being locked or restored.
Every read-modify-write happens under one `fcntl.flock` on `<dir>/.lock`, so
concurrent gpuenv processes never interleave (the kernel drops the lock when
its holder dies, SIGKILL included).

State directory: `GPUENV_STATE_DIR`, else `/var/lib/gpuenv` when running as
root, else `$XDG_STATE_HOME/gpuenv` (`~/.local/state/gpuenv`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from gpuenv import reader
from gpuenv._files import UnsafePath, create_temp, open_dir, read_at, write_all
from gpuenv.clocks import notice
from gpuenv.clocks.records import (
    Applied,
    ClockState,
    JournalEntry,
    Owner,
    process_alive,
    process_start_time,
)
from gpuenv.errors import ConfigError, FileError
from gpuenv.errors import JournalDamaged as JournalDamaged  # defined in gpuenv.errors

BACKUP = ".bak"
KEPT = "original"  # the subdirectory of the third copy: the state before the lock


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


class Found(NamedTuple):
    """A GPU's record, and why it came from the kept original: what befell the two copies
    (None: it came from them)."""

    entry: JournalEntry | None
    kept: str | None


# -- the file format -----------------------------------------------------------------


def _checksum(body: dict[str, Any]) -> str:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def encode(entry: JournalEntry) -> bytes:
    """A record's bytes: its fields and a checksum of them."""
    body = entry.to_dict()
    # One line, no `indent`: json's pure-Python encoder (what `indent` takes) leaves ~30
    # objects in reference cycles per call, garbage that piles up in gpuenvd (a journal write
    # per lease) until a full collection and fragments its heap (docs/benchmarks/daemon_memory.md).
    return json.dumps({**body, "checksum": _checksum(body)}, sort_keys=True).encode()


def decode(path: Path, data: bytes, uuid: str) -> JournalEntry:
    """The record in `data`, or JournalDamaged saying why not."""
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        body = dict(doc)
        stored = body.pop("checksum", None)
        legacy = body.get("version") == 1 and stored is None  # version 1 predates checksums
        if not legacy and stored != _checksum(body):
            raise ValueError("its checksum does not match: a value was changed or cut")
        entry = JournalEntry.from_dict(body)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise JournalDamaged(uuid, path, str(e) or type(e).__name__) from e
    if entry.uuid != uuid:
        raise JournalDamaged(uuid, path, f"it is the record of {entry.uuid}")
    return entry


# -- the cross-process lock ----------------------------------------------------------


class _DirLock:
    """flock on `<dir>/.lock-private`, re-entrant within a process (flocks on two fds of one
    process would block each other), exclusive across processes.

    On a directory gpuenv cannot write (read-only file system, another owner) the
    lock file is opened read-only, or not at all when it cannot be created: nothing
    can be written there anyway, and a release must still restore the GPU.
    """

    def __init__(self, path: Path):
        self.path = path
        self._mutex = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._mutex:
            if self._depth == 0:
                fd = self._open()
                if fd is not None:
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

    def _open(self) -> int | None:
        try:
            return _open_private_lock(self.path)
        except OSError as err:  # (a directory of another user is refused: UnsafePath)
            if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC):
                raise
        try:
            dfd = open_dir(self.path.parent, own=False)
        except OSError:
            return None
        try:
            return os.open(self.path.name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)


def _private_dir(path: Path) -> int:
    """The state directory, made 0700 and ours, as a descriptor (the caller closes it):
    anyone who can open the lock file can flock it and stall every gpuenv lock, release and
    restore (the daemon's too); a directory reached through a link, or another account's,
    is refused (UnsafePath), never chmod'ed or written (gpuenv._files.open_dir)."""
    return _checked_dir(path, private=True)


# Checked directory descriptors, kept open: open_dir walks every component from / (~0.2 ms,
# some 20 times a lease that changes a GPU's state in gpuenvd). A kept one is handed out
# (dup'ed) while the path still names that same directory with the same owner and mode
# (one lstat), else the path is walked and checked afresh.
_DIRS: dict[tuple[str, bool], tuple[int, tuple[int, int, int, int]]] = {}
_DIRS_GUARD = threading.Lock()
_DIRS_KEPT = 8


def _checked_dir(path: Path, *, private: bool) -> int:
    """`open_dir(path)`: made 0700 and ours when `private` (created if missing), else root's
    or ours and writable by no one else; the caller closes the descriptor."""
    key = (os.path.abspath(path), private)
    try:
        st = os.stat(key[0], follow_symlinks=False)
        seen = (st.st_dev, st.st_ino, st.st_uid, st.st_mode)
    except OSError:
        seen = None
    with _DIRS_GUARD:
        kept = _DIRS.get(key)
        if kept is not None and kept[1] == seen:
            return os.dup(kept[0])
    if private:
        fd = open_dir(path, create=True, mode=0o700, what="the state directory")
    else:
        fd = open_dir(path, own=False, what="the state directory")
    st = os.fstat(fd)
    with _DIRS_GUARD:
        old = _DIRS.pop(key, None)
        if old is None and len(_DIRS) >= _DIRS_KEPT:  # a few places, not one fd per path
            old = _DIRS.pop(next(iter(_DIRS)))
        if old is not None:
            os.close(old[0])
        _DIRS[key] = (os.dup(fd), (st.st_dev, st.st_ino, st.st_uid, st.st_mode))
    return fd


def _open_private_lock(path: Path) -> int:
    """Open the lock file (0600), in the directory made private first. Its name is new:
    the `.lock` of older versions was 0644 in a 0755 directory, so anyone may hold it
    open (and flock it) still; nobody but this user could open this one. One that is
    not ours or not 0600 anyway is not trusted: a new file replaces it."""
    dfd = _private_dir(path.parent)
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path.name, flags, 0o600, dir_fd=dfd)
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return fd
        os.close(fd)
        fresh_fd, fresh = create_temp(dfd, path.name)
        os.close(fresh_fd)
        os.replace(fresh, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return os.open(path.name, flags, 0o600, dir_fd=dfd)
    finally:
        os.close(dfd)


def _writer_pid(tmp: str) -> int:
    """The writer's pid in a temporary name: `.NAME.PID.RANDOM.tmp` (older: `.NAME.PID.tmp`)."""
    for field in tmp.rsplit(".", 3)[-3:-1]:
        if field.isdigit():
            return int(field)
    return -1


def _exists(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _clean_dir(dfd: int) -> int:
    """Delete the temporary files in `dfd` of writers that died; returns how many."""
    removed = 0
    for name in os.listdir(dfd):
        if not (name.startswith(".") and ".json" in name and name.endswith(".tmp")):
            continue
        pid = _writer_pid(name)
        if pid != os.getpid() and not process_alive(pid, None):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
                removed += 1
    return removed


_DIR_LOCKS: dict[str, _DirLock] = {}
_DIR_LOCKS_GUARD = threading.Lock()


def _dir_lock(state_dir: Path) -> _DirLock:
    key = os.path.abspath(state_dir)  # never resolved: a link there is refused, not followed
    with _DIR_LOCKS_GUARD:
        lock = _DIR_LOCKS.get(key)
        if lock is None:
            lock = _DIR_LOCKS[key] = _DirLock(Path(key) / ".lock-private")
        return lock


# -- the journal ---------------------------------------------------------------------


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
        if not uuid or "/" in uuid or uuid.startswith(".") or "\0" in uuid:
            raise ConfigError(f"not a GPU UUID: {uuid!r}")
        return self.path / f"{uuid}.json"

    # -- reading ----------------------------------------------------------------------

    def get(self, uuid: str) -> JournalEntry | None:
        """The GPU's record: the main copy, else the backup, else the original kept at lock
        time; None when there is none.

        Raises JournalDamaged when a copy exists and none can be trusted.
        """
        return self.lookup(uuid).entry

    def lookup(self, uuid: str) -> Found:
        """`get`, and where the record came from: `kept` says why the two copies could not
        be used (deleted, damaged) when the original kept at lock time was."""
        path = self._file(uuid)
        damage: JournalDamaged | None = None
        dfd = self._dir()
        if dfd is None:
            return Found(None, None)
        try:
            for candidate in (path, path.with_name(path.name + BACKUP)):
                try:
                    data = self._read(dfd, candidate, uuid)
                    if data is None:
                        continue
                    return Found(decode(candidate, data, uuid), None)
                except JournalDamaged as err:
                    damage = damage or err
        finally:
            os.close(dfd)
        try:
            kept = self._kept(uuid)
        except JournalDamaged as err:
            raise damage or err from None
        if kept is not None:
            why = (
                f"both copies of its record are damaged ({damage.why})"
                if damage is not None
                else "both copies of its record were deleted"
            )
            return Found(kept, why)
        if damage is not None:
            raise damage
        return Found(None, None)

    def _kept(self, uuid: str) -> JournalEntry | None:
        """The original kept at lock time (`KEPT`), or None when there is none."""
        path = self.path / KEPT / f"{uuid}.json"
        kfd = self._kept_dir()
        if kfd is None:
            return None
        try:
            data = self._read(kfd, path, uuid)
        finally:
            os.close(kfd)
        return None if data is None else decode(path, data, uuid)

    def _kept_dir(self) -> int | None:
        """The kept originals' directory, checked as the state directory is; None if absent."""
        try:
            return _checked_dir(self.path / KEPT, private=False)
        except FileNotFoundError:
            return None
        except UnsafePath:
            raise
        except OSError as err:
            raise self._file_error(err, self.path / KEPT) from err

    def _dir(self) -> int | None:
        """The state directory to read, checked (no link, root's or ours, writable by no one
        else: a record planted elsewhere is never put on a GPU); None when there is none."""
        try:
            return _checked_dir(self.path, private=False)
        except FileNotFoundError:
            return None
        except UnsafePath:
            raise
        except OSError as err:
            raise self._file_error(err, self.path) from err

    def _read(self, dfd: int, path: Path, uuid: str) -> bytes | None:
        try:
            return read_at(dfd, path.name)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno in (errno.EINVAL, errno.ELOOP, errno.EISDIR):
                # not a regular file (a FIFO, a directory, a link): damage, this GPU only
                try:
                    mode = os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_mode
                    kind = "a symbolic link" if stat.S_ISLNK(mode) else reader.kind_of(mode)
                except OSError:
                    kind = None
                raise JournalDamaged(
                    uuid, path, f"it is {kind or 'not a regular file'}, not a record"
                ) from None
            raise self._file_error(err, path) from err

    def uuids(self) -> list[str]:
        """Every GPU with a record (either copy), good or damaged."""
        dfd = self._dir()
        if dfd is None:
            return []
        try:
            names = os.listdir(dfd)
            if KEPT in names:
                kfd = self._kept_dir()
                if kfd is not None:
                    try:
                        names += os.listdir(kfd)
                    finally:
                        os.close(kfd)
        except OSError as err:
            raise self._file_error(err, self.path) from err
        finally:
            os.close(dfd)
        found = set()
        for name in names:
            if name.startswith("."):
                continue
            for suffix in (".json", ".json" + BACKUP):
                if name.endswith(suffix):
                    found.add(name[: -len(suffix)])
        return sorted(found)

    def scan(self) -> tuple[list[JournalEntry], list[JournalDamaged]]:
        """Every record, each GPU judged alone: (the good ones, the damaged ones)."""
        good, bad = [], []
        for uuid in self.uuids():
            try:
                entry = self.get(uuid)
            except JournalDamaged as err:
                bad.append(err)
                continue
            except ConfigError:  # a file name that is no GPU UUID: not ours
                continue
            if entry is not None:
                good.append(entry)
        return good, bad

    def entries(self) -> list[JournalEntry]:
        """The good records (`scan()` also says which GPUs' records are damaged)."""
        return self.scan()[0]

    # -- writing ----------------------------------------------------------------------

    def put(self, entry: JournalEntry) -> None:
        """Write one GPU's record, both copies, each completely or not at all; and the
        kept original (`KEPT`) when the GPU has none yet (the first record of a lock).

        Raises FileError (the path, and what to do) when the state directory cannot
        take it; the record on disk is then the previous one, unchanged.
        """
        data = encode(entry)
        with self.locked():
            final = self._file(entry.uuid)
            try:
                dfd = _private_dir(self.path)
                kfd = _private_dir(self.path / KEPT)
            except UnsafePath:
                raise
            except OSError as err:
                raise self._file_error(err, self.path) from err
            # Every copy is written in full before any is renamed into place: a write that
            # fails (full disk, size limit) leaves the previous record untouched. The kept
            # original is renamed last, so it never exists without a record beside it.
            places = [(dfd, final.name), (dfd, final.name + BACKUP)]
            if not _exists(kfd, final.name):
                places.append((kfd, final.name))
            tmps: list[tuple[int, str]] = []
            try:
                for fd_dir, name in places:
                    fd, tmp = create_temp(fd_dir, name, tag=str(os.getpid()))
                    tmps.append((fd_dir, tmp))
                    # the kept original is not fsynced: it guards against damage to both
                    # copies, which are; one a power cut left short fails its checksum
                    self._write_tmp(fd, data, sync=fd_dir == dfd)
                for (fd_dir, tmp), (_, name) in zip(tmps, places, strict=True):
                    os.replace(tmp, name, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)
                os.fsync(dfd)
            except OSError as err:
                for fd_dir, tmp in tmps:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=fd_dir)
                raise self._file_error(err, final) from err
            finally:
                os.close(dfd)
                os.close(kfd)
            notice.post(entry.uuid, data)  # what every account may read: who holds the GPU

    def _write_tmp(self, fd: int, data: bytes, *, sync: bool = True) -> None:
        try:
            write_all(fd, data, self._os_write)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    _os_write = staticmethod(os.write)  # tests inject a writer that stops short

    def remove(self, uuid: str) -> None:
        """Delete one GPU's record once its state was put back; no error if absent.

        The backup goes first, then the main copy, then the kept original: a crash or a
        failure in between leaves a copy that a restore puts back again (the same values),
        never a record that comes back with other values. For the same reason the removal
        is not fsynced (a lease that changes a GPU's state paid a directory fsync for it):
        a record a power cut brings back holds the state already put back. A directory in a
        record's place (damage: nothing else is written there) goes too when it is empty.
        """
        final = self._file(uuid)
        with self.locked():
            dfd = self._dir()
            if dfd is None:
                return
            try:
                for path in (final.with_name(final.name + BACKUP), final):
                    self._unlink(dfd, path)
            finally:
                os.close(dfd)
            kfd = self._kept_dir()
            if kfd is not None:
                try:
                    self._unlink(kfd, self.path / KEPT / final.name)
                finally:
                    os.close(kfd)
            notice.withdraw(uuid)

    def _unlink(self, dfd: int, path: Path) -> None:
        try:
            try:
                os.unlink(path.name, dir_fd=dfd)
            except IsADirectoryError:
                os.rmdir(path.name, dir_fd=dfd)
        except FileNotFoundError:
            return
        except OSError as err:
            raise self._file_error(err, path) from err

    def clean_tmp(self) -> int:
        """Delete temporary files left by writers that died mid-write; returns how many."""
        removed = 0
        with self.locked():
            for dfd in (self._dir(), self._kept_dir()):
                if dfd is None:
                    continue
                try:
                    removed += _clean_dir(dfd)
                finally:
                    os.close(dfd)
        return removed

    def _file_error(self, err: OSError, path: Path) -> FileError:
        return FileError(
            path,
            err.errno,
            detail=err.strerror or str(err),
            where="the journal",
            setting="GPUENV_STATE_DIR",
        )


__all__ = [
    "KEPT",
    "Applied",
    "ClockState",
    "Found",
    "Journal",
    "JournalDamaged",
    "JournalEntry",
    "Owner",
    "decode",
    "default_state_dir",
    "encode",
    "process_alive",
    "process_start_time",
]
