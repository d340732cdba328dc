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
import dataclasses
import gc
import grp
import itertools
import logging
import os
import queue
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuenv.backend import Backend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon import protocol
from gpuenv.daemon.auth import DEFAULT_SOCKET, Authorizer, Config, Peer, peer_from_socket
from gpuenv.daemon.leases import LeaseManager
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.telemetry import Sampler
from gpuenv.timebase import Clock

log = logging.getLogger("gpuenv.daemon")

MAX_CONNECTIONS = 256
MAX_WINDOWS = 1024  # open windows per connection; the oldest is dropped past this
MAX_SUBSCRIPTIONS = 8  # per connection
SEND_TIMEOUT_S = 5.0  # a client that reads nothing for this long is dropped
HANGUP_POLL_S = 0.1  # how often a waiting lock checks that its client is still there


class _Conn:
    """One client connection."""

    def __init__(self, cid: int, sock: socket.socket, peer: Peer):
        self.id = cid
        self.sock = sock
        self.peer = peer
        self.send_lock = threading.Lock()
        self.windows: dict[int, tuple[float, list[int]]] = {}
        self.subs: dict[int, threading.Event] = {}
        self.event_sub: int | None = None  # the subscription that asked for lease events
        self.closed = threading.Event()

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

    def hang_up(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


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
        self.max_connections = max_connections
        count = backend.device_count()
        if count == 0:
            raise ConfigError(
                "gpuenvd found no GPU", hint="check 'nvidia-smi'; the daemon needs at least one"
            )
        self.gpus = list(range(count))
        self.infos = [backend.device_info(i) for i in self.gpus]
        self.auth = Authorizer(config, [info.uuid for info in self.infos])
        self.leases = LeaseManager(backend, self.journal, self.auth)
        self.leases.listeners.append(self._on_lease_event)
        self.sampler = Sampler(
            backend,
            self.gpus,
            period=config.sample_period,
            clock=self.clock,
            own_pids=[os.getpid()],
        )
        self.started_at = time.time()
        self.requests = 0
        self.protocol_errors = 0
        self._listener: socket.socket | None = None
        self._conns: dict[int, _Conn] = {}
        self._conns_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._stopped = False
        self._accept_thread: threading.Thread | None = None
        self._metrics: Any = None
        # Lease events go out from their own thread: a slow subscriber must not hold up a grant.
        self._events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(maxsize=10_000)
        self._event_thread: threading.Thread | None = None

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
            restored = self.leases.recover()
            if restored:
                log.warning(
                    "recovery: restored GPUs %s left locked by owners that are gone", restored
                )
            sock.listen(128)
            self.sampler.start()
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.address)
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

            self._metrics = start_metrics(self, self.config.metrics)
        log.info(
            "gpuenvd %s listening on %s (mode %04o) for %d GPU(s), backend %s",
            _version(),
            self.address,
            self.config.socket_permissions(),
            len(self.gpus),
            self.backend.name,
        )

    def serve_forever(self) -> None:
        """Start (if not started) and serve until request_stop(); then stop()."""
        if self._listener is None:
            self.start()
        # What exists now (modules, classes, functions, config, backend: some 20,000 objects)
        # lives as long as the daemon. Left in the collector, every full collection walks all
        # of it, stalling whatever request runs then by 6-14 ms on a 2-core machine; frozen,
        # such a collection took about 1 ms. Objects made later are collected as before.
        gc.collect()
        gc.freeze()
        try:
            while not self._stop.wait(1.0):
                pass
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask serve_forever to return (safe from a signal handler)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop listening and close every connection (their leases end: GPUs restored);
        standing leases stay in the journal for the next start. Idempotent."""
        with self._conns_lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(self.address).st_mode):
                    os.unlink(self.address)
        with self._conns_lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.hang_up()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            with self._conns_lock:
                if not self._conns:
                    break
            time.sleep(0.01)
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=2.0)
        if self._event_thread is not None:
            self._events.put(None)
            self._event_thread.join(timeout=2.0)
        if self._metrics is not None:
            self._metrics.stop()
        self.sampler.stop()
        log.info("gpuenvd stopped")

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> socket.socket:
        path = self.address
        directory = os.path.dirname(path) or "."
        if os.path.abspath(path) == DEFAULT_SOCKET:  # /run/gpuenv is the daemon's own to make
            os.makedirs(directory, mode=0o755, exist_ok=True)
        elif not os.path.isdir(directory):  # a typo in --socket must not grow a tree from '/'
            raise ConfigError(
                f"the socket's directory {directory} does not exist",
                hint=f"create it first (mkdir -p {directory}) or choose another --socket",
            )
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise ConfigError(
                    f"{path} exists and is not a socket",
                    hint="remove it or choose another --socket",
                )
            if _socket_answers(path):
                raise ConfigError(
                    f"another gpuenvd already listens on {path}",
                    hint="stop it first, or use another --socket",
                )
            os.unlink(path)  # left by a daemon that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # never world-writable, not even for an instant
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
        try:
            if self.config.socket_group:
                try:
                    gid = grp.getgrnam(self.config.socket_group).gr_gid
                except KeyError:
                    raise ConfigError(
                        f"socket_group {self.config.socket_group!r} does not exist",
                        hint="create it or fix the config",
                    ) from None
                os.chown(path, -1, gid)
            os.chmod(path, self.config.socket_permissions())
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return sock

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
                time.sleep(0.05)  # EMFILE and friends: back off, do not spin
                continue
            try:
                peer = self.peer_of(sock)
            except Exception as err:
                log.warning("refused a connection: cannot read its credentials (%s)", err)
                sock.close()
                continue
            with self._conns_lock:
                full = len(self._conns) >= self.max_connections
                conn = _Conn(next(self._ids), sock, peer)
                if not full:
                    self._conns[conn.id] = conn
            _set_send_timeout(sock, SEND_TIMEOUT_S)
            if full:
                log.warning(
                    "refused %s: %d connections already", peer.describe(), self.max_connections
                )
                conn.send(
                    protocol.error_reply(
                        None, GpuenvError("gpuenvd has too many connections", hint="retry later")
                    )
                )
                sock.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name=f"gpuenvd-conn-{conn.id}", daemon=True
            ).start()

    def _serve(self, conn: _Conn) -> None:
        reader = protocol.LineReader()
        try:
            while not conn.closed.is_set():
                try:
                    data = conn.sock.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                for line in reader.feed(data):
                    if line is None:
                        self.protocol_errors += 1
                        conn.send(
                            protocol.error_reply(
                                None,
                                protocol.ProtocolError(
                                    f"request longer than {protocol.MAX_LINE} bytes",
                                    hint="send one short JSON object per line",
                                ),
                            )
                        )
                        continue
                    reply = self.handle(conn, line)
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
            with self._conns_lock:
                self._conns.pop(conn.id, None)
            with contextlib.suppress(OSError):
                conn.sock.close()

    def handle(self, conn: _Conn, line: bytes) -> dict[str, Any]:
        """Answer one request line; never raises."""
        self.requests += 1
        try:
            req = protocol.parse_request(line)
        except protocol.ProtocolError as err:
            self.protocol_errors += 1
            return protocol.error_reply(protocol.request_id_of(line), err)
        try:
            handler = getattr(self, f"_op_{req.op}")
            return protocol.ok_reply(req.id, **handler(conn, **req.args))
        except GpuenvError as err:
            return protocol.error_reply(req.id, err)
        except Exception as err:  # a bug must cost one reply, not the daemon
            log.exception("request %s from %s failed", req.op, conn.peer.describe())
            return protocol.error_reply(req.id, err)

    # -- operations ------------------------------------------------------------------------------

    def _gpus(self, selector: list[int | str] | None) -> list[int]:
        if selector is None:
            return list(self.gpus)
        for item in selector:
            if isinstance(item, str) and item.lower().startswith(("cuda:", "local")):
                raise ConfigError(
                    f"gpuenvd cannot resolve {item!r}: CUDA numbering belongs to the client",
                    hint="resolve it to an NVML index or a UUID before asking the daemon",
                )
        from gpuenv.devices import select_gpus

        return select_gpus(self.backend, selector)

    def _op_hello(self, conn: _Conn, versions: list[int], client: str | None) -> dict[str, Any]:
        common = sorted(set(versions) & set(protocol.SUPPORTED_VERSIONS))
        if not common:
            raise protocol.ProtocolError(
                f"no common protocol version (client {versions}, "
                f"daemon {list(protocol.SUPPORTED_VERSIONS)})",
                hint="upgrade gpuenv on the older side",
            )
        peer = conn.peer
        return {
            "protocol": common[-1],
            "daemon": _version(),
            "pid": os.getpid(),
            "backend": self.backend.name,
            "peer": {
                "uid": peer.uid,
                "user": peer.user,
                "pid": peer.pid,
                "admin": self.auth.is_admin(peer),
            },
            "may_lock": sorted(self.auth.lockable(peer)),
            "gpus": [{"index": i.index, "uuid": i.uuid, "name": i.name} for i in self.infos],
        }

    def _op_status(self, conn: _Conn, gpus: list[int | str] | None) -> dict[str, Any]:
        out = []
        for index in self._gpus(gpus):
            sample = self.sampler.latest(index)
            out.append(
                {
                    "index": index,
                    "uuid": self.infos[index].uuid,
                    "name": self.infos[index].name,
                    "sample": sample.to_dict() if sample is not None else None,
                    **self.leases.gpu_status(index),
                }
            )
        return {
            "gpus": out,
            "leases": [lease.to_dict() for lease in self.leases.leases()],
            "daemon": {
                "pid": os.getpid(),
                "version": _version(),
                "uptime_s": round(time.time() - self.started_at, 3),
                "connections": len(self._conns),
                **self.leases.counters(),
            },
        }

    def _op_lock(self, conn: _Conn, gpus: list[int | str] | None, **spec: Any) -> dict[str, Any]:
        indices = self._gpus(gpus)
        lease = self.leases.grant(conn.peer, conn.id, indices, hangup=conn.hung_up, **spec)
        return {"lease": lease.to_dict()}

    def _op_release(self, conn: _Conn, lease: str) -> dict[str, Any]:
        ended = self.leases.release(conn.peer, lease)
        return {"lease": ended.to_dict()}

    def _op_restore(self, conn: _Conn, gpus: list[int | str] | None, all: bool) -> dict[str, Any]:
        restored = self.leases.restore(conn.peer, self._gpus(gpus), all_owners=all)
        return {"restored": restored}

    def _op_window_start(self, conn: _Conn, gpus: list[int | str] | None) -> dict[str, Any]:
        indices = self._gpus(gpus)
        t0 = self.sampler.mark()
        wid = next(self._ids)
        if len(conn.windows) >= MAX_WINDOWS:
            conn.windows.pop(next(iter(conn.windows)))
        conn.windows[wid] = (t0, indices)
        return {"window": wid, "t0": t0}

    def _op_window_end(self, conn: _Conn, window: int) -> dict[str, Any]:
        if window not in conn.windows:
            raise protocol.ProtocolError(
                f"no open window {window} on this connection",
                hint="call window_start first; each window ends once",
            )
        t0, indices = conn.windows.pop(window)
        t1 = self.sampler.mark()
        windows = []
        for index in indices:
            w = self.sampler.window(t0, t1, index, lock_range=self.leases.lock_range(index))
            # the client's own process is expected on the GPU, not "another process"
            w = dataclasses.replace(
                w, other_pids=tuple(p for p in w.other_pids if p != conn.peer.pid)
            )
            windows.append(w.to_dict())
        return {"t0": t0, "t1": t1, "windows": windows}

    def _op_subscribe(
        self, conn: _Conn, gpus: list[int | str] | None, period: float, events: bool
    ) -> dict[str, Any]:
        if len(conn.subs) >= MAX_SUBSCRIPTIONS:
            raise protocol.ProtocolError(
                f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection",
                hint="unsubscribe first",
            )
        indices = self._gpus(gpus)
        sub = next(self._ids)
        stop = threading.Event()
        conn.subs[sub] = stop
        if events and conn.event_sub is None:
            conn.event_sub = sub
        threading.Thread(
            target=self._stream,
            args=(conn, sub, indices, period, stop),
            name=f"gpuenvd-sub-{sub}",
            daemon=True,
        ).start()
        return {"sub": sub}

    def _op_unsubscribe(self, conn: _Conn) -> dict[str, Any]:
        subs = list(conn.subs)
        for sub in subs:
            conn.subs.pop(sub).set()
        conn.event_sub = None
        return {"stopped": subs}

    def _stream(
        self, conn: _Conn, sub: int, gpus: list[int], period: float, stop: threading.Event
    ) -> None:
        last = self.clock.now()
        while not stop.wait(period) and not conn.closed.is_set():
            now = self.clock.now()
            samples = [
                s.to_dict() for g in gpus for s in self.sampler.samples(last, now, g) if s.t > last
            ]
            last = now
            if not conn.send(
                protocol.event("samples", sub=sub, samples=samples, leases=self.leases.summary())
            ):
                return

    def _on_lease_event(self, kind: str, lease_info: dict[str, Any]) -> None:
        with contextlib.suppress(queue.Full):  # subscribers miss an event rather than stall a grant
            self._events.put_nowait((kind, lease_info))

    def _dispatch_events(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            kind, lease_info = item
            with self._conns_lock:
                conns = [c for c in self._conns.values() if c.event_sub is not None]
            for conn in conns:
                conn.send(
                    protocol.event("lease", sub=conn.event_sub, action=kind, lease=lease_info)
                )


def _set_send_timeout(sock: socket.socket, seconds: float) -> None:
    whole = int(seconds)
    with contextlib.suppress(OSError):
        sock.setsockopt(
            socket.SOL_SOCKET,
            socket.SO_SNDTIMEO,
            struct.pack("ll", whole, int((seconds - whole) * 1e6)),
        )


def _socket_answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _version() -> str:
    from gpuenv import __version__

    return __version__
