"""Where root's `gpuenv check` keeps what it found, for gpuenvd's gauges: one JSON file per
GPU UUID under the state directory (`<state dir>/checks/<uuid>.json`), as `gpuenv
calibrate` keeps its clock (gpuenv.clocks.calibration_store). gpuenvd's metrics read them
(gpuenv.daemon.fleet.check_metrics). Only root writes there: a check another account ran
is shown, not published (an account could post any figure)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuenv.check.report import GpuCheck, NodeCheck, PhaseResult
from gpuenv.clocks.calibration_store import (
    checks_dir,
    keep_record,
    kept_check_file,
    read_kept_check,
)


@dataclass(frozen=True)
class KeptCheck:
    """One GPU's part of a check, and when the check ran."""

    measured_at: float  # seconds since the epoch
    check: GpuCheck


def save_checks(report: NodeCheck, *, state_dir: str | os.PathLike[str] | None = None) -> Path:
    """Keep each GPU's part of `report` (atomically, one file a GPU); the directory."""
    now = time.time()
    for g in report.gpus:
        record = {"measured_at": now, "check": asdict(g)}
        data = json.dumps(record, indent=1, sort_keys=True).encode()
        keep_record(kept_check_file(g.uuid, state_dir), data, what="the checks directory")
    return checks_dir(state_dir)


def _phase(data: dict[str, Any] | None) -> PhaseResult | None:
    if data is None:
        return None
    return PhaseResult(**{**data, "other_pids": tuple(data.get("other_pids", ()))})


def load_check(uuid: str, *, state_dir: str | os.PathLike[str] | None = None) -> KeptCheck | None:
    """GPU `uuid`'s part of the last check root kept, or None where none was kept."""
    data = read_kept_check(uuid, state_dir=state_dir, record=KeptCheck)
    if data is None:
        return None
    g = dict(data["check"])
    alone = _phase(g.pop("alone"))
    assert alone is not None
    fields = {k: v for k, v in g.items() if k in GpuCheck.__dataclass_fields__}
    check = GpuCheck(
        **{
            **fields,
            "alone": alone,
            "together": _phase(fields.get("together")),
            "slower": tuple(fields.get("slower", ())),
            "why": tuple(fields.get("why", ())),
        }
    )
    return KeptCheck(float(data["measured_at"]), check)


__all__ = ["KeptCheck", "load_check", "save_checks"]
