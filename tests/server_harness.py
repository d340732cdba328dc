"""gpuenvd in this process, for tests: the server on threads over a real Unix socket, on the
simulated GPU with a state file. `peer_of` is injected so one test can play several users
(the kernel's SO_PEERCRED would say every connection is us). Not a test module: helpers and
the `h` fixture (import it into a test module to use it)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon.auth import Peer, parse_config
from gpuenv.daemon.client import Client
from gpuenv.daemon.server import Server
from gpuenv.timebase import Clock

ME = os.getpid()
ALICE = Peer(pid=ME, uid=50001, gid=50001, user="alice", groups=frozenset({"alice", "bench"}))
BOB = Peer(pid=ME, uid=50002, gid=50002, user="bob", groups=frozenset({"bob", "bench"}))
EVE = Peer(pid=ME, uid=50003, gid=50003, user="eve", groups=frozenset({"eve"}))
OPS = Peer(pid=ME, uid=50004, gid=50004, user="ops", groups=frozenset({"ops"}))

CONFIG = """
[lock]
user:alice = all
group:bench = 1
user:bob = 0
[admin]
users = ops
"""


class HandClock:
    """Time that only the test moves (`advance`), for a daemon whose requests wait on other
    threads while the test goes on.

    A VirtualClock cannot serve there: the daemon's waiting request runs
    `timebase.wait_on` on its own thread with the lease manager's lock held, and on virtual
    time that wait moves the clock itself (nothing else would): a request asked to wait 20
    s runs through its wait at once, refused, and holds the lock meanwhile, so nothing the
    test does can end its wait. This clock is not `virtual` in that sense: another thread
    moves it, so the daemon's waits on it are real `cond.wait`s, which a grant or release
    ends at once (else a poll every WAIT_POLL_S of real time), as on the real clock. Its
    deadlines and kept turns fall in the test's time: they end when the test moves the
    clock past them, not after seconds of real time, and never early on a slow machine."""

    virtual = False

    def __init__(self, start: float = 1000.0, epoch: float = 1_790_000_000.0):
        self._t, self._start, self._epoch = start, start, epoch
        self._moved = threading.Condition()

    def now(self) -> float:
        return self._t

    def wall(self) -> float:
        return self._epoch + (self._t - self._start)

    def advance(self, seconds: float) -> None:
        with self._moved:
            self._t += seconds
            self._moved.notify_all()

    def sleep(self, seconds: float) -> None:
        """Until the test has moved the clock `seconds` on (a thread's own sleep moves
        nothing); an error after 10 s of real time in which the test did not."""
        with self._moved:
            target = self._t + seconds
            if not self._moved.wait_for(lambda: self._t >= target, timeout=10.0):
                raise RuntimeError(f"a sleep of {seconds} s: the test did not move the clock")


class Harness:
    def __init__(
        self,
        tmp: Path,
        config: str = CONFIG,
        n_gpus: int = 2,
        profile: str = "h100",
        clock: Clock | None = None,
    ):
        """`clock`: the simulated GPU's and so the daemon's (a VirtualClock: kept turns
        in virtual time, moved by the test, for requests that do not wait; a HandClock for
        requests that wait; default: real time)."""
        self.tmp = tmp
        self.sock = str(tmp / "gpuenvd.sock")
        self.backend = SimBackend(profile, n_gpus=n_gpus, state_file=tmp / "sim.json", clock=clock)
        self.journal = Journal(tmp / "journal")
        self.queue: list[Peer] = []
        cfg = parse_config(config).with_socket(self.sock)
        self.server = Server(cfg, self.backend, journal=self.journal, peer_of=self._peer_of)
        self.original = [self.truth(i) for i in range(n_gpus)]

    def _peer_of(self, sock: socket.socket) -> Peer:
        # a connection nobody queued an identity for (a liveness probe) is eve, who may only read
        return self.queue.pop(0) if self.queue else EVE

    def client(self, peer: Peer) -> Client:
        self.queue.append(peer)
        return Client(self.sock, timeout=10)

    def truth(self, index: int) -> tuple:
        t = self.backend.truth(index)
        return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w)

    def locked_sm(self, index: int) -> tuple[int, int] | None:
        return self.backend.truth(index).locked_sm


@contextlib.contextmanager
def serving(tmp: Path, **kwargs: Any) -> Iterator[Harness]:
    """A started Harness (kwargs: Harness's), stopped and closed on exit."""
    harness = Harness(tmp, **kwargs)
    harness.server.start()
    try:
        yield harness
    finally:
        harness.server.stop()
        harness.backend.close()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with serving(tmp_path) as harness:
        yield harness


def wait_for(cond, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()
