"""A simulated GPU: a small model of the physics that make benchmark numbers lie.

`SimBackend` implements the `Backend` protocol and adds a synthetic workload
API (`open_context`, `run_work`, `set_background_load`, `idle`), fault
injection and `truth()` for tests. What it models, per GPU:

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

import collections
import hashlib
import math
import os
import threading
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.backend import (
    CLOCK_LIMIT_TDP,
    CLOCK_LIMIT_UNLIMITED,
    REASON_APP_CLOCKS,
    REASON_COUNTERS,
    REASON_GPU_IDLE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    AppClocks,
    ClockLimits,
    DeviceInfo,
    FastReading,
    GpuProcess,
    PowerLimits,
    SlowReading,
    Thresholds,
)
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

STEP_NS = 10_000_000  # physics step while anything is changing
COARSE_AFTER_NS = 2_000_000_000  # after this long without a load change, step per driver update
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
    "set_locked_sm_clocks",
    "reset_locked_sm_clocks",
    "set_locked_mem_clocks",
    "reset_locked_mem_clocks",
    "set_app_clocks",
    "reset_app_clocks",
    "set_power_limit",
    "set_persistence_mode",
)
_WORKLOAD_OPS = ("open_context", "close_context", "run_work", "set_background_load")


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
class _Settings:
    """What the driver keeps for one GPU (what `gpuenv lock` changes)."""

    locked_sm: tuple[int, int] | None
    locked_mem: tuple[int, int] | None
    app_sm: int
    app_mem: int
    power_limit_w: float
    persistence: bool

    @classmethod
    def defaults(cls, p: SimProfile, persistence: bool | None = None) -> _Settings:
        return cls(
            None,
            None,
            p.default_app_sm_mhz,
            p.default_app_mem_mhz,
            p.power_default_w,
            p.persistence_default if persistence is None else persistence,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "locked_sm": list(self.locked_sm) if self.locked_sm else None,
            "locked_mem": list(self.locked_mem) if self.locked_mem else None,
            "app_sm": self.app_sm,
            "app_mem": self.app_mem,
            "power_limit_w": self.power_limit_w,
            "persistence": self.persistence,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> _Settings:
        def pair(v: Any) -> tuple[int, int] | None:
            return (int(v[0]), int(v[1])) if v else None

        return cls(
            pair(d.get("locked_sm")),
            pair(d.get("locked_mem")),
            int(d["app_sm"]),
            int(d["app_mem"]),
            float(d["power_limit_w"]),
            bool(d["persistence"]),
        )


@dataclass
class _Job:
    sm_cycles: float
    mem_cycles: float
    intensity: float
    remaining: float = 1.0  # fraction of the work still to do


@dataclass
class _Fault:
    kind: str
    op: str | None
    count: int | None


class _Gpu:
    """One simulated GPU: settings, governor, controllers, physics and latched readings."""

    def __init__(self, p: SimProfile, index: int, t_ns: int):
        self.p = p
        self.index = index
        self.asc = tuple(reversed(p.sm_clocks_mhz))  # ascending, for index arithmetic
        self.top = len(self.asc) - 1
        self.update_ns = round(p.update_s * 1e9)
        self.temp_update_ns = round(p.temp_update_s * 1e9)
        self.settings = _Settings.defaults(p)
        self.contexts: list[int] = []
        self.background: dict[int, float] = {}
        self.job: _Job | None = None
        self.job_end_ns = t_ns
        self.active_here = False  # this SimBackend ran something here: its temperature is the truth
        self.lost: str | None = None
        self.t_ns = t_ns
        self.last_change_ns = t_ns
        self.applied_app_sm = self.settings.app_sm
        self.applied_app_mem = self.settings.app_mem
        self.cap_idx = self.top  # SW power cap ceiling
        self.therm_idx = self.top  # SW thermal ceiling
        self.hw_slow = False
        self.sm_idx = self._floor_idx(p.idle_sm_mhz)
        self.mem_mhz = self.applied_app_mem
        self.reasons = REASON_GPU_IDLE
        self.active_counters: tuple[str, ...] = ("low_utilization",)
        self.reason_ns = dict.fromkeys(REASON_COUNTERS, 0)
        self.energy_mj = 0.0
        self.load = 0.0
        self._refresh_caches()
        self.temp_c = self.idle_temp_c()
        self.power_w = self._power(self.temp_c)
        self.p_filt = self.power_w
        self.period_j = 0.0
        self.period_busy = 0.0
        self.period_start_ns = t_ns
        self.power_ring: collections.deque[float] = collections.deque(
            [self.power_w] * 10, maxlen=10
        )
        self.busy_ring: collections.deque[float] = collections.deque([0.0] * 10, maxlen=10)
        self._decay: dict[int, tuple[float, float]] = {}
        self._latch(t_ns)
        self._latch_temp(t_ns)

    # -- helpers -------------------------------------------------------------------
    def _floor_idx(self, mhz: float) -> int:
        """Index of the highest supported clock <= mhz (the lowest clock if none)."""
        lo, hi = 0, self.top
        if mhz < self.asc[0]:
            return 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.asc[mid] <= mhz:
                lo = mid
            else:
                hi = mid - 1
        return lo

    @property
    def sm_mhz(self) -> int:
        return self.asc[self.sm_idx]

    @property
    def has_context(self) -> bool:
        return bool(self.contexts or self.background)

    def _power(self, temp_c: float) -> float:
        p = self.p
        return (
            p.p_base_w
            + p.leak_ref_w * math.exp((temp_c - p.leak_ref_c) / p.leak_scale_c)
            + self._dyn
        )

    def idle_temp_c(self) -> float:
        """Equilibrium temperature at the present clock and load (power and heat agree)."""
        t = self.p.ambient_c + 20.0
        for _ in range(60):
            t = self.p.ambient_c + self.p.r_c_per_w * self._power(t)
        return t

    def _refresh_caches(self) -> None:
        """Recompute what depends on clock and load only (they change at updates and job edges)."""
        p = self.p
        self.load = max(
            self.job.intensity if self.job else 0.0, max(self.background.values(), default=0.0)
        )
        g = (self.sm_mhz / p.max_sm_mhz) ** p.dyn_exponent
        self._dyn = g * (p.p_clock_w + self.load * p.p_load_w)
        if self.job:
            seconds = self.job.sm_cycles / (self.sm_mhz * 1e6) + self.job.mem_cycles / (
                self.mem_mhz * 1e6
            )
            self._rate = 1.0 / seconds if seconds > 0 else math.inf
        else:
            self._rate = 0.0
        self.busy = 1.0 if self.job else max(self.background.values(), default=0.0)

    def load_changed(self) -> None:
        self.last_change_ns = self.t_ns
        self._refresh_caches()

    def job_ns_left(self) -> int:
        if self.job is None:
            return 0
        return max(1, math.ceil(self.job.remaining / self._rate * 1e9))

    def ns_to_update(self) -> int:
        return (self.t_ns // self.update_ns + 1) * self.update_ns - self.t_ns

    # -- physics -------------------------------------------------------------------
    def advance(self, target_ns: int) -> None:
        """Integrate up to `target_ns`, running driver updates on their boundaries."""
        upd = self.update_ns
        while self.t_ns < target_ns:
            t = self.t_ns
            if self.lost:
                self.t_ns = target_ns
                return
            step = (
                upd if (self.job is None and t - self.last_change_ns > COARSE_AFTER_NS) else STEP_NS
            )
            nxt = min((t // step + 1) * step, target_ns)
            job_end = False
            if self.job is not None:
                left = self.job_ns_left()
                if t + left <= nxt:
                    nxt, job_end = t + left, True
            self._integrate(nxt - t)
            self.t_ns = nxt
            if job_end:
                self.job = None
                self.job_end_ns = nxt
                self.load_changed()
            if nxt % upd == 0:
                self._driver_update(nxt)
            if nxt % self.temp_update_ns == 0:
                self._latch_temp(nxt)

    def _integrate(self, dt_ns: int) -> None:
        p = self.p
        dt = dt_ns * 1e-9
        decay = self._decay.get(dt_ns)
        if decay is None:
            decay = (math.exp(-dt / p.tau_s), math.exp(-dt / p.power_filter_s))
            if dt_ns in (STEP_NS, self.update_ns):
                self._decay[dt_ns] = decay
        temp = self.temp_c
        power = (
            p.p_base_w + p.leak_ref_w * math.exp((temp - p.leak_ref_c) / p.leak_scale_c) + self._dyn
        )
        self.power_w = power
        self.energy_mj += power * dt * 1e3
        self.period_j += power * dt
        self.period_busy += self.busy * dt
        teq = p.ambient_c + p.r_c_per_w * power
        self.temp_c = teq + (temp - teq) * decay[0]
        self.p_filt = power + (self.p_filt - power) * decay[1]
        for name in self.active_counters:
            self.reason_ns[name] += dt_ns
        if self.job is not None:
            self.job.remaining -= dt * self._rate

    # -- the driver ----------------------------------------------------------------
    def _target_idx(self) -> tuple[int, bool]:
        """The clock the governor wants before limiters; whether a user setting holds it down."""
        p, s = self.p, self.settings
        ctx = self.has_context
        target = self.applied_app_sm if ctx else p.idle_sm_mhz
        if s.locked_sm is not None:
            lo, hi = s.locked_sm
            target = hi if ctx else min(max(p.idle_sm_mhz, lo), hi)
        return self._floor_idx(target), ctx and target < p.max_sm_mhz

    def _control(self) -> None:
        """The power-cap and thermal controllers: move the ceilings one update period on."""
        p, s = self.p, self.settings
        cur = self.sm_idx
        tgt, _ = self._target_idx()
        f = self.asc[cur]
        step_mhz = (self.asc[cur] - self.asc[cur - 1]) if cur > 0 else (self.asc[1] - self.asc[0])
        # Watts one clock step is worth at this clock and load (the driver's own estimate).
        per_step = max(1e-6, p.dyn_exponent * self._dyn / f * step_mhz)
        limit = s.power_limit_w
        if self.p_filt > limit:
            steps = min(p.max_step_down, max(1, math.ceil((self.p_filt - limit) / per_step)))
            self.cap_idx = max(0, min(self.cap_idx, cur) - steps)
        elif self.cap_idx < self.top:
            steps = int((limit - self.p_filt - 2.0) / per_step)
            if steps > 0:
                self.cap_idx = min(self.top, self.cap_idx + steps)
            if self.cap_idx >= tgt:
                self.cap_idx = self.top
        temp = self.temp_c
        if temp >= p.shutdown_c:
            self.lost = f"the GPU shut down at {temp:.0f} C (thermal protection)"
        if temp >= p.slowdown_c:
            self.hw_slow = True
        elif self.hw_slow and temp < p.slowdown_c - 3.0:
            self.hw_slow = False
        sw = p.sw_thermal_c
        if temp > sw:
            self.therm_idx = max(0, min(self.therm_idx, cur) - min(4, 1 + int(temp - sw)))
        elif self.therm_idx < self.top and temp < sw - 0.5:
            self.therm_idx += 1
            if self.therm_idx >= tgt:
                self.therm_idx = self.top

    def apply(self) -> None:
        """Set the clock from target and ceilings; derive reasons and which counters run."""
        p, s = self.p, self.settings
        tgt, user_limited = self._target_idx()
        hw_idx = self._floor_idx(p.max_sm_mhz * p.hw_slowdown_factor) if self.hw_slow else self.top
        new = min(tgt, self.cap_idx, self.therm_idx, hw_idx)
        reasons = 0
        if not self.has_context:
            reasons |= REASON_GPU_IDLE
        if user_limited:
            reasons |= REASON_APP_CLOCKS
        power = self.cap_idx < tgt
        thermal = self.therm_idx < tgt
        hw = self.hw_slow and hw_idx < tgt
        if power:
            reasons |= REASON_SW_POWER_CAP
        if thermal:
            reasons |= REASON_SW_THERMAL
        if hw:
            reasons |= REASON_HW_THERMAL | REASON_HW_SLOWDOWN
        counters = []
        if power:
            counters.append("power")
        if thermal or hw:
            counters.append("thermal")
        if reasons & REASON_GPU_IDLE:
            counters.append("low_utilization")
        if (power or thermal or hw) and new < tgt:
            counters.append("total_app_clocks")
            if p.base_sm_mhz is not None and self.asc[new] < p.base_sm_mhz:
                counters.append("total_base_clocks")
        self.reasons = reasons & p.supported_reasons
        self.active_counters = tuple(counters)
        self.sm_idx = new
        mem = self.applied_app_mem
        if s.locked_mem is not None:
            lo, hi = s.locked_mem
            mem = max((m for m in p.mem_clocks_mhz if lo <= m <= hi), default=mem)
        self.mem_mhz = mem
        self._refresh_caches()

    def _driver_update(self, t_ns: int) -> None:
        self._control()
        self.apply()
        period = (t_ns - self.period_start_ns) * 1e-9
        if period > 0:
            self.power_ring.append(self.period_j / period)
            self.busy_ring.append(self.period_busy / period)
        self.period_j = self.period_busy = 0.0
        self.period_start_ns = t_ns
        self._latch(t_ns)

    def _latch(self, t_ns: int) -> None:
        """What NVML reads until the next driver update."""
        self.r_sm = self.sm_mhz
        self.r_mem = self.mem_mhz
        self.r_reasons = self.reasons
        self.r_power_avg = sum(self.power_ring) / len(self.power_ring)
        self.r_energy_mj = int(self.energy_mj)
        self.r_reason_ns = dict(self.reason_ns)
        self.r_util = sum(self.busy_ring) / len(self.busy_ring)
        self.r_ts_ns = t_ns

    def relatch_clock(self) -> None:
        """Settings that take effect at once (a lock) show in the very next read."""
        self.apply()
        self.r_sm, self.r_mem, self.r_reasons = self.sm_mhz, self.mem_mhz, self.reasons

    def _latch_temp(self, t_ns: int) -> None:
        self.r_temp = round(self.temp_c)
        self.r_temp_ts_ns = t_ns

    def set_temperature(self, temp_c: float) -> None:
        self.temp_c = temp_c
        self.r_temp = round(temp_c)

    # -- workload ------------------------------------------------------------------
    def open_context(self, pid: int) -> None:
        self.contexts.append(pid)
        # Application clocks take effect when a context is created.
        self.applied_app_sm, self.applied_app_mem = self.settings.app_sm, self.settings.app_mem
        self.active_here = True
        self.load_changed()


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
        self._gpus = [_Gpu(self.profile, i, now) for i in range(n_gpus)]
        self._faults: dict[int, list[_Fault]] = {}
        self._closed = False
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

    def _get(self, index: int, op: str) -> _Gpu:
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
                g.settings = _Settings.from_json(entry)
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
                g.settings = _Settings.defaults(self.profile, persistence=False)
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

    def _commit(self, index: int, change: Callable[[_Settings], None]) -> None:
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
        """Leave this backend's temperature in the state file (after work), for other processes."""
        if self._state is None:
            return
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

    def clock_limits(self, index: int) -> ClockLimits:
        with self._lock:
            self._get(index, "clock_limits")
            p = self.profile
            return ClockLimits(
                max_sm_mhz=p.max_sm_mhz,
                max_mem_mhz=p.max_mem_mhz,
                default_app_sm_mhz=p.default_app_sm_mhz,
                default_app_mem_mhz=p.default_app_mem_mhz,
                base_sm_mhz=p.base_sm_mhz,
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

    def read_slow(self, index: int) -> SlowReading:
        """Energy (mJ) and time under each reason (ns), as of the last driver update."""
        with self._lock:
            g = self._get(index, "read_slow")
            off = self.profile.mem_temp_offset_c
            return SlowReading(
                energy_mj=g.r_energy_mj,
                reason_ns=dict(g.r_reason_ns),
                mem_temp_c=float(g.r_temp + round(off)) if off is not None else None,
                driver_ts_us=self._driver_ts_us(g.r_ts_ns),
            )

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
    def _workload_gpu(self, index: int, op: str) -> _Gpu:
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
            g.job = _Job(float(cycles), float(mem_cycles), float(power_intensity))
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
                self._gpus[i].lost = None

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


def _set_app(s: _Settings, sm: int, mem: int) -> None:
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
