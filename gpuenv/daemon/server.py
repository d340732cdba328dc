"""gpuenvd's socket server: one thread per connection, simple and robust.

Each connection gets a reader thread that reads request lines, answers each in
order, and, when the connection ends for any reason (the client exits, is
SIGKILLed, or the daemon stops), ends that connection's leases, which puts the
GPUs back (LeaseManager.drop). The kernel closes a dead process's socket at
once, so a SIGKILLed client's GPUs are restored within milliseconds.

The daemon keeps its own continuous Sampler over every GPU: `window_start` /
`window_end` answer a client's timed region from it, `subscribe` streams it,
and the Prometheus endpoint (metrics.py) reads it.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

from gpuenv.backend import Backend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon import protocol
from gpuenv.daemon.auth import Authorizer, Config, Peer, peer_from_socket
from gpuenv.daemon.connection import (
    SEND_TIMEOUT_S,
    Conn,
    ConnectionTable,
    set_send_timeout,
)
from gpuenv.daemon.leases import LeaseManager
from gpuenv.daemon.ops import Operations, version
from gpuenv.daemon.recovery import recover
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.telemetry import Sampler
from gpuenv.timebase import Clock

log = logging.getLogger("gpuenv.daemon")

MAX_CONNECTIONS = 256  # of users that are not admins, all together
# connections the kernel queues before accept: a client's connect with a timeout fails at once
# (EAGAIN) when the queue is full, and 200 clients starting together overflowed 128
LISTEN_BACKLOG = 1024
COLLECT_EVERY_S = 10.0  # a full garbage collection this often (serve_forever)
RECV_BYTES = 65536  # a connection's read buffer
HANGUP_POLL_S = 0.1  # how often a waiting lock checks that its client is still there
# Edge reads kept per GPU, apart from the sampler's time history: the windows' own (at most
# 50 a second, reader.EDGE_MIN_INTERVAL_S, so 40 s of windows back to back; a longer window
# under that load falls back to the periodic reads). In the time rings, each window's two
# reads filled them (~1 KB a read) until full: +6.3 MB per 10k window requests, to ~60 MB.
WINDOW_EDGES = 2048


class Server:
    """The daemon: listen on `config.socket`, serve requests, own the leases and the sampler.

    `peer_of` maps an accepted socket to its Peer (default: SO_PEERCRED); tests pass
    their own to play several users in one process.
    """

    def __init__(
        self,
        config: Config,
        backend: Backend,
        *,
        journal: Journal | None = None,
        clock: Clock | None = None,
        peer_of: Callable[[socket.socket], Peer] = peer_from_socket,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.config = config
        self.backend = backend
        self.journal = journal or Journal()
        self.clock = clock or backend.clock
        self.peer_of = peer_of
        count = backend.device_count()
        if count == 0:
            raise ConfigError(
                "gpuenvd found no GPU", hint="check 'nvidia-smi'; the daemon needs at least one"
            )
        self.gpus = list(range(count))
        self.infos = [backend.device_info(i) for i in self.gpus]
        self.auth = Authorizer(
            config,
            [info.uuid for info in self.infos],
            minors=lambda: [_minor_number(backend, i) for i in self.gpus],
        )
        self.leases = LeaseManager(backend, self.journal, self.auth, self.clock)
        self.leases.listeners.append(self._on_lease_event)
        self.sampler = Sampler(
            backend,
            self.gpus,
            period=config.sample_period,
            clock=self.clock,
            own_pids=[os.getpid()],
            edge_capacity=WINDOW_EDGES,
        )
        self.conns = ConnectionTable(max_connections, config.max_connections_per_user)
        self.ops = Operations(
            backend,
            self.infos,
            self.auth,
            self.leases,
            self.sampler,
            self.clock,
            self.conns.__len__,
        )
        self.started_at = self.ops.started_at
        self.requests = 0
        self.protocol_errors = 0
        self._listener: socket.socket | None = None
        self._place: Any = None  # listener.SocketPlace, once bound
        self._ids = itertools.count(1)
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = False
        self._accept_thread: threading.Thread | None = None
        self._metrics: Any = None
        # Lease events go out from their own thread: a slow subscriber must not hold up a grant.
        self._events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(maxsize=10_000)
        self._event_thread: threading.Thread | None = None

    def connections(self) -> int:
        """How many clients are connected now."""
        return len(self.conns)

    def subscribers_dropped(self) -> int:
        """How many subscribers were dropped for not reading (connection.Conn.push)."""
        return self.conns.dropped

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.config.socket

    def start(self) -> None:
        """Claim the socket, recover what a previous daemon left, then sample and listen.

        The socket comes first: a second daemon must fail before it touches the
        journal, not "recover" the live leases of the first one.
        """
        sock = self._bind()
        try:
            restored = recover(self.leases)
            if restored:
                log.warning(
                    "recovery: restored GPUs %s left locked by owners that are gone", restored
                )
            sock.listen(LISTEN_BACKLOG)
            self.sampler.start()
            self.ops.jobs.resume()  # jobs a daemon before this one had open: their epilogs
        except BaseException:
            sock.close()
            if self._place is not None:
                self._place.remove()
            raise
        self._listener = sock
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="gpuenvd-accept", daemon=True
        )
        self._accept_thread.start()
        self._event_thread = threading.Thread(
            target=self._dispatch_events, name="gpuenvd-events", daemon=True
        )
        self._event_thread.start()
        if self.config.metrics:
            from gpuenv.daemon.metrics import start_metrics

            try:
                self._metrics = start_metrics(self, self.config.metrics)
            except BaseException:
                self.stop()  # a daemon that will not serve leaves no socket behind
                raise
        import resource

        log.info(
            "gpuenvd %s listening on %s (mode %04o) for %d GPU(s), backend %s, %d descriptors",
            version(),
            self.address,
            self.config.socket_permissions(),
            len(self.gpus),
            self.backend.name,
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )

    def serve_forever(self) -> None:
        """Start (if not started) and serve until request_stop(); then stop()."""
        if self._listener is None:
            self.start()
        # What exists now (modules, classes, functions, config, backend: some 20,000 objects)
        # lives as long as the daemon. Left in the collector, every full collection walks all
        # of it, stalling whatever request runs then by 6-14 ms on a 2-core machine; frozen,
        # such a collection took about 1 ms. Objects made later are collected as before; the
        # sampler's rings, which fill over the next hour, hold records the collector does not
        # track (telemetry/buffers.py), so they do not bring the stalls back.
        gc.collect()
        gc.freeze()
        _steady_malloc()
        # After the freeze a full collection comes only once a quarter of what was frozen has
        # reached the oldest generation: under load the Python heap grew ~180 KB per 1,000
        # requests between them (sys._debugmallocstats), given back by one gc.collect() (about
        # 1 ms on the frozen heap). One every COLLECT_EVERY_S keeps it flat.
        last = self.clock.now()
        try:
            while not self._stop.wait(1.0):
                if self.clock.now() - last >= COLLECT_EVERY_S:
                    gc.collect()
                    last = self.clock.now()
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask serve_forever to return (safe from a signal handler)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop listening and close every connection (their leases end: GPUs restored);
        standing leases stay in the journal for the next start. Idempotent."""
        with self._state_lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._place is not None:
            self._place.remove()
        for conn in self.conns.all():
            conn.hang_up()
        self.conns.wait_empty(timeout=5.0)
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=2.0)
        if self._event_thread is not None:
            self._events.put(None)
            self._event_thread.join(timeout=2.0)
        if self._metrics is not None:
            self._metrics.stop()
        self.ops.jobs.stop()
        self.sampler.stop()
        log.info("gpuenvd stopped")

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> socket.socket:
        from gpuenv.daemon.listener import SocketPlace

        self._place = SocketPlace(
            self.address, group=self.config.socket_group, mode=self.config.socket_permissions()
        )
        return self._place.bind()

    # -- connections -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            listener = self._listener
            if listener is None:
                return
            try:
                sock, _ = listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                self._stop.wait(0.05)  # EMFILE and friends: back off, do not spin
                continue
            try:
                peer = self.peer_of(sock)
            except Exception as err:
                log.warning("refused a connection: cannot read its credentials (%s)", err)
                sock.close()
                continue
            conn = Conn(
                next(self._ids),
                sock,
                peer,
                admin=self.auth.is_admin(peer),
                on_drop=self.conns.count_drop,
                now=self.clock.now(),
            )
            set_send_timeout(sock, SEND_TIMEOUT_S)
            refused = self.conns.admit(conn)
            if refused is not None:
                log.warning("refused a connection from %s: %s", peer.describe(), refused.message)
                conn.send(protocol.error_reply(None, refused))
                sock.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name=f"gpuenvd-conn-{conn.id}", daemon=True
            ).start()

    def _serve(self, conn: Conn) -> None:
        reader = protocol.LineReader()
        # one buffer per connection: a recv(65536) per request was a 64 KiB malloc shrunk to
        # the request's size, in the C allocator's arena of whichever thread served it, which
        # fragmented those arenas (RSS kept growing with requests; docs/benchmarks/daemon_memory.md)
        buf = bytearray(RECV_BYTES)
        view = memoryview(buf)
        try:
            while not conn.closed.is_set():
                if not conn.wait_readable(self._idle_left(conn)):
                    if self._idle_left(conn) <= 0:
                        log.info(
                            "closed an idle connection of %s (nothing held, silent for %g s)",
                            conn.peer.describe(),
                            self.config.idle_timeout,
                        )
                        break
                    continue
                try:
                    n = conn.sock.recv_into(buf)
                except OSError:
                    break
                if not n:
                    break
                data = bytes(view[:n])
                conn.last_active = self.clock.now()
                for line in reader.feed(data):
                    if line is None:
                        self.protocol_errors += 1
                        conn.send(protocol.error_reply(None, _TOO_LONG))
                        continue
                    reply = self.handle(conn, line)
                    conn.last_active = self.clock.now()
                    if not conn.send(reply):
                        break
        finally:
            conn.closed.set()
            for ev in conn.subs.values():
                ev.set()
            try:
                self.leases.drop(conn.id, reason="connection closed")
            except Exception:
                log.exception("ending the leases of connection %d failed", conn.id)
            self.conns.remove(conn)
            with contextlib.suppress(OSError):
                conn.sock.close()

    def _idle_left(self, conn: Conn) -> float:
        """Seconds until `conn` counts as idle; a connection holding something never does."""
        if conn.subs or conn.windows or self.leases.held_by(conn.id):
            conn.last_active = self.clock.now()
        return conn.last_active + self.config.idle_timeout - self.clock.now()

    def handle(self, conn: Conn, line: bytes) -> dict[str, Any]:
        """Answer one request line; never raises."""
        self.requests += 1
        try:
            req = protocol.parse_request(line)
        except protocol.ProtocolError as err:
            self.protocol_errors += 1
            return protocol.error_reply(protocol.request_id_of(line), err)
        except Exception as err:  # a validator's bug: one error reply, the connection kept
            self.protocol_errors += 1
            log.exception("request from %s could not be parsed", conn.peer.describe())
            return protocol.error_reply(
                protocol.request_id_of(line),
                protocol.ProtocolError(f"request could not be read ({type(err).__name__})"),
            )
        try:
            handler = getattr(self.ops, f"op_{req.op}")
            return protocol.ok_reply(req.id, **handler(conn, **req.args))
        except GpuenvError as err:
            return protocol.error_reply(req.id, err)
        except Exception as err:  # a bug must cost one reply, not the daemon
            log.exception("request %s from %s failed", req.op, conn.peer.describe())
            return protocol.error_reply(req.id, err)

    def _on_lease_event(self, kind: str, lease_info: dict[str, Any]) -> None:
        if not self.conns.watching():  # nobody asked for lease events: no queue, no wake-up
            return
        with contextlib.suppress(queue.Full):  # subscribers miss an event rather than stall a grant
            self._events.put_nowait((kind, lease_info))

    def _dispatch_events(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            kind, lease_info = item
            conns = [c for c in self.conns.all() if c.event_sub is not None]
            for conn in conns:  # queued, never waited for: a stalled reader is dropped alone
                conn.push(
                    protocol.event("lease", sub=conn.event_sub, action=kind, lease=lease_info)
                )


def _steady_malloc() -> None:
    """Keep glibc's mmap threshold at its default, 128 KiB. Left dynamic, the first large
    block freed raises it for good: later large blocks come from the heap instead, and
    gpuenvd's RSS stepped up by ~1 MB near 10,000 requests, never given back (with
    MALLOC_MMAP_THRESHOLD_ set, no step: docs/benchmarks/daemon_memory.md). Elsewhere than
    glibc: nothing."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)


M_MMAP_THRESHOLD = -3  # glibc's malloc.h

_TOO_LONG = protocol.ProtocolError(
    f"request longer than {protocol.MAX_LINE} bytes", hint="send one short JSON object per line"
)


def _minor_number(backend: Backend, index: int) -> int | None:
    """GPU `index`'s /dev/nvidiaN minor (the `job` rule's device cgroups), None if unread."""
    try:
        return backend.details(index).minor_number
    except GpuenvError:
        return None
