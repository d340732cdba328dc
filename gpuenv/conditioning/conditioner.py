"""`Conditioner`: what a measurement waits for, decided in one place, by one owner.

    cond = Conditioner(ConditionConfig(), clock=backend.clock)
    cond.rested(sampler, gpus)                     # each GPU's idle temperature
    done = cond.before("burst", sampler, [gpu], facts, fn=fn)   # wait, or precondition once
    ...                                            # measure on `gpu`
    cond.work_ended(t1)                            # the next wait starts from here

It holds the knobs (`config`: a `ConditionConfig`, thresholds and the burst schedule's
power model alike), the clock its waits run on, and what it learned (`memory`: a
`Memory`, see gpuenv.conditioning.memory): per GPU, the temperature it rested at and
when work on it last ended; whether the sustained condition was reached; per function,
its warmup, state reference, the cap's onset and temperature slope.

A `gpuenv.stable()` session owns one, with a memory of its own, and hands it to each
bench; a bench outside a session makes one for the call over the process's memory
(`process_memory()`). Every wait is for the GPUs it is given, which a bench makes the GPU
its function runs on: a neighbour's load on another GPU never holds it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.conditioning.burst import recovered, wait_until_ready
from gpuenv.conditioning.config import Condition, ConditionConfig
from gpuenv.conditioning.memory import Memory
from gpuenv.conditioning.sustained import precondition
from gpuenv.phases import Conditioning, TemperatureFacts
from gpuenv.telemetry import SampleSource
from gpuenv.timebase import Clock
from gpuenv.verdict import GpuFacts


@dataclass(frozen=True)
class Wait:
    """What a wait for the cool, uncapped state did: how long, whether every GPU it waited
    for got there, and those that did not (`warm_only`: held back by their temperature
    alone, uncapped at their full clock)."""

    gpus: tuple[int, ...]
    waited_s: float
    ready: bool
    pending: tuple[int, ...] = ()
    warm_only: bool = False


class Conditioner:
    """The one owner of what a measurement waits for (the module docstring).

    Args:
        config: the knobs (default: `ConditionConfig()`).
        clock: the time its waits and preconditions run on.
        memory: what it learned and learns (default: a memory of its own).
        lock_tolerance_mhz: how far off a lock's range a clock still counts as held.
    """

    def __init__(
        self,
        config: ConditionConfig | None = None,
        *,
        clock: Clock,
        memory: Memory | None = None,
        lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ,
    ):
        self.config = config or ConditionConfig()
        self.clock = clock
        self.memory = memory if memory is not None else Memory()
        self.lock_tolerance_mhz = lock_tolerance_mhz
        self.idle_temp_c: dict[int, float] = {}
        self.last_end = -math.inf  # when the last measured work ended (clock time)
        self.preconditioned = False  # the sustained condition was reached

    # -- what it is told ------------------------------------------------------------------
    def rested(self, sampler: SampleSource, gpus: Sequence[int]) -> None:
        """The GPUs' temperatures now are where they rest (the wait's "cool")."""
        for g in gpus:
            latest = sampler.latest(g)
            if latest is not None:
                self.idle_temp_c[g] = latest.temp_c

    def work_ended(self, t: float) -> None:
        """Work ran on the GPU until `t` (clock time): a burst wait starts there."""
        self.last_end = max(self.last_end, t)

    # -- the one dispatch -------------------------------------------------------------------
    def before(
        self,
        mode: Condition,
        sampler: SampleSource,
        gpus: Sequence[int],
        facts: Mapping[int, GpuFacts],
        *,
        fn: Callable[..., object] | None = None,
        load: Callable[[], object] | None = None,
        progress: Callable[[str, bool], None] | None = None,
    ) -> Wait | Conditioning | None:
        """Put `gpus` in the state `mode` measures in: "burst", wait until they are cool
        and uncapped (`wait`); "sustained", run `load` to equilibrium once (`precondition`;
        None where it was reached before, or there is no load)."""
        if mode == "burst":
            return self.wait(sampler, gpus, facts, fn=fn)
        if self.preconditioned or load is None:
            return None
        return self.precondition_with(load, sampler, gpus, progress=progress)

    # -- burst ------------------------------------------------------------------------------
    def wait(
        self,
        sampler: SampleSource | None,
        gpus: Sequence[int],
        facts: Mapping[int, GpuFacts],
        *,
        fn: Callable[..., object] | None = None,
        since: float | None = None,
        config: ConditionConfig | None = None,
        temperature: bool = True,
        lookback_s: float = 0.0,
    ) -> Wait:
        """Wait until `gpus` are cool and uncapped, judged by samples since `since` (default:
        the end of the last work), at most `burst_timeout_s`. "Cool" (`temperature`) is
        within the margin of where each GPU rested; with `fn` (a bench of it) the margin is
        what fn's own temperature slope asks for (`conditioning.temperature`): nothing for
        a function not learned yet or whose time does not rise with the temperature, and
        at most `burst_temp_wait_s` beyond the clock and the cap. `config` replaces the
        conditioner's own for this wait (a bench's burst settings). Without telemetry
        (`sampler` None) there is nothing to wait for. `lookback_s`: `recovered`'s."""
        if sampler is None:
            return Wait(tuple(gpus), 0.0, True)
        mc = config or self.config_for(fn)
        since = self.last_end if since is None else since
        idle = self.idle_temp_c if temperature else None

        def wait(cc: ConditionConfig) -> tuple[float, bool, list[int]]:
            return wait_until_ready(
                sampler,
                gpus,
                self.clock,
                since=since,
                facts=facts,
                idle_temp_c=idle,
                config=cc,
                lock_tolerance_mhz=self.lock_tolerance_mhz,
                lookback_s=lookback_s,
            )

        if fn is not None and idle is not None and mc.burst_temp_margin_c is not None:
            # the clock and the cap first, then a short wait for the chip to cool
            waited, ready, pending = wait(replace(mc, burst_temp_margin_c=None))
            if ready:
                extra_s, ready, pending = wait(replace(mc, burst_timeout_s=mc.burst_temp_wait_s))
                waited += extra_s
        else:
            waited, ready, pending = wait(mc)
        warm_only = not ready and self._only_warm(sampler, pending, facts, mc, since)
        return Wait(tuple(gpus), waited, ready, tuple(pending), warm_only)

    def config_for(self, fn: Callable[..., object] | None) -> ConditionConfig:
        """The wait's config: the temperature margin fn's slope allows (None: not waited)."""
        mc = self.config
        if fn is None or mc.burst_temp_margin_c is None:
            return mc
        sens = self.memory.sensitivity
        return replace(mc, burst_temp_margin_c=sens.margin_c(fn, mc.burst_temp_shift_rel))

    def _only_warm(
        self,
        sampler: SampleSource,
        pending: Sequence[int],
        facts: Mapping[int, GpuFacts],
        mc: ConditionConfig,
        since: float,
    ) -> bool:
        """Whether the GPUs still pending are held back by their temperature alone."""
        if mc.burst_temp_margin_c is None:
            return False
        uncapped = replace(mc, burst_temp_margin_c=None)
        return all(
            recovered(
                sampler,
                g,
                since=since,
                facts=facts.get(g),
                config=uncapped,
                lock_tolerance_mhz=self.lock_tolerance_mhz,
            )
            for g in pending
        )

    # -- temperature --------------------------------------------------------------------------
    def temperature_facts(
        self, sampler: SampleSource | None, fn: Callable[..., object], gpu: int
    ) -> TemperatureFacts:
        """What the wait before a bench of fn on `gpu` knew of the temperature: where the
        GPU rested, where it is now, fn's slope (relative change per C, None until
        learned), the margin waited for (None: not waited), and a note where the GPU is
        warmer than that margin (what it costs fn)."""
        mc, latest = self.config_for(fn), sampler.latest(gpu) if sampler is not None else None
        idle, now = self.idle_temp_c.get(gpu), latest.temp_c if latest is not None else None
        slope, margin = self.memory.sensitivity.slope(fn), mc.burst_temp_margin_c
        if idle is None or now is None:
            return TemperatureFacts(idle, now, slope, margin)
        note = None
        if slope is None and now > idle + (self.config.burst_temp_margin_c or 0.0):
            note = (
                f"measured at {now:.0f} C, {now - idle:.0f} C above the session's start, "
                "without waiting to cool: this kernel's time against the temperature is "
                "not known yet (its measurements at other temperatures will show it)"
            )
        elif slope is not None and margin is not None and now - idle - margin > 0:
            note = (
                f"the wait for the chip to cool ran out at {now:.0f} C, "
                f"{now - idle - margin:.1f} C over the {margin:.1f} C this kernel allows: at "
                f"{slope * 100:+.3f}%/C it reads ~{slope * (now - idle) * 100:+.2f}% "
                "against the session's start"
            )
        return TemperatureFacts(idle, now, slope, margin, note)

    def learn_temperature(
        self, fn: Callable[..., object], temp_c: float | None, median_s: float | None
    ) -> None:
        """A bench of fn began at `temp_c` and read `median_s`: a point of its slope."""
        self.memory.sensitivity.observe(fn, temp_c, median_s)

    # -- sustained ------------------------------------------------------------------------------
    def precondition_with(
        self,
        load: Callable[[], object],
        sampler: SampleSource | None,
        gpus: Sequence[int],
        *,
        progress: Callable[[str, bool], None] | None = None,
    ) -> Conditioning:
        """`precondition`, the work being calls of `load` back to back."""

        def run_chunk(seconds: float) -> None:
            c0 = self.clock.now()
            while self.clock.now() - c0 < seconds:
                load()

        return self.precondition(run_chunk, sampler, gpus, progress=progress)

    def precondition(
        self,
        run_chunk: Callable[[float], float | None],
        sampler: SampleSource | None,
        gpus: Sequence[int],
        *,
        progress: Callable[[str, bool], None] | None = None,
    ) -> Conditioning:
        """Run the work (`run_chunk(seconds)`) until what is measured and the temperature
        settle (gpuenv.conditioning.sustained), at most `sustained_timeout_s`."""
        done = precondition(
            run_chunk, sampler, list(gpus), self.clock, config=self.config, progress=progress
        )
        self.preconditioned = True
        self.work_ended(self.clock.now())
        return done


__all__ = ["Conditioner", "Wait"]
