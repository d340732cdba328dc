"""Write a planned state, and put back the journaled original: `restore_entry` (one
GPU), `release_owner` (what a lock's release and the watchdog do), `restore`
('gpuenv restore'). Only the settings a lock changed are put back, and a journal
entry is cleared only once its restore succeeded.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv.backend import Backend
from gpuenv.clocks.journal import Applied, Journal, JournalEntry
from gpuenv.clocks.request import fmt_clock
from gpuenv.errors import GpuenvError, LockConflict, ReadOnlyError


def pause_for_test(point: str) -> None:
    """Test hook: with GPUENV_TEST_PAUSE_AT=point, say so on stderr and sleep, so a test
    can SIGKILL this process at exactly that point."""
    if os.environ.get("GPUENV_TEST_PAUSE_AT") == point:
        print(f"GPUENV_PAUSED {point}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("GPUENV_TEST_PAUSE_S", "60")))


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


def release_owner(backend: Backend, journal: Journal, token: str) -> list[str]:
    """Drop owner `token` from every journal entry; where no live owner remains, restore the
    original state and clear the entry. Returns one line per GPU on what was done.

    Used by `Lock.release` and by the watchdog after the owner died. Raises the
    first restore error after trying every GPU (failed entries stay journaled).
    """
    done: list[str] = []
    errors: list[GpuenvError] = []
    with journal.locked():
        indices: dict[str, int] | None = None
        for entry in journal.entries():
            if entry.owner(token) is None:
                continue
            others = [o for o in entry.owners if o.token != token and o.alive()]
            if others:
                journal.put(entry.with_owners(others))
                done.append(f"{entry.name}: still locked, shared with {others[0].describe()}")
                continue
            if indices is None:
                indices = indices_by_uuid(backend)
            try:
                restore_and_clear(backend, journal, entry, indices)
            except GpuenvError as err:
                errors.append(err)
                continue
            done.append(f"{entry.name}: restored")
            pause_for_test("mid_release")
    if errors:
        raise errors[0]
    return done


def restore_and_clear(
    backend: Backend, journal: Journal, entry: JournalEntry, indices: dict[str, int]
) -> None:
    index = indices.get(entry.uuid)
    if index is None:
        raise GpuenvError(
            f"{entry.name} ({entry.uuid}) is no longer present; its journal entry stays",
            hint="restore when the GPU is back ('gpuenv restore')",
        )
    restore_entry(backend, index, entry)
    journal.remove(entry.uuid)


@dataclass(frozen=True)
class RestoreItem:
    """One journaled GPU that 'gpuenv restore' would put back."""

    index: int
    entry: JournalEntry
    blocked_by: str | None  # a live owner that keeps it (without --all)

    def describe(self) -> str:
        what = f"{self.entry.name}: {describe_restore(self.entry)}"
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
        items.append(RestoreItem(index, entry, blocked))
    return items


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
    skipped. The journal entry is cleared only once its restore succeeded.
    Returns the indices restored.
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
            for it in todo:
                restore_and_clear(backend, journal, it.entry, indices)
                restored.append(it.index)
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
