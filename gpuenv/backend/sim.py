"""A simulated GPU: a small model of the physics that make benchmark numbers lie.

`SimBackend` implements the `Backend` protocol (plus `power_samples` and
`nvml_version`, as `NvmlBackend` has them) and adds a synthetic workload API
(`open_context`, `run_work`, `set_background_load`, `idle`), conditions
(`set_ambient`), fault injection and `truth()` for tests. The GPU model itself
is `sim_gpu.GpuModel`; profiles are data in `sim_profiles.py`. What it models,
per GPU:

  - the clock governor: parked at the idle clock with reason GpuIdle until a
    CUDA context exists, then boost (the application clock, or the top of a
    locked range); application clocks take effect at context creation;
  - power: static + temperature-dependent leakage + dynamic power growing with
    the clock and the load (`sim_profiles.py` gives the formula);
  - the SW power cap: every driver update period (100 ms) the driver compares
    its filtered power with the limit and moves a clock ceiling in supported
    steps (down at most `max_step_down` steps a period, up as far as the
    headroom allows), so a heavy load meets the 700 W cap within 100-300 ms and
    the capped clock creeps down as the chip heats;
  - temperature: first order (ambient + R * power, time constant tau), and the
    hotter chip leaks more, which is what pulls the capped clock down;
  - SW thermal slowdown above the max operating temperature, HW slowdown
    (0x40 | 0x8, clock halved) at the slowdown threshold, and a shutdown that
    loses the GPU;
  - readings as NVML gives them: clocks, reasons, power (a 1 s average),
    energy and the time-under-reason counters refresh at driver updates
    (100 ms), temperature every 200 ms, as integers where NVML's are.

Physics advance lazily to `clock.now()` on every call, in fixed 10 ms steps on
an integer-nanosecond timeline (100 ms steps once nothing has changed for 2 s),
so there is no background thread, virtual time is exact and a read costs
microseconds. With a `VirtualClock`, `run_work` and `idle` advance time
themselves; with the real clock they sleep.

Driver state (locked clocks, application clocks, power limit, persistence
mode, and the last temperature with its timestamp) lives in a JSON state file
when one is given, shared by every process that opens it: see `sim_state.py`.
Contexts, background loads and running work belong to the SimBackend that made
them. Persistence mode off: when the last SimBackend using the state file
closes (or its process dies), the locked clocks, application clocks and power
limit revert to defaults, as a real driver's do when it de-initialises the GPU.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv.backend import (
    CLOCK_LIMIT_TDP,
    CLOCK_LIMIT_UNLIMITED,
    AppClocks,
    ClockLimits,
    DeviceInfo,
    FastReading,
    GpuProcess,
    PowerLimits,
    SlowReading,
    Thresholds,
)
from gpuenv.backend.sim_gpu import GpuModel, Job, Settings
from gpuenv.backend.sim_profiles import PROFILES, SimProfile, get_profile
from gpuenv.backend.sim_state import StateFile, default_state_path
from gpuenv.errors import (
    ConfigError,
    DeviceNotFound,
    DriverTimeout,
    GpuLost,
    InvalidValue,
    NotSupported,
    PermissionDenied,
)
from gpuenv.timebase import Clock, RealClock

BACKGROUND_MIB = 2048  # device memory a background process holds

# NVML return codes, carried on the errors for people who know them.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15

FAULT_KINDS = ("gpu_lost", "timeout", "not_supported", "permission")
_BACKEND_OPS = (
    "device_info",
    "clock_limits",
    "app_clocks",
    "power_limits",
    "thresholds",
    "supported_reasons",
    "persistence_mode",
    "processes",
    "utilization",
    "read_fast",
    "read_slow",
    "power_samples",
    "set_locked_sm_clocks",
    "reset_locked_sm_clocks",
    "set_locked_mem_clocks",
    "reset_locked_mem_clocks",
    "set_app_clocks",
    "reset_app_clocks",
    "set_power_limit",
    "set_persistence_mode",
)
_WORKLOAD_OPS = ("open_context", "close_context", "run_work", "set_background_load", "set_ambient")


@dataclass(frozen=True)
class SimTruth:
    """What the simulated GPU is really doing, including what NVML cannot read."""

    locked_sm: tuple[int, int] | None
    locked_mem: tuple[int, int] | None
    app_sm_mhz: int  # the application clocks set now (they apply at the next context creation)
    app_mem_mhz: int
    power_limit_w: float
    persistence: bool
    sm_mhz: int  # the clock kernels run at now (not the 100 ms-old reading)
    mem_mhz: int
    temp_c: float  # exact, not rounded
    power_w: float  # instant
    reasons: int
    energy_mj: float  # exact, not the 100 ms-old counter
    reason_ns: dict[str, int]
    contexts: tuple[int, ...]  # pids holding a context (this SimBackend's view)
    t: float  # the simulated time these values belong to (clock seconds)


@dataclass
class _Fault:
    kind: str
    op: str | None
    count: int | None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SimBackend:
    """A simulated machine of `n_gpus` identical GPUs (see the module docstring).

    `profile`: "h100" (default, GPU_FACTS.md), "rtx4090", "legacy", or a `SimProfile`.
    `clock`: `RealClock` (default) or a `VirtualClock` for tests.
    `root`: whether this process may write settings (else PermissionDenied, as NVML's).
    `state_file`: where the driver state lives across processes; None keeps it in memory.
    `seed`: makes UUIDs and serial numbers differ between simulated machines.
    """

    name = "sim"
    readonly = False

    def __init__(
        self,
        profile: str | SimProfile = "h100",
        *,
        n_gpus: int = 1,
        clock: Clock | None = None,
        root: bool = True,
        state_file: str | os.PathLike[str] | None = None,
        seed: int = 0,
    ):
        self.profile = get_profile(profile)
        if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or not 1 <= n_gpus <= 64:
            raise ConfigError(
                f"a simulated machine needs 1 to 64 GPUs, not {n_gpus!r}",
                hint="set GPUENV_SIM_GPUS=1..64",
            )
        self.clock: Clock = clock if clock is not None else RealClock()
        self.root = bool(root)
        self.seed = int(seed)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        now = self._now_ns()
        self._gpus = [GpuModel(self.profile, i, now) for i in range(n_gpus)]
        self._faults: dict[int, list[_Fault]] = {}
        self._closed = False
        self._thermal_saved_at = -math.inf
        self._state = StateFile(state_file) if state_file is not None else None
        if self._state is not None:
            self._register()

    @classmethod
    def from_env(cls) -> SimBackend:
        """The simulator as the environment describes it (real time).

        GPUENV_SIM_STATE: state file (default: per-user, in $XDG_RUNTIME_DIR or /tmp;
        'none' keeps state in memory), GPUENV_SIM_PROFILE (h100), GPUENV_SIM_GPUS (1),
        GPUENV_SIM_ROOT (1: act as root; 0: writes raise PermissionDenied).
        """
        env = os.environ
        profile = env.get("GPUENV_SIM_PROFILE", "").strip() or "h100"
        gpus_text = env.get("GPUENV_SIM_GPUS", "").strip() or "1"
        try:
            n_gpus = int(gpus_text)
        except ValueError:
            raise ConfigError(
                f"GPUENV_SIM_GPUS={gpus_text!r} is not a number", hint="use 1 to 64"
            ) from None
        root_text = env.get("GPUENV_SIM_ROOT", "").strip().lower() or "1"
        if root_text not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
            raise ConfigError(f"GPUENV_SIM_ROOT={root_text!r} is not understood", hint="use 1 or 0")
        state_text = env.get("GPUENV_SIM_STATE", "").strip()
        state: str | os.PathLike[str] | None
        if state_text.lower() in ("none", "memory"):
            state = None
        else:
            state = state_text or default_state_path()
        return cls(
            profile, n_gpus=n_gpus, root=root_text in ("1", "true", "yes", "on"), state_file=state
        )

    # -- plumbing ------------------------------------------------------------------
    def _now_ns(self) -> int:
        return round(self.clock.now() * 1e9)

    def _get(self, index: int, op: str) -> GpuModel:
        """The GPU at `index`, advanced to now, after sync with the state file and faults."""
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self._gpus)
        ):
            raise DeviceNotFound(str(index), len(self._gpus))
        self._sync()
        g = self._gpus[index]
        g.advance(self._now_ns())
        self._check_faults(index, op)
        if g.lost:
            raise GpuLost(
                f"GPU is lost: {g.lost}",
                op=op,
                gpu=index,
                code=NVML_ERROR_GPU_IS_LOST,
                hint="the simulated GPU needs a reset: clear_faults() or a new SimBackend",
            )
        return g

    def _check_faults(self, index: int, op: str) -> None:
        faults = self._faults.get(index)
        if not faults:
            return
        for fault in faults:
            applies = fault.op == op or (
                fault.op is None and (op in _BACKEND_OPS or fault.kind == "gpu_lost")
            )
            if not applies:
                continue
            if fault.count is not None:
                fault.count -= 1
                if fault.count <= 0:
                    faults.remove(fault)
            raise _fault_error(fault.kind, op, index)

    def _need_root(self, index: int, op: str, what: str) -> None:
        if not self.root:
            raise PermissionDenied(
                f"permission denied: cannot {what} (NVML_ERROR_NO_PERMISSION)",
                op=op,
                gpu=index,
                code=NVML_ERROR_NO_PERMISSION,
                hint="run as root, or start 'gpuenv daemon' as root and retry "
                "(simulated GPU: this process acts unprivileged, GPUENV_SIM_ROOT=0)",
            )

    # -- state file ----------------------------------------------------------------
    def _clock_domain(self) -> str:
        return "virtual" if getattr(self.clock, "virtual", False) else "real"

    def _matches(self, data: dict[str, Any]) -> bool:
        return (
            data.get("profile") == self.profile.key
            and data.get("n_gpus") == len(self._gpus)
            and data.get("seed") == self.seed
            and isinstance(data.get("gpus"), list)
            and len(data["gpus"]) == len(self._gpus)
        )

    def _load(self, data: dict[str, Any]) -> None:
        """Take settings (and the temperature of GPUs this backend is not running) from the file."""
        now = self._now_ns()
        for g, entry in zip(self._gpus, data["gpus"], strict=True):
            g.advance(now)  # the old settings govern the time before this change
            try:
                g.settings = Settings.from_json(entry)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            temp, t_s = entry.get("temp_c"), entry.get("temp_t")
            if (
                not g.active_here
                and isinstance(temp, (int, float))
                and isinstance(t_s, (int, float))
            ):
                elapsed = (
                    self.clock.now() - t_s if entry.get("clock") == self._clock_domain() else 0.0
                )
                settle = g.idle_temp_c()
                g.set_temperature(
                    settle + (temp - settle) * math.exp(-max(0.0, elapsed) / g.p.tau_s)
                )
            g.relatch_clock()

    def _dump(self, clients: list[int], old: dict[str, Any] | None) -> dict[str, Any]:
        gpus = []
        for i, g in enumerate(self._gpus):
            entry = g.settings.to_json()
            entry["uuid"] = self._uuid(i)
            prev = old["gpus"][i] if old is not None and self._matches(old) else None
            if g.active_here or prev is None or "temp_c" not in prev:
                entry.update(
                    temp_c=round(g.temp_c, 4), temp_t=self.clock.now(), clock=self._clock_domain()
                )
            else:
                entry.update(
                    temp_c=prev["temp_c"], temp_t=prev.get("temp_t"), clock=prev.get("clock")
                )
            gpus.append(entry)
        return {
            "profile": self.profile.key,
            "n_gpus": len(self._gpus),
            "seed": self.seed,
            "clients": clients,
            "gpus": gpus,
        }

    def _revert_unpersisted(self) -> None:
        """The driver de-initialises a GPU without persistence mode when its last client leaves."""
        for g in self._gpus:
            if not g.settings.persistence:
                g.settings = Settings.defaults(self.profile, persistence=False)
                g.relatch_clock()

    def _register(self) -> None:
        assert self._state is not None
        with self._state.locked():
            data = self._state.read()
            clients: list[int] = []
            if data is not None and self._matches(data):
                self._load(data)
                clients = [int(pid) for pid in data.get("clients", []) if _pid_alive(int(pid))]
            else:
                data = None
            if not clients:
                self._revert_unpersisted()
            clients.append(self._pid)
            self._state.write(self._dump(clients, data))

    def _sync(self) -> None:
        if self._state is not None and self._state.changed():
            data = self._state.read()
            if data is not None and self._matches(data):
                self._load(data)

    def _commit(self, index: int, change: Callable[[Settings], None]) -> None:
        """Apply a settings change; with a state file, as a locked read-modify-write."""
        g = self._gpus[index]
        if self._state is None:
            change(g.settings)
            g.relatch_clock()
            return
        with self._state.locked():
            data = self._state.read()
            if data is not None and self._matches(data):
                self._load(data)
                clients = [int(pid) for pid in data.get("clients", [])]
            else:
                data, clients = None, [self._pid]
            change(g.settings)
            g.relatch_clock()
            self._state.write(self._dump(clients, data))

    def close(self) -> None:
        """Leave the simulated driver: this process's contexts end; maybe the GPU de-initialises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self._now_ns()
            for g in self._gpus:
                g.advance(now)
                g.contexts.clear()
                g.background.clear()
                g.job = None
                g.load_changed()
            if self._state is None:
                self._revert_unpersisted()
                return
            with self._state.locked():
                data = self._state.read()
                clients: list[int] = []
                if data is not None and self._matches(data):
                    self._load(data)
                    clients = [int(pid) for pid in data.get("clients", [])]
                else:
                    data = None
                if self._pid in clients:
                    clients.remove(self._pid)
                clients = [pid for pid in clients if _pid_alive(pid)]
                if not clients:
                    self._revert_unpersisted()
                self._state.write(self._dump(clients, data))

    def __enter__(self) -> SimBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _save_thermal(self) -> None:
        """Leave this backend's temperature in the state file for other processes.

        At most once a second of simulated time: a loop of short kernels must not
        turn into a loop of file writes.
        """
        if self._state is None:
            return
        now = self.clock.now()
        if now - self._thermal_saved_at < 1.0:
            return
        self._thermal_saved_at = now
        with self._state.locked():
            data = self._state.read()
            if data is not None and self._matches(data):
                self._load(data)
                clients = [int(pid) for pid in data.get("clients", [])]
            else:
                data, clients = None, [self._pid]
            self._state.write(self._dump(clients, data))

    # -- static reads ----------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._gpus)

    def _uuid(self, index: int) -> str:
        digest = hashlib.sha256(
            f"gpuenv-sim/{self.profile.key}/{self.seed}/{index}".encode()
        ).digest()
        return f"{self.profile.uuid_prefix}-{uuidlib.UUID(bytes=digest[:16], version=4)}"

    def _pci_bus_id(self, index: int) -> str:
        ids = self.profile.pci_bus_ids
        if index < len(ids):
            return ids[index]
        return f"00000000:{(0xC0 + index) % 256:02X}:00.0"

    def device_info(self, index: int) -> DeviceInfo:
        """`nvidia-smi -L`: index, UUID, PCI bus id, name, compute capability, MIG mode."""
        with self._lock:
            self._get(index, "device_info")
            p = self.profile
            serial = str(
                1652221000000
                + (int(hashlib.sha256(self._uuid(index).encode()).hexdigest(), 16) % 10**6)
            )
            return DeviceInfo(
                index=index,
                uuid=self._uuid(index),
                pci_bus_id=self._pci_bus_id(index),
                name=p.gpu_name,
                compute_capability=p.compute_capability,
                mig_mode=False if p.mig_capable else None,
                memory_total_mib=p.memory_total_mib,
                serial=serial,
            )

    def driver_version(self) -> str:
        return self.profile.driver_version

    def nvml_version(self) -> str:
        """NVML's own version, as the profile's driver would report it ("13.580.159.04")."""
        major = 13 if int(self.profile.driver_version.split(".")[0]) >= 580 else 12
        return f"{major}.{self.profile.driver_version}"

    @property
    def state_file(self) -> Path | None:
        """The simulated driver's state file, or None when state lives in memory."""
        return self._state.path if self._state is not None else None

    def clock_limits(self, index: int) -> ClockLimits:
        """`nvidia-smi -q -d CLOCK,SUPPORTED_CLOCKS`.

        `base_sm_mhz` is None, as from the real backend (NVML has no getter for it);
        the simulated driver still knows it: (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP) locks
        to the profile's base clock (1590 MHz on the h100).
        """
        with self._lock:
            self._get(index, "clock_limits")
            p = self.profile
            return ClockLimits(
                max_sm_mhz=p.max_sm_mhz,
                max_mem_mhz=p.max_mem_mhz,
                default_app_sm_mhz=p.default_app_sm_mhz,
                default_app_mem_mhz=p.default_app_mem_mhz,
                base_sm_mhz=None,
                supported_mem_mhz=p.mem_clocks_mhz,
                supported_sm_mhz=dict.fromkeys(p.mem_clocks_mhz, p.sm_clocks_mhz),
                locked_clocks_supported=p.locked_clocks_supported,
                locked_mem_supported=p.locked_mem_supported,
            )

    def app_clocks(self, index: int) -> AppClocks:
        with self._lock:
            s = self._get(index, "app_clocks").settings
            return AppClocks(sm_mhz=s.app_sm, mem_mhz=s.app_mem)

    def power_limits(self, index: int) -> PowerLimits:
        with self._lock:
            s = self._get(index, "power_limits").settings
            p = self.profile
            return PowerLimits(
                limit_w=s.power_limit_w,
                default_w=p.power_default_w,
                min_w=p.power_min_w,
                max_w=p.power_max_w,
            )

    def thresholds(self, index: int) -> Thresholds:
        with self._lock:
            self._get(index, "thresholds")
            p = self.profile
            return Thresholds(
                slowdown_c=p.slowdown_c,
                shutdown_c=p.shutdown_c,
                gpu_max_c=p.gpu_max_c,
                mem_max_c=p.mem_max_c,
            )

    def supported_reasons(self, index: int) -> int:
        with self._lock:
            self._get(index, "supported_reasons")
            return self.profile.supported_reasons

    def persistence_mode(self, index: int) -> bool | None:
        with self._lock:
            return self._get(index, "persistence_mode").settings.persistence

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute processes: this backend's contexts and background loads (one entry per pid)."""
        with self._lock:
            g = self._get(index, "processes")
            procs = {
                pid: GpuProcess(pid, self.profile.context_mib, "compute") for pid in g.contexts
            }
            for pid in g.background:
                procs[pid] = GpuProcess(pid, BACKGROUND_MIB, "compute")
            return list(procs.values())

    def utilization(self, index: int) -> tuple[int, int] | None:
        """(GPU %, memory %) over the last second of busy time."""
        with self._lock:
            g = self._get(index, "utilization")
            gpu = round(100 * g.r_util)
            return gpu, round(gpu * 0.3)

    # -- telemetry -------------------------------------------------------------------
    def _driver_ts_us(self, t_ns: int) -> int:
        return round((self.clock.wall() - (self._now_ns() - t_ns) * 1e-9) * 1e6)

    def read_fast(self, index: int) -> FastReading:
        """`nvidia-smi dmon -s pc`: values as the driver last refreshed them (every 100 ms)."""
        with self._lock:
            g = self._get(index, "read_fast")
            return FastReading(
                sm_mhz=g.r_sm,
                mem_mhz=g.r_mem,
                power_w=round(g.r_power_avg, 3),
                temp_c=float(g.r_temp),
                reasons=g.r_reasons,
                power_instant_w=round(g.power_w, 3),
                driver_ts_us=self._driver_ts_us(g.r_ts_ns),
            )

    def read_slow(self, index: int, *, energy: bool = True) -> SlowReading:
        """Energy (mJ; None with energy=False) and time under each reason (ns), as of the
        last driver update."""
        with self._lock:
            g = self._get(index, "read_slow")
            off = self.profile.mem_temp_offset_c
            return SlowReading(
                energy_mj=g.r_energy_mj if energy else None,
                reason_ns=dict(g.r_reason_ns),
                mem_temp_c=float(g.r_temp + round(off)) if off is not None else None,
                driver_ts_us=self._driver_ts_us(g.r_ts_ns),
            )

    def power_samples(self, index: int, since_us: int = 0) -> list[tuple[int, float]]:
        """The driver's 20 ms power samples newer than `since_us`: [(timestamp_us, watts)].

        As `nvmlDeviceGetSamples(TOTAL_POWER)` (the buffer holds ~2.4 s); [] when empty.
        """
        with self._lock:
            g = self._get(index, "power_samples")
            out = []
            for t_ns, watts in g.power_samples:
                ts = self._driver_ts_us(t_ns)
                if ts > since_us:
                    out.append((ts, round(watts, 3)))
            return out

    # -- writes ------------------------------------------------------------------------
    def _resolve_locked_sm(self, index: int, min_mhz: int, max_mhz: int) -> tuple[int, int]:
        p = self.profile
        symbolic = (CLOCK_LIMIT_TDP, CLOCK_LIMIT_UNLIMITED)
        if (min_mhz in symbolic) != (max_mhz in symbolic):
            raise InvalidValue(
                "cannot mix a clock in MHz with a symbolic limit (TDP/UNLIMITED)",
                op="set_locked_sm_clocks",
                gpu=index,
                code=NVML_ERROR_INVALID_ARGUMENT,
                hint="pass two clocks in MHz, or CLOCK_LIMIT_TDP / CLOCK_LIMIT_UNLIMITED for both",
            )
        if min_mhz in symbolic:
            if CLOCK_LIMIT_TDP in (min_mhz, max_mhz) and p.base_sm_mhz is None:
                raise NotSupported(
                    "this GPU reports no base (TDP) clock",
                    op="set_locked_sm_clocks",
                    gpu=index,
                    code=NVML_ERROR_NOT_SUPPORTED,
                    hint="lock to a clock in MHz",
                )
            lo = p.base_sm_mhz if min_mhz == CLOCK_LIMIT_TDP else p.sm_clocks_mhz[-1]
            hi = p.base_sm_mhz if max_mhz == CLOCK_LIMIT_TDP else p.max_sm_mhz
            assert lo is not None and hi is not None
            return (min(lo, hi), hi)
        return _snap_range(p.sm_clocks_mhz, min_mhz, max_mhz, "SM", "set_locked_sm_clocks", index)

    def set_locked_sm_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lgc min,max`: takes effect at once; the power cap can still pull below it.

        In-range values that are not supported clocks are rounded inward (min up, max
        down) as the driver rounds; values outside the supported range raise InvalidValue.
        """
        with self._lock:
            op = "set_locked_sm_clocks"
            self._get(index, op)
            self._need_locked(index, op)
            self._need_root(index, op, "lock SM clocks")
            rng = self._resolve_locked_sm(index, min_mhz, max_mhz)
            self._commit(index, lambda s: setattr(s, "locked_sm", rng))

    def _need_locked(self, index: int, op: str) -> None:
        if not self.profile.locked_clocks_supported:
            raise NotSupported(
                f"locked clocks are not supported on {self.profile.gpu_name}",
                op=op,
                gpu=index,
                code=NVML_ERROR_NOT_SUPPORTED,
                hint="use application clocks (nvidia-smi -ac) instead",
            )

    def reset_locked_sm_clocks(self, index: int) -> None:
        """`nvidia-smi -rgc`."""
        with self._lock:
            op = "reset_locked_sm_clocks"
            self._get(index, op)
            self._need_locked(index, op)
            self._need_root(index, op, "reset locked SM clocks")
            self._commit(index, lambda s: setattr(s, "locked_sm", None))

    def set_locked_mem_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lmc min,max`. NotSupported on Hopper (only the deferred -lmcd works)."""
        with self._lock:
            op = "set_locked_mem_clocks"
            self._get(index, op)
            p = self.profile
            if not p.locked_mem_supported:
                hint = (
                    "Hopper applies locked memory clocks only at the next GPU initialisation "
                    "(nvidia-smi -lmcd); lock the SM clock only"
                    if p.locked_clocks_supported
                    else "use application clocks (nvidia-smi -ac) to set the memory clock"
                )
                raise NotSupported(
                    f"locking memory clocks is not supported on {p.gpu_name}",
                    op=op,
                    gpu=index,
                    code=NVML_ERROR_NOT_SUPPORTED,
                    hint=hint,
                )
            self._need_root(index, op, "lock memory clocks")
            rng = _snap_range(p.mem_clocks_mhz, min_mhz, max_mhz, "memory", op, index)
            self._commit(index, lambda s: setattr(s, "locked_mem", rng))

    def reset_locked_mem_clocks(self, index: int) -> None:
        """`nvidia-smi -rmc`. Succeeds (nothing to reset) where only SM clocks can be locked."""
        with self._lock:
            op = "reset_locked_mem_clocks"
            self._get(index, op)
            self._need_locked(index, op)
            self._need_root(index, op, "reset locked memory clocks")
            self._commit(index, lambda s: setattr(s, "locked_mem", None))

    def set_app_clocks(self, index: int, mem_mhz: int, sm_mhz: int) -> None:
        """`nvidia-smi -ac mem,sm`: a supported pair; applies at the next context creation."""
        with self._lock:
            op = "set_app_clocks"
            self._get(index, op)
            p = self.profile
            if not p.app_clocks_supported:
                raise NotSupported(
                    f"application clocks cannot be set on {p.gpu_name}",
                    op=op,
                    gpu=index,
                    code=NVML_ERROR_NOT_SUPPORTED,
                    hint="lock clocks instead (nvidia-smi -lgc)",
                )
            self._need_root(index, op, "set application clocks")
            if mem_mhz not in p.mem_clocks_mhz or sm_mhz not in p.sm_clocks_mhz:
                raise InvalidValue(
                    f"application clocks mem {mem_mhz} / SM {sm_mhz} MHz are not a supported pair",
                    op=op,
                    gpu=index,
                    code=NVML_ERROR_INVALID_ARGUMENT,
                    hint=f"memory {'/'.join(map(str, p.mem_clocks_mhz))} MHz; SM a supported clock "
                    f"{p.sm_clocks_mhz[-1]}-{p.max_sm_mhz} MHz (nvidia-smi -q -d SUPPORTED_CLOCKS)",
                )
            self._commit(index, lambda s: _set_app(s, int(sm_mhz), int(mem_mhz)))

    def reset_app_clocks(self, index: int) -> None:
        """`nvidia-smi -rac`."""
        with self._lock:
            op = "reset_app_clocks"
            self._get(index, op)
            p = self.profile
            if not p.app_clocks_supported:
                raise NotSupported(
                    f"application clocks cannot be set on {p.gpu_name}",
                    op=op,
                    gpu=index,
                    code=NVML_ERROR_NOT_SUPPORTED,
                )
            self._need_root(index, op, "reset application clocks")
            self._commit(index, lambda s: _set_app(s, p.default_app_sm_mhz, p.default_app_mem_mhz))

    def set_power_limit(self, index: int, watts: float) -> None:
        """`nvidia-smi -pl W`: within [min, max] of power_limits(), else InvalidValue."""
        with self._lock:
            op = "set_power_limit"
            self._get(index, op)
            self._need_root(index, op, "set the power limit")
            p = self.profile
            if (
                isinstance(watts, bool)
                or not isinstance(watts, (int, float))
                or not (p.power_min_w <= watts <= p.power_max_w)
            ):
                raise InvalidValue(
                    f"power limit {watts!r} W is out of range",
                    op=op,
                    gpu=index,
                    code=NVML_ERROR_INVALID_ARGUMENT,
                    hint=f"use {p.power_min_w:g} to {p.power_max_w:g} W",
                )
            value = int(watts * 1000) / 1000.0  # NVML takes milliwatts
            self._commit(index, lambda s: setattr(s, "power_limit_w", value))

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        """`nvidia-smi -pm 1|0` (a simulator helper; gpuenv itself never changes it)."""
        with self._lock:
            op = "set_persistence_mode"
            self._get(index, op)
            self._need_root(index, op, "change persistence mode")
            self._commit(index, lambda s: setattr(s, "persistence", bool(enabled)))

    # -- synthetic workload ----------------------------------------------------------
    def _workload_gpu(self, index: int, op: str) -> GpuModel:
        return self._get(index, op)

    def open_context(self, index: int, pid: int | None = None) -> None:
        """A CUDA context appears (idle 345 -> boost at the next driver update)."""
        with self._lock:
            g = self._workload_gpu(index, "open_context")
            g.open_context(self._pid if pid is None else int(pid))

    def close_context(self, index: int, pid: int | None = None) -> None:
        """The context of `pid` (default: this process) ends."""
        with self._lock:
            g = self._workload_gpu(index, "close_context")
            pid = self._pid if pid is None else int(pid)
            if pid not in g.contexts:
                raise ConfigError(
                    f"process {pid} has no context open", gpu=index, hint="call open_context first"
                )
            g.contexts.remove(pid)
            g.load_changed()

    def set_background_load(
        self, index: int, utilization: float, *, pid: int | None = None
    ) -> None:
        """Another process keeps the GPU `utilization` (0-1) busy; 0 makes it leave."""
        if not 0.0 <= utilization <= 1.0:
            raise ConfigError(
                f"background utilization {utilization!r} is out of range", hint="use 0.0 to 1.0"
            )
        with self._lock:
            g = self._workload_gpu(index, "set_background_load")
            pid = (400_000 + index) if pid is None else int(pid)
            if utilization > 0:
                if pid not in g.background:
                    g.applied_app_sm, g.applied_app_mem = g.settings.app_sm, g.settings.app_mem
                g.background[pid] = float(utilization)
                g.active_here = True
            else:
                g.background.pop(pid, None)
            g.load_changed()

    def run_work(
        self, index: int, cycles: float, *, power_intensity: float = 1.0, mem_cycles: float = 0.0
    ) -> float:
        """Run `cycles` SM cycles (+ `mem_cycles` memory cycles) of work; return seconds taken.

        The work runs at the simulated, time-varying clocks: time = cycles / SM clock +
        mem_cycles / memory clock, integrated as the clocks change. A virtual clock is
        advanced (firing its callbacks on the way); the real one is slept on. Opens a
        context for this process first if it has none (and leaves it open, as CUDA does).
        `power_intensity` 1.0 is a heavy bf16 matmul (meets the 700 W cap on an H100);
        ~0.2 a light memory-bound kernel.
        """
        for name, value in (("cycles", cycles), ("mem_cycles", mem_cycles)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r} must be a finite number >= 0")
        if not 0.0 <= power_intensity <= 2.0:
            raise ConfigError(
                f"power_intensity={power_intensity!r} is out of range", hint="use 0.0 to 2.0"
            )
        with self._lock:
            g = self._workload_gpu(index, "run_work")
            if g.job is not None:
                raise ConfigError(
                    "work is already running on this GPU in this SimBackend",
                    gpu=index,
                    hint="run work from one thread at a time",
                )
            if self._pid not in g.contexts:
                g.open_context(self._pid)
            if cycles == 0 and mem_cycles == 0:
                return 0.0
            start_ns = g.t_ns
            g.job = Job(float(cycles), float(mem_cycles), float(power_intensity))
            g.active_here = True
            g.load_changed()
        while True:
            with self._lock:
                g.advance(self._now_ns())
                if g.job is None:
                    break
                if g.lost:
                    g.job = None
                    g.load_changed()
                    raise GpuLost(
                        f"GPU is lost: {g.lost}",
                        op="run_work",
                        gpu=index,
                        code=NVML_ERROR_GPU_IS_LOST,
                    )
                wait_ns = min(g.job_ns_left(), g.ns_to_update())
            self.clock.sleep(wait_ns * 1e-9)
        self._save_thermal()
        return (g.job_end_ns - start_ns) * 1e-9

    def idle(self, seconds: float) -> None:
        """Let `seconds` pass with no work from this backend (virtual clock: advance it)."""
        if seconds < 0:
            raise ConfigError(f"cannot idle for {seconds!r} s", hint="use a duration >= 0")
        self.clock.sleep(seconds)
        with self._lock:
            now = self._now_ns()
            for g in self._gpus:
                g.advance(now)

    def set_ambient(self, index: int, celsius: float) -> None:
        """Change the air the GPU's cooler sees (a hot aisle, a failed fan): a simulator helper.

        Hot enough, the driver's SW thermal slowdown cannot hold the max operating
        temperature, HW slowdown (0x40 | 0x8) follows at the slowdown threshold, and at
        the shutdown temperature the GPU is lost, as a real one shuts itself down.
        """
        if not -20.0 <= celsius <= 120.0:
            raise ConfigError(f"ambient {celsius!r} C is not plausible", hint="use -20 to 120 C")
        with self._lock:
            g = self._get(index, "set_ambient")
            g.ambient_c = float(celsius)
            g.load_changed()

    # -- faults and ground truth -----------------------------------------------------
    def inject_fault(
        self, index: int, kind: str, *, op: str | None = None, count: int | None = None
    ) -> None:
        """Make calls fail as NVML would: "gpu_lost" | "timeout" | "not_supported" | "permission".

        `op`: a backend method name (or workload method) or None for every NVML call
        (gpu_lost also fails the workload); `count`: how many calls fail (None: until cleared).
        """
        if kind not in FAULT_KINDS:
            raise ConfigError(
                f"unknown fault kind {kind!r}", hint=f"use one of: {', '.join(FAULT_KINDS)}"
            )
        if op is not None and op not in _BACKEND_OPS + _WORKLOAD_OPS:
            raise ConfigError(
                f"unknown operation {op!r} for a fault",
                hint="use a SimBackend method name, or None for all",
            )
        if count is not None and count < 1:
            raise ConfigError(f"fault count {count!r} must be >= 1 (or None for no end)")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self._gpus)
        ):
            raise DeviceNotFound(str(index), len(self._gpus))
        with self._lock:
            self._faults.setdefault(index, []).append(_Fault(kind, op, count))

    def clear_faults(self, index: int | None = None) -> None:
        """Remove injected faults (and revive a GPU lost to overheating) on one GPU or all."""
        with self._lock:
            for i in range(len(self._gpus)) if index is None else [index]:
                self._faults.pop(i, None)
                g = self._gpus[i]
                g.advance(self._now_ns())
                g.revive()

    def truth(self, index: int) -> SimTruth:
        """Ground truth now, for tests. Ignores faults."""
        with self._lock:
            if not 0 <= index < len(self._gpus):
                raise DeviceNotFound(str(index), len(self._gpus))
            self._sync()
            g = self._gpus[index]
            g.advance(self._now_ns())
            s = g.settings
            return SimTruth(
                locked_sm=s.locked_sm,
                locked_mem=s.locked_mem,
                app_sm_mhz=s.app_sm,
                app_mem_mhz=s.app_mem,
                power_limit_w=s.power_limit_w,
                persistence=s.persistence,
                sm_mhz=g.sm_mhz,
                mem_mhz=g.mem_mhz,
                temp_c=g.temp_c,
                power_w=g.power_w,
                reasons=g.reasons,
                energy_mj=g.energy_mj,
                reason_ns=dict(g.reason_ns),
                contexts=tuple(g.contexts),
                t=g.t_ns * 1e-9,
            )


def _set_app(s: Settings, sm: int, mem: int) -> None:
    s.app_sm, s.app_mem = sm, mem


def _snap_range(
    clocks_desc: tuple[int, ...], lo: int, hi: int, what: str, op: str, index: int
) -> tuple[int, int]:
    """Round an in-range request to supported clocks: min up, max down (never wider than asked)."""
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidValue(
                f"{what} clock {v!r} is not a number",
                op=op,
                gpu=index,
                code=NVML_ERROR_INVALID_ARGUMENT,
            )
    low, high = clocks_desc[-1], clocks_desc[0]
    if lo > hi:
        raise InvalidValue(
            f"{what} clock range {lo}-{hi} MHz has min above max",
            op=op,
            gpu=index,
            code=NVML_ERROR_INVALID_ARGUMENT,
            hint="pass min <= max",
        )
    if lo < low or hi > high:
        raise InvalidValue(
            f"{what} clock range {lo}-{hi} MHz is outside the supported {low}-{high} MHz",
            op=op,
            gpu=index,
            code=NVML_ERROR_INVALID_ARGUMENT,
            hint="pick clocks from 'gpuenv status' / nvidia-smi -q -d SUPPORTED_CLOCKS",
        )
    up = min(c for c in clocks_desc if c >= lo)
    down = max(c for c in clocks_desc if c <= hi)
    if up > down:  # both inside one gap between supported clocks: the nearest one
        mid = (lo + hi) / 2
        up = down = min(clocks_desc, key=lambda c: (abs(c - mid), -c))
    return (up, down)


def _fault_error(kind: str, op: str, index: int) -> Exception:
    if kind == "gpu_lost":
        return GpuLost(
            "GPU is lost (injected fault)",
            op=op,
            gpu=index,
            code=NVML_ERROR_GPU_IS_LOST,
            hint="the GPU needs a reset (nvidia-smi -r) or a reboot",
        )
    if kind == "timeout":
        return DriverTimeout(
            f"the driver timed out in {op} (injected fault)",
            op=op,
            gpu=index,
            code=NVML_ERROR_TIMEOUT,
            hint="retry; if it persists, check dmesg for Xid errors",
        )
    if kind == "not_supported":
        return NotSupported(
            f"{op} is not supported (injected fault)",
            op=op,
            gpu=index,
            code=NVML_ERROR_NOT_SUPPORTED,
        )
    return PermissionDenied(
        f"permission denied in {op} (injected fault)",
        op=op,
        gpu=index,
        code=NVML_ERROR_NO_PERMISSION,
    )


__all__ = ["FAULT_KINDS", "PROFILES", "SimBackend", "SimProfile", "SimTruth"]
