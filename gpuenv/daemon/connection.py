"""gpuenvd's connections: one per client socket, and who may open how many.

No local user can take every connection: a user who is not an admin may hold
at most `max_connections_per_user` at once, and all such users together at
most `max_connections`; root and admins are never refused. A connection that
holds nothing (no lease, no subscription, no open window) and says nothing for
`idle_timeout` seconds is closed.

What a connection is streamed (lease events, sample batches) goes through its own bounded
outbox, drained by a writer thread of its own: the thread that fans an event out never
waits on a client. A subscriber that does not read (stopped, or just slow) fills its outbox
or its socket and is dropped (`ConnectionTable.dropped` counts them; the metrics endpoint
shows it): four SIGSTOPped subscribers used to hold every other subscriber's lease events
back by 5 s each, one after the other.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import select
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpuenv.daemon import protocol
from gpuenv.daemon.auth import Peer
from gpuenv.errors import GpuenvError

SEND_TIMEOUT_S = 5.0  # a client that reads nothing for this long is dropped
MAX_WINDOWS = 1024  # open windows per connection; the oldest is dropped past this
MAX_SUBSCRIPTIONS = 8  # per connection
OUTBOX_MESSAGES = 256  # streamed messages a connection may have waiting; more: it is dropped
OUTBOX_BYTES = 8 << 20

log = logging.getLogger("gpuenv.daemon")


class Conn:
    """One client connection."""

    def __init__(
        self,
        cid: int,
        sock: socket.socket,
        peer: Peer,
        *,
        admin: bool = False,
        on_drop: Callable[[Conn, str], None] | None = None,
        now: float = 0.0,
    ):
        """`now`: the daemon clock's time at accept, the start of its idle time."""
        self.id = cid
        self.sock = sock
        self.peer = peer
        self.admin = admin
        self.send_lock = threading.Lock()
        self.windows: dict[int, tuple[float, list[int]]] = {}
        self.subs: dict[int, threading.Event] = {}
        self.event_sub: int | None = None  # the subscription that asked for lease events
        self.closed = threading.Event()
        self.last_active = now  # the daemon clock's (server.py's idle timeout)
        self.on_drop = on_drop
        self._outbox: collections.deque[bytes] = collections.deque()
        self._outbox_bytes = 0
        self._outbox_cv = threading.Condition()
        self._writer: threading.Thread | None = None
        self._reader_poll: select.poll | None = None

    def push(self, message: dict[str, Any]) -> bool:
        """Queue a streamed message (an event, a batch of samples) without waiting for the
        client; one whose outbox is full is dropped. False when the connection is gone."""
        if self.closed.is_set():
            return False
        data = protocol.encode(message)
        with self._outbox_cv:
            full = (
                len(self._outbox) >= OUTBOX_MESSAGES
                or self._outbox_bytes + len(data) > OUTBOX_BYTES
            )
            if not full:
                self._outbox.append(data)
                self._outbox_bytes += len(data)
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._drain, name=f"gpuenvd-out-{self.id}", daemon=True
                    )
                    self._writer.start()
                self._outbox_cv.notify()
        if full:
            self.drop(f"{OUTBOX_MESSAGES} streamed messages waited for it")
            return False
        return True

    def _drain(self) -> None:
        while True:
            with self._outbox_cv:
                while not self._outbox and not self.closed.is_set():
                    self._outbox_cv.wait(1.0)
                if self.closed.is_set():
                    self._outbox.clear()
                    return
                data = self._outbox.popleft()
                self._outbox_bytes -= len(data)
            with self.send_lock:
                if self.closed.is_set():
                    continue
                try:
                    self.sock.sendall(data)
                except OSError:
                    self.drop(f"it read nothing for {SEND_TIMEOUT_S:g} s")

    def drop(self, why: str) -> None:
        """End a connection that does not read what it is streamed (counted once)."""
        if self.closed.is_set():
            return
        self.hang_up()
        log.warning("dropped the subscriber %s: %s", self.peer.describe(), why)
        if self.on_drop is not None:
            self.on_drop(self, why)

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
        """Wait until there is something to read (or the peer hung up); False on timeout.
        Called by the connection's own thread only: its poller is made once."""
        if self._reader_poll is None:
            self._reader_poll = select.poll()
            self._reader_poll.register(self.sock, select.POLLIN | select.POLLRDHUP | select.POLLHUP)
        try:
            return bool(self._reader_poll.poll(max(0, int(timeout_s * 1000))))
        except OSError:
            return True

    def hang_up(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with self._outbox_cv:
            self._outbox_cv.notify_all()


class ConnectionTable:
    """The open connections, counted per uid; admits or refuses a new one."""

    def __init__(self, max_connections: int, max_per_user: int):
        self.max_connections = max_connections
        self.max_per_user = max_per_user
        self.lock = threading.Lock()
        self.conns: dict[int, Conn] = {}
        self._per_uid: Counter[int] = Counter()
        self._users = 0  # connections of non-admins
        self.dropped = 0  # subscribers dropped for not reading
        self._empty = threading.Condition(self.lock)

    def count_drop(self, conn: Conn, why: str) -> None:
        with self.lock:
            self.dropped += 1

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
            if not self.conns:
                self._empty.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        """Wait until every connection's thread has removed it, at most `timeout` seconds of
        real time (a join of those threads, not the daemon's time); whether none is left."""
        with self.lock:
            return self._empty.wait_for(lambda: not self.conns, timeout)

    def all(self) -> list[Conn]:
        with self.lock:
            return list(self.conns.values())

    def watching(self) -> bool:
        """Whether any connection subscribed to lease events."""
        with self.lock:
            return any(c.event_sub is not None for c in self.conns.values())


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
