"""Write a planned state, and put back the journaled original: `restore_entry` (one
GPU), `release_owner` (what a lock's release and the watchdog do), `restore`
('gpuenv restore'). Only the settings a lock changed are put back, and a journal
entry is cleared only once its restore succeeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.backend import Backend
from gpuenv.clocks.journal import Applied, Journal, JournalDamaged, JournalEntry
from gpuenv.clocks.request import fmt_clock
from gpuenv.errors import GpuenvError, LockConflict, NotSupported, ReadOnlyError
from gpuenv.errors import JournalNotUpdated as JournalNotUpdated  # defined in gpuenv.errors


def apply_state(backend: Backend, index: int, applied: Applied, done: list[str]) -> None:
    """Write `applied` on one GPU, recording each step in `done` for an in-process rollback."""
    if applied.power_limit_w is not None:
        backend.set_power_limit(index, applied.power_limit_w)
        done.append("power_limit_w")
    if applied.app_clocks is not None:
        backend.set_app_clocks(index, applied.app_clocks[0], applied.app_clocks[1])
        done.append("app_clocks")
    if applied.locked_mem is not None:
        backend.set_locked_mem_clocks(index, *applied.locked_mem)
        done.append("locked_mem")
    if applied.locked_sm is not None:
        backend.set_locked_sm_clocks(index, *applied.locked_sm)
        done.append("locked_sm")


def restore_entry(backend: Backend, index: int, entry: JournalEntry) -> None:
    """Put back the settings `entry.applied` touched, as `entry.original` had them.

    Idempotent: safe whether the lock was applied fully, partly or not at all.
    A locked range that was not known before (`locked_known=False`) is reset.
    """
    orig, applied = entry.original, entry.applied
    if applied.locked_sm is not None:
        if orig.locked_sm is not None:
            backend.set_locked_sm_clocks(index, *orig.locked_sm)
        else:
            backend.reset_locked_sm_clocks(index)
    if applied.locked_mem is not None:
        if orig.locked_mem is not None:
            backend.set_locked_mem_clocks(index, *orig.locked_mem)
        else:
            backend.reset_locked_mem_clocks(index)
    if applied.app_clocks is not None:
        limits = backend.clock_limits(index)
        defaults = (limits.default_app_mem_mhz, limits.default_app_sm_mhz)
        original = (orig.app_mem_mhz, orig.app_sm_mhz)
        if original[0] is None or original[1] is None or original == defaults:
            backend.reset_app_clocks(index)
        else:
            backend.set_app_clocks(index, original[0], original[1])
    if (
        applied.power_limit_w is not None
        and backend.power_limits(index).limit_w != orig.power_limit_w
    ):
        backend.set_power_limit(index, orig.power_limit_w)


def indices_by_uuid(backend: Backend) -> dict[str, int]:
    return {backend.device_info(i).uuid: i for i in range(backend.device_count())}


def release_owner(
    backend: Backend, journal: Journal, token: str, *, known: Sequence[JournalEntry] = ()
) -> list[str]:
    """Drop owner `token` from every journal entry; where no live owner remains, restore the
    original state and clear the entry. Returns one line per GPU on what was done.

    Used by `Lock.release` and by the watchdog after the owner died. `known`: the
    records the lock itself wrote, used for a GPU whose record is damaged or gone (so
    a damaged file never strands a lock). Every GPU is tried; then the first GPU error
    is raised, or JournalNotUpdated when only the journal could not record the restore.
    """
    done: list[str] = []
    errors: list[GpuenvError] = []
    journal_errors: list[GpuenvError] = []
    with journal.locked():
        indices: dict[str, int] | None = None
        why: dict[str, str | None] = {}  # Found.kept of the records read by uuid
        for entry in _owned_entries(journal, token, known, journal_errors, why):
            others = [o for o in entry.owners if o.token != token and o.alive()]
            if others:
                _journal_step(journal_errors, journal.put, entry.with_owners(others))
                done.append(f"{entry.name}: still locked, shared with {others[0].describe()}")
                continue
            if indices is None:
                indices = indices_by_uuid(backend)
            index = indices.get(entry.uuid)
            try:
                if index is None:
                    raise _gone(entry)
                kept = why[entry.uuid] if entry.uuid in why else _kept_why(journal, entry.uuid)
                restore_entry(backend, index, entry)
            except GpuenvError as err:
                errors.append(err)
                continue
            _journal_step(journal_errors, journal.remove, entry.uuid)
            done.append(f"{entry.name}: restored{_from_kept(kept)}")
    if errors:
        raise errors[0]
    if journal_errors:
        raise JournalNotUpdated(done, journal_errors)
    return done


def _kept_why(journal: Journal, uuid: str) -> str | None:
    """Why the record restored is the original kept at lock time (both copies damaged or
    deleted), or None: said with the restore, by the watchdog too, so that a damaged journal
    does not pass unseen."""
    try:
        return journal.lookup(uuid).kept
    except GpuenvError:  # a damaged record that `known` (the lock's own copy) stands in for
        return None


def _from_kept(kept: str | None) -> str:
    return "" if kept is None else f" ({kept}; put back from the copy kept at lock time)"


def _owned_entries(
    journal: Journal,
    token: str,
    known: Sequence[JournalEntry],
    errors: list[GpuenvError],
    why: dict[str, str | None],
) -> list[JournalEntry]:
    """The records `token` holds: from the journal, else (a damaged record, a directory
    that cannot be read) the lock's own copy of what it wrote. A record that is gone
    was restored from outside ('gpuenv restore --all'): nothing is left to do there.

    A lock's token is in the records of its own GPUs only (it writes no other), so with
    `known` only those are read: a release under the journal's lock no longer lists the
    directory and reads every GPU's record (gpuenvd's releases, one GPU at a time, read
    all of them each time). Without `known` (the watchdog, a standing lease), all are.
    `why` gets, by uuid, why each record read alone came from the original kept at lock
    time (`Found.kept`), so that the release's line says so without reading it again."""
    mine = {e.uuid: e for e in known}
    if mine:
        return [e for e in (_own_record(journal, token, m, errors, why) for m in known) if e]
    try:
        good, damaged = journal.scan()
    except GpuenvError as err:  # the directory cannot be read: restore from memory
        errors.append(err)
        return list(mine.values())
    return [e for e in good if e.owner(token) is not None] + [
        mine[d.uuid] for d in damaged if d.uuid in mine
    ]


def _own_record(
    journal: Journal,
    token: str,
    mine: JournalEntry,
    errors: list[GpuenvError],
    why: dict[str, str | None],
) -> JournalEntry | None:
    """The journal's record of `mine`'s GPU while `token` holds it; `mine` itself when the
    record is damaged or cannot be read (as `_owned_entries` says); None when it is gone
    or another owner's now."""
    why[mine.uuid] = None
    try:
        found = journal.lookup(mine.uuid)
    except JournalDamaged:
        return mine
    except GpuenvError as err:  # the directory cannot be read: restore from memory
        errors.append(err)
        return mine
    entry, why[mine.uuid] = found
    return entry if entry is not None and entry.owner(token) is not None else None


def _journal_step(errors: list[GpuenvError], step: Any, arg: Any) -> None:
    """A journal write after the GPU was restored: its failure must not stop the others."""
    try:
        step(arg)
    except GpuenvError as err:
        errors.append(err)


def _gone(entry: JournalEntry) -> GpuenvError:
    return GpuenvError(
        f"{entry.name} ({entry.uuid}) is no longer present; its journal entry stays",
        hint="restore when the GPU is back ('gpuenv restore')",
    )


def restore_and_clear(
    backend: Backend,
    journal: Journal,
    entry: JournalEntry,
    indices: dict[str, int],
    journal_errors: list[GpuenvError] | None = None,
) -> None:
    """Put `entry` back, then clear its record; with `journal_errors`, a record that cannot
    be cleared is added there instead of raised (the GPU is back either way)."""
    index = indices.get(entry.uuid)
    if index is None:
        raise _gone(entry)
    restore_entry(backend, index, entry)
    if journal_errors is None:
        journal.remove(entry.uuid)
    else:
        _journal_step(journal_errors, journal.remove, entry.uuid)


def reset_to_defaults(backend: Backend, index: int) -> list[str]:
    """The driver's defaults on one GPU (`nvidia-smi -rgc -rmc -rac`, `-pl` default), for
    when the journal that knew the state before a lock is gone. Returns what was done."""
    limits = backend.clock_limits(index)
    steps = []
    for what, call, wanted in (
        ("locked SM clocks reset", backend.reset_locked_sm_clocks, limits.locked_clocks_supported),
        (
            "locked memory clocks reset",
            backend.reset_locked_mem_clocks,
            limits.locked_mem_supported,
        ),
        ("application clocks to default", backend.reset_app_clocks, True),
    ):
        if not wanted:
            continue
        try:
            call(index)
        except NotSupported:
            continue
        steps.append(what)
    power = backend.power_limits(index)
    if power.limit_w != power.default_w:
        backend.set_power_limit(index, power.default_w)
    steps.append(f"power limit {power.default_w:g} W (default)")
    return steps


def unrecorded_changes(backend: Backend, index: int) -> list[str]:
    """What differs from the driver's defaults on a GPU no journal record covers: a power
    limit other than the default, application clocks other than the default, a clock that
    looks locked. Empty when it looks untouched (NVML cannot read a lock back)."""
    from gpuenv.clocks.status import looks_pinned

    seen = []
    try:
        power = backend.power_limits(index)
        if abs(power.limit_w - power.default_w) > 0.5:
            seen.append(f"power limit {power.limit_w:g} W (default {power.default_w:g} W)")
    except GpuenvError:
        pass
    try:
        limits, app = backend.clock_limits(index), backend.app_clocks(index)
        default = (limits.default_app_sm_mhz, limits.default_app_mem_mhz)
        if (
            None not in default
            and None not in (app.sm_mhz, app.mem_mhz)
            and (app.sm_mhz, app.mem_mhz) != default
        ):
            seen.append(
                f"application clocks SM {app.sm_mhz}, memory {app.mem_mhz} MHz "
                f"(default {default[0]}, {default[1]} MHz)"
            )
    except GpuenvError:
        pass
    try:
        pinned = looks_pinned(backend, index)
    except GpuenvError:
        pinned = None
    if pinned is not None:
        seen.append(
            f"the SM clock reads {backend.read_fast(index).sm_mhz} MHz where an "
            "unlocked GPU would not: it looks locked"
        )
    return seen


def defaults_would(backend: Backend, index: int) -> str:
    """What 'gpuenv restore --defaults -i N' would write on GPU `index`, in words."""
    parts = ["reset locked clocks", "application clocks to the default"]
    try:
        power = backend.power_limits(index)
        parts.append(f"power limit {power.default_w:g} W (now {power.limit_w:g} W)")
    except GpuenvError:
        parts.append("power limit to the default")
    return (
        f"'gpuenv restore --defaults -i {index}' would: {', '.join(parts)}; the driver's "
        "defaults, not necessarily what was there before"
    )


def not_put_back(backend: Backend, index: int, why: str, seen: Sequence[str]) -> str:
    """One line on a GPU that could not be put back: why, what was seen, what can be done."""
    name = backend.device_info(index).name
    saw = f"; it shows {', '.join(seen)}" if seen else ""
    return f"not restored: GPU {index} ({name}): {why}{saw}; {defaults_would(backend, index)}"


def left_as_is(backend: Backend, index: int, seen: Sequence[str]) -> str:
    """One line on a GPU gpuenv holds no record of but that is not at the driver's defaults:
    what it shows, and that restore changed nothing (not an error: an admin's power limit,
    another tool's lock; if it is unwanted, what would reset it)."""
    name = backend.device_info(index).name
    return (
        f"left as it is: GPU {index} ({name}): gpuenv has no journal record of it, so nothing "
        f"of gpuenv's to put back; it shows {', '.join(seen)}; if that is not wanted, "
        f"{defaults_would(backend, index)}"
    )


def unrecorded_report(backend: Backend, indices: Sequence[int], journal: Journal) -> list[str]:
    """One line per GPU among `indices` that has no journal record (none, not damaged) but a
    state that differs from the driver's defaults (an admin's setting, a tool's lock, both
    copies of a record deleted): what restore saw and left as it is."""
    from gpuenv.clocks.status import anothers_lock

    recorded = set(journal.uuids())
    lines = []
    for index in indices:
        if backend.device_info(index).uuid in recorded:
            continue
        other = anothers_lock(backend, index)
        if other is not None:  # root's, not this account's: say whose, and who ends it
            name = backend.device_info(index).name
            lines.append(f"left as it is: GPU {index} ({name}): {other.describe()}")
            continue
        seen = unrecorded_changes(backend, index)
        if seen:
            lines.append(left_as_is(backend, index, seen))
    return lines


def restore_defaults(backend: Backend, indices: Sequence[int], journal: Journal) -> list[str]:
    """'gpuenv restore --defaults' for GPUs whose record is damaged or gone: driver
    defaults, then their damaged records removed. One line per GPU."""
    if backend.readonly:
        raise ReadOnlyError(
            f"reset GPU {', '.join(map(str, indices))} to driver defaults",
            reason=getattr(backend, "reason", "read-only"),
        )
    lines = []
    with journal.locked():
        for index in indices:
            info = backend.device_info(index)
            steps = reset_to_defaults(backend, index)
            journal.remove(info.uuid)
            lines.append(
                f"GPU {index} ({info.name}): reset to driver defaults ({', '.join(steps)}); "
                "this is not necessarily what was there before the lock"
            )
    return lines


@dataclass(frozen=True)
class RestoreItem:
    """One journaled GPU that 'gpuenv restore' would put back."""

    index: int
    entry: JournalEntry
    blocked_by: str | None  # a live owner that keeps it (without --all)
    kept: str | None = None  # why the original kept at lock time is used (Journal.lookup)

    def describe(self) -> str:
        what = f"{self.entry.name}: {describe_restore(self.entry)}"
        if self.kept is not None:
            what = f"{what}{_from_kept(self.kept)}"
        return what if self.blocked_by is None else f"{what}: held by {self.blocked_by}"


def plan_restore(
    backend: Backend,
    gpus: str | int | Sequence[str | int] | None = None,
    *,
    journal: Journal,
    all_owners: bool = False,
) -> list[RestoreItem]:
    """The journal entries on the selected GPUs, and who (if anyone live) holds each."""
    from gpuenv.devices import select_gpus

    wanted = select_gpus(backend, gpus)
    indices = indices_by_uuid(backend)
    items = []
    for entry in journal.entries():
        index = indices.get(entry.uuid)
        if index is None or index not in wanted:
            continue
        live = [o for o in entry.owners if o.kind != "standing" and o.owner_alive()]
        blocked = live[0].describe() if live and not all_owners else None
        items.append(RestoreItem(index, entry, blocked, journal.lookup(entry.uuid).kept))
    return items


def damaged_records(
    backend: Backend, gpus: str | int | Sequence[str | int] | None, *, journal: Journal
) -> list[tuple[int, JournalDamaged]]:
    """The selected GPUs whose record cannot be trusted: (index, why), each GPU alone."""
    from gpuenv.devices import select_gpus

    wanted = select_gpus(backend, gpus)
    indices = indices_by_uuid(backend)
    return [
        (indices[d.uuid], d)
        for d in journal.scan()[1]
        if d.uuid in indices and indices[d.uuid] in wanted
    ]


def restore(
    gpus: str | int | Sequence[str | int] | None = None,
    *,
    backend: Backend | None = None,
    journal: Journal | None = None,
    all_owners: bool = False,
) -> list[int]:
    """Put back the journaled original state on the selected GPUs (`gpuenv restore`).

    Standing locks and locks whose owner died are restored. A lock held by a live
    process is left alone and raises LockConflict naming it (after the others were
    restored), unless `all_owners`. Idempotent: a GPU with no journal entry is
    skipped. The journal entry is cleared only once its restore succeeded. A GPU
    whose record is damaged raises JournalDamaged, after the others were restored
    (`restore_defaults` is then what can be done for it). Returns the indices restored.
    """
    own_backend = backend is None
    backend = backend if backend is not None else open_default()
    journal = journal if journal is not None else Journal()
    try:
        restored: list[int] = []
        with journal.locked():
            items = plan_restore(backend, gpus, journal=journal, all_owners=all_owners)
            todo = [it for it in items if it.blocked_by is None]
            if todo and backend.readonly:
                raise ReadOnlyError(
                    "; ".join(it.describe() for it in todo),
                    reason=getattr(backend, "reason", "read-only"),
                )
            indices = {it.entry.uuid: it.index for it in items}
            journal_errors: list[GpuenvError] = []
            for it in todo:
                # a journal that cannot be written (read-only, immutable, full) must not
                # stop the next GPU's restore, nor hide that this one was put back
                restore_and_clear(backend, journal, it.entry, indices, journal_errors)
                restored.append(it.index)
            damaged = damaged_records(backend, gpus, journal=journal)
        if journal_errors:
            raise JournalNotUpdated([f"restored {it.describe()}" for it in todo], journal_errors)
        if damaged:
            raise damaged[0][1]
        blocked = [it for it in items if it.blocked_by is not None]
        if blocked:
            raise LockConflict(
                blocked[0].index,
                blocked[0].blocked_by or "",
                hint="it restores when it ends; use --all (all_owners=True) to restore anyway",
            )
        return sorted(restored)
    finally:
        if own_backend:
            backend.close()


def describe_restore(entry: JournalEntry) -> str:
    """What restoring `entry` writes: 'reset locked SM clocks, set power limit to 700 W'."""
    orig, applied = entry.original, entry.applied
    parts = []
    if applied.locked_sm is not None:
        parts.append(
            f"lock SM clock to {fmt_clock(orig.locked_sm)}"
            if orig.locked_sm
            else "reset locked SM clocks"
        )
    if applied.locked_mem is not None:
        parts.append(
            f"lock memory clock to {fmt_clock(orig.locked_mem)}"
            if orig.locked_mem
            else "reset locked memory clocks"
        )
    if applied.app_clocks is not None:
        parts.append(
            f"application clocks back to SM {orig.app_sm_mhz}, memory {orig.app_mem_mhz} MHz"
        )
    if applied.power_limit_w is not None:
        parts.append(f"power limit back to {orig.power_limit_w:g} W")
    return ", ".join(parts) or "nothing"


def open_default() -> Backend:
    from gpuenv.backend import open_backend

    return open_backend()
