"""Conditioning: put the GPU in a known state before (and while) measuring. One config.

Two states a GPU that cannot be locked can still be measured in, the same way twice:

  burst ("cool and uncapped"): before a measurement, and between short bursts of
    reps, wait until the GPU is back in the state a rested GPU is in: no reason
    holding the clock down (`reasons.HELD_DOWN`: power cap, thermal slowdown, HW
    slowdown, power brake) in the two newest samples taken one driver refresh
    after the last work, the SM clock at its maximum (or inside a lock) unless the
    GPU idles, and (before a measurement, when the idle temperature is known) the
    temperature within a margin of it. On an H100 the power cap clears within
    ~0.5 s of the load stopping (GPU_FACTS.md).
  sustained ("equilibrium"): run the work back to back until what is measured
    stops drifting. A GPU approaching equilibrium relaxes roughly exponentially
    with a thermal time constant tau, so what is still to come is about tau x the
    present rate of change; the signal is the time per call where the work is
    timed (else the inverse of the median SM clock), and the temperature must
    settle too (leakage lowers a capped clock as the chip heats).

`gpuenv.session` (stable()) and `gpuenv.timing` (bench) both condition through
this module, with `ConditionConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv import stats
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ, lock_holds
from gpuenv.errors import ConfigError
from gpuenv.progress import Progress
from gpuenv.reasons import HELD_DOWN, Reason, short_names
from gpuenv.telemetry import DRIVER_REFRESH_S
from gpuenv.timebase import Clock
from gpuenv.verdict import GpuFacts

CONDITIONS = ("burst", "sustained")


@dataclass(frozen=True)
class ConditionConfig:
    """Every threshold of the burst and sustained conditions.

    burst
      burst_s: GPU time per burst of reps; the SW power cap engages within
        100-300 ms on an H100, so a burst ends well before it can.
      burst_duty: rest at least (1 / duty - 1) x the burst between bursts.
      burst_wait: after that rest, "fresh": wait until samples taken one driver
        refresh after the burst show the GPU cool and uncapped (gpuenv.bench: a
        rest of >= 0.1 s); "seen": wait so only while the newest samples, or a rep's
        probed clock, show it held down (the do_bench drop-in, whose budget is a few
        bursts: a rest of one driver refresh each would double its wall time).
      burst_power_tau_s: the rests follow the power the cap controller acts on: a
        first-order filter of the power with this time constant (the H100's cap
        engages 100-300 ms into a heavy load: ~0.15 s). Before each burst, rest until
        the filter, driven by the heaviest instant power seen in this measurement
        during the burst to come, stays under `burst_power_target` x the limit: a
        light kernel never rests, a heavy one as little as keeps it off the cap
        whatever its budget. None (or no power reading): the duty rule above.
      burst_power_target: that fraction of the power limit.
      burst_timeout_s: the longest wait for the GPU to recover; after it, measure
        anyway (the findings say what state the GPU was in) and say so.
      burst_temp_margin_c: "cool" is within this of the idle temperature (the
        session's starting temperature, or `burst_idle_temp_c`); checked before a
        measurement, not between its bursts. None: temperature is not waited for.
      burst_clock_rel: "uncapped" is an SM clock within this fraction of the
        maximum (or inside the locked range).
      burst_ready: "reasons": ready when the newest samples show no held-down reason
        (after heavy load the H100's power-cap bit stays ~0.5 s, the clock one 15 MHz
        step under its maximum until it clears); "clock": when the clock is back within
        `burst_clock_rel`, a SW power-cap bit alone not waited for (thermal and HW
        slowdowns still are).
      poll_s: how often to look while waiting.
    sustained
      sustained_chunk_s: the work runs in chunks this long; each gives one point
        (time per call or clock, temperature).
      sustained_window_s: the drift still to come is fitted over this much history.
      sustained_tol: equilibrium when the predicted drift still to come is below
        this fraction of the signal, for the signal and through the temperature.
      sustained_tau_s: the thermal time constant of a data-centre GPU under load.
      sustained_min_s: run at least this long (default: one window).
      sustained_timeout_s: precondition at most this long, then measure anyway.
      temp_sensitivity: relative change of the signal per C, when it cannot be
        fitted (the GPU was never capped, or the temperature hardly moved).
    """

    burst_s: float = 0.025
    burst_duty: float = 0.2
    burst_wait: str = "fresh"
    burst_power_tau_s: float | None = None
    burst_power_target: float = 0.9
    burst_timeout_s: float = 30.0
    burst_temp_margin_c: float | None = 5.0
    burst_clock_rel: float = 0.02
    burst_ready: str = "reasons"
    burst_idle_temp_c: float | None = None
    poll_s: float = 0.05
    sustained_chunk_s: float = 0.5
    sustained_window_s: float = 10.0
    sustained_tol: float = 0.005
    sustained_tau_s: float = 20.0
    sustained_min_s: float | None = None
    sustained_timeout_s: float = 180.0
    temp_sensitivity: float = 0.01

    def __post_init__(self) -> None:
        if self.burst_wait not in ("fresh", "seen") or not 0 < self.burst_duty <= 1 \
                or self.burst_ready not in ("reasons", "clock"):
            raise ConfigError(f"burst_wait {self.burst_wait!r} / burst_duty {self.burst_duty} / "
                              f"burst_ready {self.burst_ready!r}",
                              hint="burst_wait is 'fresh' or 'seen'; 0 < burst_duty <= 1; "
                                   "burst_ready is 'reasons' or 'clock'")


DEFAULT = ConditionConfig()


# -- burst: cool and uncapped ------------------------------------------------------------


def recovered(
    sampler: Any,
    gpu: int,
    *,
    since: float,
    facts: GpuFacts | None = None,
    idle_temp_c: float | None = None,
    config: ConditionConfig = DEFAULT,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
) -> bool:
    """Is GPU `gpu` cool and uncapped, judged by samples taken after `since` (the end of
    the last work) plus one driver refresh? No telemetry: nothing to wait for."""
    fresh = sampler.samples(since + DRIVER_REFRESH_S, None, gpu)
    if not fresh:
        # nothing new yet: wait for it, unless there is no telemetry at all (a gap must
        # not block the measurement)
        return sampler.latest(gpu) is None
    newest = fresh[-2:]
    # "clock": the clock itself says whether the cap still holds it (a GPU whose maximum
    # is not known waits for the bit)
    by_clock = config.burst_ready == "clock" and facts is not None and bool(
        facts.lock_range_mhz or facts.max_sm_mhz)
    held = HELD_DOWN & ~Reason.SW_POWER_CAP if by_clock else HELD_DOWN
    if len(newest) < 2 or any(s.reasons & held for s in newest):
        return False
    for s in newest if by_clock else newest[-1:]:
        if not s.reasons & Reason.GPU_IDLE and facts is not None:
            rng = facts.lock_range_mhz
            if rng is not None:
                if not lock_holds(s.sm_mhz, rng, lock_tolerance_mhz):
                    return False
            elif facts.max_sm_mhz and s.sm_mhz < (1 - config.burst_clock_rel) * facts.max_sm_mhz:
                return False
    idle = config.burst_idle_temp_c if config.burst_idle_temp_c is not None else idle_temp_c
    margin = config.burst_temp_margin_c
    return idle is None or margin is None or s.temp_c <= idle + margin


def wait_until_ready(
    sampler: Any,
    gpus: Sequence[int],
    clock: Clock,
    *,
    since: float,
    facts: Mapping[int, GpuFacts] | None = None,
    idle_temp_c: Mapping[int, float] | None = None,
    config: ConditionConfig = DEFAULT,
    min_rest_s: float = 0.0,
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
) -> tuple[float, bool, list[int]]:
    """Rest at least `min_rest_s`, then wait until every GPU is cool and uncapped, at most
    `config.burst_timeout_s`. Returns (seconds waited, ready, the GPUs still not ready).
    Without a sampler it only rests."""
    start = clock.now()
    clock.sleep(min_rest_s)
    if sampler is None:
        return clock.now() - start, True, []
    with Progress() as shown:  # a wait of seconds says what it waits for (a terminal only)
        while True:
            pending = [
                g for g in gpus
                if not recovered(
                    sampler, g, since=since, facts=(facts or {}).get(g),
                    idle_temp_c=(idle_temp_c or {}).get(g), config=config,
                    lock_tolerance_mhz=lock_tolerance_mhz,
                )
            ]  # fmt: skip
            waited = clock.now() - start
            if not pending:
                return waited, True, []
            if waited >= config.burst_timeout_s:
                return waited, False, pending
            shown.update(_waiting(sampler, pending[0], facts, config.burst_timeout_s))
            clock.sleep(config.poll_s)


def _waiting(sampler: Any, gpu: int, facts: Mapping[int, GpuFacts] | None, limit_s: float) -> str:
    """"gpuenv: waiting for GPU 0 to recover (at most 30 s): clock 1420 -> 1980 MHz, 61 C"."""
    line = f"gpuenv: waiting for GPU {gpu} to recover (at most {limit_s:.0f} s)"
    s, f = sampler.latest(gpu), (facts or {}).get(gpu)
    if s is None:
        return line
    top = f and (f.lock_range_mhz[0] if f.lock_range_mhz else f.max_sm_mhz)
    clk = f"{s.sm_mhz:.0f} -> {top:.0f}" if top else f"{s.sm_mhz:.0f}"
    return f"{line}: clock {clk} MHz, {s.temp_c:.0f} C" + "".join(
        f", {n}" for n in short_names(s.reasons & HELD_DOWN))


def burst_rest_s(burst_s: float, config: ConditionConfig = DEFAULT) -> float:
    """The least rest after a burst that took `burst_s`, for the configured duty cycle."""
    return burst_s * (1 / config.burst_duty - 1)


MAX_CLOCK_REDOS = 3  # reps measured again after the clock fell under them, per measurement
CLOCK_FALL_REL = 0.05  # probes scatter ~2% (2% redid a far-from-cap mm512 on the H100)


REST_POWER_FRAC = 0.25  # the power at rest is at most this of the limit (H100: 120 of 700 W)
# The modelled filtered power each GPU was left at (clock time, watts, watts at rest): the
# GPU's state outlives a measurement, so the next one (an autotuner's next config, a
# moment later) starts from it, not from the 1 s average that lags it.
_FILTER_LEFT: dict[int, tuple[float, float, float]] = {}


class Bursts:
    """The burst rule for a measurement's reps (condition "burst"): the one schedule of
    gpuenv.bench and the do_bench drop-in, which differ only in their ConditionConfig.

    Reps run in bursts of at most `burst_s`. A burst also ends at once when a rep's
    probed clock falls more than CLOCK_FALL_REL below the highest this measurement
    saw (the cap coming on: NVML reports it up to a driver refresh later); that rep
    is measured again after a rest that waits for the GPU to recover (at most
    MAX_CLOCK_REDOS times a measurement). Between bursts: with `burst_power_tau_s`,
    the rest the power model asks for (ConditionConfig), else `burst_rest_s`; then the
    wait `burst_wait` says. `in_bursts_s()` is the time measured inside bursts since
    `start`: a budget counted in bursts, not wall time.

        bursts = Bursts(sampler, gpu, clock, facts=facts, config=cc, start=t_measure)
        while ...:
            rep = device.rep(fn)
            if bursts.clock_fell(rep.clock_mhz): ...  # discard rep (measured again)
            if bursts.due(): bursts.rest()
    """

    def __init__(self, sampler: Any, gpu: int, clock: Clock, *, facts: GpuFacts | None,
                 config: ConditionConfig, start: float, burst_start: float | None = None,
                 rested_s: float = 0.0, lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ):
        self.sampler, self.gpu, self.clock = sampler, gpu, clock
        self.facts, self.config, self.tol = facts, config, lock_tolerance_mhz
        self.burst_start = start if burst_start is None else burst_start
        self.origin = self.burst_start - DRIVER_REFRESH_S  # a sample at the start counts
        self.segment = start  # the part of this burst that counts in the budget began
        self.measured_s = 0.0  # closed bursts' share of the budget
        self.peak_mhz = 0.0
        self.bursts: list[float] = []
        self.rests = self.waits = self.redos = 0
        self.rest_s = 0.0
        self.fell = False
        self.filt_w: float | None = None  # the modelled filtered power, at `self.burst_start`
        self.rested_s = rested_s  # the wait before measuring (for a GPU found held down)

    def clock_fell(self, mhz: float | None) -> bool:
        """A rep's probed clock: True when it fell under the burst (end it; redo the rep)."""
        if mhz is None:
            return False
        if mhz > self.peak_mhz:
            self.peak_mhz = mhz
            return False
        fell = mhz < (1 - CLOCK_FALL_REL) * self.peak_mhz
        if fell and self.redos < MAX_CLOCK_REDOS:
            self.redos += 1
            self.fell = True
            return True
        return False

    def due(self) -> bool:
        return self.fell or self.clock.now() - self.burst_start >= self.config.burst_s

    def in_bursts_s(self) -> float:
        return self.measured_s + (self.clock.now() - self.segment)

    def rest(self) -> None:
        """End the burst: rest and wait as the config says, then begin the next."""
        cc, now = self.config, self.clock.now()
        burst = now - self.burst_start
        self.bursts.append(burst)
        self.measured_s += now - self.segment
        rest = self._power_rest(burst) if not self.fell else None
        wait = self.fell or cc.burst_wait == "fresh" or self._held_down()
        if rest is None:
            rest = burst_rest_s(burst, cc)
        if wait:
            self.waits += 1
            wait_until_ready(self.sampler, [self.gpu], self.clock, since=now,
                             facts={self.gpu: self.facts} if self.facts else None,
                             config=cc, min_rest_s=rest, lock_tolerance_mhz=self.tol)  # fmt: skip
        elif rest > 0:
            self.clock.sleep(rest)
        took = self.clock.now() - now
        if took > 0:
            self.rests += 1
            self.rest_s += took
        if self.filt_w is not None:  # the filter relaxed toward the power at rest
            low = self._watts()[1]
            self.filt_w = low + (self.filt_w - low) * math.exp(-took / (cc.burst_power_tau_s or 1))
        self.fell = False
        self.burst_start = self.segment = self.clock.now()

    def _watts(self) -> tuple[float, float]:
        """The heaviest instant power seen in this measurement, and the power at rest."""
        # this measurement's samples only (a session's sampler holds hours of others)
        samples = self.sampler.samples(self.origin, None, self.gpu) if self.sampler else []
        watts = [s.power_instant_w if s.power_instant_w is not None else s.power_w
                 for s in samples]  # fmt: skip
        limit = self.facts.power_limit_w if self.facts and self.facts.power_limit_w else 0.0
        return max(watts, default=0.0), min([*watts, REST_POWER_FRAC * limit])

    def _power_rest(self, burst: float) -> float | None:
        """The rest after a burst of `burst` s that keeps the next burst's filtered power
        under the target (ConditionConfig.burst_power_tau_s); None: no model."""
        cc = self.config
        tau, limit = cc.burst_power_tau_s, self.facts.power_limit_w if self.facts else None
        if tau is None or not limit or self.sampler is None:
            return None
        heavy, low = self._watts()
        if heavy <= 0:
            return None
        if self.filt_w is None:  # from the 1 s average read first, or where the last
            first = self.sampler.samples(self.origin, None, self.gpu)[:1]  # last one left it
            before = max(low, first[0].power_w if first else low)
            left = _FILTER_LEFT.get(self.gpu)
            if left is not None and first and first[0].t >= left[0]:
                before = max(before, left[2] + (left[1] - left[2])
                             * math.exp(-(self.burst_start - left[0]) / tau))  # fmt: skip
            self.filt_w = low + (before - low) * math.exp(-self.rested_s / tau)
        self.filt_w = heavy + (self.filt_w - heavy) * math.exp(-burst / tau)
        target = cc.burst_power_target * limit
        if heavy <= target:
            return 0.0  # light: the filter cannot reach the target
        # the filter may start the next burst at most here to end it under the target
        start_max = heavy - (heavy - target) * math.exp(cc.burst_s / tau)
        if start_max <= low:
            return None  # a burst this heavy and long cannot stay under: the duty rule
        if self.filt_w <= start_max:
            return 0.0
        return tau * math.log((self.filt_w - low) / (start_max - low))

    def _held_down(self) -> bool:
        latest = self.sampler.latest(self.gpu) if self.sampler is not None else None
        return latest is not None and bool(latest.reasons & HELD_DOWN)

    def summary(self) -> dict[str, Any]:
        """What the schedule did, for Measurement.extra (the measurement ends here)."""
        tau = self.config.burst_power_tau_s
        if self.filt_w is not None and tau:
            heavy, low = self._watts()
            now = self.clock.now()
            end = heavy + (self.filt_w - heavy) * math.exp(-(now - self.burst_start) / tau)
            _FILTER_LEFT[self.gpu] = (now, end, low)
        return {"burst_rests": self.rests, "bursts": len(self.bursts) + 1,
                "burst_max_s": max([*self.bursts, self.clock.now() - self.burst_start]),
                "burst_rest_s": self.rest_s, "burst_waits": self.waits,
                "burst_clock_redos": self.redos, "in_bursts_s": self.in_bursts_s()}  # fmt: skip


# -- sustained: equilibrium --------------------------------------------------------------


@dataclass(frozen=True)
class Conditioning:
    """What preconditioning did (condition "sustained")."""

    seconds: float
    steady: bool
    sm_mhz: float | None
    temp_c: float | None
    limited: bool  # a reason holding the clock down was seen in the last chunk
    residual: float | None  # predicted drift still to come, relative (tau x slope)

    def to_dict(self) -> dict[str, Any]:
        return {
            "precondition_s": self.seconds,
            "precondition_steady": self.steady,
            "precondition_sm_mhz": self.sm_mhz,
            "precondition_temp_c": self.temp_c,
            "precondition_limited": self.limited,
            "precondition_residual": self.residual,
        }


@dataclass
class _Track:
    """One GPU's chunk points: (chunk end, signal, temperature)."""

    pts: list[tuple[float, float, float | None]] = field(default_factory=list)
    capped_from: int | None = None  # index of the first chunk under a limiting reason


def residual(
    pts: Sequence[tuple[float, float, float | None]], capped_from: int | None,
    config: ConditionConfig = DEFAULT,
) -> float | None:  # fmt: skip
    """The relative drift of the signal still to come; None while there is too little history.

    max(tau x |slope of the signal| / level, tau x |temperature slope| x sensitivity),
    slopes fitted over the last window (the temperature's over three: NVML reads whole
    degrees, so a slow creep shows as 0 or 1 step in a short window), the sensitivity
    fitted from the chunks since the clock was first held down when the temperature
    moved enough, else `config.temp_sensitivity`.
    """
    window_s, tau_s = config.sustained_window_s, config.sustained_tau_s
    end = pts[-1][0]
    recent = [p for p in pts if p[0] >= end - window_s]
    if len(recent) < 4 or recent[-1][0] <= recent[0][0]:
        return None
    step = (recent[-1][0] - recent[0][0]) / (len(recent) - 1)
    level = stats.median([p[1] for p in recent])
    if level <= 0:
        return 0.0
    drift = tau_s * abs(stats.ols_slope([p[1] for p in recent]) / step) / level
    longer = [p for p in pts if p[0] >= end - 3 * window_s]
    temps = [p[2] for p in longer]
    if len(longer) < 4 or any(t is None for t in temps):
        return drift
    long_step = (longer[-1][0] - longer[0][0]) / (len(longer) - 1)
    temp_slope = stats.ols_slope([float(t) for t in temps if t is not None]) / long_step
    since = [(p[2], p[1]) for p in pts[capped_from or 0 :] if p[2] is not None]
    span = max(t for t, _ in since) - min(t for t, _ in since) if since else 0.0
    if capped_from is None or span < 2.0:
        sensitivity = config.temp_sensitivity
    else:
        sensitivity = abs(fit_slope([t for t, _ in since], [v for _, v in since])) / level
    return max(drift, tau_s * abs(temp_slope) * sensitivity)


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 when xs do not vary)."""
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    den = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def precondition(
    run_chunk: Callable[[float], float | None],
    sampler: Any,
    gpus: Sequence[int],
    clock: Clock,
    *,
    config: ConditionConfig = DEFAULT,
    progress: Callable[[str, bool], None] | None = None,
) -> Conditioning:
    """Sustained: call `run_chunk(config.sustained_chunk_s)` until every GPU is at equilibrium.

    `run_chunk(seconds)` runs the work back to back for about that long and returns
    the time per call (None when the work is not timed: then the signal is the
    inverse of the chunk's median SM clock). `progress(line, settled)` gets a line
    after each chunk. Runs at least `sustained_min_s` (default: one window), at most
    `sustained_timeout_s` (`steady` False then).
    """
    min_s = config.sustained_window_s if config.sustained_min_s is None else config.sustained_min_s
    start = clock.now()
    tracks = {g: _Track() for g in gpus}
    while True:
        c0 = clock.now()
        per_call = run_chunk(config.sustained_chunk_s)
        c1 = clock.now()
        states = []
        for g in gpus:
            chunk = sampler.samples(c0, c1, g) if sampler is not None else []
            mhz = stats.median([float(s.sm_mhz) for s in chunk]) if chunk else None
            temp = chunk[-1].temp_c if chunk else None
            limited = any(s.reasons & HELD_DOWN for s in chunk)
            tr = tracks[g]
            if limited and tr.capped_from is None:
                tr.capped_from = len(tr.pts)
            signal = per_call if per_call is not None else (1.0 / mhz if mhz else None)
            if signal is not None:
                tr.pts.append((c1, signal, temp))
            left = residual(tr.pts, tr.capped_from, config) if tr.pts else None
            states.append((g, mhz, temp, limited, left))
        elapsed = c1 - start
        lefts = [s[4] for s in states]
        worst = None if any(x is None for x in lefts) else max(lefts)  # type: ignore[type-var]
        settled = elapsed >= min_s and worst is not None and worst <= config.sustained_tol
        if progress is not None:
            progress(_progress_line(elapsed, per_call, states, worst, settled), settled)
        if settled or elapsed >= config.sustained_timeout_s:
            _, mhz, temp, _, _ = states[0] if states else (None, None, None, False, None)
            return Conditioning(elapsed, settled, mhz, temp, any(s[3] for s in states), worst)


def _progress_line(elapsed: float, per_call: float | None, states: Sequence[tuple[
        int, float | None, float | None, bool, float | None]], worst: float | None,
        settled: bool) -> str:  # fmt: skip
    from gpuenv.units import fmt_s
    parts = [
        f"GPU {g}" + (f" {mhz:.0f} MHz" if mhz is not None else "")
        + (f" {temp:.0f} C" if temp is not None else "") + (" capped" if limited else "")
        for g, mhz, temp, limited, _ in states
    ]
    line = f"preconditioning {elapsed:5.1f} s: " + ", ".join(parts)
    if per_call is not None:
        line += f", {fmt_s(per_call)}/call"
    if worst is not None:
        line += f", still to drift ~{worst:.2%}"
    return line + (": steady" if settled else "")


__all__ = ["CONDITIONS", "DEFAULT", "MAX_CLOCK_REDOS", "Bursts", "ConditionConfig",
           "Conditioning", "burst_rest_s", "fit_slope", "precondition", "recovered",
           "residual", "wait_until_ready"]  # fmt: skip
