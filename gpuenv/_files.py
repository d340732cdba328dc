"""Files and directories gpuenv writes, made safe against other local accounts.

Two concerns, one place:
  - `replaced(path)`: a file replaced whole, written to a temporary file beside its place and
    renamed over it once complete, so a reader, a full disk or a crash never meets half a file;
  - `open_dir(path)`: a directory reached without trusting any name on the way. Every
    component is opened relative to the one before (`O_NOFOLLOW`, `O_DIRECTORY`, the
    openat() way), and each must belong to root or to this user and be writable by no one
    else (a sticky directory such as /tmp excepted: there only an entry's owner may rename
    it). A symbolic link is followed only where its owner could have placed it anyway (a
    directory no one else may write); the place itself is never a link. Whatever gpuenv
    then creates or writes there goes through the returned descriptor (`dir_fd=`), so a
    name swapped after the check is never followed: root's gpuenv and gpuenvd write only
    where they meant to, whatever another account plants in /tmp.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any

from gpuenv.errors import UnsafePath as UnsafePath  # defined in gpuenv.errors

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on symbolic links in one lookup


def _refuse(path: str, why: str, what: str) -> UnsafePath:
    return UnsafePath(
        f"{what} {path} {why}; refusing to use it (another account could choose what is "
        "written there)",
        hint="use a directory that belongs to you or root and that no one else may write "
        "(remove this one, or point the setting elsewhere)",
    )


def account(uid: int) -> str:
    """An account as every refusal names it: "mallory (uid 1001)", or "uid 1001" when the
    account has no name (the one lookup: files refused here, the fake gpuenvd's socket)."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _writable_by_others(st: os.stat_result) -> bool:
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and st.st_gid != os.getegid()


def _trust(st: os.stat_result, shown: str, what: str) -> None:
    """A directory on the way: root's or ours, and only its owner may change its entries."""
    me = os.geteuid()
    if st.st_uid not in (0, me):
        raise _refuse(shown, f"belongs to {account(st.st_uid)}", what)
    if _writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
        raise _refuse(shown, f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})", what)


def open_dir(
    path: str | os.PathLike[str],
    *,
    create: bool = False,
    mode: int = 0o700,
    own: bool | None = True,
    what: str = "the directory",
) -> int:
    """An O_DIRECTORY descriptor of `path`, reached safely (see the module docstring).

    `create`: make the missing components (`mode` for the last; 0755 on the way).
    `own`: True, the place itself must belong to this user, and its mode becomes `mode`
    when it grants more (a private place, a state directory); False, it may be root's too,
    writable by no one else, and is left as it is; None, it may be anyone's (the caller
    only makes private things inside it, through the descriptor: a socket's directory).
    Raises UnsafePath (a ConfigError) naming the component and why; the caller closes the
    descriptor.
    """
    shown = os.path.abspath(os.fspath(path))
    todo = [p for p in shown.split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    here, links, name = "", 0, ""
    try:
        _trust(os.fstat(fd), "/", what)
        while todo:
            name = todo.pop(0)
            last = not todo
            at = f"{here}/{name}"
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode if last else 0o755, dir_fd=fd)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                parent = os.fstat(fd)
                others = _writable_by_others(parent) and st.st_uid not in (0, os.geteuid())
                if last or others:
                    raise _refuse(at, "is a symbolic link", what)
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symbolic links", at)
                target = os.readlink(name, dir_fd=fd)
                todo[:0] = [p for p in target.split("/") if p]
                if target.startswith("/"):
                    os.close(fd)
                    fd, here = os.open("/", _DIR_FLAGS), ""
                continue
            if name == "..":
                here = os.path.dirname(here)
            elif name != ".":
                here = at
            nfd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            if not last:
                _trust(st, here, what)
        _check_place(fd, here or "/", mode=mode, own=own, what=what)
    except BaseException as err:
        os.close(fd)
        if isinstance(err, OSError) and naming(err, f"{here}/{name}") is not err:
            raise naming(err, f"{here}/{name}") from err  # not "j is on a read-only ..."
        raise
    return fd


def _check_place(fd: int, shown: str, *, mode: int, own: bool | None, what: str) -> None:
    st = os.fstat(fd)
    me = os.geteuid()
    if own:
        if st.st_uid != me:
            raise _refuse(shown, f"belongs to {account(st.st_uid)}, not to {account(me)}", what)
        if stat.S_IMODE(st.st_mode) & ~mode & 0o7777:
            os.fchmod(fd, mode)  # the descriptor: never a name someone could have swapped
    elif own is False:
        _trust(st, shown, what)


def create_temp(dir_fd: int, name: str, mode: int = 0o600, *, tag: str = "") -> tuple[int, str]:
    """A new file in `dir_fd`, its name `.NAME[.TAG].<random>.tmp` (never predictable, never
    an existing file or link: O_EXCL): (its descriptor, its name)."""
    for _ in range(100):
        tmp = f".{name}{'.' + tag if tag else ''}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode,
                dir_fd=dir_fd,
            )
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no unused temporary name", name)


def write_all(fd: int, data: bytes, write: Callable[[int, Any], int] = os.write) -> None:
    """Every byte, or OSError (os.write may write less: a size limit, a full disk).
    `write`: the writer (tests inject one that stops short)."""
    view = memoryview(data)
    while view:
        n = write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, "the write stopped short")
        view = view[n:]


def replace_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Replace `name` in the directory `dir_fd` by `data`, whole (temp file + rename), with
    exactly `mode`, whatever the umask (a file meant for every account stays readable)."""
    fd, tmp = create_temp(dir_fd, name, mode)
    try:
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def naming(err: OSError, path: str | os.PathLike[str]) -> OSError:
    """`err` with `path` as its file where it names none, or only a name relative to a
    directory descriptor: a write to an open file (a full disk) names no file ("the disk
    holding a file is full"), a temporary file made through the directory's descriptor
    only its own name (".x.png.2dbd.tmp is on a read-only file system")."""
    if isinstance(err.filename, str) and os.path.isabs(err.filename):
        return err
    return OSError(err.errno, err.strerror, os.fspath(path))


@contextlib.contextmanager
def replaced(
    path: str | os.PathLike[str], *, binary: bool = False, umask_mode: bool = False
) -> Iterator[IO[Any]]:
    """`with replaced(path) as f: f.write(...)`: `path` changes only when the block ends
    without an error; else the temporary file is removed and `path` is as it was.

    The new file is private (0600) unless `umask_mode`: then as open() would make it.
    The temporary file is made in the directory's descriptor, under a random name
    (O_EXCL, O_NOFOLLOW), and renamed relative to it: no name is followed twice.
    """
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    dfd = os.open(folder, _DIR_FLAGS)
    try:
        try:
            fd, tmp = create_temp(dfd, name)
        except OSError as err:
            raise naming(err, path) from err
        try:
            if umask_mode:
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, "wb" if binary else "w") as fh:
                yield fh
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(err, OSError) and naming(err, path) is not err:
                raise naming(err, path) from err
            raise
    finally:
        os.close(dfd)


def read_at(dir_fd: int, name: str, limit: int = 64 << 20) -> bytes:
    """The bytes of the regular file `name` in `dir_fd` (never through a link)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        return read_open(fd, name, limit)
    finally:
        os.close(fd)


def read_open(fd: int, name: str, limit: int = 64 << 20) -> bytes:
    """The bytes of the file open as `fd`, a regular one (`name`: what errors call it)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", name)
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, "file too large", name)
    return b"".join(chunks)


__all__ = [
    "UnsafePath",
    "create_temp",
    "open_dir",
    "read_at",
    "read_open",
    "replace_at",
    "replaced",
    "write_all",
]
