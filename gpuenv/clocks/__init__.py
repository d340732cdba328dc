"""Lock GPU clocks, and always put back exactly what was there.

    with gpuenv.lock(sm=1350):          # nvidia-smi -lgc 1350,1350 on every GPU
        run_benchmark()                 # restored on exit, exception, Ctrl-C; the
                                        # watchdog restores after SIGKILL too

`gpuenv.lock` (gpuenv.locking) is the one public lock: gpuenvd's lease when a daemon
serves the GPUs, else a local lock. This package is that local path: `local_lock` locks
here, as root, and never asks a daemon.

The package, in the order a lock goes through it:
  request.py            parse and validate what the caller asks (`make_request`)
  plan.py               read each GPU, snap the request to supported clocks, choose
                        locked or application clocks (`plan_lock`); reads only
  locks.py              `Lock` / `local_lock()`: refuse, share or replace an existing lock,
                        journal, then apply GPU by GPU, rolling back on failure
  restoring.py          apply, put back the journaled original (`release_owner`,
                        `restore`)
  status.py             does the lock hold (`lock_holds`: one answer), `lock_status`
  journal.py            the crash-safe record of what was changed and by whom
  supervisor.py         the watchdog process that restores after its owner's death
  calibration.py        'gpuenv calibrate': the clock a sustained load holds
  calibration_store.py  where that clock is kept, read by sm="sustained"

NVML has no getter for locked clocks, so whether a GPU is locked, and to what,
is known only from the journal (`ClockState.locked_known`); whether the lock
holds right now is checked against the SM clock (`status.lock_holds`).

The names below are importable from `gpuenv.clocks` (loaded on first use).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuenv.clocks.calibration_store import Calibration, load_calibration, save_calibration
    from gpuenv.clocks.journal import ClockState
    from gpuenv.clocks.locks import Decision, Lock, decide, local_lock, standing_lock
    from gpuenv.clocks.plan import (
        GpuPlan,
        LockPlan,
        describe_applied,
        describe_target,
        plan_lock,
        read_state,
    )
    from gpuenv.clocks.request import NAMED_SM, LockRequest, LockSettings, make_request
    from gpuenv.clocks.restoring import (
        RestoreItem,
        describe_restore,
        plan_restore,
        release_owner,
        restore,
        restore_entry,
    )
    from gpuenv.clocks.status import (
        LOCK_TOLERANCE_MHZ,
        LockStatus,
        check_holds,
        lock_holds,
        lock_status,
    )

_EXPORTS = {
    "Calibration": "calibration_store",
    "load_calibration": "calibration_store",
    "save_calibration": "calibration_store",
    "ClockState": "journal",
    "Decision": "locks",
    "Lock": "locks",
    "decide": "locks",
    "local_lock": "locks",
    "standing_lock": "locks",
    "GpuPlan": "plan",
    "LockPlan": "plan",
    "describe_applied": "plan",
    "describe_target": "plan",
    "plan_lock": "plan",
    "read_state": "plan",
    "NAMED_SM": "request",
    "LockRequest": "request",
    "LockSettings": "request",
    "make_request": "request",
    "RestoreItem": "restoring",
    "describe_restore": "restoring",
    "plan_restore": "restoring",
    "release_owner": "restoring",
    "restore": "restoring",
    "restore_entry": "restoring",
    "LOCK_TOLERANCE_MHZ": "status",
    "LockStatus": "status",
    "check_holds": "status",
    "lock_holds": "status",
    "lock_status": "status",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuenv.clocks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpuenv.clocks.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "LOCK_TOLERANCE_MHZ",
    "NAMED_SM",
    "Calibration",
    "ClockState",
    "Decision",
    "GpuPlan",
    "Lock",
    "LockPlan",
    "LockRequest",
    "LockSettings",
    "LockStatus",
    "RestoreItem",
    "check_holds",
    "decide",
    "describe_applied",
    "describe_restore",
    "describe_target",
    "load_calibration",
    "local_lock",
    "lock_holds",
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
