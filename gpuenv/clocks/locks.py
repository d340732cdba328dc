"""Take a lock locally: the `Lock` class and `local_lock()` / `standing_lock()` (the path
`gpuenv.lock` takes as root when no gpuenvd serves the GPUs).

Under the journal's file lock, `decide` refuses or shares an existing lock (or
replaces a stale one), once per lock; then each GPU's original state (the plan's
read of it, when still current) and owner are journaled, and only then applied,
GPU by GPU; a failure rolls back the GPUs already changed (all or nothing). A
lock owned by a process, once granted, first starts a watchdog
(`supervisor.Watchdog`) that restores if the process dies.
"""

from __future__ import annotations

import atexit
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpuenv.backend import Backend
from gpuenv.clocks.journal import (
    Applied,
    ClockState,
    Journal,
    JournalEntry,
    Owner,
    process_start_time,
)
from gpuenv.clocks.plan import (
    GpuPlan,
    LockPlan,
    describe_applied,
    describe_target,
    plan_lock,
    state_with,
)
from gpuenv.clocks.request import LockRequest, LockSettings, requested
from gpuenv.clocks.restoring import (
    JournalNotUpdated,
    apply_state,
    describe_restore,
    indices_by_uuid,
    open_default,
    release_owner,
    restore_and_clear,
    restore_entry,
)
from gpuenv.clocks.status import check_holds
from gpuenv.clocks.supervisor import Watchdog, backend_spec
from gpuenv.errors import ConfigError, GpuenvError, LockConflict, ReadOnlyError

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+

DYING_WAIT_S = 3.0  # how long to wait for a dead owner's watchdog before cleaning up ourselves
# How old a plan's read of an unlocked GPU may be to be journaled as its original state (one
# read per lock): a lock planned and taken at once (the daemon's, a process's) is well inside.
STATE_FRESH_S = 1.0


@dataclass
class Decision:
    """What taking a lock does on one GPU."""

    plan: GpuPlan
    action: str  # "fresh" | "share" (identical lock held: counted) | "replace" (see below)
    entry: JournalEntry | None = None  # the existing entry, for share and replace

    def describe(self) -> str:
        """'GPU 0 (NVIDIA H100 80GB HBM3): lock SM clock to 1350 MHz' and the like."""
        return f"{self.plan.name}: {self.action_text()}"

    def action_text(self) -> str:
        live = [o.describe() for o in self.entry.owners if o.owner_alive()] if self.entry else []
        then = describe_applied(self.plan.applied, self.plan.current)
        if self.action == "share":
            return f"share the identical lock held by {live[0] if live else '?'}"
        if self.action == "replace":
            assert self.entry is not None
            why = (
                f"take over from {live[0]} (--force)"
                if live
                else "clean up a lock whose owner died"
            )
            return f"{why}: first {describe_restore(self.entry)}; then {then}"
        return then


def decide(
    plan: LockPlan, journal: Journal, *, force: bool = False, wait_dying: bool = True
) -> list[Decision] | None:
    """Per GPU: take it fresh, share an identical lock, or replace a stale (or, with
    `force`, a live) one after restoring its original state. Raises LockConflict
    naming the owner. Returns None while a dead owner's watchdog is still restoring
    (and `wait_dying`): call again shortly.
    """
    decisions = []
    pending = False
    for gp in plan.gpus:
        entry = journal.get(gp.uuid)
        if entry is None:
            decisions.append(Decision(gp, "fresh"))
            continue
        live = [o for o in entry.owners if o.owner_alive()]
        if live:
            if entry.applied == gp.applied:
                decisions.append(Decision(gp, "share", entry))
            elif force:
                decisions.append(Decision(gp, "replace", entry))
            else:
                raise LockConflict(
                    gp.index,
                    f"{live[0].describe()}, holding {describe_target(entry.applied)}",
                    hint=_conflict_hint(live[0]),
                )
        elif wait_dying and any(o.watchdog_alive() for o in entry.owners):
            pending = True  # its watchdog is restoring it right now
        else:
            decisions.append(Decision(gp, "replace", entry))
    return None if pending else decisions


def _original(backend: Backend, d: Decision) -> ClockState:
    """Under the journal's lock, for a GPU that no gpuenv lock holds now (a stale one was
    just restored): the state to journal and put back on release.

    The plan's own read, when it found no gpuenv lock either and is under STATE_FRESH_S
    old: any gpuenv lock that came and went since restored exactly what it found, so
    only a change made outside gpuenv (nvidia-smi) in that moment could differ, as it
    could between a read here and the journal write. Else (a plan that saw a lock, one
    the daemon kept, a replaced lock) the state is read now.
    """
    gp = d.plan
    read_at = gp.unlocked_at
    fresh = read_at is not None and backend.clock.now() - read_at <= STATE_FRESH_S
    if d.action == "fresh" and fresh:
        return gp.current
    return state_with(backend, gp.index, gp.uuid, None)


def _conflict_hint(owner: Owner) -> str:
    end = "run 'gpuenv restore' to end it" if owner.kind == "standing" else "wait for it to end"
    return f"{end}, ask for the same state to share it, or use --force to take over"


class Lock:
    """A lock on one or more GPUs, applied when made. Release with `release()` or `with`.

    Not re-entrant: entering it twice, or after release, raises ConfigError.
    """

    def __init__(
        self,
        backend: Backend,
        plan: LockPlan,
        journal: Journal,
        *,
        kind: str = "process",
        force: bool = False,
        supervise: bool = True,
        command: str | None = None,
        owner: Owner | None = None,
        own_backend: bool = False,
    ):
        self.backend = backend
        self.plan = plan
        self.request = plan.request
        self.gpus = [gp.index for gp in plan.gpus]
        self.journal = journal
        self.kind = kind
        # `owner`: a record made by the caller (the daemon's lease for a client)
        self.owner = owner or Owner.current(
            kind=kind, request=plan.request.describe(), command=command
        )
        self.notes: list[str] = [f"{gp.name}: {n}" for gp in plan.gpus for n in gp.notes]
        self.shared: list[int] = []  # GPUs where an identical lock was already held
        self.records: list[JournalEntry] = []  # what this lock journaled: kept until released
        self._own_backend = own_backend
        self._watchdog: Watchdog | None = None
        self._entered = False
        self._released = True
        self._acquire(force=force, supervise=supervise and kind != "standing")
        self._released = False
        if kind != "standing":
            atexit.register(self.release)

    # context manager: applied at construction, released on exit
    def __enter__(self) -> Lock:
        if self._released:
            raise ConfigError("this lock was released", hint="take a new one with gpuenv.lock(...)")
        if self._entered:
            raise ConfigError("this lock is already entered (locks are not re-entrant)")
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def released(self) -> bool:
        return self._released

    @property
    def token(self) -> str:
        return self.owner.token

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<gpuenv.Lock {self.request.describe()} on GPUs {self.gpus} ({state})>"

    def _acquire(self, *, force: bool, supervise: bool) -> None:
        try:
            if self.backend.readonly:
                raise ReadOnlyError(
                    "; ".join(gp.describe() for gp in self.plan.gpus),
                    reason=getattr(self.backend, "reason", "read-only"),
                )
            # on the GPU's clock (the simulator's may be virtual): the dying owner's watchdog
            # restores the GPU in the time the GPU lives on
            clock = self.backend.clock
            deadline = clock.now() + DYING_WAIT_S
            while True:
                with self.journal.locked():
                    self.journal.clean_tmp()
                    # The one conflict check, under the journal's lock: another owner may have
                    # locked since the plan was made, and nobody can until this lock is taken.
                    # Past the deadline a dead owner's watchdog is stuck: clean up ourselves.
                    decisions = decide(
                        self.plan, self.journal, force=force, wait_dying=clock.now() < deadline
                    )
                    if decisions is not None:
                        if supervise:  # only once granted: a refused lock starts no process
                            self._start_watchdog()
                        self._take(decisions)
                        return
                clock.sleep(0.02)
        except BaseException:
            if self._watchdog is not None:
                self._watchdog.stop()
            self._close_backend()
            raise

    def _start_watchdog(self) -> None:
        spec = backend_spec(self.backend)
        if spec is None:
            return  # e.g. an in-memory simulated GPU: no other process can reach it
        self._watchdog = Watchdog.start(
            spec,
            token=self.owner.token,
            state_dir=self.journal.path,
            owner_start=self.owner.pid_start,
            uuids=[gp.uuid for gp in self.plan.gpus],
        )
        self.owner = replace(
            self.owner,
            watchdog_pid=self._watchdog.pid,
            watchdog_start=process_start_time(self._watchdog.pid),
        )

    def _take(self, decisions: list[Decision]) -> None:
        """Under the journal lock: clean up, journal every GPU, then apply GPU by GPU."""
        indices = None
        for d in decisions:  # stale or forced-out locks go back to their original state first
            if d.action == "replace":
                assert d.entry is not None
                indices = indices or indices_by_uuid(self.backend)
                restore_and_clear(self.backend, self.journal, d.entry, indices)
                live = [o.describe() for o in d.entry.owners if o.owner_alive()]
                if live:
                    self.notes.append(f"{d.plan.name}: took over from {live[0]} (--force)")
        written: list[Decision] = []
        applied: list[tuple[Decision, list[str]]] = []
        try:
            for d in decisions:  # the journal first, for every GPU, before any setting changes
                if d.action == "share":
                    assert d.entry is not None
                    owners = [o for o in d.entry.owners if o.alive()] + [self.owner]
                    self.journal.put(d.entry.with_owners(owners))
                    self.shared.append(d.plan.index)
                else:
                    d.entry = JournalEntry(
                        uuid=d.plan.uuid,
                        index=d.plan.index,
                        name=d.plan.name,
                        backend=self.backend.name,
                        original=_original(self.backend, d),
                        applied=d.plan.applied,
                        owners=(self.owner,),
                    )
                    self.journal.put(d.entry)
                written.append(d)
            self.records = [d.entry.with_owners(self._owners_of(d)) for d in written if d.entry]
            for d in (x for x in decisions if x.action != "share"):
                steps: list[str] = []
                applied.append((d, steps))
                apply_state(self.backend, d.plan.index, d.plan.applied, steps)
        except BaseException as err:
            self._rollback(written, applied, err)
            raise

    def _owners_of(self, d: Decision) -> list[Owner]:
        assert d.entry is not None
        if d.action == "share":
            return [o for o in d.entry.owners if o.alive()] + [self.owner]
        return [self.owner]

    def _rollback(
        self, written: list[Decision], applied: list[tuple[Decision, list[str]]], err: BaseException
    ) -> None:
        """Undo the GPUs already changed and drop our journal records; a record whose undo
        failed stays (ownerless), so that 'gpuenv restore' can finish it."""
        failed: list[str] = []
        undone = {id(d) for d, _ in applied}
        for d, steps in applied:
            assert d.entry is not None
            partial = replace(
                d.entry, applied=Applied(**{k: getattr(d.entry.applied, k) for k in steps})
            )
            try:
                restore_entry(self.backend, d.plan.index, partial)
            except GpuenvError as undo_err:
                failed.append(f"{d.plan.name}: {undo_err}")
                self._journal_quietly(self.journal.put, d.entry.with_owners(()))
                continue
            self._journal_quietly(self.journal.remove, d.plan.uuid)
        for d in written:
            if d.action == "share":
                entry = self._journal_quietly(self.journal.get, d.plan.uuid)
                if entry is not None:
                    self._journal_quietly(
                        self.journal.put,
                        entry.with_owners([o for o in entry.owners if o.token != self.token]),
                    )
            elif id(d) not in undone:
                self._journal_quietly(self.journal.remove, d.plan.uuid)
        if failed:
            raise GpuenvError(
                f"{err}; rolling back also failed: {'; '.join(failed)}",
                hint="run 'gpuenv restore' to put back the journaled state",
            ) from err

    @staticmethod
    def _journal_quietly(step: Any, arg: Any) -> Any:
        """A journal step of a rollback: the error that caused the rollback is the one
        to report (a journal that could not be written is often that error)."""
        try:
            return step(arg)
        except GpuenvError:
            return None

    def holds(self) -> dict[int, bool | None]:
        """Per GPU: is the SM clock inside the locked range right now? None: cannot tell."""
        return {
            gp.index: check_holds(self.backend, gp.index, gp.applied)[0] for gp in self.plan.gpus
        }

    def release(self) -> list[str]:
        """Put back the original state (unless another owner shares the lock). Idempotent."""
        if self._released:
            return []
        self._released = True
        atexit.unregister(self.release)
        try:
            lines = release_owner(self.backend, self.journal, self.token, known=self.records)
        except JournalNotUpdated as err:  # the GPUs are back: say so, do not fail the caller
            warnings.warn(str(err), stacklevel=2)
            lines = err.done
        except BaseException:
            # Not restored: the watchdog keeps watching and restores when this process ends.
            self._close_backend()
            raise
        if self._watchdog is not None:  # told only now, after the restore
            self._watchdog.stop()
        self._close_backend()
        return lines

    def _close_backend(self) -> None:
        if self._own_backend:
            self._own_backend = False
            self.backend.close()


def local_lock(
    sm: int | str | tuple[int, int] | None = None,
    /,
    *,
    request: LockRequest | None = None,
    gpus: str | int | Sequence[str | int] | None = None,
    backend: Backend | None = None,
    force: bool = False,
    supervise: bool = True,
    journal: Journal | None = None,
    kind: str = "process",
    command: str | None = None,
    **settings: Unpack[LockSettings],
) -> Lock:
    """The local path of `gpuenv.lock` (root, no gpuenvd): lock clocks on `gpus` (default
    all) now; restore exactly what was there on release.

    `request` (a `LockRequest`), or its keywords as `gpuenv.lock` takes them:
    `nvidia-smi -lgc MIN,MAX` (`sm`, `sm_max`), `-lmc` (`mem`), `-pl` (`power_limit_w`).
    `sm` is MHz, a (min, max) range, or 'max', 'base' (the TDP clock) or 'sustained'
    (the clock 'gpuenv calibrate' measured). Use as a context manager, or call
    `release()`. A watchdog process restores within a second if this process dies
    (`supervise=False` to do without one). Raises LockConflict when another owner
    holds a different lock (`force=True` takes it over; its original state is put
    back first), ConfigError naming the valid range, PermissionDenied without root.
    """
    request = requested(request, sm, settings)
    own = backend is None
    backend = backend if backend is not None else open_default()
    try:
        journal = journal if journal is not None else Journal()
        plan = plan_lock(backend, request, gpus, journal=journal)
    except BaseException:
        if own:
            backend.close()
        raise
    return Lock(
        backend,
        plan,
        journal,
        kind=kind,
        force=force,
        supervise=supervise,
        command=command,
        own_backend=own,
    )


def standing_lock(
    sm: int | str | tuple[int, int] | None = None,
    /,
    *,
    request: LockRequest | None = None,
    gpus: str | int | Sequence[str | int] | None = None,
    backend: Backend | None = None,
    force: bool = False,
    journal: Journal | None = None,
    command: str | None = None,
    **settings: Unpack[LockSettings],
) -> Lock:
    """`gpuenv lock` without gpuenvd: a local lock no process owns; it lasts until
    `restore()` ('gpuenv restore')."""
    return local_lock(
        request=requested(request, sm, settings),
        gpus=gpus,
        backend=backend,
        force=force,
        supervise=False,
        journal=journal,
        kind="standing",
        command=command,
    )
