"""Does the lock hold? One answer, used by every module that asks.

`lock_holds` decides for one SM clock reading against a locked range, within
`LOCK_TOLERANCE_MHZ` either side (NVML reports whole MHz, and a clock read while
the driver settles may round one step off); `check_holds` reads a GPU now and
says why not; `lock_status` is what 'gpuenv status' shows (owner, range, holds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuenv.backend import Backend
from gpuenv.clocks import notice
from gpuenv.clocks.journal import Applied, Journal, JournalDamaged, JournalEntry, Owner, decode
from gpuenv.clocks.plan import describe_target
from gpuenv.clocks.request import TDP_LOCK
from gpuenv.reasons import THERMAL, Reason, reason_names

LOCK_TOLERANCE_MHZ = 1.0  # how far outside the locked range the SM clock may read


def lock_holds(
    sm_mhz: float, locked_range: tuple[float, float], tolerance_mhz: float = LOCK_TOLERANCE_MHZ
) -> bool:
    """Whether an SM clock reading is inside `locked_range` (MHz), within `tolerance_mhz`.

    Both sides count: below the range the GPU is held down (power cap, thermal);
    above it the lock is not in force at all (reset by the driver or another tool).
    """
    lo, hi = locked_range
    return lo - tolerance_mhz <= sm_mhz <= hi + tolerance_mhz


def check_holds(backend: Backend, index: int, applied: Applied) -> tuple[bool | None, str | None]:
    """(holds, why not) for a lock on GPU `index`, from the SM clock and reasons now."""
    if applied.locked_sm is not None:
        lo, hi = applied.locked_sm
        if applied.locked_sm == TDP_LOCK:
            base = backend.clock_limits(index).base_sm_mhz
            if base is None:
                return None, "locked to the base clock, whose value NVML does not report"
            lo = hi = base
    elif applied.app_clocks is not None:
        lo = hi = applied.app_clocks[1]
    else:
        return None, None
    reading = backend.read_fast(index)
    sm = reading.sm_mhz
    if lock_holds(sm, (lo, hi)):
        return True, None
    target = f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"
    if sm > hi:
        return False, (
            f"the SM clock reads {sm} MHz, above the locked {target}: the lock is not in "
            "force (reset by the driver or another tool?); 'gpuenv restore' then lock again"
        )
    why = _below_reason(reading.reasons)
    return False, f"the SM clock reads {sm} MHz, below the locked {target}: {why}"


def _below_reason(reasons: int) -> str:
    if reasons & Reason.SW_POWER_CAP:
        return "the power cap (SwPowerCap) pulls it below the lock"
    if reasons & THERMAL:
        return "thermal slowdown pulls it below the lock"
    if reasons & Reason.HW_SLOWDOWN:
        return "hardware slowdown (HwSlowdown) pulls it below the lock"
    if reasons & Reason.GPU_IDLE:
        return "the GPU is idle (GpuIdle)"
    names = reason_names(reasons)
    return f"active reasons: {', '.join(names)}" if names else "no clock-event reason is reported"


@dataclass(frozen=True)
class LockStatus:
    """What 'gpuenv status' shows about a GPU's lock."""

    locked: bool | None  # None: no gpuenv lock, and NVML cannot tell about others
    owner: str | None  # the first live owner, described; or who left a stale lock
    range: tuple[int, int] | None  # locked SM range, MHz (the app clock for app-clock GPUs)
    holds: bool | None
    reason_if_not_held: str | None
    owners: tuple[str, ...] = ()
    applied: Applied | None = None
    stale: bool = False  # every owner died: 'gpuenv restore' puts the original back
    note: str | None = None
    pinned: bool = False  # no gpuenv lock, yet the SM clock looks locked (see looks_pinned)
    release: str | None = None  # another account's lock: how it ends, and who can end it

    def describe(self) -> str:
        """One line: 'locked to 1350 MHz by pid 42 (...); holds' and so on."""
        if self.locked is None:
            return self.note or "not locked by gpuenv"
        text = describe_target(self.applied or Applied())
        who = f" by {self.owner}" if self.owner else ""
        line = f"locked ({text}){who}"
        if self.stale and self.release is None:
            line += "; stale: run 'gpuenv restore'"
        if self.holds is True:
            line += "; holds"
        elif self.holds is False:
            line += f"; NOT held: {self.reason_if_not_held}"
        elif self.reason_if_not_held:
            line += f"; {self.reason_if_not_held}"
        if self.release is not None:
            line += f"; {self.release}"
        return line


def lock_status(
    backend: Backend, index: int, journal: Journal | None = None, *, check_pinned: bool = False
) -> LockStatus:
    """Lock owner and whether the lock holds right now on GPU `index` (for 'gpuenv status').

    `check_pinned`: with no gpuenv lock, also read whether the clock looks locked anyway
    (`looks_pinned`: two more reads, so only where a person looks).
    """
    journal = journal if journal is not None else Journal()
    uuid = backend.device_info(index).uuid
    entry = journal.get(uuid)
    if entry is None:
        other = anothers_lock(backend, index)
        if other is not None:
            return other
        pinned = looks_pinned(backend, index) if check_pinned else None
        return LockStatus(
            locked=None,
            owner=None,
            range=None,
            holds=None,
            reason_if_not_held=None,
            note=pinned
            or "not locked by gpuenv (NVML cannot tell whether another tool locked clocks)",
            pinned=pinned is not None,
        )
    live = [o for o in entry.owners if o.alive()]
    stale = not live
    owner = (
        live[0].describe()
        if live
        else (f"{entry.owners[0].describe()}, which has ended" if entry.owners else None)
    )
    rng = _locked_range(backend, index, entry.applied)
    holds, why = check_holds(backend, index, entry.applied)
    return LockStatus(
        locked=True,
        owner=owner,
        range=rng,
        holds=holds,
        reason_if_not_held=why,
        owners=tuple(o.describe() for o in live),
        applied=entry.applied,
        stale=stale,
    )


def _locked_range(backend: Backend, index: int, applied: Applied) -> tuple[int, int] | None:
    """The SM range a lock holds (the app clock for app-clock GPUs; the base clock's value
    for a base lock, where NVML reports it)."""
    rng = applied.locked_sm
    if rng == TDP_LOCK:
        base = backend.clock_limits(index).base_sm_mhz
        rng = (base, base) if base is not None else None
    if rng is None and applied.app_clocks is not None:
        rng = (applied.app_clocks[1], applied.app_clocks[1])
    return rng


def anothers_lock(backend: Backend, index: int) -> LockStatus | None:
    """The lock root took on GPU `index` without gpuenvd, as its notice tells every
    account (`notice.py`); None where none is posted."""
    if os.geteuid() == 0:
        # root's own journal is the truth for root: its notice would only echo it, or
        # outlive a journal that was lost, which must be seen as lost
        return None
    posted = _posted(backend.device_info(index).uuid)
    return _anothers(backend, index, posted) if posted is not None else None


def _posted(uuid: str) -> JournalEntry | None:
    """Root's record of a lock on GPU `uuid`, from the notice every account may read
    (`notice.py`); None where there is none or it is damaged."""
    found = notice.read(uuid)
    if found is None:
        return None
    try:
        return decode(found[0], found[1], uuid)
    except JournalDamaged:
        return None


def _anothers(backend: Backend, index: int, entry: JournalEntry) -> LockStatus:
    """Another account's lock (root's, taken without gpuenvd): who holds it and how it ends,
    since this account cannot release it ('gpuenv restore' here finds nothing of its own)."""
    live = [o for o in entry.owners if o.alive()]
    holders = live or list(entry.owners[:1])
    who = holders[0].user if holders else "root"
    owners = tuple(_anothers_owner(o) for o in holders)
    if not live:
        release = f"its owner has ended: ask {who} to run 'gpuenv restore' to put it back"
    elif any(o.kind == "standing" for o in live):
        release = f"it stays until {who} runs 'gpuenv restore': ask {who} to release it"
    else:
        release = f"it ends with that process, or ask {who} to run 'gpuenv restore'"
    holds, why = check_holds(backend, index, entry.applied)
    rng = _locked_range(backend, index, entry.applied)
    return LockStatus(
        locked=True,
        owner=owners[0] if owners else None,
        range=rng,
        holds=holds,
        reason_if_not_held=why,
        owners=owners if live else (),
        applied=entry.applied,
        stale=not live,
        release=release,
    )


def _anothers_owner(o: Owner) -> str:
    """ "root's standing lock (gpuenv lock --sm 1350, since 2026-11-27 15:50:50)"."""
    what = f"{o.command}, since {o.since}"
    if o.kind == "standing":
        return f"{o.user}'s standing lock ({what})"
    if o.kind == "lease":
        return f"a gpuenvd lease of {o.user}'s, pid {o.pid} ({what})"
    return f"{o.user}'s pid {o.pid} ({what})"


PINNED_MARGIN_MHZ = 30  # two clock steps: more than a reading taken mid-change


def looks_pinned(backend: Backend, index: int) -> str | None:
    """Why the SM clock looks locked on a GPU gpuenv journals no lock for, or None.

    NVML cannot read locked clocks back, but an unlocked GPU sits at its lowest clock
    when idle without a context (GpuIdle) and at its highest with one, unless a reason
    holds it down. An idle clock above the lowest, or a clock below the highest with no
    reason at all, is what a lock looks like: `nvidia-smi -lgc`, or a gpuenv journal that
    was deleted or lost.
    """
    limits = backend.clock_limits(index)
    supported = [c for clocks in limits.supported_sm_mhz.values() for c in clocks]
    reading = backend.read_fast(index)
    sm = reading.sm_mhz
    if supported and reading.reasons & Reason.GPU_IDLE:
        pinned = sm > min(supported) + PINNED_MARGIN_MHZ
    else:
        pinned = reading.reasons == 0 and sm < limits.max_sm_mhz - PINNED_MARGIN_MHZ
    if not pinned:
        return None
    state = "idle" if reading.reasons & Reason.GPU_IDLE else "not held down by any reason"
    return (
        f"the SM clock reads {sm} MHz while the GPU is {state}: it looks locked, but gpuenv "
        "journals no lock (nvidia-smi -lgc, or a journal that was lost); "
        "'gpuenv restore --defaults' resets it to the driver's defaults"
    )
