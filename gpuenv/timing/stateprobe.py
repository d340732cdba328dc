"""A kernel whose time does not move with the GPU's state is not waited for.

A burst measurement waits, before its first burst, until the GPU is cool and uncapped
(gpuenv.conditioning). That wait buys nothing for a kernel whose time the state does not
move: a memory-bound copy right after heavy load reads the same at the capped clock. So a
function measured before on a GPU found ready leaves a reference (its time, its reps'
probed clock, and whether it is light: under `state_light_frac` of the power limit), kept
per function and GPU in the measurement's `Memory` (gpuenv.conditioning.memory: a
session's own, else the process's); and when the GPU is held down the next time, a few
reps of it (about `state_probe_s`) are compared with that reference (the thresholds are
the `ConditionConfig`'s):

- the clock at least `state_clock_gap` below the reference's and the time within
  `state_free_rel` of it: the state does not move this kernel's number;
- a light kernel at the reference's time, whatever the clock (a reason bit lingering,
  the clock a step down or on its way back): a wait buys its number nothing, and it
  cannot set off the cap itself. (A 1 GiB clone on an H100 after load found the clock
  0.7% under its reference, where neither rule applied before, and waited 0.28 s.)

Either way it is measured at once. Not: a heavy kernel at full clock on a GPU whose power
is still high (its first burst would meet the cap), nor a function not measured before.
What was probed (`gpuenv.phases.StateProbe`) is kept with how the first burst began
(`gpuenv.phases.FirstBurst`).

The same place keeps, per function and GPU, how long fn may work unbroken before the cap
meets it (`burst_limit`): a burst measurement that met the cap learned it
(`gpuenv.conditioning.Bursts`, ConditionConfig.burst_learn), and the next call's bursts
start that short instead of meeting the cap again to learn it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from gpuenv import conditioning, stats
from gpuenv.conditioning.memory import Memory
from gpuenv.phases import StateProbe
from gpuenv.results import Measurement
from gpuenv.telemetry import DRIVER_REFRESH_S, SampleSource
from gpuenv.timing.devices import Device
from gpuenv.verdict import GpuFacts


def probe_state(
    fn: Callable[[], Any],
    device: Device,
    sampler: SampleSource | None,
    gpu: int,
    identity: Hashable,
    facts: GpuFacts | None,
    config: conditioning.ConditionConfig,
    memory: Memory,
    *,
    since: float,
    probe_clock: bool = True,
) -> StateProbe | None:
    """Is the GPU held down now (judged by the samples since `since`), yet fn's time the
    same as on a GPU found ready (see the module docstring)? What was probed, `free` where
    fn need not wait; None where nothing was: nothing known yet, the clock probe off, or
    the GPU ready."""
    ref = memory.state_reference(fn, device.kind, identity)
    if ref is None or sampler is None or not probe_clock:
        return None
    if conditioning.recovered(  # by the newest samples: ready now, no wait to spare
        sampler, gpu, since=since - 2 * DRIVER_REFRESH_S, facts=facts, config=config
    ):
        return None
    t_ref, c_ref, light = ref
    c_now = device.probe_clock_mhz()
    latest = sampler.latest(gpu)
    if latest is not None and latest.sm_mhz > 0:
        c_now = min(c_now or latest.sm_mhz, latest.sm_mhz)
    down = c_now is not None and c_now <= c_ref * (1 - config.state_clock_gap)
    if not (down or light):
        return StateProbe(t_ref, c_ref, c_now, light, free=False)
    n = max(3, min(10, round(config.state_probe_s / max(t_ref, 1e-9))))
    reps = device.reps(fn, n) if device.rep_batch > 1 else [device.rep(fn) for _ in range(n)]
    t_now = stats.median([r.time_s for r in reps])
    moved = t_now / t_ref - 1
    free = abs(moved) <= config.state_free_rel
    return StateProbe(t_ref, c_ref, c_now, light, free, time_s=t_now, reps=n, moved=moved)


def remember_state(
    fn: Callable[[], Any],
    device: Device,
    m: Measurement,
    gpu: int,
    identity: Hashable,
    facts: GpuFacts | None,
    clock_mhz: float | None,
    config: conditioning.ConditionConfig,
    memory: Memory,
    *,
    ready: bool,
    probed_free: bool,
) -> None:
    """Keep fn's reference from burst measurement `m` (its time, `clock_mhz`: its reps'
    probed clock, and whether it is light) when it began on a GPU found ready (`ready`:
    not held down) and nothing was skipped (`probed_free`: `probe_state` let it start
    without its wait)."""
    median = m.stats.median_s
    if clock_mhz is None or median is None or not m.stats.n or not ready or probed_free:
        return
    limit = facts.power_limit_w if facts is not None else None
    seen = [w.power_w_max for w in m.summary_windows if w.gpu == gpu]
    power = seen[0] if seen else None
    light = limit is not None and power is not None and power < config.state_light_frac * limit
    memory.remember_state_reference(fn, device.kind, identity, (median, clock_mhz, light))


def burst_limit(
    fn: Callable[[], Any], device: Device, identity: Hashable, memory: Memory
) -> float | None:
    """The longest unbroken work a burst measurement of fn on this GPU let through before
    the cap met it (None: none met it yet). A per-call wrapper (the do_bench drop-in's)
    stands for the function it names in `memo_subject`."""
    return memory.burst_limit(getattr(fn, "memo_subject", fn), device.kind, identity)


def remember_burst_limit(
    fn: Callable[[], Any], device: Device, identity: Hashable, limit_s: float | None, memory: Memory
) -> None:
    """Keep what a burst measurement learned of the cap's onset (None: nothing)."""
    if limit_s is not None:
        memory.remember_burst_limit(getattr(fn, "memo_subject", fn), device.kind, identity, limit_s)


__all__ = [
    "burst_limit",
    "probe_state",
    "remember_burst_limit",
    "remember_state",
]
