"""Lock GPU clocks, and always put back exactly what was there.

    with gpuenv.lock(sm=1350):          # nvidia-smi -lgc 1350,1350 on every GPU
        run_benchmark()                 # restored on exit, exception, Ctrl-C; the
                                        # watchdog restores after SIGKILL too

Three steps, each its own function:
  - `plan_lock`: read each GPU's state and limits, validate the request and snap
    it to supported clocks (errors name the valid range), choose locked clocks or,
    on GPUs without them, application clocks. Reads only.
  - `Lock` (from `lock()`): start the watchdog, then under the journal's file lock
    refuse or share an existing lock, write each GPU's original state and owner to
    the journal, and only then apply, GPU by GPU; a failure rolls back the GPUs
    already changed (all or nothing).
  - `release_owner` / `restore`: put back the journaled original state (only the
    settings the lock changed) and clear the journal entry once that succeeded.

NVML has no getter for locked clocks, so whether a GPU is locked, and to what,
is known only from the journal (`ClockState.locked_known`); whether the lock
holds right now is checked against the SM clock (`lock_status`).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuenv.backend import (
    CLOCK_LIMIT_TDP,
    REASON_GPU_IDLE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    Backend,
    ClockLimits,
    reason_names,
)
from gpuenv.errors import ConfigError, GpuenvError, LockConflict, NotSupported, ReadOnlyError
from gpuenv.journal import Applied, ClockState, Journal, JournalEntry, Owner, default_state_dir

NAMED_SM = ("max", "base", "sustained")
DYING_WAIT_S = 3.0  # how long to wait for a dead owner's watchdog before cleaning up ourselves
_BASE = (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)


# -- reading ---------------------------------------------------------------------------


def read_state(backend: Backend, index: int, *, journal: Journal | None = None) -> ClockState:
    """The state a lock would change on GPU `index` (`nvidia-smi -q -d CLOCK,POWER`).

    Locked ranges come from the journal (NVML cannot read them back); without a
    journal entry they are None with `locked_known=False`.
    """
    journal = journal if journal is not None else Journal()
    uuid = backend.device_info(index).uuid
    try:
        app = backend.app_clocks(index)
        app_sm, app_mem = app.sm_mhz, app.mem_mhz
    except NotSupported:
        app_sm = app_mem = None
    locked_sm = locked_mem = None
    known = False
    entry = journal.get(uuid)
    if entry is not None:
        locked_sm = entry.applied.locked_sm or entry.original.locked_sm
        locked_mem = entry.applied.locked_mem or entry.original.locked_mem
        known = entry.original.locked_known or entry.applied.locked_sm is not None
    return ClockState(
        uuid=uuid,
        locked_sm=locked_sm,
        locked_mem=locked_mem,
        locked_known=known,
        app_sm_mhz=app_sm,
        app_mem_mhz=app_mem,
        power_limit_w=backend.power_limits(index).limit_w,
        persistence=backend.persistence_mode(index),
    )


# -- calibration (written by 'gpuenv calibrate', read by sm="sustained") ------------------


@dataclass(frozen=True)
class Calibration:
    """The highest SM clock a sustained load held on one GPU."""

    uuid: str
    sustained_mhz: int
    measured_at: float  # seconds since the epoch
    power_limit_w: float | None = None  # the limit it was measured under
    gpu_name: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _calibration_file(uuid: str, state_dir: str | os.PathLike[str] | None) -> Path:
    base = Path(state_dir) if state_dir is not None else default_state_dir()
    return base / "calibration" / f"{uuid}.json"


def save_calibration(
    uuid: str,
    sustained_mhz: int,
    *,
    power_limit_w: float | None = None,
    gpu_name: str | None = None,
    details: dict[str, Any] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Store the calibrated clock of GPU `uuid` (atomically); returns the file written."""
    path = _calibration_file(uuid, state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = Calibration(
        uuid, int(sustained_mhz), time.time(), power_limit_w, gpu_name, details or {}
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.__dict__, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def load_calibration(
    uuid: str, *, state_dir: str | os.PathLike[str] | None = None
) -> Calibration | None:
    """The stored calibration of GPU `uuid`, or None if 'gpuenv calibrate' never ran for it."""
    path = _calibration_file(uuid, state_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise ConfigError(
            f"the calibration file {path} is damaged ({err})", hint="run 'gpuenv calibrate' again"
        ) from err
    return Calibration(**{k: data[k] for k in Calibration.__dataclass_fields__ if k in data})


# -- requests and plans --------------------------------------------------------------


@dataclass(frozen=True)
class LockRequest:
    """What a caller asks for. `sm`: MHz, (min, max) MHz, or 'max' | 'base' | 'sustained'."""

    sm: int | tuple[int, int] | str | None = None
    mem: int | tuple[int, int] | None = None
    power_limit_w: float | None = None

    def describe(self) -> str:
        parts = []
        if self.sm is not None:
            parts.append(f"SM {_fmt_clock(self.sm)}")
        if self.mem is not None:
            parts.append(f"memory {_fmt_clock(self.mem)}")
        if self.power_limit_w is not None:
            parts.append(f"power limit {self.power_limit_w:g} W")
        return ", ".join(parts) or "nothing"


def make_request(
    sm: int | str | tuple[int, int] | None = None,
    *,
    sm_max: int | None = None,
    mem: int | str | tuple[int, int] | None = None,
    power_limit_w: float | None = None,
) -> LockRequest:
    """Normalise user input ('1350', '1200,1500', 'base', sm_max=...) into a LockRequest."""
    sm_value = _parse_clock(sm, "--sm", named=True)
    if sm_max is not None:
        if not isinstance(sm_value, int):
            raise ConfigError(
                "--sm-max needs --sm as one number", hint="e.g. --sm 1200 --sm-max 1500"
            )
        sm_value = (sm_value, int(sm_max))
    mem_value = _parse_clock(mem, "--mem", named=False)
    if isinstance(mem_value, str):  # unreachable: named=False
        raise ConfigError(f"--mem {mem_value!r} is not a clock")
    if power_limit_w is not None and power_limit_w <= 0:
        raise ConfigError(f"power limit {power_limit_w} W must be positive")
    if sm_value is None and mem_value is None and power_limit_w is None:
        raise ConfigError("nothing to lock", hint="give an SM clock (--sm), --mem or --power-limit")
    return LockRequest(sm=sm_value, mem=mem_value, power_limit_w=power_limit_w)


def _parse_clock(value: Any, flag: str, *, named: bool) -> int | tuple[int, int] | str | None:
    if value is None or isinstance(value, tuple):
        if isinstance(value, tuple) and value[0] > value[1]:
            raise ConfigError(f"{flag} range {value[0]},{value[1]} has min above max")
        return None if value is None else (int(value[0]), int(value[1]))
    if isinstance(value, bool):
        raise ConfigError(f"{flag} {value!r} is not a clock")
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if named and text in NAMED_SM:
        return text
    try:
        if "," in text:
            lo, hi = (int(p) for p in text.split(","))
            return _parse_clock((lo, hi), flag, named=named)
        return int(text)
    except ValueError:
        names = ", or one of " + ", ".join(NAMED_SM) if named else ""
        raise ConfigError(
            f"{flag} {value!r} is not understood",
            hint=f"give a clock in MHz (1350), a range MIN,MAX (1200,1500){names}",
        ) from None


@dataclass(frozen=True)
class GpuPlan:
    """What a lock will do on one GPU."""

    index: int
    uuid: str
    name: str  # "GPU 0 (NVIDIA H100 80GB HBM3)"
    current: ClockState  # as read while planning
    applied: Applied
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.name}: {describe_applied(self.applied, self.current)}"


@dataclass(frozen=True)
class LockPlan:
    request: LockRequest
    gpus: tuple[GpuPlan, ...]

    def lines(self) -> list[str]:
        out = []
        for gp in self.gpus:
            out.append(gp.describe())
            out.extend(f"  note: {n}" for n in gp.notes)
        return out


def describe_applied(applied: Applied, current: ClockState | None = None) -> str:
    """'lock SM clock to 1350 MHz, set power limit to 500 W (now 700 W)'."""
    parts = []
    if applied.power_limit_w is not None:
        now = f" (now {current.power_limit_w:g} W)" if current is not None else ""
        parts.append(f"set power limit to {applied.power_limit_w:g} W{now}")
    if applied.app_clocks is not None:
        mem, sm = applied.app_clocks
        parts.append(f"set application clocks to SM {sm} MHz, memory {mem} MHz")
    if applied.locked_mem is not None:
        parts.append(f"lock memory clock to {_fmt_clock(applied.locked_mem)}")
    if applied.locked_sm is not None:
        parts.append(f"lock SM clock to {_fmt_clock(applied.locked_sm)}")
    return ", ".join(parts) or "nothing"


def _fmt_clock(value: int | tuple[int, int] | str) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, int):
        return f"{value} MHz"
    if tuple(value) == _BASE:
        return "the base clock (TDP)"
    lo, hi = value
    return f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"


def _sm_clocks(limits: ClockLimits, mem_mhz: int | None = None) -> tuple[int, ...]:
    """Supported SM clocks, ascending: for `mem_mhz`, else for the highest memory clock."""
    table = limits.supported_sm_mhz
    if mem_mhz is not None and mem_mhz in table:
        return tuple(sorted(table[mem_mhz]))
    if limits.supported_mem_mhz and limits.supported_mem_mhz[0] in table:
        return tuple(sorted(table[limits.supported_mem_mhz[0]]))
    merged = sorted({c for clocks in table.values() for c in clocks})
    return tuple(merged)


def _range_text(clocks: Sequence[int]) -> str:
    steps = {b - a for a, b in itertools.pairwise(clocks)}
    if len(steps) == 1:
        return f"{clocks[0]}-{clocks[-1]} MHz in {steps.pop()} MHz steps"
    return f"{clocks[0]}-{clocks[-1]} MHz ({len(clocks)} clocks)"


def _snap(value: int, clocks: Sequence[int], what: str, name: str, notes: list[str]) -> int:
    if not clocks:
        return value
    if value < clocks[0] or value > clocks[-1]:
        raise ConfigError(
            f"{what} {value} MHz is out of range: {name} supports {_range_text(clocks)}",
            hint="choose a clock in that range, or 'max', 'base', 'sustained'"
            if what.startswith("SM")
            else "choose one of the supported clocks",
        )
    best = min(clocks, key=lambda c: (abs(c - value), c))
    if best != value:
        notes.append(f"{what} {value} MHz is not a supported clock; using {best} MHz")
    return best


def _snap_range(
    lo: int, hi: int, clocks: Sequence[int], what: str, name: str, notes: list[str]
) -> tuple[int, int]:
    a = _snap(lo, clocks, what, name, notes)
    b = _snap(hi, clocks, what, name, notes)
    if a > b:
        raise ConfigError(f"{what} range {lo}-{hi} MHz snaps to nothing on {name}")
    return (a, b)


def plan_lock(
    backend: Backend,
    request: LockRequest,
    gpus: str | int | Sequence[str | int] | None = None,
    *,
    journal: Journal | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> LockPlan:
    """Validate `request` on each selected GPU and decide what to write. Reads only."""
    from gpuenv.devices import describe, select_gpus

    journal = journal if journal is not None else Journal(state_dir)
    plans = []
    for index in select_gpus(backend, gpus):
        name = describe(backend, index)
        limits = backend.clock_limits(index)
        current = read_state(backend, index, journal=journal)
        notes: list[str] = []
        applied = Applied(power_limit_w=_plan_power(backend, index, name, request.power_limit_w))
        if limits.locked_clocks_supported:
            applied = replace(
                applied,
                locked_sm=_plan_locked_sm(request.sm, limits, current.uuid, name, notes, journal),
                locked_mem=_plan_locked_mem(request.mem, limits, backend, index, name, notes),
            )
        elif request.sm is not None or request.mem is not None:
            applied = replace(
                applied, app_clocks=_plan_app_clocks(request, limits, current, name, notes, journal)
            )
            notes.append(
                f"{name} has no locked clocks: using application clocks, which take effect "
                "when a process next creates a CUDA context"
            )
        if current.persistence is False:
            notes.append(
                "persistence mode is off: the driver may drop these settings when the last "
                "process using the GPU exits (enable it with 'nvidia-smi -pm 1')"
            )
        plans.append(GpuPlan(index, current.uuid, name, current, applied, tuple(notes)))
    return LockPlan(request, tuple(plans))


def _plan_power(backend: Backend, index: int, name: str, watts: float | None) -> float | None:
    if watts is None:
        return None
    limits = backend.power_limits(index)
    if not limits.min_w <= watts <= limits.max_w:
        raise ConfigError(
            f"power limit {watts:g} W is out of range: "
            f"{name} accepts {limits.min_w:g}-{limits.max_w:g} W"
        )
    return float(watts)


def _sm_target(
    sm: int | tuple[int, int] | str, limits: ClockLimits, uuid: str, name: str, journal: Journal
) -> int | tuple[int, int]:
    """Resolve a named target to MHz (or the symbolic base lock)."""
    if sm == "max":
        clocks = _sm_clocks(limits)
        return clocks[-1] if clocks else limits.max_sm_mhz
    if sm == "base":
        return limits.base_sm_mhz if limits.base_sm_mhz is not None else _BASE
    if sm == "sustained":
        cal = load_calibration(uuid, state_dir=journal.path)
        if cal is None:
            raise ConfigError(
                f"no calibrated clock for {name}", hint="run 'gpuenv calibrate' first"
            )
        return int(cal.sustained_mhz)
    assert not isinstance(sm, str)
    return sm


def _plan_locked_sm(
    sm: int | tuple[int, int] | str | None,
    limits: ClockLimits,
    uuid: str,
    name: str,
    notes: list[str],
    journal: Journal,
) -> tuple[int, int] | None:
    if sm is None:
        return None
    target = _sm_target(sm, limits, uuid, name, journal)
    if target == _BASE:
        return _BASE
    clocks = _sm_clocks(limits)
    if isinstance(target, int):
        snapped = _snap(target, clocks, "SM clock", name, notes)
        return (snapped, snapped)
    return _snap_range(target[0], target[1], clocks, "SM clock", name, notes)


def _plan_locked_mem(
    mem: int | tuple[int, int] | None,
    limits: ClockLimits,
    backend: Backend,
    index: int,
    name: str,
    notes: list[str],
) -> tuple[int, int] | None:
    if mem is None:
        return None
    if not limits.locked_mem_supported:
        cc = backend.device_info(index).compute_capability
        why = (
            "Hopper GPUs apply a memory-clock lock only at the next GPU initialisation "
            "(nvidia-smi -lmcd), not now"
            if cc is not None and cc[0] == 9
            else "this GPU or driver cannot lock memory clocks"
        )
        raise NotSupported(
            f"locking the memory clock is not supported on {name}: {why}",
            op="set_locked_mem_clocks",
            hint="drop --mem and lock the SM clock only",
        )
    clocks = tuple(sorted(limits.supported_mem_mhz))
    if isinstance(mem, int):
        snapped = _snap(mem, clocks, "memory clock", name, notes)
        return (snapped, snapped)
    return _snap_range(mem[0], mem[1], clocks, "memory clock", name, notes)


def _plan_app_clocks(
    request: LockRequest,
    limits: ClockLimits,
    current: ClockState,
    name: str,
    notes: list[str],
    journal: Journal,
) -> tuple[int, int]:
    if isinstance(request.mem, tuple):
        raise ConfigError(
            f"{name} supports only application clocks: give one memory clock, not a range"
        )
    mem = request.mem
    if mem is None:
        mem = current.app_mem_mhz or limits.default_app_mem_mhz or limits.max_mem_mhz
    mem = _snap(mem, tuple(sorted(limits.supported_mem_mhz)), "memory clock", name, notes)
    if request.sm is None:
        sm = current.app_sm_mhz or limits.default_app_sm_mhz or limits.max_sm_mhz
    else:
        target = _sm_target(request.sm, limits, current.uuid, name, journal)
        if target == _BASE:
            raise ConfigError(
                f"{name} does not report its base clock", hint="give the SM clock in MHz"
            )
        if isinstance(target, tuple):
            if target[0] != target[1]:
                raise ConfigError(
                    f"{name} supports only application clocks: give one SM clock, not a range"
                )
            target = target[0]
        sm = target
    sm = _snap(sm, _sm_clocks(limits, mem), "SM clock", name, notes)
    return (mem, sm)


# -- applying and restoring ------------------------------------------------------------


def _test_pause(point: str) -> None:
    """Test hook: with GPUENV_TEST_PAUSE_AT=point, say so on stderr and sleep, so a test
    can SIGKILL this process at exactly that point."""
    if os.environ.get("GPUENV_TEST_PAUSE_AT") == point:
        print(f"GPUENV_PAUSED {point}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("GPUENV_TEST_PAUSE_S", "60")))


def _apply(backend: Backend, index: int, applied: Applied, done: list[str]) -> None:
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


def _indices_by_uuid(backend: Backend) -> dict[str, int]:
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
                indices = _indices_by_uuid(backend)
            try:
                _restore_and_clear(backend, journal, entry, indices)
            except GpuenvError as err:
                errors.append(err)
                continue
            done.append(f"{entry.name}: restored")
            _test_pause("mid_release")
    if errors:
        raise errors[0]
    return done


def _restore_and_clear(
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
    indices = _indices_by_uuid(backend)
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
    backend = backend if backend is not None else _open_default()
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
                _restore_and_clear(backend, journal, it.entry, indices)
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
            f"lock SM clock to {_fmt_clock(orig.locked_sm)}"
            if orig.locked_sm
            else "reset locked SM clocks"
        )
    if applied.locked_mem is not None:
        parts.append(
            f"lock memory clock to {_fmt_clock(orig.locked_mem)}"
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


def _open_default() -> Backend:
    from gpuenv.backend import open_backend

    return open_backend()


# -- the lock --------------------------------------------------------------------------


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


def _conflict_hint(owner: Owner) -> str:
    end = "run 'gpuenv restore' to end it" if owner.kind == "standing" else "wait for it to end"
    return f"{end}, ask for the same state to share it, or use --force to take over"


def describe_target(applied: Applied) -> str:
    """What a lock holds, short: 'SM 1350 MHz, power limit 500 W'."""
    parts = []
    if applied.locked_sm is not None:
        parts.append(f"SM {_fmt_clock(applied.locked_sm)}")
    if applied.locked_mem is not None:
        parts.append(f"memory {_fmt_clock(applied.locked_mem)}")
    if applied.app_clocks is not None:
        mem, sm = applied.app_clocks
        parts.append(f"application clocks SM {sm} MHz, memory {mem} MHz")
    if applied.power_limit_w is not None:
        parts.append(f"power limit {applied.power_limit_w:g} W")
    return ", ".join(parts) or "nothing"


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
        self._own_backend = own_backend
        self._watchdog: Any = None
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
            decide(self.plan, self.journal, force=force)  # refuse before starting a watchdog
            if supervise:
                self._start_watchdog()
            deadline = time.monotonic() + DYING_WAIT_S
            while True:
                with self.journal.locked():
                    self.journal.clean_tmp()
                    # past the deadline a dead owner's watchdog is stuck: clean up ourselves
                    decisions = decide(
                        self.plan, self.journal, force=force, wait_dying=time.monotonic() < deadline
                    )
                    if decisions is not None:
                        self._take(decisions)
                        return
                time.sleep(0.02)
        except BaseException:
            if self._watchdog is not None:
                self._watchdog.stop()
            self._close_backend()
            raise

    def _start_watchdog(self) -> None:
        from gpuenv.journal import process_start_time
        from gpuenv.supervisor import Watchdog, backend_spec

        spec = backend_spec(self.backend)
        if spec is None:
            return  # e.g. an in-memory simulated GPU: no other process can reach it
        self._watchdog = Watchdog.start(
            spec,
            token=self.owner.token,
            state_dir=self.journal.path,
            owner_start=self.owner.pid_start,
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
                indices = indices or _indices_by_uuid(self.backend)
                _restore_and_clear(self.backend, self.journal, d.entry, indices)
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
                        original=read_state(self.backend, d.plan.index, journal=self.journal),
                        applied=d.plan.applied,
                        owners=(self.owner,),
                    )
                    self.journal.put(d.entry)
                written.append(d)
            _test_pause("after_journal")
            for n, d in enumerate(x for x in decisions if x.action != "share"):
                if n:
                    _test_pause("mid_apply")
                steps: list[str] = []
                applied.append((d, steps))
                _apply(self.backend, d.plan.index, d.plan.applied, steps)
        except BaseException as err:
            self._rollback(written, applied, err)
            raise
        _test_pause("after_apply")

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
                self.journal.put(d.entry.with_owners(()))
                continue
            self.journal.remove(d.plan.uuid)
        for d in written:
            if d.action == "share":
                entry = self.journal.get(d.plan.uuid)
                if entry is not None:
                    self.journal.put(
                        entry.with_owners([o for o in entry.owners if o.token != self.token])
                    )
            elif id(d) not in undone:
                self.journal.remove(d.plan.uuid)
        if failed:
            raise GpuenvError(
                f"{err}; rolling back also failed: {'; '.join(failed)}",
                hint="run 'gpuenv restore' to put back the journaled state",
            ) from err

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
            return release_owner(self.backend, self.journal, self.token)
        finally:
            if self._watchdog is not None:
                self._watchdog.stop()
            self._close_backend()

    def _close_backend(self) -> None:
        if self._own_backend:
            self._own_backend = False
            self.backend.close()


def lock(
    sm: int | str | tuple[int, int] | None = None,
    *,
    sm_max: int | None = None,
    mem: int | str | tuple[int, int] | None = None,
    power_limit_w: float | None = None,
    gpus: str | int | Sequence[str | int] | None = None,
    backend: Backend | None = None,
    force: bool = False,
    supervise: bool = True,
    journal: Journal | None = None,
    kind: str = "process",
    command: str | None = None,
) -> Lock:
    """Lock clocks on `gpus` (default all) now; restore exactly what was there on release.

    `nvidia-smi -lgc MIN,MAX` (`sm`, `sm_max`), `-lmc` (`mem`), `-pl` (`power_limit_w`).
    `sm` is MHz, a (min, max) range, or 'max', 'base' (the TDP clock) or 'sustained'
    (the clock 'gpuenv calibrate' measured). Use as a context manager, or call
    `release()`. A watchdog process restores within a second if this process dies
    (`supervise=False` to do without one). Raises LockConflict when another owner
    holds a different lock (`force=True` takes it over; its original state is put
    back first), ConfigError naming the valid range, PermissionDenied without root.
    """
    own = backend is None
    backend = backend if backend is not None else _open_default()
    try:
        journal = journal if journal is not None else Journal()
        request = make_request(sm, sm_max=sm_max, mem=mem, power_limit_w=power_limit_w)
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
    *,
    sm_max: int | None = None,
    mem: int | str | tuple[int, int] | None = None,
    power_limit_w: float | None = None,
    gpus: str | int | Sequence[str | int] | None = None,
    backend: Backend | None = None,
    force: bool = False,
    journal: Journal | None = None,
    command: str | None = None,
) -> Lock:
    """`gpuenv lock`: a lock no process owns; it lasts until `restore()` ('gpuenv restore')."""
    return lock(
        sm,
        sm_max=sm_max,
        mem=mem,
        power_limit_w=power_limit_w,
        gpus=gpus,
        backend=backend,
        force=force,
        supervise=False,
        journal=journal,
        kind="standing",
        command=command,
    )


# -- does the lock hold? -----------------------------------------------------------------


def check_holds(backend: Backend, index: int, applied: Applied) -> tuple[bool | None, str | None]:
    """(holds, why not) for a lock on GPU `index`, from the SM clock and reasons now."""
    if applied.locked_sm is not None:
        lo, hi = applied.locked_sm
        if applied.locked_sm == _BASE:
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
    if lo - 1 <= sm <= hi + 1:
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
    if reasons & REASON_SW_POWER_CAP:
        return "the power cap (SwPowerCap) pulls it below the lock"
    if reasons & (REASON_HW_THERMAL | REASON_SW_THERMAL):
        return "thermal slowdown pulls it below the lock"
    if reasons & REASON_HW_SLOWDOWN:
        return "hardware slowdown (HwSlowdown) pulls it below the lock"
    if reasons & REASON_GPU_IDLE:
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

    def describe(self) -> str:
        """One line: 'locked to 1350 MHz by pid 42 (...); holds' and so on."""
        if self.locked is None:
            return self.note or "not locked by gpuenv"
        text = describe_target(self.applied or Applied())
        who = f" by {self.owner}" if self.owner else ""
        line = f"locked ({text}){who}"
        if self.stale:
            line += "; stale: run 'gpuenv restore'"
        if self.holds is True:
            line += "; holds"
        elif self.holds is False:
            line += f"; NOT held: {self.reason_if_not_held}"
        elif self.reason_if_not_held:
            line += f"; {self.reason_if_not_held}"
        return line


def lock_status(backend: Backend, index: int, journal: Journal | None = None) -> LockStatus:
    """Lock owner and whether the lock holds right now on GPU `index` (for 'gpuenv status')."""
    journal = journal if journal is not None else Journal()
    entry = journal.get(backend.device_info(index).uuid)
    if entry is None:
        return LockStatus(
            locked=None,
            owner=None,
            range=None,
            holds=None,
            reason_if_not_held=None,
            note="not locked by gpuenv (NVML cannot tell whether another tool locked clocks)",
        )
    live = [o for o in entry.owners if o.alive()]
    stale = not live
    owner = (
        live[0].describe()
        if live
        else (f"{entry.owners[0].describe()}, which has ended" if entry.owners else None)
    )
    rng = entry.applied.locked_sm
    if rng == _BASE:
        base = backend.clock_limits(index).base_sm_mhz
        rng = (base, base) if base is not None else None
    if rng is None and entry.applied.app_clocks is not None:
        rng = (entry.applied.app_clocks[1], entry.applied.app_clocks[1])
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


__all__ = [
    "NAMED_SM",
    "Calibration",
    "ClockState",
    "Decision",
    "GpuPlan",
    "Lock",
    "LockPlan",
    "LockRequest",
    "LockStatus",
    "RestoreItem",
    "check_holds",
    "decide",
    "describe_applied",
    "describe_restore",
    "describe_target",
    "load_calibration",
    "lock",
    "lock_status",
    "make_request",
    "plan_lock",
    "plan_restore",
    "read_state",
    "release_owner",
    "restore",
    "restore_entry",
    "save_calibration",
    "standing_lock",
]
