"""Leases: clock locks the daemon holds on behalf of its clients.

Everything clocks.py guarantees holds here too (the original state journaled
before anything changes, multi-GPU locks all or nothing, exact restore), with
the journal's owner on each GPU being the daemon (holds.py says why, and how
sharing stays O(1) and the queue fair). This module adds:

  - who may do what (auth.Authorizer: lock these GPUs, release that lease);
  - the tie to a connection: when it closes, its leases end (`drop`). A lease is
    owned by its connection, never judged by the client's pid;
  - waiting for a conflicting lease to end (`wait` seconds), in arrival order;
  - standing leases that outlive the connection and the daemon (recovery.py
    finds them again at start);
  - one log line per grant, release and refusal.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuenv.backend import Backend
from gpuenv.clocks import (
    Lock,
    LockPlan,
    LockRequest,
    lock_status,
    plan_lock,
    release_owner,
)
from gpuenv.clocks import restore as clocks_restore
from gpuenv.clocks.journal import Applied, Journal, Owner, process_start_time
from gpuenv.clocks.locks import STATE_FRESH_S
from gpuenv.daemon.auth import Authorizer, Peer
from gpuenv.daemon.holds import (
    DAEMON_MARK,
    HoldTable,
    Lease,
    Waiter,
    command_of,
    daemon_owner,
    owner_dict,
    standing_owner,
)
from gpuenv.errors import ConfigError, GpuenvError, LockConflict
from gpuenv.timebase import REAL_CLOCK, Clock, wait_on

log = logging.getLogger("gpuenv.daemon")

# a waiting lock re-checks this often (a holder outside the daemon sends no event)
WAIT_POLL_S = 0.1
# how long any request waits for a GPU whose lock is being written right now (milliseconds,
# normally), even one that asked not to wait
BUSY_WAIT_S = 30.0
MAX_LEASES_PER_CONNECTION = 64


class LeaseManager:
    """The daemon's leases; every public method is safe to call from any connection thread."""

    def __init__(
        self, backend: Backend, journal: Journal, auth: Authorizer, clock: Clock = REAL_CLOCK
    ):
        self.backend = backend
        self.journal = journal
        self.auth = auth
        self.clock = clock  # of every wait (the daemon's: virtual in tests)
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._leases: dict[str, Lease] = {}
        self._by_conn: dict[int, dict[str, Lease]] = {}
        self._peers: dict[int, tuple[float | None, str]] = {}  # conn -> (start, command)
        # plans by request, with when each was made (the backend's clock): _plan
        self._plans: dict[tuple[LockRequest, tuple[int, ...]], tuple[LockPlan, float]] = {}
        self._cond = threading.Condition()
        self._table = HoldTable(self._cond, clock)  # holds by GPU, and the queue
        self._pid = os.getpid()
        self._start = process_start_time(self._pid)
        self._uuids = [backend.device_info(i).uuid for i in range(backend.device_count())]
        self._grants = 0
        self._releases = 0
        self._refusals = 0

    # -- queries --------------------------------------------------------------------------------

    def leases(self) -> list[Lease]:
        with self._cond:
            return list(self._leases.values())

    def held_by(self, conn: int) -> int:
        """How many leases connection `conn` holds."""
        with self._cond:
            return len(self._by_conn.get(conn, ()))

    def waiting(self) -> list[Waiter]:
        with self._cond:
            return self._table.waiting()

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
                "waiting": len(self._table.waiting()),
            }

    def summary(self) -> list[dict[str, Any]]:
        return [
            {"id": lease.id, "user": lease.user, "gpus": list(lease.gpus), "request": lease.request}
            for lease in self.leases()
        ]

    def gpu_status(self, index: int) -> dict[str, Any]:
        """The lock on one GPU (clocks.lock_status, its holders named), owners and leases."""
        status = lock_status(self.backend, index, self.journal)
        entry = self.journal.get(self._uuids[index])
        with self._cond:
            hold = self._table.holds.get(index)
            held = list(hold.leases.values()) if hold is not None else []
            who = hold.holders() if hold is not None and held else None
            mine = hold.lock.token if hold is not None and hold.lock is not None else None
        owners = [owner_dict(o) for o in (entry.owners if entry else ()) if o.token != mine]
        owners += [
            {
                "user": lease.user,
                "uid": lease.uid,
                "pid": lease.pid,
                "kind": "lease",
                "command": f"{lease.command} {DAEMON_MARK}",
                "since": lease.granted_at,
                "request": lease.request,
                "alive": True,
            }
            for lease in held
            if not lease.standing
        ]
        if who is not None:
            status = replace(status, owner=who)
        return {
            "locked": bool(status.locked),
            "lock": status.describe(),
            "range_mhz": list(status.range) if status.range else None,
            "holds": status.holds,
            "owners": owners,
            "leases": [lease.id for lease in held],
        }

    def lock_range(self, index: int) -> tuple[int, int] | None:
        """The locked SM range on a GPU, for telemetry windows."""
        with self._cond:
            hold = self._table.holds.get(index)
        if hold is not None:
            applied = hold.applied
        else:
            entry = self.journal.get(self._uuids[index])
            if entry is None:
                return None
            applied = entry.applied
        if applied.locked_sm is not None:
            lo, hi = applied.locked_sm
            if lo > 100_000:  # symbolic base clock
                base = self.backend.clock_limits(index).base_sm_mhz
                return (base, base) if base is not None else None
            return (lo, hi)
        if applied.app_clocks is not None:
            return (applied.app_clocks[1], applied.app_clocks[1])
        return None

    # -- grant ----------------------------------------------------------------------------------

    def grant(
        self,
        peer: Peer,
        conn: int | None,
        gpus: list[int],
        request: LockRequest,
        *,
        standing: bool = False,
        wait: float = 0.0,
        label: str | None = None,
        hangup: Callable[[], bool] = lambda: False,
    ) -> Lease:
        """Lock `gpus` for `peer` as `request` asks; raise PermissionDenied, ConfigError, or
        LockConflict naming the holder (after waiting up to `wait` seconds for it to end)."""
        try:
            self.auth.check_lock(peer, gpus)
            if conn is not None and not standing:
                with self._cond:
                    held = len(self._by_conn.get(conn, ()))
                if held >= MAX_LEASES_PER_CONNECTION:
                    raise ConfigError(
                        f"this connection already holds {held} leases", hint="release some first"
                    )
            plan = self._plan(request, gpus)
            lease, owner = self._new_lease(peer, conn, plan, standing=standing, label=label)
            me = Waiter(peer, plan, wait > 0, standing=standing, since=self.clock.wall())
            self._acquire(lease, owner, me, wait=wait, hangup=hangup)
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

    def _plan(self, request: LockRequest, gpus: list[int]) -> LockPlan:
        """clocks.plan_lock, or the plan already made for this request: while leases hold
        every GPU it names, in its state (a sharer) or another (a request refused or
        queued: under mixed load, most of them), and for STATE_FRESH_S after it was made
        whatever the GPUs' state (clients that lock and release in turn find the GPU free
        each time). Planning reads the GPU and the journal: ~0.3 ms on an idle machine,
        most of what a shared lock or a refusal costs. A reused plan is as safe as a fresh
        one: what it validated and snapped does not change, and its read of the GPU's
        state is journaled as the original only while under STATE_FRESH_S old and taken
        with no lock held (clocks.locks._original reads the state again otherwise)."""
        key = (request, tuple(gpus))
        now = self.backend.clock.now()
        with self._cond:
            kept = self._plans.get(key)
            if kept is not None:
                plan, made = kept
                if now - made < STATE_FRESH_S or self._table.occupied(plan):
                    return plan
        plan = plan_lock(self.backend, request, gpus, journal=self.journal)
        with self._cond:
            if len(self._plans) >= 256:
                self._plans.clear()
            self._plans[key] = (plan, now)
        return plan

    def _new_lease(
        self, peer: Peer, conn: int | None, plan: LockPlan, *, standing: bool, label: str | None
    ) -> tuple[Lease, Owner | None]:
        """The lease record, and a standing lease's own journal owner."""
        # A connection's peer never changes: look its process up once (psutil costs ~1 ms).
        with self._cond:
            known = self._peers.get(conn) if conn is not None else None
        if known is None:
            known = (process_start_time(peer.pid), command_of(peer.pid) or f"pid {peer.pid}")
            if conn is not None:
                with self._cond:
                    self._peers[conn] = known
        command = f"{label} ({known[1]})" if label else known[1]
        token = uuid.uuid4().hex
        lease = Lease(
            id=token[:12],
            token=token,
            uid=peer.uid,
            user=peer.user,
            pid=peer.pid,
            gpus=tuple(gp.index for gp in plan.gpus),
            request=plan.request.describe(),
            standing=standing,
            label=label,
            granted_at=self.clock.wall(),
            conn=None if standing else conn,
            command=command,
        )
        if not standing:
            return lease, None
        return lease, standing_owner(
            token, peer, known[0], command, lease.request, self.clock.wall()
        )

    def _acquire(
        self,
        lease: Lease,
        owner: Owner | None,
        me: Waiter,
        *,
        wait: float,
        hangup: Callable[[], bool],
    ) -> None:
        """Queue, wait for our turn, reserve the GPUs, then write what needs writing."""
        clock = self.clock
        deadline = clock.now() + wait
        busy_deadline = clock.now() + max(wait, BUSY_WAIT_S)
        with self._cond:
            self._table.enqueue(me)
        try:
            while True:
                with self._cond:
                    while True:
                        blocker = self._table.blocker(me)
                        if blocker is None:
                            break
                        gpu, who, busy, kept_turn = blocker
                        now = clock.now()
                        if now >= (busy_deadline if busy else deadline):
                            if not (me.patient or busy or lease.standing or kept_turn):
                                self._table.keep_turn(me)  # a standing lease never drains
                            raise LockConflict(gpu, who, hint=_WAIT_HINT)
                        if hangup():
                            raise ConfigError("the client went away while waiting for the lock")
                        left = (busy_deadline if busy else deadline) - now
                        wait_on(self._cond, clock, min(left, WAIT_POLL_S))
                    writes = self._table.reserve(lease, me)
                    if not writes:  # sharing: nothing to write, recorded at once
                        self._granted(lease, me, {})
                        return
                try:
                    self._write(lease, owner, me, writes)
                    return
                except LockConflict as err:  # a lock the daemon does not hold (a local root one)
                    if clock.now() >= deadline:
                        raise LockConflict(
                            err.gpu if err.gpu is not None else "?", err.owner, hint=_WAIT_HINT
                        ) from None
                    if hangup():
                        raise ConfigError(
                            "the client went away while waiting for the lock"
                        ) from None
                    clock.sleep(min(WAIT_POLL_S, max(0.0, deadline - clock.now())))
        finally:
            with self._cond:
                self._table.leave(me)

    def _granted(self, lease: Lease, me: Waiter, made: dict[int, Lock]) -> None:
        """Under _cond: the lease is granted."""
        self._table.attach(lease, me, made)
        self._leases[lease.id] = lease
        if lease.conn is not None:
            self._by_conn.setdefault(lease.conn, {})[lease.id] = lease
        self._grants += 1

    def _write(self, lease: Lease, owner: Owner | None, me: Waiter, writes: list[int]) -> None:
        """Journal and apply, outside _cond, with every GPU of the lease taken (reserve): a
        daemon owner on each GPU in `writes`, or a standing lease's own owner on all its
        GPUs. All or nothing: whatever fails, what was written is undone and the GPUs are
        free again before this returns."""
        made: dict[int, Lock] = {}
        try:
            if owner is not None:
                lease.lock = self._lock(me.plan, owner)
            else:
                for gp in me.plan.gpus:
                    if gp.index in writes:
                        made[gp.index] = self._lock(LockPlan(me.plan.request, (gp,)), None)
            with self._cond:
                self._granted(lease, me, made)
        except BaseException:
            self._undo(lease, made)
            raise
        finally:
            with self._cond:
                self._table.free(lease.gpus)

    def _undo(self, lease: Lease, made: dict[int, Lock]) -> None:
        """A grant failed after writing some GPUs: put them back (a failed undo is logged,
        and its journal record stays for 'gpuenv restore')."""
        locks = list(made.values()) + ([lease.lock] if lease.lock is not None else [])
        lease.lock = None
        for lk in locks:
            try:
                lk.release()
            except GpuenvError as err:
                log.error("undoing %s failed: %s; 'gpuenv restore' retries", lease.describe(), err)

    def _lock(self, plan: LockPlan, owner: Owner | None) -> Lock:
        standing = owner is not None
        lk = Lock(
            self.backend,
            plan,
            self.journal,
            kind="standing" if standing else "lease",
            supervise=False,  # the daemon itself is the watchdog
            owner=owner
            or daemon_owner(plan.request.describe(), self._pid, self._start, self.clock.wall()),
        )
        if not standing:
            atexit.unregister(lk.release)  # the daemon ends its locks itself
        return lk

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
            mine = list(self._by_conn.get(conn, {}).values())
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

        One transition: it waits until no grant or release is in flight on the GPUs it
        touches, and takes them until it is done, so that no lease is granted between
        the leases it ends and the restore, nor restored from under a grant.
        """
        admin = self.auth.is_admin(peer)
        wanted = set(gpus)
        reason = f"restored by {peer.describe()}"
        with self._cond:
            while True:
                chosen = [
                    lease
                    for lease in self._leases.values()
                    if wanted & set(lease.gpus)
                    and (admin or lease.uid == peer.uid)
                    and (lease.standing or all_owners)
                ]
                taken = (wanted if admin else set()).union(*(lease.gpus for lease in chosen))
                if self._table.still(taken):
                    break
                self._cond.wait(WAIT_POLL_S)
            self._table.take(taken, "restoring")
            ended = [
                (lease, self._table.detach(lease)[0]) for lease in chosen if self._forget(lease)
            ]
        try:
            before = self._locked(gpus)
            for lease, locks in ended:
                self._let_go(lease, locks, reason)
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
        finally:
            with self._cond:
                self._table.free(taken)
        for lease, _ in ended:
            self._notify("released", lease)
        return sorted(before - after)

    def _locked(self, gpus: list[int]) -> set[int]:
        return {i for i in gpus if self.journal.get(self._uuids[i]) is not None}

    def _end(self, lease: Lease, reason: str) -> None:
        """Forget the lease; write the journal only where it was the last of its kind. Waits
        for any transition in flight on its GPUs first (a grant that shares one of them
        joins before it is judged the last)."""
        with self._cond:
            while not self._table.still(lease.gpus):
                if lease.id not in self._leases:
                    return  # ended by another thread meanwhile
                self._cond.wait(WAIT_POLL_S)
            if not self._forget(lease):
                return
            locks, writes = self._table.detach(lease)
            self._table.take(writes, "releasing")
        try:
            self._let_go(lease, locks, reason)
        finally:
            if writes:
                with self._cond:
                    self._table.free(writes)
        self._notify("released", lease)

    def _forget(self, lease: Lease) -> bool:
        """Under _cond: drop the lease from the tables; False if it was already gone."""
        if self._leases.pop(lease.id, None) is None:
            return False
        if lease.conn is not None:
            mine = self._by_conn.get(lease.conn, {})
            mine.pop(lease.id, None)
            if not mine:  # else one empty dict stayed per connection that ever held one
                self._by_conn.pop(lease.conn, None)
        self._releases += 1
        return True

    def _let_go(self, lease: Lease, locks: list[Lock], reason: str) -> None:
        """Outside _cond, its GPUs taken: release the daemon owners the lease was the last
        of, and a standing lease's own; log it."""
        done: list[str] = []
        try:
            for lk in locks:
                done += lk.release()
            if lease.standing:
                if isinstance(lease.lock, Lock):
                    done += lease.lock.release()
                else:
                    done += release_owner(self.backend, self.journal, lease.token)
        except GpuenvError as err:
            log.error(
                "%s ended (%s) but restoring failed: %s; 'gpuenv restore' retries",
                lease.describe(),
                reason,
                err,
            )
        log.info(
            "released %s: %s%s", lease.describe(), reason, f" ({'; '.join(done)})" if done else ""
        )

    def _notify(self, kind: str, lease: Lease) -> None:
        info = lease.to_dict()
        for listener in list(self.listeners):
            try:
                listener(kind, info)
            except Exception:
                log.exception("lease event listener failed")

    # -- start ----------------------------------------------------------------------------------

    def adopt(self, lease: Lease, index: int, applied: Applied) -> None:
        """A standing lease found again in the journal at start (recovery.py)."""
        with self._cond:
            known = self._leases.setdefault(lease.id, lease)
            if index not in known.gpus:
                known.gpus = tuple(sorted({*known.gpus, index}))
            self._table.adopt(known, index, applied)


_WAIT_HINT = "wait for it to end (lock with a wait), or ask for the same state to share it"


def _gpu_list(gpus: list[int]) -> str:
    return "GPU " + ",".join(map(str, gpus)) if gpus else "no GPU"
