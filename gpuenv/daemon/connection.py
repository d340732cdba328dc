"""gpuenvd's connections: one per client socket, and who may open how many.

No local user can take every connection: a user who is not an admin may hold
at most `max_connections_per_user` at once, and all such users together at
most `max_connections`; root and admins are never refused. A connection that
holds nothing (no lease, no subscription, no open window) and says nothing for
`idle_timeout` seconds is closed.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections import Counter
from typing import Any

from gpuenv.daemon import protocol
from gpuenv.daemon.auth import Peer
from gpuenv.errors import GpuenvError

SEND_TIMEOUT_S = 5.0  # a client that reads nothing for this long is dropped
MAX_WINDOWS = 1024  # open windows per connection; the oldest is dropped past this
MAX_SUBSCRIPTIONS = 8  # per connection


class Conn:
    """One client connection."""

    def __init__(self, cid: int, sock: socket.socket, peer: Peer, *, admin: bool = False):
        self.id = cid
        self.sock = sock
        self.peer = peer
        self.admin = admin
        self.send_lock = threading.Lock()
        self.windows: dict[int, tuple[float, list[int]]] = {}
        self.subs: dict[int, threading.Event] = {}
        self.event_sub: int | None = None  # the subscription that asked for lease events
        self.closed = threading.Event()
        self.last_active = time.monotonic()

    def send(self, message: dict[str, Any]) -> bool:
        data = protocol.encode(message)
        with self.send_lock:
            if self.closed.is_set():
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.hang_up()
                return False

    def hung_up(self) -> bool:
        """True when the peer has closed its end (checked without consuming its data)."""
        if self.closed.is_set():
            return True
        poller = select.poll()
        poller.register(self.sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        try:
            return any(
                ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                for _, ev in poller.poll(0)
            )
        except OSError:
            return True

    def wait_readable(self, timeout_s: float) -> bool:
        """Wait until there is something to read (or the peer hung up); False on timeout."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLRDHUP | select.POLLHUP)
        try:
            return bool(poller.poll(max(0, int(timeout_s * 1000))))
        except OSError:
            return True

    def hang_up(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class ConnectionTable:
    """The open connections, counted per uid; admits or refuses a new one."""

    def __init__(self, max_connections: int, max_per_user: int):
        self.max_connections = max_connections
        self.max_per_user = max_per_user
        self.lock = threading.Lock()
        self.conns: dict[int, Conn] = {}
        self._per_uid: Counter[int] = Counter()
        self._users = 0  # connections of non-admins

    def __len__(self) -> int:
        return len(self.conns)

    def admit(self, conn: Conn) -> GpuenvError | None:
        """Add `conn`, or return why not. Root and admins always get in."""
        with self.lock:
            if not conn.admin:
                mine = self._per_uid[conn.peer.uid]
                if mine >= self.max_per_user:
                    return GpuenvError(
                        f"{conn.peer.user} already has {mine} connections to gpuenvd",
                        hint="close some (each gpuenv.daemon.client.Client is one), then retry",
                    )
                if self._users >= self.max_connections:
                    return GpuenvError("gpuenvd has too many connections", hint="retry later")
                self._users += 1
            self._per_uid[conn.peer.uid] += 1
            self.conns[conn.id] = conn
            return None

    def remove(self, conn: Conn) -> None:
        with self.lock:
            if self.conns.pop(conn.id, None) is None:
                return
            self._per_uid[conn.peer.uid] -= 1
            if self._per_uid[conn.peer.uid] <= 0:
                del self._per_uid[conn.peer.uid]
            if not conn.admin:
                self._users -= 1

    def all(self) -> list[Conn]:
        with self.lock:
            return list(self.conns.values())


def set_send_timeout(sock: socket.socket, seconds: float) -> None:
    whole = int(seconds)
    with contextlib.suppress(OSError):
        sock.setsockopt(
            socket.SOL_SOCKET,
            socket.SO_SNDTIMEO,
            struct.pack("ll", whole, int((seconds - whole) * 1e6)),
        )


def socket_answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
