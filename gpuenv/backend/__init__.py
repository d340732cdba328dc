"""The one door to the GPU: open a backend (`open_backend`, `backend_from_spec`).

What a backend is (the `Backend` protocol, its records and capabilities) lives in
`backend/base.py`, the read-only guard in `backend/readonly.py`; both are re-exported
here, so `from gpuenv.backend import Backend` is the one import code above the seam
needs. The implementations (`nvml*.py`, the only importers of pynvml; `sim*.py`, the
model) import `backend.base`, never this package, and are imported here only when a
backend of theirs is opened: no import circle, even through the factory.

    >>> backend = open_backend("sim")  # the simulated H100 ("nvml": the real GPUs)
    >>> backend.device_info(0).name, backend.clock_limits(0).max_sm_mhz
    ('NVIDIA H100 80GB HBM3', 1980)
    >>> backend.close()
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from gpuenv.backend.base import (
    CLOCK_LIMIT_TDP,
    CLOCK_LIMIT_UNLIMITED,
    REASON_APP_CLOCKS,
    REASON_COUNTERS,
    REASON_GPU_IDLE,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    REASON_SYNC_BOOST,
    WRITES,
    AppClocks,
    Backend,
    Capabilities,
    ClockLimits,
    DeviceInfo,
    FastReading,
    GpuProcess,
    MemorySystem,
    MemoryUsage,
    PowerLimits,
    SlowReading,
    Thresholds,
    Workload,
)
from gpuenv.backend.readonly import ReadOnlyBackend, env_readonly
from gpuenv.errors import ConfigError
from gpuenv.reasons import REASON_NAMES, reason_names

log = logging.getLogger(__name__)


def _open(kind: str | None, spec: Mapping[str, Any] | None) -> Backend:
    """The backend of `kind`: from `spec` where given, else as the environment says."""
    if kind == "nvml":
        from gpuenv.backend.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "sim":
        from gpuenv.backend.sim import SimBackend

        return SimBackend.from_spec(spec) if spec is not None else SimBackend.from_env()
    if spec is not None:
        raise ConfigError(
            f"unknown backend {kind!r} in a backend spec",
            hint="a spec comes from Backend.spec(): kind 'nvml' or 'sim'",
        )
    raise ConfigError(
        f"unknown backend {kind!r} (from GPUENV_BACKEND or --backend)",
        hint="use 'nvml' for the real GPU or 'sim' for the simulated one",
    )


def _spec_kind(spec: Mapping[str, Any]) -> str | None:
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"a backend spec is a JSON object, not {spec!r}",
            hint="pass what Backend.spec() returned",
        )
    kind = spec.get("kind")
    return kind if isinstance(kind, str) else None


def backend_from_spec(spec: Mapping[str, Any]) -> Backend:
    """Reopen the backend that `Backend.spec()` described, exactly: the environment is
    not consulted, and a read-only spec opens read-only."""
    backend = _open(_spec_kind(spec), spec)
    reason = spec.get("readonly")
    return ReadOnlyBackend(backend, reason=str(reason)) if reason else backend


def open_backend(
    kind: str | None = None,
    *,
    readonly: bool | None = None,
    dry_run: bool = False,
    spec: Mapping[str, Any] | None = None,
) -> Backend:
    """Open the GPU backend.

    Read-only when `readonly` is True, when `dry_run` is True, when the spec says so,
    or when GPUENV_READONLY=1 (the environment can only make it stricter).

    Args:
        kind: "nvml", "sim", or None to read GPUENV_BACKEND (default "nvml").
        readonly: refuse every write before it reaches the GPU.
        dry_run: as `readonly`, for a command's `--dry-run`.
        spec: what `Backend.spec()` returned in another process: the same GPUs.

    Returns:
        The `Backend`: the real GPU through NVML, or the simulated one.

    Raises:
        NvmlUnavailable: no NVIDIA driver (try `kind="sim"`).
        ConfigError: an unknown kind or spec.
    """
    ro_env = env_readonly()
    if spec is not None:
        kind = _spec_kind(spec)
    elif kind is None:
        kind = os.environ.get("GPUENV_BACKEND", "").strip().lower() or "nvml"
    backend = _open(kind, spec)
    if dry_run:
        return ReadOnlyBackend(backend, reason="--dry-run")
    if ro_env:
        return ReadOnlyBackend(backend, reason="GPUENV_READONLY=1")
    if spec is not None and spec.get("readonly"):
        return ReadOnlyBackend(backend, reason=str(spec["readonly"]))
    if readonly:
        return ReadOnlyBackend(backend, reason="read-only")
    return backend


def open_backend_quietly() -> Backend | None:
    """The default backend (`open_backend()`), or None where NVML is unavailable, said once
    in the log: timing without telemetry."""
    from gpuenv.errors import BackendError

    try:
        return open_backend()
    except BackendError as err:
        log.warning("timing without telemetry: %s", err)
        return None


_SHARED: list[Backend | None] = []  # opened once per process (NVML start-up is not free)


def shared_backend() -> Backend | None:
    """`open_backend_quietly()`, opened once a process, for the callers that time many
    short calls with no backend given (the do_bench drop-in, gpuenv.rank), each of which
    would otherwise pay NVML's start-up."""
    if not _SHARED:
        _SHARED.append(open_backend_quietly())
    return _SHARED[0]


__all__ = [
    "CLOCK_LIMIT_TDP",
    "CLOCK_LIMIT_UNLIMITED",
    "REASON_APP_CLOCKS",
    "REASON_COUNTERS",
    "REASON_GPU_IDLE",
    "REASON_HW_POWER_BRAKE",
    "REASON_HW_SLOWDOWN",
    "REASON_HW_THERMAL",
    "REASON_NAMES",
    "REASON_SW_POWER_CAP",
    "REASON_SW_THERMAL",
    "REASON_SYNC_BOOST",
    "WRITES",
    "AppClocks",
    "Backend",
    "Capabilities",
    "ClockLimits",
    "DeviceInfo",
    "FastReading",
    "GpuProcess",
    "MemorySystem",
    "MemoryUsage",
    "PowerLimits",
    "ReadOnlyBackend",
    "SlowReading",
    "Thresholds",
    "Workload",
    "backend_from_spec",
    "env_readonly",
    "open_backend",
    "open_backend_quietly",
    "reason_names",
    "shared_backend",
]
