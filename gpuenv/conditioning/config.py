"""Every threshold of the burst and sustained conditions: one `ConditionConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from gpuenv.errors import ConfigError

# the states a measurement is taken in: rested before each burst, or hot and steady
Condition = Literal["burst", "sustained"]
CONDITIONS: tuple[Condition, ...] = get_args(Condition)


@dataclass(frozen=True)
class ConditionConfig:
    """Every threshold of the burst and sustained conditions.

    No figure of one GPU model decides a number on another. Each threshold is one of:
    relative to the GPU's own facts, read once per measurement (`GpuFacts`: its power
    limit, maximum clock, thresholds): every `*_frac` and `*_rel` below; waited for on
    the GPU's own readings, never timed (how long the cap's bit lingers after a load,
    ~0.5 s on an H100 and an H200, is what the burst wait sees, not a constant); or
    learned on the GPU (`burst_learn`: the cap's onset, per function and per GPU, in the
    conditioner's `Memory`). The seconds that remain are starting points and budgets:
    the figures named beside them (H100, H200) say where they came from, not that every
    GPU behaves so.

    burst
      burst_s: GPU time per burst of reps; the SW power cap engages 100-300 ms into a
        heavy load on an H100 (127-178 ms on an H200), so a burst ends well before it
        can. A GPU whose cap comes on sooner is learned (`burst_learn`); one whose cap
        comes on later (the simulated A100, 400 ms) only rests more than it must.
      burst_duty: rest at least (1 / duty - 1) x the burst between bursts.
      burst_wait: after that rest, "fresh": wait until samples taken one driver
        refresh after the burst show the GPU cool and uncapped (gpuenv.bench: a
        rest of >= 0.1 s); "seen": wait so only while the newest samples, or a rep's
        probed clock, show it held down (the do_bench drop-in, whose budget is a few
        bursts: a rest of one driver refresh each would double its wall time).
      burst_power_tau_s: the rests follow the power the cap controller acts on: a
        first-order filter of the power with this time constant (the H100's cap
        engages 100-300 ms into a heavy load, the H200's 127-178 ms: ~0.15 s; NVML does
        not report it: where a GPU's controller is faster, the cap meets a burst, the rep
        is measured again and the onset learned). Before each burst, rest until
        the filter, driven by the heaviest instant power seen in this measurement
        (1.6x the limit until a reading refreshed inside the work has shown it:
        `burst.UNSEEN_POWER_FRAC`) during the burst to come, stays under
        `burst_power_target` x the limit: a light kernel rests at most once, a heavy
        one as little as keeps it off the cap whatever its budget. None (or no power
        reading): the duty rule above.
      burst_power_target: that fraction of the power limit.
      burst_clock_fall_rel: a rep whose probed clock falls more than this fraction below
        the highest this measurement saw ends its burst and is measured again (probes
        scatter ~2%: 2% redid a far-from-cap 512^3 matmul on the H100; relative to the
        GPU's own clock), at most
        `burst_clock_redos` times a measurement.
      burst_window_redos: after each rest, the reps whose telemetry windows show a
        held-down reason (the power cap, thermal: what the findings would name) are
        dropped and measured again, their time not counted in the budget; at most this
        many times a measurement, and not after a wait for the GPU ran out (a GPU held
        down for good still ends, its finding kept). 0 (the default; the do_bench
        drop-in's is 4): reps are kept as measured.
      burst_learn: a burst that met the cap (a probed clock fell, or a window showed a
        held-down reason) says the cap comes on sooner than the schedule assumed: the
        unbroken work before a rest is held to half of what met it (down to a few
        reps' worth), for the rest of the measurement and the next call of the same
        function on the GPU, and each burst then rests at least the duty rule's rest.
        What met the cap is kept for the GPU too (`Memory.cap_onset`): another heavy
        function, or one whose power no reading has shown yet, starts from it there.
        Off by default; the do_bench drop-in turns it on.
      burst_timeout_s: the longest wait for the GPU to recover; after it, measure
        anyway (the findings say what state the GPU was in) and say so.
      burst_temp_margin_c: "cool" is within this of the idle temperature (the
        session's starting temperature, or `burst_idle_temp_c`); checked before a
        measurement, not between its bursts. None: temperature is not waited for.
        A `stable()` session narrows or lifts it per function (`temperature.py`):
        a kernel is waited for only until its expected shift, from the slope its
        own measurements showed, is under `burst_temp_shift_rel`; one not learned
        yet, or whose time does not rise with the temperature, is not waited for.
      burst_temp_shift_rel: that target.
      burst_temp_wait_s: the longest such a wait for the chip to cool, beyond the wait
        for the clock and the cap: an H100 takes more than 30 s after a few seconds of
        load to come back within 5 C, and a 30 s wait bought an 8192^3 matmul 0.2%
        (0.54% cold vs hot unwaited, 0.31% after it); an H200 is back at ~35 C 5 s after
        7 s of load. A budget, not a model: a GPU that cools sooner ends the wait sooner;
        past it the measurement's note says what the remaining degrees cost.
      burst_clock_rel: "uncapped" is an SM clock within this fraction of the GPU's own
        maximum (or inside the locked range).
      burst_ready: "reasons": ready when the newest samples show no held-down reason
        (after heavy load the H100's power-cap bit stays ~0.5 s, the clock one 15 MHz
        step under its maximum until it clears; an H200's clears within 5 s, not timed
        closer); "clock": when the clock is back within
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
    the burst schedule's power model (conditioning.Bursts; measured on the H100 and H200;
    every power a share of the GPU's own limit, read per measurement)
      rest_power_frac: the power at rest is at most this share of the limit (H100: 120
        of 700 W, H200: 123-125 of 700 W, with a context).
      unseen_power_frac: a heavy kernel's power before any reading has shown it, as a
        share of the limit. The instant power is the driver's value at its last refresh
        (every ~100 ms: a step of heavy work showed 27-74 ms late on an H200), so until a
        refresh fell inside the work the schedule assumes the worst: the H200's 8192^3
        bf16 matmuls drew up to 892 W against its 700 W limit (1.27x), the simulated
        H100's heaviest kernel 1.57x.
      heavy_seen_frac: a reading refreshed inside the work still reads under what the work
        draws where the work ran only part of the time the value covers (an MLP block
        drawing 760-941 W on an H100 read 575-591 W so, and met the cap). A reading this
        far up the limit says the kernel is heavy, not how heavy: it is then scheduled as
        `unseen_power_frac`; a lower one says it is light.
      unseen_first_s: from a rested GPU, the work that may run before the first rest while
        no reading has shown its power (a driver refresh and a little falls in it: the
        driver's refresh period, not a GPU model's; the H200's cap engaged 127-178 ms into
        work, the H100's 100-300 ms). Where a heavy kernel met the cap sooner on this GPU,
        at most the onset learned there (`burst_learn`).
      onset_floor_reps, heavy_run_s: the cap's onset, learned (`burst_learn`): the
        unbroken work that met the cap is halved, never under `onset_floor_reps` reps'
        worth; a kernel a reading showed heavy works at most `heavy_run_s` unbroken, or
        the GPU's learned onset where that is shorter (`heavy_run_s` is the starting
        bound: on an H100 the cap met an MLP block inside bursts of 30-60 ms begun from
        rest).
    the first burst (gpuenv.bench)
      cold_start_fresh: a call begun on an idle GPU waits for samples taken a driver
        refresh after its warmup (heavy work begun on an idle GPU can set off the cap in
        its first ~50 ms, which the warmup's own samples cannot show yet).
      state_probe_s: the state probe's reps (gpuenv.timing.stateprobe): about this much of
        fn's time, 3 to 10 reps.
      state_clock_gap: the clock this far below a function's reference: the probe can tell.
      state_free_rel: fn's time within this of its reference: the state does not move it.
      state_light_frac: a kernel drawing under this share of the GPU's own power limit
        (read per measurement: 350 W of an H100's or H200's 700 W, 200 W of an A100's
        400 W) is light.
    """

    burst_s: float = 0.025
    burst_duty: float = 0.2
    burst_wait: str = "fresh"
    burst_power_tau_s: float | None = None
    burst_power_target: float = 0.9
    burst_clock_fall_rel: float = 0.05
    burst_clock_redos: int = 3
    # off for gpuenv.bench and stable() (on for the do_bench drop-in): on an H100 after 7 s
    # of load they made a session's MLP block take 5.5-7.0 s (10 bursts, 3.1-3.6 s of
    # waits) where it took 1.19 s without them, its number no closer to cold
    burst_window_redos: int = 0
    burst_learn: bool = False
    burst_timeout_s: float = 30.0
    burst_temp_margin_c: float | None = 5.0
    burst_temp_shift_rel: float = 0.005
    burst_temp_wait_s: float = 2.0
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
    rest_power_frac: float = 0.25
    unseen_power_frac: float = 1.6
    heavy_seen_frac: float = 0.5
    unseen_first_s: float = 0.105  # one driver refresh (0.1 s) and SEEN_AFTER_S
    onset_floor_reps: int = 3
    heavy_run_s: float = 0.025
    cold_start_fresh: bool = True
    state_probe_s: float = 0.005
    state_clock_gap: float = 0.05
    state_free_rel: float = 0.003
    state_light_frac: float = 0.5

    def __post_init__(self) -> None:
        if (
            self.burst_wait not in ("fresh", "seen")
            or not 0 < self.burst_duty <= 1
            or self.burst_ready not in ("reasons", "clock")
        ):
            raise ConfigError(
                f"burst_wait {self.burst_wait!r} / burst_duty {self.burst_duty} / "
                f"burst_ready {self.burst_ready!r}",
                hint="burst_wait is 'fresh' or 'seen'; 0 < burst_duty <= 1; "
                "burst_ready is 'reasons' or 'clock'",
            )
        if (
            not 0 <= self.burst_clock_fall_rel < 1
            or self.burst_clock_redos < 0
            or self.burst_window_redos < 0
        ):
            raise ConfigError(
                f"burst_clock_fall_rel {self.burst_clock_fall_rel} / "
                f"burst_clock_redos {self.burst_clock_redos} / "
                f"burst_window_redos {self.burst_window_redos}",
                hint="0 <= burst_clock_fall_rel < 1; burst_clock_redos, burst_window_redos >= 0",
            )
        fracs = {
            n: getattr(self, n)
            for n in (
                "rest_power_frac",
                "heavy_seen_frac",
                "state_clock_gap",
                "state_free_rel",
                "state_light_frac",
            )
        }
        positive = {
            n: getattr(self, n)
            for n in ("unseen_power_frac", "unseen_first_s", "heavy_run_s", "state_probe_s")
        }
        bad = [
            f"{n} {x!r}"
            for n, x in fracs.items()
            if not (isinstance(x, int | float) and 0 <= x < 1)
        ]
        bad += [
            f"{n} {x!r}" for n, x in positive.items() if not (isinstance(x, int | float) and x > 0)
        ]
        if not isinstance(self.onset_floor_reps, int) or self.onset_floor_reps < 1:
            bad.append(f"onset_floor_reps {self.onset_floor_reps!r}")
        if not isinstance(self.cold_start_fresh, bool):
            bad.append(f"cold_start_fresh {self.cold_start_fresh!r}")
        if bad:
            raise ConfigError(
                " / ".join(bad),
                hint="fractions are 0 <= x < 1, seconds and unseen_power_frac above 0, "
                "onset_floor_reps an integer >= 1, cold_start_fresh True or False",
            )
        if not self.burst_temp_shift_rel > 0 or not self.burst_temp_wait_s >= 0:
            raise ConfigError(
                f"burst_temp_shift_rel {self.burst_temp_shift_rel} / "
                f"burst_temp_wait_s {self.burst_temp_wait_s}",
                hint="a fraction above 0 (0.005: half a percent); seconds >= 0",
            )


DEFAULT = ConditionConfig()
