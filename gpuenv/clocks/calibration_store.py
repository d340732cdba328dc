"""Where 'gpuenv calibrate' keeps its result, read by `sm="sustained"`: one JSON file
per GPU UUID under the state directory (`<state dir>/calibration/<uuid>.json`); and where
root's `gpuenv check` keeps its figures for gpuenvd's gauges (`<state dir>/checks/`:
gpuenv.check.store writes and reads them as records, gpuenvd's metrics as plain JSON)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv._files import open_dir, replace_at
from gpuenv.clocks.journal import default_state_dir
from gpuenv.errors import ConfigError


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
    record = Calibration(
        uuid, int(sustained_mhz), time.time(), power_limit_w, gpu_name, details or {}
    )
    data = json.dumps(record.__dict__, indent=1, sort_keys=True).encode()
    keep_record(path, data, what="the calibration directory")
    return path


def keep_record(path: Path, data: bytes, *, what: str) -> None:
    """Write one of root's records for gpuenvd to read (0644, in a 0755 directory made
    if need be), atomically: a failed write leaves the old file and no temporary one. The
    directory is reached without trusting a name (no link, root's): root writes only there."""
    dfd = open_dir(path.parent, create=True, mode=0o755, what=what)
    try:
        replace_at(dfd, path.name, data, mode=0o644)
    finally:
        os.close(dfd)


def load_calibration(
    uuid: str, *, state_dir: str | os.PathLike[str] | None = None
) -> Calibration | None:
    """The stored calibration of GPU `uuid`, or None if 'gpuenv calibrate' never ran for it."""
    path = _calibration_file(uuid, state_dir)
    data = _read_kept(path, "the calibration file", "run 'gpuenv calibrate' again", Calibration)
    if data is None:
        return None
    return Calibration(**{k: data[k] for k in Calibration.__dataclass_fields__ if k in data})


def _read_kept(path: Path, what: str, hint: str, record: type | None = None) -> Any:
    """The JSON a file of root's records holds (None: no file), checked as `record` where
    given; a damaged file is a ConfigError that says `hint`."""
    from gpuenv import reader

    text = reader.read_text(path, what=what, missing_ok=True, setting="GPUENV_STATE_DIR")
    if text is None:
        return None
    try:
        data = reader.parse_json(text, what=what, path=path)
        if record is not None:
            reader.check_record(record, data, what=what, path=path)
    except reader.BadRecord as err:
        raise ConfigError(f"{err.message} (the file is damaged)", hint=hint) from err
    return data


def checks_dir(state_dir: str | os.PathLike[str] | None) -> Path:
    """Where root's `gpuenv check` keeps its figures, a file a GPU."""
    base = Path(state_dir) if state_dir is not None else default_state_dir()
    return base / "checks"


def kept_check_file(uuid: str, state_dir: str | os.PathLike[str] | None) -> Path:
    return checks_dir(state_dir) / f"{uuid}.json"


def read_kept_check(
    uuid: str, *, state_dir: str | os.PathLike[str] | None = None, record: type | None = None
) -> dict[str, Any] | None:
    """The JSON object root's last `gpuenv check` kept for GPU `uuid` (None: none kept),
    checked as `record` where given (gpuenv.check.store's; gpuenvd, below gpuenv.check,
    reads it as plain JSON)."""
    path, what = kept_check_file(uuid, state_dir), "the kept check"
    data = _read_kept(path, what, "run 'gpuenv check' again as root", record)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} {path} holds no JSON object (the file is damaged)",
            hint="run 'gpuenv check' again as root",
        )
    return data
