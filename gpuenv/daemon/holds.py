"""The daemon's side of a lock on one GPU: one state, the leases that share it, the queue.

Sharing costs O(1) in the number of sharers. The journal does not name each
connection lease: on each GPU, the daemon's connection leases of one state
share one journal owner, the daemon itself (kind "lease", its pid as owner and
as watchdog). Joining or leaving a held state changes only a dict here; the
journal is written when the first lease takes the GPU and when the last one
lets it go. Exact restore after a crash needs nothing more: the original state
is in the journal entry, and every connection lease ends with the daemon
(gpuenvd restores at its next start; 'gpuenv restore' does it by hand). The
owner is judged by the daemon's pid, never by a pid a client can drop (a
client that forks and exits keeps its lease for as long as its connection
lives). Standing leases, which outlive the daemon, keep one journal owner each
(the client's uid and name), so that a restarted daemon finds them again.

One state machine per GPU. A GPU is free (no hold), held (a hold with at least one lease),
or changing: one transition is in flight on it (`HoldTable.changing`: writing, releasing,
restoring), which writes the journal and the GPU outside the lock. Every transition takes
all the GPUs it touches at once under the lease manager's lock, and only when none of them
is changing: a grant takes the GPUs it shares as well as those it writes (else a release
could put a shared GPU back under it), a release the GPUs it writes, an admin's restore
every GPU it names and every GPU of the leases it ends. Nothing waits for one GPU while
holding another, so no two transitions can wait for each other. Each transition frees its
GPUs in a `finally`, after undoing what it wrote if it failed: so a GPU nobody is changing
is, always, either free at its prior state or held by a lease, never "being written" with
no one writing it.

Fair queuing: requests that cannot be granted now wait in arrival order. A
request is granted when every GPU it asks for is free or held in the state it
wants, and no earlier waiter wants another state on one of them. So a request
for another clock gets its turn once the sharers ahead of it let go (newcomers
for the held state queue behind it), and the sharers queued behind it get
theirs as soon as it ends: neither side starves the other. Turns are taken in
batches: when a state gets the GPU, every request already queued for it goes
too, so each change of state serves all who waited for it. Requests that do not
wait hold no place, so a refusal keeps a turn for its state for TURN_KEPT_S:
requests of another state that come later queue behind it, and those of its
state that come meanwhile go at its place. Without that, a steady trickle of
waiting requests for one clock would keep the GPU from everyone who asks for
the other without waiting. Standing leases neither keep turns nor wait behind
them: they last until restored, so a turn kept against one would never come.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuenv.clocks import Lock, LockPlan, describe_target
from gpuenv.clocks.journal import Applied, Owner
from gpuenv.timebase import REAL_CLOCK, Clock

if TYPE_CHECKING:
    from gpuenv.daemon.auth import Peer

DAEMON_MARK = "via gpuenvd"  # ends the command of every journal owner the daemon writes
# how long a turn kept for requests that do not wait holds its place in the queue
TURN_KEPT_S = 1.0


@dataclass(eq=False)
class Lease:
    """One grant. `lock` is the standing lease's own Lock (None once found again at start)."""

    id: str
    token: str
    uid: int
    user: str
    pid: int
    gpus: tuple[int, ...]
    request: str  # "SM 1350 MHz"
    standing: bool
    label: str | None
    granted_at: float  # epoch seconds
    conn: int | None  # the connection it is tied to; None for standing leases
    command: str = ""
    lock: Lock | None = None
    shared: tuple[int, ...] = ()  # GPUs where it joined an identical lock already held

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "uid": self.uid,
            "user": self.user,
            "pid": self.pid,
            "gpus": list(self.gpus),
            "request": self.request,
            "standing": self.standing,
            "label": self.label,
            "granted_at": self.granted_at,
            "shared": list(self.shared),
        }

    def describe(self) -> str:
        kind = "standing lease" if self.standing else "lease"
        gpus = ",".join(map(str, self.gpus))
        return f"{kind} {self.id} ({self.user}, pid {self.pid}: {self.request} on GPU {gpus})"

    def holder(self) -> str:
        """'alice (pid 42: nightly gemm (python bench.py), since 10:00:03) via gpuenvd'."""
        since = time.strftime("%H:%M:%S", time.localtime(self.granted_at))
        kind = "a standing lease of " if self.standing else ""
        return f"{kind}{self.user} (pid {self.pid}: {self.command}, since {since}) {DAEMON_MARK}"


@dataclass(eq=False)
class Hold:
    """The daemon's lock on one GPU: the state, its leases (oldest first), and the
    journaled owner that stands for the connection leases among them."""

    index: int
    applied: Applied
    leases: dict[str, Lease] = field(default_factory=dict)
    connection_leases: int = 0
    lock: Lock | None = None  # the daemon's own journal owner; None while no connection lease
    batch: int = 0  # waiters queued up to this number when the state got its turn join it

    def add(self, lease: Lease) -> None:
        self.leases[lease.id] = lease
        self.connection_leases += not lease.standing

    def remove(self, lease: Lease) -> None:
        if self.leases.pop(lease.id, None) is not None:
            self.connection_leases -= not lease.standing

    def idle(self) -> bool:
        return not self.leases and self.lock is None

    def holders(self) -> str:
        """The oldest lease, and how many share it."""
        first = next(iter(self.leases.values()), None)
        if first is None:  # seen only while a transition is in flight on the GPU
            return "gpuenvd (writing this GPU's lock now)"
        more = len(self.leases) - 1
        return first.holder() + (
            f" and {more} other lease{'s' if more > 1 else ''}" if more else ""
        )

    def describe(self) -> str:
        """For a conflict message: who holds it, and what."""
        return f"{self.holders()}, holding {describe_target(self.applied)}"


@dataclass(eq=False)
class Waiter:
    """A lock request in the queue (arrival order)."""

    peer: Peer
    plan: LockPlan
    patient: bool = True  # asked to wait: holds its place; one that did not is never "ahead"
    since: float = field(kw_only=True)  # epoch seconds, on the daemon's clock (its wall)
    seq: int = 0  # its place in the queue (HoldTable.enqueue)
    rank: int = 0  # the place it is judged by: its own, or the turn its state was promised
    until: float | None = None  # a turn kept for requests that do not wait, until then
    standing: bool = False  # a standing lease's request (kept turns are for those that end)

    def __post_init__(self) -> None:
        self.applied: dict[int, Applied] = {gp.index: gp.applied for gp in self.plan.gpus}

    def describe(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return (
            f"{self.peer.user} (pid {self.peer.pid}), waiting since {since} for "
            f"{self.plan.request.describe()} {DAEMON_MARK}"
        )


class HoldTable:
    """The holds by GPU, the transitions in flight, and the queue of waiting requests. Every
    method is called under `cond` (the lease manager's), and none of them writes the journal
    or the GPU."""

    def __init__(self, cond: threading.Condition, clock: Clock = REAL_CLOCK):
        self.cond = cond
        self.clock = clock  # of kept turns' ends (the daemon's: virtual in tests)
        self.holds: dict[int, Hold] = {}
        self.queue: list[Waiter] = []
        self._changing: dict[int, str] = {}  # GPU -> the transition in flight on it
        self._seq = 0

    # -- transitions ----------------------------------------------------------------------------

    def changing(self) -> dict[int, str]:
        """The GPUs a transition is writing now, and which ("writing", "releasing", ...)."""
        return dict(self._changing)

    def still(self, gpus: Iterable[int]) -> bool:
        """Is no transition in flight on any of `gpus`?"""
        return not any(gpu in self._changing for gpu in gpus)

    def take(self, gpus: Iterable[int], what: str) -> None:
        """Start a transition on `gpus` (all still: callers wait for `still` first)."""
        gpus = list(gpus)
        if not self.still(gpus):
            raise RuntimeError(f"GPUs {gpus} taken by two transitions at once")
        for gpu in gpus:
            self._changing[gpu] = what

    def free(self, gpus: Iterable[int]) -> None:
        """The transition on `gpus` is over (done or undone): forget the holds it left with
        no lease, and wake everyone who waits."""
        for gpu in gpus:
            self._changing.pop(gpu, None)
            hold = self.holds.get(gpu)
            if hold is not None and hold.idle():
                del self.holds[gpu]
        self.cond.notify_all()

    def enqueue(self, me: Waiter) -> None:
        self._seq += 1
        me.seq = me.rank = self._seq
        if not me.patient:  # a turn kept for its state: it goes at that turn's place
            kept = self._kept(me.applied)
            if kept is not None:
                me.rank = kept.seq
        self.queue.append(me)

    def waiting(self) -> list[Waiter]:
        """The requests in the queue (not the turns kept for requests that do not wait)."""
        return [w for w in self.queue if w.until is None]

    def keep_turn(self, me: Waiter) -> None:
        """`me` did not wait and was refused: keep a turn for its state, so that the
        requests of another state that come later go after it (holds.py says why)."""
        if self._kept(me.applied) is None:
            kept = Waiter(
                me.peer, me.plan, until=self.clock.now() + TURN_KEPT_S, since=self.clock.wall()
            )
            self.enqueue(kept)

    def _kept(self, applied: dict[int, Applied]) -> Waiter | None:
        now = self.clock.now()
        expired = [w for w in self.queue if w.until is not None and w.until <= now]
        for w in expired:
            self.queue.remove(w)
        if expired:
            self.cond.notify_all()
        return next((w for w in self.queue if w.until is not None and w.applied == applied), None)

    def occupied(self, plan: LockPlan) -> bool:
        """Is every GPU `plan` names held by a lease (in any state) and settled? A request
        then shares on the plan, or is refused or queued on it; it writes only once its
        GPUs are free, and the lock reads their state again unless the plan's read is fresh
        and saw no lock (clocks.locks._original): a plan made once serves it meanwhile."""
        return all(gp.index in self.holds and gp.index not in self._changing for gp in plan.gpus)

    def blocker(self, me: Waiter) -> tuple[int, str, bool, bool] | None:
        """What keeps `me` from its GPUs now (gpu, who, transient?, only a kept turn?), or
        None. A holder or a waiting request is named before a kept turn: a request refused
        by kept turns alone keeps none of its own (leases.py), else two clocks asked for in
        turn without waiting refuse each other for ever, each refusal keeping a turn that
        refuses the next, with the GPU free."""
        kept: tuple[int, str, bool, bool] | None = None
        now = self.clock.now()
        for gpu, want in me.applied.items():
            hold = self.holds.get(gpu)
            if hold is not None and hold.leases and hold.applied != want:
                return gpu, hold.describe(), False, False
            if gpu in self._changing:  # being written: wait anyway (milliseconds)
                return gpu, self._describe_change(gpu), True, False
            if hold is not None and me.rank <= hold.batch:
                continue  # it waited for this state's turn: it goes with the batch
            for waiter in self.queue:
                if waiter.seq >= me.rank:
                    break
                if not waiter.patient:
                    continue
                if waiter.until is not None and (waiter.until <= now or me.standing):
                    continue  # over; or a standing request, which a kept turn never holds up
                other = waiter.applied.get(gpu)
                if other is not None and other != want:
                    # first come, first served: joining the state held now must not starve
                    # an earlier request that waits to change it
                    if waiter.until is None:
                        return gpu, waiter.describe(), False, False
                    kept = kept or (gpu, waiter.describe(), False, True)
        return kept

    def _describe_change(self, gpu: int) -> str:
        hold = self.holds.get(gpu)
        if hold is not None and hold.leases:
            return hold.describe()
        return f"gpuenvd ({self._changing[gpu]} this GPU's lock now)"

    def reserve(self, lease: Lease, me: Waiter) -> list[int]:
        """Our turn (no blocker, so none of our GPUs is changing): make the holds; return the
        GPUs whose journal must be written: where no connection lease holds the state yet, or
        all for a standing lease. When there are any, the grant takes every GPU it names,
        those it only shares too, until it is recorded or undone (`free`). An empty list
        means sharing: nothing to write, the O(1) path, recorded at once by the caller."""
        writes = []
        for gp in me.plan.gpus:
            hold = self.holds.get(gp.index)
            if hold is None:
                # a new turn: every request queued now for this state goes with it
                hold = self.holds[gp.index] = Hold(gp.index, gp.applied, batch=self._seq)
            if lease.standing or hold.lock is None:
                writes.append(gp.index)
        if writes:
            self.take(lease.gpus, "writing")
        return writes

    def attach(self, lease: Lease, me: Waiter, made: dict[int, Lock]) -> None:
        """The lease is granted: it joins its holds and leaves the queue. Every hold is
        looked up before any is changed: a lease joins all its GPUs or none."""
        holds = [self.holds[gpu] for gpu in lease.gpus]
        shared = []
        for hold in holds:
            if hold.index in made:
                hold.lock = made[hold.index]
            elif hold.leases:
                shared.append(hold.index)
            hold.add(lease)
        lease.shared = tuple(shared)
        # Granted, it leaves the queue waking no one: a request it held up wants another
        # state on one of its GPUs, which its lease now holds. (Waking every waiter on each
        # grant cost a burst of wake-ups per lease when many waited: each woke, found
        # itself still blocked, and slept again.)
        if me in self.queue:
            self.queue.remove(me)

    def leave(self, me: Waiter) -> None:
        """`me` leaves the queue without a grant (refused, timed out, gone): those queued
        behind it may go now."""
        if me in self.queue:
            self.queue.remove(me)
            self.cond.notify_all()

    def detach(self, lease: Lease) -> tuple[list[Lock], list[int]]:
        """The lease ends (none of its GPUs changing: the caller waited for `still`): the
        daemon owners to release (it was the last connection lease of its state), and the
        GPUs whose release must be written, which the caller takes before it lets go of the
        lock. Holds left with nothing to write and no lease are forgotten at once."""
        locks: list[Lock] = []
        writes: list[int] = []
        for gpu in lease.gpus:
            hold = self.holds.get(gpu)
            if hold is None:
                continue
            hold.remove(lease)
            last = hold.connection_leases == 0 and hold.lock is not None
            if last:
                locks.append(hold.lock)  # type: ignore[arg-type]
                hold.lock = None
            if last or lease.standing:
                writes.append(gpu)
            elif hold.idle():
                del self.holds[gpu]
        return locks, writes

    def adopt(self, lease: Lease, index: int, applied: Applied) -> None:
        hold = self.holds.get(index)
        if hold is None:
            hold = self.holds[index] = Hold(index, applied)
        hold.add(lease)


def daemon_owner(request: str, pid: int, start: float | None, now: float) -> Owner:
    """The journal owner that stands for the daemon's connection leases on one GPU (`now`:
    epoch seconds, the daemon clock's wall)."""
    return Owner(
        token=uuid.uuid4().hex,
        kind="lease",
        pid=pid,
        pid_start=start,
        uid=os.geteuid(),
        user="gpuenvd",
        command=f"connection leases ('gpuenv daemon leases' lists them) {DAEMON_MARK}",
        started_at=now,
        request=request,
        watchdog_pid=pid,
        watchdog_start=start,
    )


def standing_owner(
    token: str, peer: Peer, pid_start: float | None, command: str, request: str, now: float
) -> Owner:
    """A standing lease's own journal owner: the client's identity; no watchdog (`now`:
    epoch seconds, the daemon clock's wall)."""
    return Owner(
        token=token,
        kind="standing",
        pid=peer.pid,
        pid_start=pid_start,
        uid=peer.uid,
        user=peer.user,
        command=f"{command} {DAEMON_MARK}",
        started_at=now,
        request=request,
    )


def command_of(pid: int) -> str | None:
    """The client's command line, shortened, for the journal and for conflict messages."""
    try:
        import shlex

        import psutil

        argv = psutil.Process(pid).cmdline()
    except Exception:
        return None
    if not argv:
        return None
    argv = [os.path.basename(argv[0]), *argv[1:]]
    text = shlex.join(argv)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= 100 else text[:97] + "..."


def owner_dict(o: Owner) -> dict[str, Any]:
    return {
        "user": o.user,
        "uid": o.uid,
        "pid": o.pid,
        "kind": o.kind,
        "command": o.command,
        "since": o.started_at,
        "request": o.request,
        "alive": o.alive(),
    }
