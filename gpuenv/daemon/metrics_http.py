"""gpuenvd's /metrics HTTP server: one thread, a bounded number of connections, a snapshot.

prometheus-client's own server gave every TCP connection a thread and a descriptor for as
long as the client kept it open: an account with no lock right opened 1,100 idle
connections and the daemon ran out of descriptors (root's `gpuenv lock` refused, "Too many
open files"), and a flood of 256 scrapes a second rebuilt the exposition 256 times a second
under the GIL (lease p99 17 -> 194 ms). Here:
  - one thread multiplexes every connection (selectors): no thread per client;
  - at most MAX_CONNECTIONS are open at once; one more takes the place of the oldest that
    has not yet sent its request (an idle hog loses its place to a scraper that talks), or,
    when every one is being answered, is closed at once: the endpoint holds at most
    MAX_CONNECTIONS + 1 descriptors whatever anyone does;
  - a connection has DEADLINE_S to send its request and take the answer, then is closed;
  - at most ACCEPTS_PER_S connections are taken a second, at most a tenth of a second's
    worth at once (`AcceptPace`): a scrape flood waits in the kernel's queue instead of
    taking the GIL from the lease threads. A scrape costs this thread ~0.1-0.15 ms (accept,
    read, one send, close), so ACCEPTS_PER_S scrapes a second take ~3% of a core (at 50 a
    second, the limit before, a flood was served 50 a second however little each cost; at
    400, on a 2-core machine, what the scrapers and the kernel spent doubled the lease
    round trip's median);
  - the answer (header and exposition) is rebuilt at most once per SNAPSHOT_S; every scrape
    in between is sent the same bytes, at once from the read that completes its request
    (Prometheus scrapes every 15-60 s: a second-old value is fresh).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger("gpuenv.daemon")

MAX_CONNECTIONS = 32
ACCEPTS_PER_S = 250.0
BURST_S = 0.1  # the bucket holds this many seconds' worth of accepts
DEADLINE_S = 5.0
SNAPSHOT_S = 1.0
MAX_REQUEST = 8192
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Client:
    def __init__(self, sock: socket.socket, now: float):
        self.sock = sock
        self.deadline = now + DEADLINE_S
        self.request = b""
        self.out = b""


class AcceptPace:
    """A token bucket: `rate` connections a second, at most `rate * BURST_S` at once."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.size = max(1.0, rate * BURST_S)
        self.clock = clock
        self.tokens = self.size
        self._at = clock()

    def refill(self) -> bool:
        """Add what the time since the last refill earned; True while one may be taken."""
        now = self.clock()
        self.tokens = min(self.size, self.tokens + (now - self._at) * self.rate)
        self._at = now
        return self.tokens >= 1.0

    def take(self) -> bool:
        """Take one connection's token; False (nothing taken) when the bucket is empty."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class MetricsHTTP:
    """Serve `render()` on GET /metrics (and /), bounded as the module docstring says.
    `clock` (seconds) paces accepts, ages the snapshot and times connections out."""

    def __init__(
        self,
        host: str,
        port: int,
        render: Callable[[], bytes],
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host, port))
            self.listener.listen(32)  # a short queue: taken in under a second
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.render = render
        self.clock = clock
        self.served = 0
        self.refused = 0  # connections closed early: MAX_CONNECTIONS were open
        self.renders = 0
        self._page = b""
        self._header = 0  # the page's header is page[:_header]
        self._page_at = -1e9
        self._clients: dict[int, _Client] = {}
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._listening = True
        self.pace = AcceptPace(ACCEPTS_PER_S, clock)
        self.thread = threading.Thread(target=self._loop, name="gpuenvd-metrics", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2.0)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self._sel.select(timeout=0.05 if not self._listening else 0.2):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._io(self._clients.get(key.fd), events)
                self._expire()
                self._pace()
        except Exception:  # the endpoint must not take the daemon with it
            log.exception("the metrics endpoint stopped")
        finally:
            for client in list(self._clients.values()):
                self._close(client)
            self._sel.close()
            self.listener.close()

    def _pace(self) -> None:
        """Refill the accept bucket; stop watching the listener while it is empty."""
        want = self.pace.refill()
        if want != self._listening:
            if want:
                self._sel.register(self.listener, selectors.EVENT_READ)
            else:
                self._sel.unregister(self.listener)
            self._listening = want

    def _accept(self) -> None:
        while self.pace.tokens >= 1.0:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # EMFILE and friends: the others go on
                log.warning("metrics endpoint: accept failed (%s)", err)
                return
            self.pace.take()
            if len(self._clients) >= MAX_CONNECTIONS:
                self.refused += 1
                waiting = [c for c in self._clients.values() if not c.out]
                if not waiting:
                    sock.close()
                    continue
                self._close(min(waiting, key=lambda c: c.deadline))
            sock.setblocking(False)
            client = _Client(sock, self.clock())
            self._clients[sock.fileno()] = client
            self._sel.register(sock, selectors.EVENT_READ)

    def _io(self, client: _Client | None, events: int) -> None:
        if client is None:
            return
        try:
            if events & selectors.EVENT_READ and not client.out:
                data = client.sock.recv(4096)
                if not data:
                    self._close(client)
                    return
                client.request += data
                if b"\r\n\r\n" in client.request or b"\n\n" in client.request:
                    client.out = self._answer(client.request)
                    if self._send(client):  # most answers fit the socket's buffer at once
                        return
                    self._sel.modify(client.sock, selectors.EVENT_WRITE)
                elif len(client.request) > MAX_REQUEST:
                    self._close(client)
                    return
            if events & selectors.EVENT_WRITE and client.out:
                self._send(client)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(client)

    def _send(self, client: _Client) -> bool:
        """Send what the socket takes now; True once all of it went (the client is closed)."""
        try:
            sent = client.sock.send(client.out)
        except (BlockingIOError, InterruptedError):
            return False
        client.out = client.out[sent:]
        if client.out:
            return False
        self.served += 1
        self._close(client)
        return True

    def _answer(self, request: bytes) -> bytes:
        line = request.split(b"\n", 1)[0].decode("latin-1").split()
        method, path = (line[0], line[1].split("?")[0]) if len(line) >= 2 else ("", "")
        if method not in ("GET", "HEAD"):
            return _response(405, b"only GET\n", "text/plain")
        if path not in ("/", "/metrics"):
            return _response(404, b"see /metrics\n", "text/plain")
        try:
            page = self.snapshot()
        except Exception:
            log.exception("metrics endpoint: building the exposition failed")
            return _response(500, b"see gpuenvd's log\n", "text/plain")
        return page[: self._header] if method == "HEAD" else page

    def snapshot(self) -> bytes:
        """The whole answer to a GET (header and exposition), rebuilt when older than
        SNAPSHOT_S: every scrape in between is served these bytes as they are."""
        now = self.clock()
        if now - self._page_at >= SNAPSHOT_S:
            body = self.render()
            self._page = _response(200, body, CONTENT_TYPE)
            self._header = len(self._page) - len(body)
            self._page_at = self.clock()
            self.renders += 1
        return self._page

    def _expire(self) -> None:
        now = self.clock()
        for client in [c for c in self._clients.values() if c.deadline < now]:
            self._close(client)

    def _close(self, client: _Client) -> None:
        self._clients.pop(client.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(client.sock)
        with contextlib.suppress(OSError):
            client.sock.close()

    def connections(self) -> int:
        return len(self._clients)


def _response(code: int, body: bytes, ctype: str, *, head: bool = False) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}[
        code
    ]
    header = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    return header if head else header + body


__all__ = ["MAX_CONNECTIONS", "MetricsHTTP"]
