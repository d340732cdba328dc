"""Plan a lock: read each GPU's state and limits, validate the request and snap it to
supported clocks (errors name the valid range), and choose locked clocks or, on GPUs
without them, application clocks. Reads only; nothing here writes a GPU setting.

NVML has no getter for locked clocks, so whether a GPU is locked, and to what, is
known only from the journal (`ClockState.locked_known`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuenv.backend import Backend, ClockLimits
from gpuenv.clocks.calibration_store import load_calibration
from gpuenv.clocks.journal import Applied, ClockState, Journal, JournalEntry
from gpuenv.clocks.request import TDP_LOCK, LockRequest, fmt_clock
from gpuenv.errors import ConfigError, NotSupported


def read_state(backend: Backend, index: int, *, journal: Journal | None = None) -> ClockState:
    """The state a lock would change on GPU `index` (`nvidia-smi -q -d CLOCK,POWER`).

    Locked ranges come from the journal (NVML cannot read them back); without a
    journal entry they are None with `locked_known=False`.
    """
    journal = journal if journal is not None else Journal()
    uuid = backend.device_info(index).uuid
    return state_with(backend, index, uuid, journal.get(uuid))


def state_with(backend: Backend, index: int, uuid: str, entry: JournalEntry | None) -> ClockState:
    """`read_state` with the GPU's journal entry (None: no gpuenv lock) already read."""
    try:
        app = backend.app_clocks(index)
        app_sm, app_mem = app.sm_mhz, app.mem_mhz
    except NotSupported:
        app_sm = app_mem = None
    locked_sm = locked_mem = None
    known = False
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


@dataclass(frozen=True)
class GpuPlan:
    """What a lock will do on one GPU."""

    index: int
    uuid: str
    name: str  # "GPU 0 (NVIDIA H100 80GB HBM3)"
    current: ClockState  # as read while planning
    applied: Applied
    notes: tuple[str, ...] = ()
    # when `current` was read (the backend's clock), if no gpuenv lock held the GPU then: a lock
    # taken soon after journals it as the original state instead of reading it again
    # (`Lock`, `STATE_FRESH_S`); None: it shows a lock's settings, or is of unknown age
    unlocked_at: float | None = None

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
        parts.append(f"lock memory clock to {fmt_clock(applied.locked_mem)}")
    if applied.locked_sm is not None:
        parts.append(f"lock SM clock to {fmt_clock(applied.locked_sm)}")
    return ", ".join(parts) or "nothing"


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
        uuid = backend.device_info(index).uuid
        entry = journal.get(uuid)
        current = state_with(backend, index, uuid, entry)
        read_at = backend.clock.now() if entry is None else None
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
        plans.append(GpuPlan(index, uuid, name, current, applied, tuple(notes), read_at))
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
        return limits.base_sm_mhz if limits.base_sm_mhz is not None else TDP_LOCK
    if sm == "sustained":
        cal = load_calibration(uuid, state_dir=journal.path)
        if cal is None:
            raise ConfigError(
                f"no calibrated clock for {name} in {journal.path}",
                hint="run 'gpuenv calibrate' first, as the account whose state directory that "
                "is: each account keeps its own (root's is /var/lib/gpuenv)",
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
    if target == TDP_LOCK:
        return TDP_LOCK
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
        if target == TDP_LOCK:
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


def describe_target(applied: Applied) -> str:
    """What a lock holds, short: 'SM 1350 MHz, power limit 500 W'."""
    parts = []
    if applied.locked_sm is not None:
        parts.append(f"SM {fmt_clock(applied.locked_sm)}")
    if applied.locked_mem is not None:
        parts.append(f"memory {fmt_clock(applied.locked_mem)}")
    if applied.app_clocks is not None:
        mem, sm = applied.app_clocks
        parts.append(f"application clocks SM {sm} MHz, memory {mem} MHz")
    if applied.power_limit_w is not None:
        parts.append(f"power limit {applied.power_limit_w:g} W")
    return ", ".join(parts) or "nothing"
