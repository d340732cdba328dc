"""Environment metadata: what state produced the numbers (GPUs, driver, clocks, power,
host, versions, the batch job), recorded with every run (gpuenv.results re-exports it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gpuenv.backend import Backend
from gpuenv.errors import GpuenvError
from gpuenv.timebase import Clock

T = TypeVar("T")


def environment_metadata(
    backend: Backend,
    gpus: Sequence[int],
    *,
    clock: Clock | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What state produced the numbers: GPUs, driver, clocks, power, host, versions.

    Never raises for a value it cannot read (it records the error instead), and
    never imports torch: CUDA and torch versions are recorded only when the
    program has imported torch already.
    """
    from gpuenv import __version__

    clock = clock or backend.clock
    wall = clock.wall()
    meta: dict[str, Any] = {
        "gpuenv_version": __version__,
        "time_unix": wall,
        "time_utc": datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "backend": getattr(backend, "name", None),
        "readonly": bool(getattr(backend, "readonly", False)),
        "cpu_model": _cpu_model(),
        "cpu_governor": _read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "cpu_count": os.cpu_count(),
    }
    errors: dict[str, str] = {}
    meta["driver_version"] = _try(backend.driver_version, errors, "driver_version")
    torch = sys.modules.get("torch")
    if torch is not None:
        meta["torch_version"] = getattr(torch, "__version__", None)
        meta["cuda_version"] = getattr(getattr(torch, "version", None), "cuda", None)
    meta["gpus"] = [_gpu_metadata(backend, g) for g in gpus]
    job = job_metadata(os.environ)
    if job:
        meta["job"] = job
    if errors:
        meta["errors"] = errors
    if extra:
        meta.update(extra)
    return meta


# the batch job a result came from: Slurm's ids (the job's report is `gpuenv job JOB_ID` on
# its node) and its rank; torchrun's where no Slurm
_JOB_ENV = (
    (
        "slurm",
        "SLURM_JOB_ID",
        {
            "job_id": "SLURM_JOB_ID",
            "step_id": "SLURM_STEP_ID",
            "array_job_id": "SLURM_ARRAY_JOB_ID",
            "array_task_id": "SLURM_ARRAY_TASK_ID",
            "rank": "SLURM_PROCID",
            "local_id": "SLURM_LOCALID",
            "node": "SLURMD_NODENAME",
            "ntasks": "SLURM_NTASKS",
        },
    ),
    (
        "torchrun",
        "TORCHELASTIC_RUN_ID",
        {
            "run_id": "TORCHELASTIC_RUN_ID",
            "rank": "RANK",
            "local_rank": "LOCAL_RANK",
            "world_size": "WORLD_SIZE",
        },
    ),
)


def job_metadata(env: Mapping[str, str]) -> dict[str, str]:
    """The scheduler's job this process runs in ({} outside one): ids, rank, node, read
    from `env` (the process's environment, `os.environ`)."""
    for scheduler, marker, fields in _JOB_ENV:
        if env.get(marker):
            out = {"scheduler": scheduler}
            out.update({k: str(env[v])[:64] for k, v in fields.items() if env.get(v)})
            return out
    return {}


def _gpu_metadata(backend: Backend, g: int) -> dict[str, Any]:
    errors: dict[str, str] = {}
    out: dict[str, Any] = {"index": g}
    info = _try(lambda: backend.device_info(g), errors, "device_info")
    if info is not None:
        out.update(
            uuid=info.uuid,
            name=info.name,
            pci_bus_id=info.pci_bus_id,
            compute_capability=list(info.compute_capability or ()) or None,
            mig_mode=info.mig_mode,
            memory_total_mib=info.memory_total_mib,
        )
    limits = _try(lambda: backend.clock_limits(g), errors, "clock_limits")
    if limits is not None:
        out.update(
            max_sm_mhz=limits.max_sm_mhz,
            max_mem_mhz=limits.max_mem_mhz,
            base_sm_mhz=limits.base_sm_mhz,
            default_app_sm_mhz=limits.default_app_sm_mhz,
        )
    app = _try(lambda: backend.app_clocks(g), errors, "app_clocks")
    if app is not None:
        out.update(app_sm_mhz=app.sm_mhz, app_mem_mhz=app.mem_mhz)
    power = _try(lambda: backend.power_limits(g), errors, "power_limits")
    if power is not None:
        out.update(power_limit_w=power.limit_w, default_power_limit_w=power.default_w)
    th = _try(lambda: backend.thresholds(g), errors, "thresholds")
    if th is not None:
        out.update(slowdown_c=th.slowdown_c, shutdown_c=th.shutdown_c)
    out["persistence"] = _try(lambda: backend.persistence_mode(g), errors, "persistence_mode")
    if info is not None:  # the fleet view: this card's own sustained clock, if calibrated
        with contextlib.suppress(GpuenvError, OSError):
            from gpuenv.clocks.calibration_store import load_calibration

            cal = load_calibration(info.uuid)
            if cal is not None:
                out["sustained_sm_mhz"] = cal.sustained_mhz
    now = _try(lambda: backend.read_fast(g), errors, "read_fast")
    if now is not None:
        out.update(
            sm_mhz=now.sm_mhz,
            mem_mhz=now.mem_mhz,
            temp_c=now.temp_c,
            power_w=now.power_w,
            reasons=now.reasons,
        )
    if errors:
        out["errors"] = errors
    return out


def _try(fn: Callable[[], T], errors: dict[str, str], what: str) -> T | None:
    try:
        return fn()
    except Exception as err:  # metadata must never stop a measurement
        errors[what] = " ".join(str(err).split()) or type(err).__name__
        return None


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _cpu_model() -> str | None:
    text = _read_text("/proc/cpuinfo")
    if text:
        for line in text.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None
