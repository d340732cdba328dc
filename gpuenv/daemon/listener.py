"""gpuenvd's socket: made so that no other account can redirect or re-mode it.

The default place, /run/gpuenv, is the daemon's own directory (0755, made when missing,
refused when another account owns it or it is a link). Any directory is reached through
`gpuenv._files.open_dir` (no link followed, every component root's or ours) and used only
through its descriptor. The socket is bound in a fresh private (0700) directory inside
it, given its group and mode there, where no one else can reach it, and only then renamed
to its name: it is never reachable with the wrong mode, and no chmod or chown ever goes
through a name another account could have swapped (in a directory others may write, a
chmod by name after bind followed the attacker's link). On stop, the name is removed only
while it is still this daemon's socket (same inode).
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import secrets
import socket
import stat

from gpuenv._files import open_dir
from gpuenv.daemon.auth import DEFAULT_SOCKET
from gpuenv.daemon.connection import socket_answers
from gpuenv.errors import ConfigError, FileError

log = logging.getLogger("gpuenv.daemon")


def _group_id(group: str | None) -> int:
    if not group:
        return -1
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(
            f"socket_group {group!r} does not exist", hint="create it or fix the config"
        ) from None


class SocketPlace:
    """The socket's directory (held open as a descriptor) and the socket bound there."""

    def __init__(self, path: str, *, group: str | None, mode: int):
        self.path = os.path.abspath(path)
        self.directory, self.name = os.path.split(self.path)
        self.group = group
        self.mode = mode
        self._dfd: int | None = None
        self._inode: tuple[int, int] | None = None

    def _open_directory(self) -> int:
        default = self.path == DEFAULT_SOCKET  # /run/gpuenv is the daemon's own to make
        try:
            fd = open_dir(
                self.directory,
                create=default,
                mode=0o755,
                own=True if default else None,
                what="the socket's directory",
            )
        except FileNotFoundError:  # a typo in --socket must not grow a tree from '/'
            raise ConfigError(
                f"the socket's directory {self.directory} does not exist",
                hint=f"create it first (mkdir -p {self.directory}) or choose another --socket",
            ) from None
        st = os.fstat(fd)
        if st.st_mode & 0o022 and not default:
            log.warning(
                "the socket's directory %s is writable by others (mode %04o): another account "
                "can remove the socket or put its own there (clients refuse a socket not served "
                "by gpuenvd's account); prefer /run/gpuenv",
                self.directory,
                stat.S_IMODE(st.st_mode),
            )
        return fd

    def _check_existing(self, dfd: int) -> None:
        try:
            st = os.stat(self.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(
                f"{self.path} exists and is not a socket",
                hint="remove it or choose another --socket",
            )
        if socket_answers(self.path):
            raise ConfigError(
                f"another gpuenvd already listens on {self.path}",
                hint="stop it first, or use another --socket",
            )
        # else left by a daemon that died: the rename below replaces it

    def bind(self) -> socket.socket:
        """A socket bound at `path` with its group and mode (not yet listening)."""
        gid = _group_id(self.group)
        dfd = self._open_directory()
        try:
            self._check_existing(dfd)
            sock = self._bind_private(dfd, gid)
        except OSError as err:
            os.close(dfd)
            # the names made here are relative to the directory (a private directory, then
            # the socket renamed out of it): said alone, ".sock.7d25..." names no place
            raise FileError(
                self.directory,
                err.errno,
                detail=err.strerror or str(err),
                where=f"gpuenvd's socket {self.path}",
                setting="--socket or GPUENV_SOCKET",
            ) from err
        except BaseException:
            os.close(dfd)
            raise
        self._dfd = dfd
        return sock

    def _bind_private(self, dfd: int, gid: int) -> socket.socket:
        private = f".{self.name}.{secrets.token_hex(8)}"
        os.mkdir(private, 0o700, dir_fd=dfd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        pfd = -1
        try:
            pfd = os.open(private, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            st = os.fstat(pfd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise ConfigError(f"the private directory made in {self.directory} was swapped")
            # bound through the descriptor: a name others could swap is never looked up
            sock.bind(f"/proc/self/fd/{pfd}/s")
            if gid >= 0:
                os.chown("s", -1, gid, dir_fd=pfd, follow_symlinks=False)
            os.chmod("s", self.mode, dir_fd=pfd)  # in a 0700 directory of ours: no one else's
            st = os.stat("s", dir_fd=pfd, follow_symlinks=False)
            os.rename("s", self.name, src_dir_fd=pfd, dst_dir_fd=dfd)
            self._inode = (st.st_dev, st.st_ino)
        except BaseException:
            sock.close()
            if pfd >= 0:
                with contextlib.suppress(OSError):
                    os.unlink("s", dir_fd=pfd)
            raise
        finally:
            if pfd >= 0:
                os.close(pfd)
            with contextlib.suppress(OSError):
                os.rmdir(private, dir_fd=dfd)
        return sock

    def remove(self) -> None:
        """Unlink the socket's name while it is still ours; close the directory. Idempotent."""
        dfd, self._dfd = self._dfd, None
        if dfd is None:
            return
        try:
            st = os.stat(self.name, dir_fd=dfd, follow_symlinks=False)
            if self._inode == (st.st_dev, st.st_ino):
                os.unlink(self.name, dir_fd=dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


__all__ = ["SocketPlace"]
