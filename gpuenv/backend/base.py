"""The one door to the GPU: what a backend is (its protocol, records and capabilities).

Everything above this package gets a `Backend` passed in and never knows
whether the GPU is real (`backend/nvml.py` and its `nvml_*` modules, the only
importers of pynvml) or simulated (`backend/sim.py` and its `sim_*` modules).
GPUs are addressed by NVML index here; code above
keys anything persistent by UUID.

Reads come in three costs (measured on an H100: docs/explanation/what-gpus-do.md):
  - `read_fast`: SM/memory clock, power, temperature, reasons: ~2 us a value on an
    H100; safe on the sampler's every tick.
  - `read_slow`: time under each clock-event reason (~0.1-0.2 ms) at region edges and
    every ~100 ms at most, off the caller's thread; with `energy=True` (the default)
    also the energy counter, which costs ~3 ms of driver time (and ~4 ms of CPU on
    the lent H100): the sampler asks for it once a second, never at edges.
  - everything else (static facts, processes): status, doctor, planning.

Writes raise `PermissionDenied` without root, `NotSupported` where the GPU cannot,
and `ReadOnlyError` before reaching the GPU when wrapped in `ReadOnlyBackend`.

Code above this package asks a backend what it needs instead of testing its name:
its `clock` (the time its GPU lives on: real for NVML, virtual or real for the
simulator), its `capabilities` (is the GPU a model, may this process write
settings), its `workload` (a synthetic load to run, for a GPU with no CUDA behind
it; None for a real GPU) and its `spec()` (JSON that reopens the same GPUs in
another process: `open_backend(spec=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gpuenv.backend.details import GpuDetails
from gpuenv.reasons import COUNTER_NAMES, Reason
from gpuenv.timebase import Clock

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
    # What a model knows beyond NVML's process list (the simulator names the processes it
    # stands for and shares out its SM time); None from NVML: ask the host (nvitop, psutil).
    sm_pct: int | None = None
    user: str | None = None
    command: str | None = None


@dataclass(frozen=True)
class MemoryUsage:
    """`nvidia-smi --query-gpu=memory.used,memory.total` (MiB)."""

    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do: what code above the seam asks instead of the backend's name."""

    # The GPUs are a model (the simulator): CUDA cannot see them, and what gpuenv finds
    # describes the model, not this machine.
    simulated: bool
    # This process may change GPU settings as far as the driver is concerned (root for
    # NVML; the simulator's permission model). A `ReadOnlyBackend` still says what the
    # process may do: its own `readonly` says that gpuenv will not.
    privileged: bool


@dataclass(frozen=True)
class MemorySystem:
    """A GPU's cache and memory bus as CUDA reports them (`cudaDeviceProp.l2CacheSize`,
    `memoryBusWidth`; torch: `get_device_properties().L2_cache_size`): what sizes an L2
    flush and how long it takes."""

    l2_bytes: int
    bus_bits: int

    @property
    def bytes_per_mem_cycle(self) -> float:
        """Bytes the memory moves per memory clock cycle: the bus, double data rate (an
        H100 SXM's 5120 bits: 1280 B, 3.35 TB/s at 2619 MHz; an H200's 6144: 1536 B)."""
        return self.bus_bits / 8 * 2


@runtime_checkable
class Workload(Protocol):
    """A synthetic load on a GPU with no CUDA behind it (the simulator's).

    What the simulated device times, what `stable()` preconditions with by default
    and what the monitor's scenarios drive. Work advances a virtual clock, or sleeps
    on the real one.
    """

    clock: Clock

    def clock_limits(self, index: int) -> ClockLimits: ...
    def open_context(self, index: int, pid: int | None = None) -> None: ...
    def close_context(self, index: int, pid: int | None = None) -> None: ...
    def run_work(
        self, index: int, cycles: float, *, power_intensity: float = 1.0, mem_cycles: float = 0.0
    ) -> float:
        """Run `cycles` SM cycles (+ `mem_cycles` memory cycles); return the seconds taken."""
        ...

    def memory_system(self, index: int) -> MemorySystem:
        """The simulated GPU's L2 and memory bus (what CUDA would report)."""
        ...

    def set_background_load(
        self, index: int, utilization: float, *, pid: int | None = None
    ) -> None: ...
    def idle(self, seconds: float) -> None: ...
    def virtual_copy(self) -> Backend:
        """The same GPUs in memory on a virtual clock of their own, with the settings in
        force now but fresh (no context, no load, at idle temperature): work on the copy
        takes no wall time, reaches no other process and does not depend on what ran before."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Everything gpuenv may ask of a GPU. Indices are NVML indices."""

    # "nvml" | "sim": which driver records (journal entries, status) belong to. Code
    # above the seam never branches on it: it asks `capabilities`, `workload`, `spec()`.
    name: str
    readonly: bool
    clock: Clock  # the time the GPU lives on: real for NVML, virtual or real for the simulator

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def workload(self) -> Workload | None:
        """A synthetic load this backend can run (the simulator's); None for a real GPU."""
        ...

    def spec(self) -> dict[str, Any] | None:
        """JSON that reopens the same GPUs in another process (`open_backend(spec=...)`),
        on real time; None where no other process can (a simulator kept in memory)."""
        ...

    def mig_parent_index(self, mig_uuid: str) -> int | None:
        """NVML index of the GPU that holds MIG device `mig_uuid` ("MIG-..."), or None."""
        ...

    # -- static / slow-changing reads ---------------------------------------------
    def device_count(self) -> int: ...
    def device_info(self, index: int) -> DeviceInfo: ...
    def driver_version(self) -> str: ...
    def clock_limits(self, index: int) -> ClockLimits: ...
    def app_clocks(self, index: int) -> AppClocks: ...
    def power_limits(self, index: int) -> PowerLimits: ...
    def thresholds(self, index: int) -> Thresholds: ...
    def supported_reasons(self, index: int) -> int: ...
    def performance_state(self, index: int) -> int:
        """The P-state: 0 for P0 (maximum performance) to 15 (`--query-gpu=pstate`)."""
        ...

    def persistence_mode(self, index: int) -> bool | None: ...
    def processes(self, index: int) -> list[GpuProcess]: ...
    def utilization(self, index: int) -> tuple[int, int] | None:
        """(gpu %, memory %) over the driver's last sample period, or None."""
        ...

    def memory(self, index: int) -> MemoryUsage | None:
        """Device memory used and total, or None where the GPU does not say."""
        ...

    def details(self, index: int) -> GpuDetails:
        """`nvidia-smi -q`'s board, PCIe, fan, ECC and engines (backend/details.py)."""
        ...

    # -- telemetry ----------------------------------------------------------------
    def read_fast(self, index: int) -> FastReading: ...
    def read_slow(self, index: int, *, energy: bool = True) -> SlowReading:
        """Cumulative counters. `energy=False` skips the ~3 ms energy counter
        (`energy_mj` is None then)."""
        ...

    def power_samples(self, index: int, since_us: int = 0) -> list[tuple[int, float]]:
        """The driver's power samples stamped after `since_us`: [(timestamp_us, watts)],
        each the mean power since the sample before (every ~20 ms; the driver keeps
        ~2.4 s). `nvmlDeviceGetSamples(TOTAL_POWER_SAMPLES)`; [] when there are none."""
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


# The writes: what ReadOnlyBackend refuses, by method name.
WRITES = (
    "set_locked_sm_clocks",
    "reset_locked_sm_clocks",
    "set_locked_mem_clocks",
    "reset_locked_mem_clocks",
    "set_app_clocks",
    "reset_app_clocks",
    "set_power_limit",
)
