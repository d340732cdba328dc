"""Talking to gpuenvd: what `gpuenv lock/restore/status`, `stable()` and `gpuenv run` use
(through `gpuenv.locking`) when a daemon serves the GPUs.

    from gpuenv.daemon.client import connect, daemon_available
    if daemon_available():
        with connect() as gd, gd.lock(sm=1350, gpus=[0]) as lease:
            ...                       # clocks locked; the daemon restores them when the
                                      # lease is released or this process dies
        with connect() as gd:
            w = gd.window_start()
            work()
            windows = gd.window_end(w)   # one telemetry Window per GPU

Errors the daemon reports come back as the same gpuenv error classes
(LockConflict, PermissionDenied, ConfigError ...), so callers handle them as
they would a local lock.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import socket as _socket
import stat
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from gpuenv import errors as _errors
from gpuenv._files import account
from gpuenv.clocks.request import LockRequest, LockSettings, requested
from gpuenv.daemon import protocol
from gpuenv.daemon.auth import DEFAULT_SOCKET
from gpuenv.errors import DaemonNotTrusted as DaemonNotTrusted  # defined in gpuenv.errors
from gpuenv.errors import DaemonUnavailable as DaemonUnavailable  # defined in gpuenv.errors
from gpuenv.errors import GpuenvError
from gpuenv.progress import Progress

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+

    from gpuenv.clocks.plan import LockPlan

GpuSelector = int | str | Sequence[int | str] | None


def authenticate(sock: _socket.socket, path: str) -> None:
    """Refuse a daemon the kernel says runs as an account no one named (SO_PEERCRED).

    Anyone who can write the socket's directory (or GPUENV_SOCKET's) can listen there and
    answer "locked" while nothing is locked: a reply is believed only from root, this user,
    or gpuenvd's configured account (auth.trusted_daemon_uids)."""
    from gpuenv.daemon.auth import peer_from_socket, trusted_daemon_uids

    peer = peer_from_socket(sock)
    trusted = trusted_daemon_uids()
    if peer.uid in trusted:
        return
    try:
        owner = account(os.lstat(path).st_uid)
    except OSError:
        owner = "an account that removed it since"
    raise DaemonNotTrusted(
        f"refusing the gpuenvd at {path}: it is served by {peer.user} (uid {peer.uid}, pid "
        f"{peer.pid}) and the socket belongs to {owner}, not to gpuenvd's account "
        f"({', '.join(sorted(set(trusted.values())))}); nothing was asked of it",
        hint=f"someone may have put a fake gpuenvd there: check 'ls -l {path}' and remove it "
        "if it is not yours; a gpuenvd running as another account is named by '[daemon] "
        "user = NAME' in /etc/gpuenv/gpuenvd.conf or GPUENV_DAEMON_USER",
    )


HELLO_TIMEOUT_S = 3.0  # a socket silent this long after connecting is not a working gpuenvd
MAX_REPLY_BYTES = 16 << 20  # a reply line longer than this is not gpuenvd's


def default_socket() -> str:
    """GPUENV_SOCKET, else /run/gpuenv/gpuenv.sock."""
    return os.environ.get("GPUENV_SOCKET", "").strip() or DEFAULT_SOCKET


def daemon_available(socket: str | os.PathLike | None = None, *, timeout: float = 1.0) -> bool:
    """True when a gpuenvd that speaks this protocol answers on `socket` (default_socket()).

    Cheap when there is no daemon (a stat); otherwise one connect and a hello. Raises
    DaemonNotTrusted when the socket is served by an account that is not gpuenvd's.
    """
    path = os.fspath(socket) if socket is not None else default_socket()
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    try:
        with Client(path, timeout=timeout):
            return True
    except DaemonNotTrusted:
        raise  # a fake daemon is said, never taken for "no daemon"
    except GpuenvError:
        return False


def _gpus_field(gpus: GpuSelector) -> Any:
    if gpus is None or gpus == "all":
        return None
    if isinstance(gpus, (int, str)):
        if isinstance(gpus, str) and "," in gpus:
            return [g.strip() for g in gpus.split(",") if g.strip()]
        return [gpus]
    return list(gpus)


# The classes a daemon's error reply is re-raised as, by the name it gives (any other name:
# GpuenvError). The errors of one part of gpuenv (BadRecord, JournalDamaged, ...) are not
# among them: their fields do not cross the socket.
_ERROR_TYPES: dict[str, type[GpuenvError]] = {
    cls.__name__: cls
    for cls in (
        GpuenvError,
        _errors.ConfigError,
        _errors.DeviceNotFound,
        _errors.FileError,
        _errors.BackendError,
        _errors.NvmlUnavailable,
        _errors.NotSupported,
        _errors.PermissionDenied,
        _errors.GpuLost,
        _errors.DriverTimeout,
        _errors.InvalidValue,
        _errors.ReadOnlyError,
        _errors.LockConflict,
        _errors.ProtocolError,
        _errors.DaemonUnavailable,
    )
}


def _raise_remote(body: dict[str, Any]) -> None:
    """Re-raise a daemon error reply as the gpuenv error class it names."""
    cls = _ERROR_TYPES.get(str(body.get("type")), GpuenvError)
    err = cls.__new__(cls)
    # Bypass each class's own constructor: the daemon already composed message and hint.
    if isinstance(err, _errors.BackendError):
        err.op = None
        err.code = None
    if isinstance(err, _errors.LockConflict):
        err.owner = str(body.get("owner", ""))
    GpuenvError.__init__(
        err,
        str(body.get("message", "the daemon refused")),
        gpu=body.get("gpu"),
        hint=body.get("hint"),
    )
    raise err


class Client:
    """One connection to gpuenvd. Leases taken through it end when it closes."""

    def __init__(
        self,
        socket: str | os.PathLike | None = None,
        *,
        timeout: float | None = 30.0,
        client: str | None = None,
    ):
        self.path = os.fspath(socket) if socket is not None else default_socket()
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._buf = b""
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
        except OSError as err:
            sock.close()
            raise DaemonUnavailable(
                f"cannot reach gpuenvd at {self.path} ({err.strerror or err})",
                hint="start it as root ('sudo gpuenv daemon' or 'systemctl start gpuenvd'), "
                "or point GPUENV_SOCKET at its socket",
            ) from None
        try:
            authenticate(sock, self.path)  # before a byte is sent or believed
        except BaseException:
            sock.close()
            raise
        self._sock: _socket.socket | None = sock
        limit = HELLO_TIMEOUT_S if timeout is None else min(timeout, HELLO_TIMEOUT_S)
        try:
            with Progress(
                f"gpuenv: waiting for gpuenvd at {self.path} to answer (at most {limit:g} s)"
            ):
                self.info = self.call(
                    "hello",
                    versions=list(protocol.SUPPORTED_VERSIONS),
                    client=client,
                    timeout=limit,
                )
        except BaseException:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------

    def call(self, op: str, *, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply; a daemon error is raised as its gpuenv class."""
        sock = self._require()
        req_id = next(self._ids)
        try:
            sock.sendall(protocol.encode(protocol.request(op, req_id, **fields)))
        except OSError as err:
            self.close()
            raise DaemonUnavailable(
                f"lost the connection to gpuenvd at {self.path} ({err.strerror or err})",
                hint="see its log (journalctl -u gpuenvd)",
            ) from None
        while True:
            msg = self._read(timeout)
            if "event" in msg:
                self._events.append(msg)
                continue
            if msg.get("id") != req_id:
                continue  # a reply to a request we gave up on
            if not msg.get("ok"):
                _raise_remote(msg.get("error") or {})
            return msg

    def _require(self) -> _socket.socket:
        if self._sock is None:
            raise DaemonUnavailable("this gpuenvd connection is closed", hint="connect again")
        return self._sock

    def _read(self, timeout: float | None = None) -> dict[str, Any]:
        sock = self._require()
        if timeout is not None:
            sock.settimeout(timeout)
        try:
            while b"\n" not in self._buf:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    waited = sock.gettimeout()
                    raise DaemonUnavailable(
                        f"gpuenvd at {self.path} did not answer in "
                        + (f"{waited:g} s" if waited else "time"),
                        hint="check 'systemctl status gpuenvd', or point GPUENV_SOCKET elsewhere",
                    ) from None
                if not chunk:
                    self.close()
                    raise DaemonUnavailable(
                        f"gpuenvd at {self.path} closed the connection",
                        hint="see its log (journalctl -u gpuenvd)",
                    )
                self._buf += chunk
                if len(self._buf) > MAX_REPLY_BYTES:
                    self._not_gpuenvd(self._buf)
        finally:
            if timeout is not None and self._sock is not None:
                self._sock.settimeout(self.timeout)
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            msg = None
        if not isinstance(msg, dict):
            self._not_gpuenvd(line)
        return msg

    def _not_gpuenvd(self, data: bytes) -> NoReturn:
        """Whatever answers is not gpuenvd (another service, a stale socket's new owner)."""
        self.close()
        raise DaemonUnavailable(
            f"{self.path} is not gpuenvd: it answered {data[:40]!r}",
            hint="point GPUENV_SOCKET at gpuenvd's socket, or unset it",
        )

    def close(self) -> None:
        """Close the connection: the daemon ends every non-standing lease taken through it."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations -----------------------------------------------------------------------------

    def status(self, gpus: GpuSelector = None) -> dict[str, Any]:
        """GPUs (clocks, lock state, owners) and every lease the daemon holds."""
        return self.call("status", gpus=_gpus_field(gpus))

    def lock(
        self,
        request: LockRequest | None = None,
        *,
        gpus: GpuSelector = None,
        standing: bool = False,
        wait: float = 0.0,
        label: str | None = None,
        **settings: Unpack[LockSettings],
    ) -> Lease:
        """Take a lease for `request` (or its keywords: `gd.lock(sm=1350, gpus=[0])`);
        LockConflict names the holder unless it lets go within `wait` seconds."""
        request = requested(request, None, settings)
        with Progress(f"gpuenv: waiting for gpuenvd's lease (at most {wait:g} s)" if wait else ""):
            reply = self.call(
                "lock",
                gpus=_gpus_field(gpus),
                **request.to_wire(),
                standing=standing or None,
                wait=wait or None,
                label=label,
                timeout=None if self.timeout is None else self.timeout + wait,
            )
        return Lease(self, reply["lease"])

    def release(self, lease_id: str) -> dict[str, Any]:
        return self.call("release", lease=lease_id)["lease"]

    def restore(self, gpus: GpuSelector = None, *, all_owners: bool = False) -> list[int]:
        """End your standing leases on `gpus` (admins: everyone's); returns the GPUs restored."""
        return list(
            self.call("restore", gpus=_gpus_field(gpus), all=all_owners or None)["restored"]
        )

    def window_start(self, gpus: GpuSelector = None) -> int:
        """Mark the start of a region; returns the id to pass to window_end."""
        return int(self.call("window_start", gpus=_gpus_field(gpus))["window"])

    def window_end(self, window: int) -> list[Any]:
        """Mark the end of a region: one telemetry Window per GPU, from the daemon's sampler."""
        from gpuenv.telemetry import Window

        reply = self.call("window_end", window=window)
        return [Window.from_dict(w) for w in reply["windows"]]

    @contextlib.contextmanager
    def window(self, gpus: GpuSelector = None) -> Iterator[list[Any]]:
        """`with gd.window() as ws: work()` -> ws holds one Window per GPU afterwards."""
        windows: list[Any] = []
        wid = self.window_start(gpus)
        try:
            yield windows
        finally:
            windows.extend(self.window_end(wid))

    def subscribe(
        self, *, period: float = 1.0, gpus: GpuSelector = None, events: bool = True
    ) -> Iterator[dict[str, Any]]:
        """Stream: yields {"event": "samples", ...} every `period` s (and lease events if asked)."""
        sub = self.call("subscribe", period=period, gpus=_gpus_field(gpus), events=events)["sub"]
        while True:
            msg = (
                self._events.popleft()
                if self._events
                else self._read(timeout=max(30.0, 4 * period))
            )
            if msg.get("event") and msg.get("sub") == sub:
                yield msg


class Lease:
    """A lease from gpuenvd: a context manager that releases on exit."""

    def __init__(self, client: Client, info: dict[str, Any]):
        self.client = client
        self.info = info
        self.id: str = info["id"]
        self.gpus: list[int] = list(info["gpus"])
        self.standing: bool = bool(info.get("standing"))
        self.released = False

    def release(self) -> None:
        """End the lease (idempotent). The daemon restores the GPUs when no one else shares them."""
        if self.released:
            return
        self.released = True
        if not self.client.closed:
            self.client.release(self.id)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<gpuenvd lease {self.id} GPUs {self.gpus}{' standing' if self.standing else ''}>"


class OwnedLease(Lease):
    """A lease with its own connection (from `lock()`): closing it ends the lease."""

    def release(self) -> None:
        if self.released:
            return
        try:
            super().release()
        finally:
            self.client.close()


class DaemonLock(OwnedLease):
    """A lock taken through gpuenvd, with the part of `gpuenv.clocks.Lock`'s API that
    callers use: `gpus`, `shared`, `notes`, `holds()`, `release()`, and `with`."""

    def __init__(self, client: Client, info: dict[str, Any], plan: LockPlan):
        super().__init__(client, info)
        self.shared: list[int] = list(info.get("shared", []))
        self.notes: list[str] = [f"locked through gpuenvd (lease {self.id})"]
        self.plan = plan  # as gpuenv.locking.acquire planned it, or as the daemon reports it
        self._entered = False

    @property
    def request(self) -> LockRequest:
        """What was asked for, as `gpuenv.clocks.Lock.request` (the daemon's words for it:
        `info["request"]`)."""
        return self.plan.request

    def holds(self) -> dict[int, bool | None]:
        """Per GPU: is the SM clock inside the locked range right now (None: cannot tell)."""
        return {g["index"]: g.get("holds") for g in self.client.status(self.gpus)["gpus"]}

    def __enter__(self) -> DaemonLock:
        if self.released:
            raise _errors.ConfigError("this lock was released", hint="take a new one")
        if self._entered:
            raise _errors.ConfigError("this lock is already entered (locks are not re-entrant)")
        self._entered = True
        return self

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<gpuenv lock via gpuenvd {self.request.describe()} on GPUs {self.gpus} ({state})>"


def connect(socket: str | os.PathLike | None = None, *, timeout: float | None = 30.0) -> Client:
    """Open a connection to gpuenvd (DaemonUnavailable if none answers)."""
    return Client(socket, timeout=timeout)


def lock(
    request: LockRequest | None = None,
    *,
    gpus: GpuSelector = None,
    standing: bool = False,
    wait: float = 0.0,
    label: str | None = None,
    socket: str | os.PathLike | None = None,
    **settings: Unpack[LockSettings],
) -> OwnedLease:
    """Lock through the daemon on a connection of its own (`request`, or its keywords).

    The lease lasts while this process holds the returned object (or, with
    `standing`, until `restore`); if the process dies, the daemon restores.
    """
    request = requested(request, None, settings)
    client = Client(socket, client=label)
    try:
        lease = client.lock(request, gpus=gpus, standing=standing, wait=wait, label=label)
    except BaseException:
        client.close()
        raise
    return OwnedLease(client, lease.info)


def restore(
    gpus: GpuSelector = None, *, all_owners: bool = False, socket: str | os.PathLike | None = None
) -> list[int]:
    """`gpuenv restore` through the daemon."""
    with Client(socket) as client:
        return client.restore(gpus, all_owners=all_owners)


def status(gpus: GpuSelector = None, *, socket: str | os.PathLike | None = None) -> dict[str, Any]:
    with Client(socket) as client:
        return client.status(gpus)
