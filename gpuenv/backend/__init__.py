"""The one door to the GPU.

Everything above this package gets a `Backend` passed in and never knows
whether the GPU is real (`backend/nvml.py`, the only importer of pynvml) or
simulated (`backend/sim.py`). GPUs are addressed by NVML index here; code above
keys anything persistent by UUID.

Reads come in three costs (GPU_FACTS.md):
  - `read_fast`: SM/memory clock, power, temperature, reasons: ~2 us a value on an
    H100; safe on the sampler's every tick.
  - `read_slow`: time under each clock-event reason (~0.1-0.2 ms) at region edges and
    every ~100 ms at most, off the caller's thread; with `energy=True` (the default)
    also the energy counter, which costs ~3 ms of driver time (and ~4 ms of CPU on
    the lent H100): the sampler asks for it once a second, never at edges.
  - everything else (static facts, processes): status, doctor, planning.

Writes raise `PermissionDenied` without root, `NotSupported` where the GPU cannot,
and `ReadOnlyError` before reaching the GPU when wrapped in `ReadOnlyBackend`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpuenv.errors import ConfigError, ReadOnlyError
from gpuenv.reasons import COUNTER_NAMES, REASON_NAMES, Reason, reason_names

# Symbolic clock values accepted by set_locked_sm_clocks (NVML_CLOCK_LIMIT_ID_*).
CLOCK_LIMIT_TDP = 0xFFFFFF01  # (TDP, TDP) locks to the base clock: 1590 MHz on an H100
CLOCK_LIMIT_UNLIMITED = 0xFFFFFF02

# Clock-event ("throttle") reasons: gpuenv.reasons is the one vocabulary; these names
# stay importable from here for code written against them.
REASON_GPU_IDLE = int(Reason.GPU_IDLE)
REASON_APP_CLOCKS = int(Reason.APP_CLOCKS)
REASON_SW_POWER_CAP = int(Reason.SW_POWER_CAP)
REASON_HW_SLOWDOWN = int(Reason.HW_SLOWDOWN)
REASON_SYNC_BOOST = int(Reason.SYNC_BOOST)
REASON_SW_THERMAL = int(Reason.SW_THERMAL)
REASON_HW_THERMAL = int(Reason.HW_THERMAL)
REASON_HW_POWER_BRAKE = int(Reason.HW_POWER_BRAKE)
# Cumulative time-under-reason counters (NVML field ids 74-81, nanoseconds).
REASON_COUNTERS = COUNTER_NAMES


@dataclass(frozen=True)
class DeviceInfo:
    """Static facts about one GPU (`nvidia-smi -L`, `nvidia-smi -q`)."""

    index: int  # NVML index (nvidia-smi order), not CUDA's
    uuid: str
    pci_bus_id: str  # "00000000:18:00.0"
    name: str
    compute_capability: tuple[int, int] | None
    mig_mode: bool | None  # None: GPU without MIG support
    memory_total_mib: int | None
    serial: str | None = None


@dataclass(frozen=True)
class ClockLimits:
    """What the GPU allows: `nvidia-smi -q -d CLOCK,SUPPORTED_CLOCKS`."""

    max_sm_mhz: int
    max_mem_mhz: int
    default_app_sm_mhz: int | None
    default_app_mem_mhz: int | None
    base_sm_mhz: int | None  # the TDP/base clock (nvidia-smi base-clocks); None if unknown
    supported_mem_mhz: tuple[int, ...]  # descending
    # per memory clock, descending
    supported_sm_mhz: dict[int, tuple[int, ...]] = field(default_factory=dict)
    locked_clocks_supported: bool = True  # Volta+: nvmlDeviceSetGpuLockedClocks
    locked_mem_supported: bool = False  # Ampere+, but not applied at once on Hopper


@dataclass(frozen=True)
class PowerLimits:
    """`nvidia-smi -q -d POWER`: watts."""

    limit_w: float  # enforced now
    default_w: float
    min_w: float
    max_w: float


@dataclass(frozen=True)
class Thresholds:
    """`nvidia-smi -q -d TEMPERATURE`: degrees C; None where the GPU does not say."""

    slowdown_c: float | None
    shutdown_c: float | None
    gpu_max_c: float | None
    mem_max_c: float | None


@dataclass(frozen=True)
class FastReading:
    """The cheap values, read together (`nvidia-smi dmon -s pc`)."""

    sm_mhz: int
    mem_mhz: int
    power_w: float  # nvmlDeviceGetPowerUsage: a 1 s average on Ampere and newer
    temp_c: float
    reasons: int  # clock-event reasons bitmask
    power_instant_w: float | None = None  # field NVML_FI_DEV_POWER_INSTANT where supported
    driver_ts_us: int | None = None  # driver's timestamp of the value, where NVML gives one


@dataclass(frozen=True)
class SlowReading:
    """Cumulative counters: never on a hot path (the energy read alone costs ~3 ms)."""

    energy_mj: int | None  # nvmlDeviceGetTotalEnergyConsumption, since driver load
    reason_ns: dict[str, int]  # REASON_COUNTERS name -> cumulative ns; missing where unsupported
    mem_temp_c: float | None = None  # field 82
    driver_ts_us: int | None = None


@dataclass(frozen=True)
class AppClocks:
    """Application clocks now (`nvidia-smi -q -d CLOCK`, 'Applications Clocks')."""

    sm_mhz: int | None
    mem_mhz: int | None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int | None
    kind: str  # "compute" | "graphics"


@runtime_checkable
class Backend(Protocol):
    """Everything gpuenv may ask of a GPU. Indices are NVML indices."""

    name: str  # "nvml" | "sim"
    readonly: bool

    # -- static / slow-changing reads ---------------------------------------------
    def device_count(self) -> int: ...
    def device_info(self, index: int) -> DeviceInfo: ...
    def driver_version(self) -> str: ...
    def clock_limits(self, index: int) -> ClockLimits: ...
    def app_clocks(self, index: int) -> AppClocks: ...
    def power_limits(self, index: int) -> PowerLimits: ...
    def thresholds(self, index: int) -> Thresholds: ...
    def supported_reasons(self, index: int) -> int: ...
    def persistence_mode(self, index: int) -> bool | None: ...
    def processes(self, index: int) -> list[GpuProcess]: ...
    def utilization(self, index: int) -> tuple[int, int] | None:
        """(gpu %, memory %) over the driver's last sample period, or None."""
        ...

    # -- telemetry ----------------------------------------------------------------
    def read_fast(self, index: int) -> FastReading: ...
    def read_slow(self, index: int, *, energy: bool = True) -> SlowReading:
        """Cumulative counters. `energy=False` skips the ~3 ms energy counter
        (`energy_mj` is None then)."""
        ...

    # -- writes (root) ------------------------------------------------------------
    def set_locked_sm_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lgc min,max`. Accepts CLOCK_LIMIT_TDP / CLOCK_LIMIT_UNLIMITED for both."""
        ...

    def reset_locked_sm_clocks(self, index: int) -> None:
        """`nvidia-smi -rgc`."""
        ...

    def set_locked_mem_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lmc min,max`."""
        ...

    def reset_locked_mem_clocks(self, index: int) -> None:
        """`nvidia-smi -rmc`."""
        ...

    def set_app_clocks(self, index: int, mem_mhz: int, sm_mhz: int) -> None:
        """`nvidia-smi -ac mem,sm`."""
        ...

    def reset_app_clocks(self, index: int) -> None:
        """`nvidia-smi -rac`."""
        ...

    def set_power_limit(self, index: int, watts: float) -> None:
        """`nvidia-smi -pl W`. Implementations read the limit back and raise if it did not take."""
        ...

    def close(self) -> None: ...


_WRITES = (
    "set_locked_sm_clocks",
    "reset_locked_sm_clocks",
    "set_locked_mem_clocks",
    "reset_locked_mem_clocks",
    "set_app_clocks",
    "reset_app_clocks",
    "set_power_limit",
)


class ReadOnlyBackend:
    """Wraps a backend so that every write raises `ReadOnlyError` before reaching the GPU.

    Reads pass straight through (attribute delegation), so telemetry costs the same.
    """

    readonly = True

    def __init__(self, inner: Backend, reason: str = "GPUENV_READONLY=1"):
        self._inner = inner
        self.reason = reason
        self.name = inner.name

    @property
    def inner(self) -> Backend:
        return self._inner

    def __getattr__(self, attr: str):  # reads: delegate
        if attr in _WRITES:
            def refuse(index: int, *args: object, **kwargs: object) -> None:
                raise ReadOnlyError(_describe_write(attr, args), gpu=index, reason=self.reason)

            return refuse
        return getattr(self._inner, attr)


def _describe_write(op: str, args: tuple[object, ...]) -> str:
    words = {
        "set_locked_sm_clocks": "lock SM clocks to {}-{} MHz",
        "reset_locked_sm_clocks": "reset locked SM clocks",
        "set_locked_mem_clocks": "lock memory clocks to {}-{} MHz",
        "reset_locked_mem_clocks": "reset locked memory clocks",
        "set_app_clocks": "set application clocks to mem {} / SM {} MHz",
        "reset_app_clocks": "reset application clocks",
        "set_power_limit": "set the power limit to {} W",
    }[op]
    try:
        return words.format(*args)
    except IndexError:
        return words


def env_readonly() -> bool:
    """True when GPUENV_READONLY asks for read-only mode ('1', 'true', 'yes', 'on')."""
    value = os.environ.get("GPUENV_READONLY", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"GPUENV_READONLY={value!r} is not understood", hint="use 1 or 0")


def open_backend(
    kind: str | None = None, *, readonly: bool | None = None, dry_run: bool = False
) -> Backend:
    """Open the GPU backend.

    `kind`: "nvml", "sim", or None to read GPUENV_BACKEND (default "nvml").
    Read-only when `readonly` is True, when `dry_run` is True, or when
    GPUENV_READONLY=1 (the environment can only make it stricter).
    """
    if kind is None:
        kind = os.environ.get("GPUENV_BACKEND", "").strip().lower() or "nvml"
    ro_env = env_readonly()
    backend: Backend
    if kind == "nvml":
        from gpuenv.backend.nvml import NvmlBackend

        backend = NvmlBackend()
    elif kind == "sim":
        from gpuenv.backend.sim import SimBackend

        backend = SimBackend.from_env()
    else:
        raise ConfigError(
            f"unknown backend {kind!r} (from GPUENV_BACKEND or --backend)",
            hint="use 'nvml' for the real GPU or 'sim' for the simulated one",
        )
    if dry_run:
        return ReadOnlyBackend(backend, reason="--dry-run")
    if readonly or ro_env:
        return ReadOnlyBackend(backend, reason="GPUENV_READONLY=1" if ro_env else "read-only")
    return backend


__all__ = [
    "CLOCK_LIMIT_TDP",
    "CLOCK_LIMIT_UNLIMITED",
    "REASON_COUNTERS",
    "REASON_NAMES",
    "AppClocks",
    "Backend",
    "ClockLimits",
    "DeviceInfo",
    "FastReading",
    "GpuProcess",
    "PowerLimits",
    "ReadOnlyBackend",
    "SlowReading",
    "Thresholds",
    "env_readonly",
    "open_backend",
    "reason_names",
]
