#!/usr/bin/env python3
"""How well gpuenv's telemetry finds what happened during a measurement.

Scripted episodes on the simulated GPU (virtual time, so every run is exact and
repeatable), each inside one `env.measure()` region at a random offset, with
ground truth from `SimBackend.truth()` (what NVML cannot see: the true clock and
the true time under each reason) or from the script itself (when it started a
process or injected a fault). An episode counts as injected when its true
length is > 0; as detected when the region's measurement carries the finding
for it. Then 1,000 steady regions (and steady multi-rep measurements) with
nothing wrong: any finding on them is a false alarm.

Prints a markdown table. Goal: 100% of episodes lasting at least one driver
update period (100 ms) detected, and 0 false alarms.

    python -m benchmarks.detection [--episodes 20] [--steady 1000] [--seed 1]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import random
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import runner
from gpuenv.backend.sim import SimBackend
from gpuenv.conditioning import ConditionConfig
from gpuenv.session import Session, stable
from gpuenv.timebase import VirtualClock

DRIVER_PERIOD_S = 0.1
LIGHT = 0.3  # power intensity of background work that stays under the power cap
CHUNK_S = 0.01  # work runs in 10 ms pieces so the script can watch the ground truth


def work_for(
    sim: SimBackend,
    seconds: float,
    intensity: float,
    watch: Callable[[float], None] | None = None,
    gpu: int = 0,
) -> None:
    """Keep a GPU busy for `seconds` of simulated time, calling watch(dt) after each piece."""
    end = sim.clock.now() + seconds
    while (left := end - sim.clock.now()) > 1e-9:
        t = sim.clock.now()
        clock_hz = max(sim.truth(gpu).sm_mhz, 1) * 1e6
        sim.run_work(gpu, min(CHUNK_S, left) * clock_hz, power_intensity=intensity)
        if watch is not None:
            watch(sim.clock.now() - t)


def kinds_of(m) -> set[str]:
    return {f.kind for f in m.findings if f.severity != "info" or f.kind == "power_cap"}


def new_env(profile: str = "h100", **kw) -> tuple[SimBackend, Session]:
    sim = SimBackend(profile, clock=VirtualClock())
    env = stable(backend=sim, **kw)
    env.__enter__()
    sim.open_context(0)
    sim.idle(1.0)
    return sim, env


def region(env: Session, rng: random.Random, sim: SimBackend, episode: Callable[[], None]):
    """One measured region: light work, the episode, light work (random lengths)."""
    with env.measure("episode") as m:
        work_for(sim, rng.uniform(0.0, 0.3), LIGHT)
        episode()
        work_for(sim, rng.uniform(0.0, 0.3), LIGHT)
    return m.measurement


# -- the episode kinds: each yields (nominal length, true length s, detected) ---------------


def power_cap(durations, n, rng):
    sim, env = new_env()
    for d in durations:
        for _ in range(n):
            before = sim.truth(0).reason_ns["power"]
            m = region(env, rng, sim, functools.partial(work_for, sim, d, 1.0))
            true_s = (sim.truth(0).reason_ns["power"] - before) / 1e9
            yield d, true_s, "power_cap" in kinds_of(m)
            sim.idle(2.0)
    env.__exit__(None, None, None)


def thermal(durations, n, rng):
    # no burst-mode wait: the episode is the hot GPU itself
    sim, env = new_env("rtx4090", mode_config=ConditionConfig(burst_timeout_s=0.0))
    limit = sim.thresholds(0).gpu_max_c or 83.0
    work_for(sim, 0.0, 1.0)
    while sim.truth(0).temp_c < limit - 0.5:  # heat up outside any region
        work_for(sim, 1.0, 1.0)
    for d in durations:
        for _ in range(n):
            while sim.truth(0).temp_c > limit - 0.05:  # just below the slowdown
                sim.idle(0.05)
            before = sim.truth(0).reason_ns["thermal"]
            m = region(env, rng, sim, functools.partial(work_for, sim, d, 1.0))
            true_s = (sim.truth(0).reason_ns["thermal"] - before) / 1e9
            yield d, true_s, "thermal" in kinds_of(m)
    env.__exit__(None, None, None)


def lock_below(durations, n, rng):
    sim, env = new_env(sm=1830)
    lock_mhz = 1830
    for d in durations:
        for _ in range(n):
            below = [0.0]

            def watch(dt: float, below: list[float] = below) -> None:
                if sim.truth(0).sm_mhz < lock_mhz - 1:
                    below[0] += dt

            m = region(env, rng, sim, functools.partial(work_for, sim, d, 1.0, watch))
            yield d, below[0], "lock_not_held" in kinds_of(m)
            sim.idle(2.0)
    env.__exit__(None, None, None)


def other_process(durations, n, rng):
    sim, env = new_env()
    for d in durations:
        for _ in range(n):

            def episode(d=d) -> None:
                sim.set_background_load(0, 0.5, pid=4242)
                work_for(sim, d, LIGHT)
                sim.set_background_load(0, 0.0, pid=4242)

            m = region(env, rng, sim, episode)
            yield d, d, "other_process" in kinds_of(m)
            sim.idle(0.5)
    env.__exit__(None, None, None)


def telemetry_fault(counts, n, rng):
    sim, env = new_env()
    period = env.sampler.period
    for count in counts:
        for _ in range(n):

            def episode(count=count) -> None:
                sim.inject_fault(
                    0, rng.choice(["timeout", "gpu_lost"]), op="read_fast", count=count
                )
                work_for(sim, count * period + 0.05, LIGHT)  # every failing read falls inside

            m = region(env, rng, sim, episode)
            yield count * period, count * period, "telemetry_gap" in kinds_of(m)
    env.__exit__(None, None, None)


def cold_start(lengths, n, rng):
    for d in lengths:
        for _ in range(n):
            sim = SimBackend("h100", clock=VirtualClock())
            with stable(backend=sim) as env:
                sim.idle(rng.uniform(0.0, 1.0))  # no context yet: the GPU is parked idle
                with env.measure("first") as m:
                    idle_s = [0.0]

                    def watch(
                        dt: float, sim: SimBackend = sim, idle_s: list[float] = idle_s
                    ) -> None:
                        if sim.truth(0).sm_mhz <= 345:
                            idle_s[0] += dt

                    work_for(sim, d, LIGHT, watch)
            yield d, max(idle_s[0], CHUNK_S), "warmup_ramp" in kinds_of(m.measurement)


# -- steady runs: nothing wrong, nothing may be found -----------------------------------------


def steady(n_regions, rng, **kw):
    sim, env = new_env(**kw)
    alarms: list[str] = []
    for _ in range(n_regions):
        sim.idle(rng.uniform(0.0, 0.2))
        with env.measure("steady") as m:
            work_for(sim, rng.choice([0.005, 0.02, 0.1, 0.3, 0.5]) * rng.uniform(0.5, 1.5), LIGHT)
        alarms += [f.kind for f in m.findings]
    env.__exit__(None, None, None)
    return alarms


def steady_one_of_two(n_regions, rng):
    """Two GPUs sampled, the work on GPU 1 only: GPU 0 idles and must raise nothing."""
    sim = SimBackend("h100", n_gpus=2, clock=VirtualClock())
    alarms: list[str] = []
    with stable(backend=sim, gpus="0,1") as env:
        sim.open_context(1)
        sim.idle(1.0)
        for _ in range(n_regions):
            sim.idle(rng.uniform(0.0, 0.2))
            with env.measure("steady") as m:
                work_for(sim, rng.choice([0.005, 0.02, 0.1, 0.3]), LIGHT, gpu=1)
            alarms += [f.kind for f in m.findings]
    return alarms


def steady_reps(n_measurements, rng):
    sim, env = new_env()
    alarms: list[str] = []
    for _ in range(n_measurements):
        cycles = rng.uniform(0.002, 0.05) * 1980e6
        m = env.repeat(functools.partial(sim.run_work, 0, cycles, power_intensity=LIGHT), reps=20)
        alarms += [f.kind for f in m.findings]
    env.__exit__(None, None, None)
    return alarms


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--episodes", type=int, default=20, help="episodes per kind and length")
    ap.add_argument("--steady", type=int, default=1000, help="steady regions (false alarms)")
    ap.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    warnings.simplefilter("ignore")  # burst-mode timeouts on the hot consumer card
    started = time.perf_counter()
    lengths = [0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
    kinds = {
        "power_cap (heavy load: SW power cap)": ("power_cap", power_cap, lengths),
        "thermal (RTX 4090 profile: SW thermal slowdown)": ("thermal", thermal, lengths),
        "lock_not_held (lock 1830 MHz pulled below by the cap)": ("lock", lock_below, lengths),
        "other_process (another process on the GPU)": ("other", other_process, lengths),
        "telemetry_gap (NVML reads fail: timeout, GPU lost)": (
            "gap",
            telemetry_fault,
            [1, 2, 4, 8, 40],
        ),
        "warmup_ramp (cold start: region begins without a context)": (
            "cold",
            cold_start,
            [0.05, 0.2, 1.0],
        ),
    }
    rows = []
    for label, (_, fn, params) in kinds.items():
        buckets: dict[str, list[bool]] = defaultdict(list)
        for _, true_s, found in fn(params, args.episodes, rng):
            if true_s <= 0:
                continue  # nothing happened (e.g. the cap never engaged in 20 ms)
            key = ">= 0.1 s" if true_s >= DRIVER_PERIOD_S - 1e-9 else "< 0.1 s"
            buckets[key].append(found)
        for key in ("< 0.1 s", ">= 0.1 s"):
            got = buckets.get(key, [])
            if got:
                rows.append((label, key, len(got), sum(got)))
    alarms = steady(args.steady, rng)
    alarms_locked = steady(args.steady, rng, sm=1350)
    alarms_reps = steady_reps(max(1, args.steady // 10), rng)
    alarms_two = steady_one_of_two(max(1, args.steady // 5), rng)
    elapsed = time.perf_counter() - started

    day = datetime.datetime.now().astimezone()
    print(
        f"Detection on the simulated H100 (and RTX 4090 profile), virtual time, "
        f"seed {args.seed}; {day:%Y-%m-%d}; script ran {elapsed:.0f} s.\n"
    )
    print("| episode | true length | injected | detected | rate |")
    print("| --- | --- | ---: | ---: | ---: |")
    for label, key, n, found in rows:
        print(f"| {label} | {key} | {n} | {found} | {100 * found / n:.0f}% |")
    print()
    print("| steady runs (nothing wrong) | runs | false alarms |")
    print("| --- | ---: | ---: |")
    for what, n, found in (
        ("single regions, 2.5 ms to 0.75 s of light work, unlocked", args.steady, alarms),
        ("single regions, same, clocks locked at 1350 MHz", args.steady, alarms_locked),
        ("20-rep measurements (env.repeat), light work", max(1, args.steady // 10), alarms_reps),
        (
            "single regions, GPUs 0 and 1 sampled, work on GPU 1 only",
            max(1, args.steady // 5),
            alarms_two,
        ),
    ):
        detail = f" ({', '.join(sorted(set(found)))})" if found else ""
        print(f"| {what} | {n} | {len(found)}{detail} |")
    missed = [r for r in rows if r[1] == ">= 0.1 s" and r[3] < r[2]]
    return 1 if missed or alarms or alarms_locked or alarms_reps or alarms_two else 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "detection",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"episodes": 5, "steady": 200},
        )
    )
