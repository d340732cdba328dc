"""Leases: clock locks the daemon holds on behalf of its clients.

A lease is a `gpuenv.clocks.Lock` taken by the daemon with the client as its
journaled owner (kind "lease", the client's pid, uid and user; the daemon as
its watchdog), so everything clocks.py guarantees holds here too: the original
state is journaled before anything changes, an identical lock is shared and
counted (the last one out restores), a different one is refused with the
holder named, and multi-GPU locks are all or nothing. This module adds only
what the daemon needs on top:

  - who may do what (auth.Authorizer: lock these GPUs, release that lease);
  - the tie to a connection: when it closes, its leases end (`drop`);
  - waiting for a conflicting lease to end (`wait` seconds), first come, first
    served: while a request waits to change a GPU's state, newcomers that would
    share the state held now are refused, so the waiting one is not starved;
  - standing leases (kind "standing", owned by the client's uid) that outlive
    the connection and the daemon itself: `recover` finds them again in the
    journal at start, and puts back any GPU whose owners are all gone;
  - one log line per grant, release and refusal.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.backend import Backend
from gpuenv.clocks import Lock, LockPlan, lock_status, make_request, plan_lock, release_owner
from gpuenv.clocks import restore as clocks_restore
from gpuenv.clocks.journal import Journal, Owner, process_start_time
from gpuenv.daemon.auth import Authorizer, Peer
from gpuenv.errors import ConfigError, GpuenvError, LockConflict

log = logging.getLogger("gpuenv.daemon")

# a waiting lock re-checks this often (a holder outside the daemon sends no event)
WAIT_POLL_S = 0.1
MAX_LEASES_PER_CONNECTION = 64


@dataclass
class Lease:
    """One grant. `lock` is None for a standing lease found again in the journal at start."""

    id: str
    token: str  # the journal owner token
    uid: int
    user: str
    pid: int
    gpus: tuple[int, ...]
    request: str  # "SM 1350 MHz"
    standing: bool
    label: str | None
    granted_at: float  # epoch seconds
    conn: int | None  # the connection it is tied to; None for standing leases
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


@dataclass(eq=False)
class _Waiter:
    """A lock request waiting for its GPUs (queued in arrival order)."""

    seq: int
    peer: Peer
    plan: LockPlan
    since: float  # epoch seconds

    @property
    def applied(self) -> dict[int, Any]:
        return {gp.index: gp.applied for gp in self.plan.gpus}

    def describe(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return (
            f"{self.peer.user} (pid {self.peer.pid}), waiting since {since} for "
            f"{self.plan.request.describe()}"
        )


class LeaseManager:
    """The daemon's leases; every public method is safe to call from any connection thread."""

    def __init__(self, backend: Backend, journal: Journal, auth: Authorizer):
        self.backend = backend
        self.journal = journal
        self.auth = auth
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._leases: dict[str, Lease] = {}
        self._peers: dict[int, tuple[float | None, str | None]] = {}  # conn -> (start, command)
        self._cond = threading.Condition()
        self._changes = 0  # bumped on every release: waiting grants retry
        self._waiters: list[_Waiter] = []  # lock requests waiting, in arrival order
        self._seq = itertools.count()
        self._pid = os.getpid()
        self._start = process_start_time(self._pid)
        self._grants = 0
        self._releases = 0
        self._refusals = 0

    # -- queries --------------------------------------------------------------------------------

    def leases(self) -> list[Lease]:
        with self._cond:
            return list(self._leases.values())

    def get(self, lease_id: str) -> Lease:
        with self._cond:
            lease = self._leases.get(lease_id)
        if lease is None:
            raise ConfigError(
                f"no lease {lease_id!r}", hint="'gpuenv status' lists the leases held now"
            )
        return lease

    def counters(self) -> dict[str, int]:
        with self._cond:
            standing = sum(1 for lease in self._leases.values() if lease.standing)
            return {
                "grants": self._grants,
                "releases": self._releases,
                "refusals": self._refusals,
                "leases_standing": standing,
                "leases_connection": len(self._leases) - standing,
            }

    def summary(self) -> list[dict[str, Any]]:
        return [
            {"id": lease.id, "user": lease.user, "gpus": list(lease.gpus), "request": lease.request}
            for lease in self.leases()
        ]

    def gpu_status(self, index: int) -> dict[str, Any]:
        """The lock on one GPU as clocks.lock_status sees it, its owners, and our leases on it."""
        status = lock_status(self.backend, index, self.journal)
        entry = self.journal.get(self.backend.device_info(index).uuid)
        owners = [
            {"user": o.user, "uid": o.uid, "pid": o.pid, "kind": o.kind, "command": o.command,
             "since": o.started_at, "request": o.request, "alive": o.alive()}
            for o in (entry.owners if entry is not None else ())
        ]  # fmt: skip
        return {
            "locked": bool(status.locked),
            "lock": status.describe(),
            "range_mhz": list(status.range) if status.range else None,
            "holds": status.holds,
            "owners": owners,
            "leases": [lease.id for lease in self.leases() if index in lease.gpus],
        }

    def lock_range(self, index: int) -> tuple[int, int] | None:
        """The locked SM range on a GPU (from the journal), for telemetry windows."""
        entry = self.journal.get(self.backend.device_info(index).uuid)
        if entry is None:
            return None
        if entry.applied.locked_sm is not None:
            lo, hi = entry.applied.locked_sm
            if lo > 100_000:  # symbolic base clock
                base = self.backend.clock_limits(index).base_sm_mhz
                return (base, base) if base is not None else None
            return (lo, hi)
        if entry.applied.app_clocks is not None:
            return (entry.applied.app_clocks[1], entry.applied.app_clocks[1])
        return None

    # -- grant ----------------------------------------------------------------------------------

    def grant(
        self,
        peer: Peer,
        conn: int | None,
        gpus: list[int],
        *,
        sm: int | tuple[int, int] | str | None = None,
        sm_max: int | None = None,
        mem: int | tuple[int, int] | None = None,
        power_limit_w: float | None = None,
        standing: bool = False,
        wait: float = 0.0,
        label: str | None = None,
        hangup: Callable[[], bool] = lambda: False,
    ) -> Lease:
        """Lock `gpus` for `peer`; raise PermissionDenied, ConfigError, or LockConflict naming
        the holder (after waiting up to `wait` seconds for it to end)."""
        try:
            self.auth.check_lock(peer, gpus)
            request = make_request(sm, sm_max=sm_max, mem=mem, power_limit_w=power_limit_w)
            if conn is not None and not standing:
                with self._cond:
                    held = sum(1 for lease in self._leases.values() if lease.conn == conn)
                if held >= MAX_LEASES_PER_CONNECTION:
                    raise ConfigError(
                        f"this connection already holds {held} leases", hint="release some first"
                    )
            plan = plan_lock(self.backend, request, gpus, journal=self.journal)
            lease = self._acquire(
                peer, conn, plan, standing=standing, wait=wait, label=label, hangup=hangup
            )
        except GpuenvError as err:
            with self._cond:
                self._refusals += 1
            log.warning("refused %s: lock %s: %s", peer.describe(), _gpu_list(gpus), err)
            raise
        log.info(
            "granted %s to %s%s", lease.describe(), peer.describe(), f" [{label}]" if label else ""
        )
        self._notify("granted", lease)
        return lease

    def _acquire(
        self,
        peer: Peer,
        conn: int | None,
        plan: LockPlan,
        *,
        standing: bool,
        wait: float,
        label: str | None,
        hangup: Callable[[], bool],
    ) -> Lease:
        deadline = time.monotonic() + wait
        owner = self._owner(peer, conn, plan, standing=standing, label=label)
        me = _Waiter(next(self._seq), peer, plan, time.time())
        try:
            while True:
                with self._cond:
                    seen = self._changes
                    ahead = self._ahead_of(me)
                try:
                    if ahead is not None:
                        # first come, first served: a request that joins the lock held now
                        # must not starve one that waits to change it
                        gpu, waiter = ahead
                        raise LockConflict(gpu, waiter.describe())
                    lk = Lock(
                        self.backend,
                        plan,
                        self.journal,
                        kind=owner.kind,
                        supervise=False,  # the daemon itself is the watchdog
                        owner=owner,  # the client, not the daemon process
                    )
                    break
                except LockConflict as err:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        # --force is not the daemon's to give: say what a client can do
                        raise LockConflict(
                            err.gpu if err.gpu is not None else "?",
                            err.owner,
                            hint="wait for it to end (lock with a wait), or ask for the same "
                            "state to share it",
                        ) from None
                    if hangup():
                        raise ConfigError(
                            "the client went away while waiting for the lock"
                        ) from None
                    with self._cond:
                        if me not in self._waiters:
                            self._waiters.append(me)
                        if self._changes == seen:
                            self._cond.wait(min(left, WAIT_POLL_S))
        finally:
            with self._cond:
                if me in self._waiters:
                    self._waiters.remove(me)
                    self._changes += 1  # those queued behind it may go now
                    self._cond.notify_all()
        if not standing:
            # clocks.Lock releases at interpreter exit; the daemon ends leases itself
            atexit.unregister(lk.release)
        lease = Lease(
            id=owner.token[:12],
            token=owner.token,
            uid=peer.uid,
            user=peer.user,
            pid=peer.pid,
            gpus=tuple(lk.gpus),
            request=plan.request.describe(),
            standing=standing,
            label=label,
            granted_at=owner.started_at,
            conn=None if standing else conn,
            lock=lk,
            shared=tuple(lk.shared),
        )
        with self._cond:
            self._leases[lease.id] = lease
            self._grants += 1
        return lease

    def _ahead_of(self, me: _Waiter) -> tuple[int, _Waiter] | None:
        """An earlier waiter that wants a different state on one of my GPUs (under _cond)."""
        for waiter in self._waiters:
            if waiter.seq >= me.seq:
                break
            for gpu, applied in me.applied.items():
                if gpu in waiter.applied and waiter.applied[gpu] != applied:
                    return gpu, waiter
        return None

    def _owner(
        self, peer: Peer, conn: int | None, plan: LockPlan, *, standing: bool, label: str | None
    ) -> Owner:
        """The journal's owner record: the client's identity; the daemon watches over it."""
        # Built directly, not from Owner.current(): every field that describes a process is
        # the client's, so looking the daemon itself up (psutil, pwd) on each lock was wasted.
        # A connection's peer never changes: look its process up once (psutil costs ~1 ms).
        with self._cond:
            known = self._peers.get(conn) if conn is not None else None
        if known is None:
            known = (process_start_time(peer.pid), _command_of(peer.pid))
            if conn is not None:
                with self._cond:
                    self._peers[conn] = known
        pid_start, command = known
        if label:
            command = f"{label} ({command})" if command else label
        return Owner(
            token=uuid.uuid4().hex,
            kind="standing" if standing else "lease",
            pid=peer.pid,
            pid_start=pid_start,
            uid=peer.uid,
            user=peer.user,
            command=f"{command or 'pid ' + str(peer.pid)} via gpuenvd",
            started_at=time.time(),
            request=plan.request.describe(),
            watchdog_pid=None if standing else self._pid,
            watchdog_start=None if standing else self._start,
        )

    # -- release --------------------------------------------------------------------------------

    def release(self, peer: Peer, lease_id: str, *, reason: str = "released") -> Lease:
        """End one lease (its owner, or an admin); the GPUs go back unless a lease shares them."""
        lease = self.get(lease_id)
        try:
            self.auth.check_release(peer, lease.uid, lease.user, f"lease {lease_id}")
        except GpuenvError as err:
            with self._cond:
                self._refusals += 1
            log.warning("refused %s: release %s: %s", peer.describe(), lease_id, err)
            raise
        by = "" if peer.uid == lease.uid else f" by {peer.describe()}"
        self._end(lease, f"{reason}{by}")
        return lease

    def drop(self, conn: int, *, reason: str = "connection closed") -> list[Lease]:
        """End every non-standing lease of a connection (it closed)."""
        with self._cond:
            mine = [lease for lease in self._leases.values() if lease.conn == conn]
            self._peers.pop(conn, None)
        for lease in mine:
            self._end(lease, reason)
        return mine

    def restore(self, peer: Peer, gpus: list[int], *, all_owners: bool = False) -> list[int]:
        """`gpuenv restore` through the daemon.

        A user ends their own standing leases on `gpus` (with `all_owners`, their
        connection leases too). An admin with `all_owners` ends every lease on
        them and puts back any other gpuenv lock (clocks.restore(all_owners=True));
        without it, every standing lease on them. Returns the GPUs put back.
        """
        admin = self.auth.is_admin(peer)
        wanted = set(gpus)
        with self._cond:
            chosen = [
                lease
                for lease in self._leases.values()
                if wanted & set(lease.gpus)
                and (admin or lease.uid == peer.uid)
                and (lease.standing or all_owners)
            ]
        before = self._locked(gpus)
        for lease in chosen:
            self._end(lease, f"restored by {peer.describe()}")
        if admin:
            # and what the daemon does not hold: standing locks made as root, stale locks;
            # a live process's lock only with all_owners (else LockConflict names it)
            try:
                clocks_restore(
                    gpus, backend=self.backend, journal=self.journal, all_owners=all_owners
                )
            finally:
                log.info(
                    "%s restored GPUs %s%s",
                    peer.describe(),
                    _gpu_list(gpus),
                    " (all owners)" if all_owners else "",
                )
        after = self._locked(gpus)
        return sorted(before - after)

    def _locked(self, gpus: list[int]) -> set[int]:
        return {i for i in gpus if self.journal.get(self.backend.device_info(i).uuid) is not None}

    def _end(self, lease: Lease, reason: str) -> None:
        with self._cond:
            if self._leases.pop(lease.id, None) is None:
                return  # ended by another thread meanwhile
        try:
            if lease.lock is not None:
                done = lease.lock.release()
            else:
                done = release_owner(self.backend, self.journal, lease.token)
        except GpuenvError as err:
            log.error(
                "%s ended (%s) but restoring failed: %s; 'gpuenv restore' retries",
                lease.describe(),
                reason,
                err,
            )
            done = []
        finally:
            with self._cond:
                self._releases += 1
                self._changes += 1
                self._cond.notify_all()
        log.info(
            "released %s: %s%s", lease.describe(), reason, f" ({'; '.join(done)})" if done else ""
        )
        self._notify("released", lease)

    def _notify(self, kind: str, lease: Lease) -> None:
        info = lease.to_dict()
        for listener in list(self.listeners):
            try:
                listener(kind, info)
            except Exception:
                log.exception("lease event listener failed")

    # -- start and stop ---------------------------------------------------------------------------

    def recover(self) -> list[int]:
        """At daemon start: find standing leases again, and put back every GPU whose
        owners are all gone (connection leases of a daemon that died, processes whose
        watchdog died too). Returns the GPUs restored."""
        indices = {self.backend.device_info(i).uuid: i for i in range(self.backend.device_count())}
        restored: list[int] = []
        with self.journal.locked():
            entries, damaged = self.journal.scan()
            for bad in damaged:  # each GPU alone: the others are still recovered
                if bad.uuid in indices:
                    log.error("recovery: GPU %d: %s: %s", indices[bad.uuid], bad.message, bad.hint)
            for entry in entries:
                index = indices.get(entry.uuid)
                if index is None or entry.backend != self.backend.name:
                    continue  # another machine's GPU, or a simulated GPU's journal
                # a connection lease dies with the daemon that held it (its "watchdog")
                gone = [
                    o
                    for o in entry.owners
                    if not o.alive() or (o.kind == "lease" and not o.watchdog_alive())
                ]
                try:
                    for owner in gone:
                        log.warning(
                            "recovery: GPU %d: owner %s is gone; releasing its lock",
                            index,
                            owner.describe(),
                        )
                        release_owner(self.backend, self.journal, owner.token)
                    if not entry.owners:
                        # nobody owns it (a rollback that failed): put it back as restore would
                        clocks_restore([index], backend=self.backend, journal=self.journal)
                except GpuenvError as err:  # serve anyway: the entry stays for 'gpuenv restore'
                    log.error("recovery: GPU %d could not be restored: %s", index, err)
                    continue
                if (gone or not entry.owners) and self.journal.get(entry.uuid) is None:
                    restored.append(index)
            for entry in self.journal.entries():
                index = indices.get(entry.uuid)
                if index is None or entry.backend != self.backend.name:
                    continue
                for owner in entry.owners:
                    if owner.kind == "standing" and owner.command.endswith("via gpuenvd"):
                        self._adopt(owner, index)
        return sorted(restored)

    def _adopt(self, owner: Owner, index: int) -> None:
        lease_id = owner.token[:12]
        with self._cond:
            lease = self._leases.get(lease_id)
            if lease is not None:
                lease.gpus = tuple(sorted({*lease.gpus, index}))
                return
            self._leases[lease_id] = Lease(
                id=lease_id,
                token=owner.token,
                uid=owner.uid,
                user=owner.user,
                pid=owner.pid,
                gpus=(index,),
                request=owner.request,
                standing=True,
                label=None,
                granted_at=owner.started_at,
                conn=None,
            )
        log.info(
            "recovery: standing lease %s of %s on GPU %d is still held", lease_id, owner.user, index
        )


def _command_of(pid: int) -> str | None:
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


def _gpu_list(gpus: list[int]) -> str:
    return "GPU " + ",".join(map(str, gpus)) if gpus else "no GPU"
