"""One simulated GPU: driver settings, governor, controllers, physics, latched readings.

`GpuModel` is the model behind `SimBackend` (see `sim.py` for what it covers
and `sim_profiles.py` for the formula and constants). Time is an integer
nanosecond timeline; `advance(t_ns)` integrates up to it in fixed steps and runs
the driver's update (controllers, then the readings NVML returns) on every
`update_s` boundary, so results do not depend on how often anyone reads.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

from gpuenv.backend.base import (
    REASON_APP_CLOCKS,
    REASON_COUNTERS,
    REASON_GPU_IDLE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)
from gpuenv.backend.sim_profiles import SimProfile

STEP_NS = 10_000_000  # physics step while anything is changing
COARSE_AFTER_NS = 2_000_000_000  # after this long without a load change, step per driver update
SKIP_AFTER_NS = 60_000_000_000  # a quiet gap longer than this is jumped over ...
SKIP_KEEP_NS = 10_000_000_000  # ... but for its last 10 s, stepped as usual
MAX_CONTENTION = 0.9  # the most SM time other processes take from this one's work
# nvmlDeviceGetSamples(TOTAL_POWER): one every 20 ms, each the mean power over the 20 ms
# before its stamp (an H200: a 10 ms kernel of ~700 W from idle read one 331-446 W sample
# at the first stamp after it; docs/h200/power_samples-2026-11-29.json) ...
POWER_SAMPLE_NS = 20_000_000
POWER_SAMPLES_KEPT = 120  # ... ~2.4 s of them


@dataclass
class Settings:
    """What the driver keeps for one GPU (what `gpuenv lock` changes)."""

    locked_sm: tuple[int, int] | None
    locked_mem: tuple[int, int] | None
    app_sm: int
    app_mem: int
    power_limit_w: float
    persistence: bool

    @classmethod
    def defaults(cls, p: SimProfile, persistence: bool | None = None) -> Settings:
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
    def from_json(cls, d: dict[str, Any]) -> Settings:
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


@dataclass(frozen=True)
class Presence:
    """What another process of the host has on this GPU (`sim_host.py` shares it).

    `contexts`: its CUDA contexts; `background`: a standing load (0-1) it keeps up;
    `work`: the power intensity of the kernels it is running, until `until_ns` (its lease:
    it renews it while kernels keep coming, so back-to-back kernels read as one load).
    """

    contexts: int = 0
    background: float = 0.0
    work: float = 0.0
    until_ns: int | None = None

    @property
    def present(self) -> bool:
        return bool(self.contexts or self.background or self.work)


@dataclass
class Job:
    sm_cycles: float
    mem_cycles: float
    intensity: float
    remaining: float = 1.0  # fraction of the work still to do


class GpuModel:
    """One simulated GPU: settings, governor, controllers, physics and latched readings."""

    def __init__(
        self,
        p: SimProfile,
        index: int,
        t_ns: int,
        own_pid: int | None = None,
        own_key: str | None = None,
    ):
        self.p = p
        self.index = index
        self.asc = tuple(reversed(p.sm_clocks_mhz))  # ascending, for index arithmetic
        self.top = len(self.asc) - 1
        self.update_ns = round(p.update_s * 1e9)
        self.temp_update_ns = round(p.temp_update_s * 1e9)
        self.ambient_c = p.ambient_c  # the air the cooler sees (SimBackend.set_ambient changes it)
        self.settings = Settings.defaults(p)
        self.contexts: list[int] = []
        self.background: dict[int, float] = {}  # by pid: another process's, or ours (own_pid)
        self.own_pid = own_pid  # a background load under it is this process's own work
        self.others: dict[str, Presence] = {}  # every process's presence when shared (its key)
        self.own = own_key  # this process's key among them
        self.others_end: int | None = None  # the first work lease among them to end
        self.job: Job | None = None
        self.job_end_ns = t_ns
        self.lost: str | None = None
        self.t_ns = t_ns
        self.last_change_ns = t_ns
        self.applied_app_sm = self.settings.app_sm
        self.applied_app_mem = self.settings.app_mem
        self.cap_idx = self.top  # SW power cap ceiling
        self.over_ns = -(1 << 62)  # the last driver update that held the power at the limit
        self.over_limit_w = 0.0  # ... and that limit (a new limit starts the controller afresh)
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
        self.period_j = 0.0
        self.period_busy = 0.0
        self.period_start_ns = t_ns
        self.busy_ring: collections.deque[float] = collections.deque([0.0] * 10, maxlen=10)
        self._decay: dict[int, tuple[float, float, float]] = {}
        self.power_samples: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=POWER_SAMPLES_KEPT
        )
        self.next_sample_ns = (t_ns // POWER_SAMPLE_NS + 1) * POWER_SAMPLE_NS
        self.settle()
        # the energy counter at the last sample's stamp (at the power settled so far)
        self.sample_mj = self._energy_at(self.next_sample_ns - POWER_SAMPLE_NS, t_ns)

    def settle(self) -> None:
        """Temperature and power at equilibrium with the present clock, load and air, as
        after a long time so (a fresh GPU at idle; a copy of one in the same room)."""
        self.temp_c = self.idle_temp_c()
        self.power_w = self._power(self.temp_c)
        self.p_filt = self.power_w
        # the fast view of the power (profile cap_fast_filter_s); not shared with the
        # host's other processes (physics()): it forgets a burst within ~0.1 s
        self.p_fast = self.power_w
        self.power_ring: collections.deque[float] = collections.deque(
            [self.power_w] * 10, maxlen=10
        )
        self._latch(self.t_ns)
        self._latch_temp(self.t_ns)

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
        return bool(self.contexts or self.background) or any(
            p.present for p in self.others.values()
        )

    def set_others(self, others: dict[str, Presence]) -> None:
        """The processes of the host and what they run here (ours included, under the key
        `own`: max, not sum, for the load; never a contender for our own work's SM time)."""
        if others == self.others:
            return
        self.others = others
        self._expire_others(self.t_ns)

    def _expire_others(self, t_ns: int) -> None:
        """Work whose lease ended by `t_ns` stops; the load changes."""
        self.others = {
            pid: (
                Presence(p.contexts, p.background)
                if p.until_ns is not None and p.until_ns <= t_ns
                else p
            )
            for pid, p in self.others.items()
        }
        ends = [p.until_ns for p in self.others.values() if p.work and p.until_ns is not None]
        self.others_end = min(ends, default=None)
        self.load_changed()

    def _power(self, temp_c: float) -> float:
        p = self.p
        return (
            p.p_base_w
            + max(0.0, p.leak_ref_w + p.leak_w_per_c * (temp_c - p.leak_ref_c))
            + self._dyn
        )

    def idle_temp_c(self) -> float:
        """Equilibrium temperature at the present clock and load (power and heat agree):
        t = ambient + r * power(t), solved in closed form on each piece of the leakage
        (linear in t above its floor, zero below). Every state-file load asks it for each GPU
        (60 fixed-point steps each were ~1 ms of a simulated clock lock)."""
        p, a, r, k = self.p, self.ambient_c, self.p.r_c_per_w, self.p.leak_w_per_c
        fixed = p.p_base_w + self._dyn
        if r * k < 1.0:  # else heat runs away: no equilibrium above the floor
            t = (a + r * (fixed + p.leak_ref_w - k * p.leak_ref_c)) / (1.0 - r * k)
            if p.leak_ref_w + k * (t - p.leak_ref_c) >= 0.0:
                return t
        t = a + r * fixed  # no leakage at this temperature
        if p.leak_ref_w + k * (t - p.leak_ref_c) <= 0.0:
            return t
        for _ in range(60):  # (r * k >= 1: no profile does; the old iteration, bounded)
            t = a + r * self._power(t)
        return t

    def _refresh_caches(self) -> None:
        """Recompute what depends on clock and load only (they change at updates and job edges)."""
        p = self.p
        bg = max(self.background.values(), default=0.0)
        for o in self.others.values():
            bg = max(bg, o.background, o.work)
        self.load = max(self.job.intensity if self.job else 0.0, bg)
        g = (self.sm_mhz / p.max_sm_mhz) ** p.dyn_exponent
        self._dyn = g * (p.p_clock_w + self.load * p.p_load_w)
        if self.job:
            seconds = self.job.sm_cycles / (self.sm_mhz * 1e6) + self.job.mem_cycles / (
                self.mem_mhz * 1e6
            )
            # another process's kernels time-slice with this one's (no MPS): the share of
            # the SM it takes is time this work does not run
            self._rate = (1.0 - self._contention()) / seconds if seconds > 0 else math.inf
        else:
            self._rate = 0.0
        busy = max(self.background.values(), default=0.0)
        for o in self.others.values():
            busy = max(busy, o.background, 1.0 if o.work else 0.0)
        self.busy = 1.0 if self.job else busy

    def _contention(self) -> float:
        """The share of SM time other processes take from this one's work: a background
        load's utilization, half for another process's own work, at most MAX_CONTENTION.
        A background load under this process's own pid is its own (gpuenv check's GPUs all
        at once): it draws power and heats, and takes none of its own kernels' SM time."""
        share = max((u for pid, u in self.background.items() if pid != self.own_pid), default=0.0)
        for key, o in self.others.items():
            if key != self.own:
                share = max(share, o.background, 0.5 if o.work else 0.0)
        return min(share, MAX_CONTENTION)

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
        """Integrate up to `target_ns`, running driver updates on their boundaries; another
        process's work stops where its lease ends."""
        while self.others_end is not None and self.others_end <= target_ns:
            self._advance(self.others_end)
            self._expire_others(self.others_end)
        self._advance(target_ns)

    def _skip(self, target_ns: int) -> None:
        """Jump over all but the last SKIP_KEEP_NS of a long quiet gap (a state another process
        left an hour ago): temperature and counters in closed form, the rest as it was, so
        catching up costs the same after a minute as after a month."""
        gap_ns = target_ns - self.t_ns - SKIP_KEEP_NS
        gap = gap_ns * 1e-9
        teq = self.idle_temp_c()
        self.temp_c = teq + (self.temp_c - teq) * math.exp(-gap / self.p.tau_s)
        self.energy_mj += self.power_w * gap * 1e3
        for name in self.active_counters:
            self.reason_ns[name] += gap_ns
        self.t_ns += gap_ns
        self.period_j = self.period_busy = 0.0
        self.period_start_ns = self.t_ns

    def _advance(self, target_ns: int) -> None:
        if self.job is None and not self.lost and target_ns - self.t_ns > SKIP_AFTER_NS:
            self._skip(target_ns)
        upd = self.update_ns
        while self.t_ns < target_ns:
            t = self.t_ns
            if self.lost:  # off the bus, drawing nothing: it only cools
                dt = (target_ns - t) * 1e-9
                self.temp_c = self.ambient_c + (self.temp_c - self.ambient_c) * math.exp(
                    -dt / self.p.tau_s
                )
                self.power_w = 0.0
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
            if nxt >= self.next_sample_ns:
                self._record_power_samples(nxt)
            if job_end:
                self.job = None
                self.job_end_ns = nxt
                self.load_changed()
            if nxt % upd == 0:
                self._driver_update(nxt)
            elif self.p.cap_fast_filter_s and nxt % STEP_NS == 0:
                self._fast_cap(nxt)
            if nxt % self.temp_update_ns == 0:
                self._latch_temp(nxt)

    def _record_power_samples(self, t_ns: int) -> None:
        """The samples stamped up to `t_ns` (a step's end), each the mean power since the
        one before: the energy counter's growth between their stamps over 20 ms. The
        step's power is constant, so the counter at a stamp inside it is exact."""
        keep = POWER_SAMPLE_NS * POWER_SAMPLES_KEPT
        if t_ns - self.next_sample_ns > keep:  # a long gap: only the last 2.4 s matter
            self.next_sample_ns = (
                t_ns - keep
            ) // POWER_SAMPLE_NS * POWER_SAMPLE_NS + POWER_SAMPLE_NS
            self.sample_mj = self._energy_at(self.next_sample_ns - POWER_SAMPLE_NS, t_ns)
        while self.next_sample_ns <= t_ns:
            mj = self._energy_at(self.next_sample_ns, t_ns)
            watts = (mj - self.sample_mj) / (POWER_SAMPLE_NS * 1e-6)  # mJ per ms
            self.power_samples.append((self.next_sample_ns, watts))
            self.sample_mj = mj
            self.next_sample_ns += POWER_SAMPLE_NS

    def _energy_at(self, at_ns: int, t_ns: int) -> float:
        """The energy counter (mJ) at `at_ns`, within the step that ended at `t_ns`."""
        return self.energy_mj - self.power_w * (t_ns - at_ns) * 1e-6

    def _integrate(self, dt_ns: int) -> None:
        p = self.p
        dt = dt_ns * 1e-9
        decay = self._decay.get(dt_ns)
        if decay is None:
            fast = p.cap_fast_filter_s
            decay = (
                math.exp(-dt / p.tau_s),
                math.exp(-dt / p.power_filter_s),
                math.exp(-dt / fast) if fast else 0.0,
            )
            if dt_ns in (STEP_NS, self.update_ns):
                self._decay[dt_ns] = decay
        temp = self.temp_c
        power = (
            p.p_base_w + max(0.0, p.leak_ref_w + p.leak_w_per_c * (temp - p.leak_ref_c)) + self._dyn
        )
        self.power_w = power
        self.energy_mj += power * dt * 1e3
        self.period_j += power * dt
        self.period_busy += self.busy * dt
        teq = self.ambient_c + p.r_c_per_w * power
        self.temp_c = teq + (temp - teq) * decay[0]
        self.p_filt = power + (self.p_filt - power) * decay[1]
        self.p_fast = power + (self.p_fast - power) * decay[2]
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

    def _control(self, t_ns: int) -> None:
        """The power-cap and thermal controllers: move the ceilings one update period on."""
        p, s = self.p, self.settings
        cur = self.sm_idx
        tgt, _ = self._target_idx()
        per_step = self._watts_per_step()
        limit = s.power_limit_w
        # the power the cap acts on: the filtered power, or its fast view where that is higher
        p_cap = max(self.p_filt, self.p_fast) if p.cap_fast_filter_s else self.p_filt
        if p_cap > limit:
            self._cap_down(t_ns, p_cap)
        elif self.cap_idx < self.top:
            steps = int((limit - p_cap - 2.0) / per_step)
            if steps > 0:
                self.cap_idx = min(self.top, self.cap_idx + steps)
            else:  # held at the limit
                self.over_ns, self.over_limit_w = t_ns, limit
            if self.cap_idx >= tgt:
                # the last step is let go only `cap_hold_s` after the power was over
                held = (t_ns - self.over_ns) * 1e-9 < p.cap_hold_s and self.over_limit_w == limit
                self.cap_idx = max(0, tgt - 1) if held and tgt > 0 else self.top
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

    def _watts_per_step(self) -> float:
        """Watts one clock step is worth at this clock and load (the driver's own estimate)."""
        cur = self.sm_idx
        step_mhz = (self.asc[cur] - self.asc[cur - 1]) if cur > 0 else (self.asc[1] - self.asc[0])
        return max(1e-6, self.p.dyn_exponent * self._dyn / self.asc[cur] * step_mhz)

    def _cap_down(self, t_ns: int, p_cap: float) -> None:
        """Lower the cap's ceiling for a power `p_cap` over the limit."""
        limit = self.settings.power_limit_w
        steps = min(
            self.p.max_step_down, max(1, math.ceil((p_cap - limit) / self._watts_per_step()))
        )
        self.cap_idx = max(0, min(self.cap_idx, self.sm_idx) - steps)
        self.over_ns, self.over_limit_w = t_ns, limit

    def _fast_cap(self, t_ns: int) -> None:
        """Between driver updates, the fast view of the power (cap_fast_filter_s) over the
        limit lowers the clock at once; the readings show it at the next update."""
        if self.p_fast > self.settings.power_limit_w:
            self._cap_down(t_ns, self.p_fast)
            self.apply()

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
        self._control(t_ns)
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
        # the "instant" power is the value at the update, held until the next: a heavy
        # step showed in it 27-74 ms late on an H200 (benchmarks/power_lag.py)
        self.r_power_instant = self.power_w
        self.r_energy_mj = int(self.energy_mj)
        self.r_reason_ns = dict(self.reason_ns)
        self.r_util = sum(self.busy_ring) / len(self.busy_ring)
        self.r_ts_ns = t_ns

    def reasons_read(self) -> int:
        """The reasons NVML reads now: the latched ones, and the power cap's whenever the power
        reading (the 1 s average NVML reports as power usage) is over the limit, as just after
        a limit was lowered: that reading never exceeds the limit without its reason. (The
        instant power may, for the cap's onset, 100-300 ms, as on an H100: the burst schedule
        of gpuenv's do_bench drop-in lives in that window.)"""
        over = self.r_power_avg > self.settings.power_limit_w
        return self.r_reasons | (REASON_SW_POWER_CAP & self.p.supported_reasons if over else 0)

    def relatch_clock(self) -> None:
        """Settings that take effect at once (a lock) show in the very next read."""
        self.apply()
        self.r_sm, self.r_mem, self.r_reasons = self.sm_mhz, self.mem_mhz, self.reasons

    def _latch_temp(self, t_ns: int) -> None:
        self.r_temp = round(self.temp_c)
        self.r_temp_ts_ns = t_ns

    def revive(self) -> None:
        """A reset GPU: back on the bus with fresh controllers and readings."""
        if self.lost is None:
            return
        self.lost = None
        self.cap_idx = self.therm_idx = self.top
        self.hw_slow = self.temp_c >= self.p.slowdown_c
        self.load_changed()
        self.apply()
        self._latch(self.t_ns)
        self._latch_temp(self.t_ns)

    def set_temperature(self, temp_c: float) -> None:
        self.temp_c = temp_c
        self.r_temp = round(temp_c)

    # -- shared between the processes of a host ----------------------------------------
    def physics(self) -> dict[str, Any]:
        """The running GPU's state (not its settings, not this process's work), as JSON:
        what another process of the host takes over with `adopt` (`sim_host.py`)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in _PHYSICS}
        out["active_counters"] = list(self.active_counters)
        out["reason_ns"] = dict(self.reason_ns)
        out["r_reason_ns"] = dict(self.r_reason_ns)
        out["power_ring"] = list(self.power_ring)
        out["busy_ring"] = list(self.busy_ring)
        out["power_samples"] = [list(s) for s in self.power_samples]
        out["sample_mj"] = self.sample_mj
        return out

    def adopt(self, state: dict[str, Any], now_ns: int, *, fresh: bool = False) -> None:
        """Take over the running GPU's state another process left (`physics()`) where it
        is newer than ours, or this model is `fresh` (it has seen nothing yet); what this
        process runs itself (contexts, work) stays. KeyError/TypeError/ValueError on a
        state that is not one (a time after `now_ns` included: it would stop the GPU)."""
        values = {name: _PHYSICS[name](state[name]) for name in _PHYSICS}
        if values["t_ns"] > now_ns + 1_000_000_000:
            raise ValueError("a running state from the future")
        if values["t_ns"] < self.t_ns and not fresh:  # ours is newer: theirs adds nothing
            return
        counters = {k: int(state["reason_ns"][k]) for k in REASON_COUNTERS}
        latched = {k: int(state["r_reason_ns"][k]) for k in REASON_COUNTERS}
        rings = [[_finite(x) for x in state[name]][-10:] for name in ("power_ring", "busy_ring")]
        samples = [(int(t), _finite(w)) for t, w in state["power_samples"]]
        active = tuple(str(c) for c in state["active_counters"])
        if not set(active) <= set(REASON_COUNTERS):
            raise ValueError(f"unknown counters {active!r}")
        if not (0 <= values["sm_idx"] <= self.top and 0 <= values["cap_idx"] <= self.top):
            raise ValueError("clock index out of range")
        if not (0 <= values["therm_idx"] <= self.top) or len(rings[0]) != 10:
            raise ValueError("clock index or power ring out of range")
        if self.job is not None and not fresh:
            # Our kernel ran from our time to theirs: without this, the state taken over
            # (already at their time) skips that stretch and the kernel redoes it, so a
            # 30 ms step read up to ~50 ms whenever another process (the sampler of
            # `gpuenv run`) had written the running GPU meanwhile.
            self.advance(values["t_ns"])
        for name, value in values.items():
            setattr(self, name, value)
        self.reason_ns, self.r_reason_ns, self.active_counters = counters, latched, active
        self.power_ring = collections.deque(rings[0], maxlen=10)
        self.busy_ring = collections.deque(rings[1] or [0.0] * 10, maxlen=10)
        self.power_samples = collections.deque(samples, maxlen=POWER_SAMPLES_KEPT)
        # (a state written before samples were means: they start afresh from its counter)
        self.sample_mj = _finite(state.get("sample_mj", values["energy_mj"]))
        self._refresh_caches()

    # -- workload ------------------------------------------------------------------
    def open_context(self, pid: int) -> None:
        self.contexts.append(pid)
        # Application clocks take effect when a context is created.
        self.applied_app_sm, self.applied_app_mem = self.settings.app_sm, self.settings.app_mem
        self.load_changed()


def _lost(value: Any) -> str | None:
    return None if value is None else str(value)


def _finite(value: Any) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{value!r} is not a finite number")
    return out


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


# The running state `physics()` shares, and how each value is read back.
_PHYSICS: dict[str, Any] = {
    "t_ns": int,
    "last_change_ns": int,
    "applied_app_sm": int,
    "applied_app_mem": int,
    "ambient_c": _finite,
    "lost": _lost,
    "cap_idx": int,
    "over_ns": int,
    "over_limit_w": _finite,
    "therm_idx": int,
    "hw_slow": _flag,
    "sm_idx": int,
    "mem_mhz": int,
    "reasons": int,
    "energy_mj": _finite,
    "temp_c": _finite,
    "power_w": _finite,
    "p_filt": _finite,
    "period_j": _finite,
    "period_busy": _finite,
    "period_start_ns": int,
    "next_sample_ns": int,
    "r_sm": int,
    "r_mem": int,
    "r_reasons": int,
    "r_power_avg": _finite,
    "r_power_instant": _finite,
    "r_energy_mj": int,
    "r_util": _finite,
    "r_ts_ns": int,
    "r_temp": int,
    "r_temp_ts_ns": int,
}


__all__ = [
    "COARSE_AFTER_NS",
    "POWER_SAMPLES_KEPT",
    "POWER_SAMPLE_NS",
    "STEP_NS",
    "GpuModel",
    "Job",
    "Presence",
    "Settings",
]
