"""gpuenvd's lease manager with its threads stopped at gates, for tests that choose the order in
which concurrent grants, releases and restores reach the GPU and the hold table. Not a test
module: helpers.

A thread the test started stops at a gate before each write to the simulated GPU (set_*,
reset_*: `GatedBackend`) and before each time it takes the manager's lock
(`WatchedCondition`), until the test opens that gate. The condition and the journal's lock
(`WatchedJournal`) also record who waits on them, so the test can tell when every operation
in flight is parked (at a gate, or waiting its turn, or waiting for a thread that is) and look
at the hold table between two steps of its own choosing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuenv.backend import WRITES
from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon.auth import Authorizer, Peer, parse_config
from gpuenv.daemon.leases import LeaseManager

ME = os.getpid()
ALICE = Peer(pid=ME, uid=50001, gid=50001, user="alice", groups=frozenset({"alice"}))
BOB = Peer(pid=ME, uid=50002, gid=50002, user="bob", groups=frozenset({"bob"}))
OPS = Peer(pid=ME, uid=50004, gid=50004, user="ops", groups=frozenset({"ops"}))
CONFIG = "[lock]\nuser:alice = all\nuser:bob = all\n[admin]\nusers = ops\n"


class Gate:
    """Where a write waits: which thread, what it writes on which GPU."""

    def __init__(self, thread: threading.Thread, op: str, index: int):
        self.thread = thread
        self.op = op
        self.index = index
        self.open = threading.Event()

    def __repr__(self) -> str:
        return f"<{self.thread.name}: {self.op}({self.index})>"


class GatedBackend:
    """The simulated GPU; writes from gated threads wait at a `Gate` until it is opened."""

    def __init__(self, sim: SimBackend):
        self.sim = sim
        self.gated: set[threading.Thread] = set()  # threads whose writes wait
        self.parked: list[Gate] = []
        self.changed = threading.Condition()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.sim, name)
        if name in WRITES:
            return self._gated(name, value)
        return value

    def _gated(self, op: str, write: Callable[..., Any]) -> Callable[..., Any]:
        def call(index: int, *args: Any) -> Any:
            self.stop(op, index)
            return write(index, *args)

        return call

    def stop(self, op: str, index: int) -> None:
        """A gated thread waits here until the test opens its gate."""
        me = threading.current_thread()
        if me not in self.gated:
            return
        gate = Gate(me, op, index)
        with self.changed:
            self.parked.append(gate)
            self.changed.notify_all()
        gate.open.wait()

    def open(self, gate: Gate) -> None:
        with self.changed:
            self.parked.remove(gate)
            self.changed.notify_all()
        gate.open.set()


class WatchedCondition(threading.Condition):
    """threading.Condition that knows which threads wait on it and were not woken since.

    A thread woken by notify() leaves the set at once (before it runs again), so "every
    thread is in the set" means none of them can move until someone else acts."""

    def __init__(self, gates: GatedBackend) -> None:
        self._rlock = threading.RLock()
        super().__init__(self._rlock)
        self.gates = gates
        self.waiting: set[threading.Thread] = set()

    def __enter__(self) -> bool:
        if not self._rlock._is_owned():  # type: ignore[attr-defined]
            self.gates.stop("acquire", -1)  # every turn at the hold table is a step
        return super().__enter__()

    def wait(self, timeout: float | None = None) -> bool:
        me = threading.current_thread()
        self.waiting.add(me)
        try:
            return super().wait(timeout)
        finally:
            self.waiting.discard(me)

    def notify(self, n: int = 1) -> None:
        self.waiting.clear()  # which n it wakes is not known: count them all as running
        super().notify(n)

    def notify_all(self) -> None:
        self.waiting.clear()
        super().notify_all()


class WatchedJournal(Journal):
    """The journal, knowing who holds its lock and who waits for it."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.holder: threading.Thread | None = None
        self.waiting: set[threading.Thread] = set()

    @contextlib.contextmanager
    def locked(self) -> Iterator[Journal]:
        me = threading.current_thread()
        if self.holder is me:
            with super().locked():
                yield self
            return
        self.waiting.add(me)
        try:
            with super().locked():
                self.holder = me
                self.waiting.discard(me)
                try:
                    yield self
                finally:
                    self.holder = None  # before the lock is let go: its waiters may run
        finally:
            self.waiting.discard(me)


class Race:
    """A LeaseManager on two simulated GPUs whose operations run on threads the test steps."""

    def __init__(self, tmp: Path, n_gpus: int = 2):
        self.sim = SimBackend("h100", n_gpus=n_gpus, state_file=tmp / "sim.json")
        self.backend = GatedBackend(self.sim)
        self.journal = WatchedJournal(tmp / "journal")
        uuids = [self.sim.device_info(i).uuid for i in range(n_gpus)]
        self.auth = Authorizer(parse_config(CONFIG), uuids)
        self.manager = LeaseManager(self.backend, self.journal, self.auth)  # type: ignore[arg-type]
        self.cond = WatchedCondition(self.backend)
        self.manager._cond = self.manager._table.cond = self.cond
        self.n_gpus = n_gpus
        self.original = [self.truth(i) for i in range(n_gpus)]
        self.threads: list[threading.Thread] = []
        self.results: dict[str, Any] = {}  # thread name -> what its operation returned
        self.errors: dict[str, BaseException] = {}  # thread name -> what it raised

    def truth(self, index: int) -> tuple:
        t = self.sim.truth(index)
        return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w)

    def start(self, name: str, op: Callable[[], Any]) -> threading.Thread:
        """Run `op` on a thread of its own whose GPU writes wait at gates."""

        def body() -> None:
            try:
                self.results[name] = op()
            except BaseException as err:
                self.errors[name] = err

        thread = threading.Thread(target=body, name=name, daemon=True)
        self.backend.gated.add(thread)
        self.threads.append(thread)
        thread.start()
        return thread

    def live(self) -> list[threading.Thread]:
        return [t for t in self.threads if t.is_alive()]

    def parked(self) -> bool:
        """Is every live operation stopped until the test acts: at a gate, waiting on the
        manager's condition, or for the journal's lock held by a thread that is parked?"""
        at_gate = {g.thread for g in self.backend.parked}
        waiting = set(self.cond.waiting)
        holder = self.journal.holder

        def stopped(t: threading.Thread, depth: int = 0) -> bool:
            if t in at_gate or t in waiting:
                return True
            if t in self.journal.waiting and holder is not None and holder is not t:
                return depth < 3 and stopped(holder, depth + 1)
            return False

        return all(stopped(t) for t in self.live())

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until nothing can move without the test (a bound, not a timing claim)."""
        deadline = time.monotonic() + timeout
        while not self.parked():
            if time.monotonic() > deadline:
                raise AssertionError(f"operations still running: {self.live()}")
            time.sleep(0.001)

    def advance(self, name: str, until: Callable[[Gate], bool] | None = None) -> Gate | None:
        """Open thread `name`'s gates one by one until it ends, waits for something else, or
        stops at a gate `until` accepts (returned)."""
        while True:
            self.settle()
            gate = next((g for g in self.backend.parked if g.thread.name == name), None)
            if gate is None:
                return None
            if until is not None and until(gate):
                return gate
            self.backend.open(gate)

    def step(self, k: int) -> bool:
        """Let the k-th parked write (modulo how many there are) pass; False if none."""
        gates = list(self.backend.parked)
        if not gates:
            return False
        self.backend.open(gates[k % len(gates)])
        self.settle()
        return True

    def drain(self) -> None:
        """Let every write pass until every operation has ended."""
        while self.live():
            self.settle()
            if not self.step(0) and self.live():
                # parked only on the condition: the waits poll; give them their turn
                time.sleep(0.01)
        for t in self.threads:
            t.join()

    def close(self) -> None:
        self.backend.gated.clear()
        for gate in list(self.backend.parked):
            self.backend.open(gate)
        for t in self.threads:
            t.join(timeout=30)
        self.sim.close()
