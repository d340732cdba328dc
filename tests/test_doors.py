"""Doors agree: the same reps and telemetry judged through every door to a measurement give
the same findings, severities and verdict.

One scenario is played on the simulated GPU on virtual time under a stable() session's
sampler; its reps (times and spans) are then handed to each door's own entry point:
  - stable():            env.record(name, times, spans)
  - gpuenv.bench:        bench(..., session=env, device=<replays the reps>, condition="none")
  - the do_bench drop-in rides on gpuenv.bench (tests/test_integrations.py)
  - gpuenv run regions:  gpuenv.run.report.build_measurements(regions with their windows)
  - torch.utils.benchmark adapter: integrations.torch_benchmark.record(evidence, ...)
  - pytest-benchmark plugin: integrations.pytest_plugin._annotate(state, fixture, t0, t1, ...)
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.integrations import pytest_plugin, torch_benchmark
from gpuenv.judge import Evidence
from gpuenv.run.report import build_measurements
from gpuenv.run.tracker import Region
from gpuenv.session import stable
from gpuenv.timebase import VirtualClock
from gpuenv.timing.devices import Rep

H100_HZ = 1980e6

Verdict = tuple[str, tuple[tuple[str, str, tuple[int, ...]], ...]]


class Replay:
    """A timing device that hands back reps already measured (their spans on the sampler)."""

    kind = "replay"
    rep_batch = 1
    batch = 1
    flush_l2 = None  # no cache
    device = None  # no torch device

    def __init__(self, reps: list[Rep], clock: Any):
        self.queue = list(reps)
        self.clock = clock

    def prepare(self, fn: Callable[[], Any]) -> None:
        pass

    def for_auto(self, fn: Callable[[], Any]) -> tuple[Replay, str]:
        return self, "reps measured before, replayed"

    def rep(self, fn: Callable[[], Any]) -> Rep:
        return self.queue.pop(0)

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        return [self.rep(fn) for _ in range(n)]

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        raise AssertionError("a replay is measured as it is (condition='none')")

    def probe_clock_mhz(self) -> float | None:
        return None

    def settings(self) -> dict[str, Any]:
        return {}


def _key(findings: Any, verdict: str) -> Verdict:
    rows = []
    for f in findings:
        d = f if isinstance(f, dict) else f.to_dict()
        rows.append((d["kind"], d["severity"], tuple(d["reps"])))
    return verdict, tuple(sorted(rows))


def play(
    profile: str,
    work: Callable[[SimBackend], list[tuple[float, float]]],
    *,
    sm: int | None = None,
    policy: str = "annotate",
    cold: bool = False,
) -> dict[str, Verdict]:
    """Play a scenario, then judge its reps through every door; door name -> verdict key."""
    sim = SimBackend(profile, clock=VirtualClock())
    if not cold:
        sim.open_context(0)
        sim.idle(0.5)
    out: dict[str, Verdict] = {}
    with stable(sm=sm, backend=sim, policy=policy, mode="burst") as env:
        spans = work(sim)
        env.sampler.mark()
        sim.idle(0.3)  # the driver's refresh after the last rep, for every door alike
        times = [b - a for a, b in spans]
        reps = [Rep(a, b, t) for (a, b), t in zip(spans, times, strict=True)]

        m = env.record("x", times, spans, policy=policy)
        out["stable"] = _key(m.findings, m.verdict)

        m = timing.bench(
            lambda: None,
            name="x",
            session=env,
            device=Replay(reps, sim.clock),
            warmup=0,
            reps=len(reps),
            condition="none",
            probe_clock=False,
            keep_trace=False,
            policy=policy,
        )
        out["bench"] = _key(m.findings, m.verdict)

        regions = []
        for a, b in spans:
            r = Region("x", 1, a, b)
            r.windows = {g: env.sampler.window(a, b, g) for g in env.gpus}
            regions.append(r)
        run = Region("(run)", 1, spans[0][0], spans[-1][1])
        run.windows = {g: env.sampler.window(*run_span(spans), g) for g in env.gpus}
        ms = build_measurements(
            regions,
            run,
            gpus=env.gpus,
            facts=env.facts,
            policy=policy,
            stable_clocks=env.config.stable_clocks,
            wall_at=lambda t: t,
        )
        by_name = {m.name: m for m in ms}
        out["run"] = _key(by_name["x"].findings, by_name["x"].verdict)

        if len(spans) == 1:  # torch's Timer gives one region per call
            rec = torch_benchmark.record(
                Evidence.sampled(env.sampler, spans, env.gpus),
                times[0],
                facts=env.facts,
                session=env,
            )
            out["torch"] = _key(rec["findings"], rec["verdict"])
        if policy in ("annotate", "reject") and sm is None:  # the plugin's own choices
            state = SimpleNamespace(
                sampler=env.sampler, backend=sim, gpus=env.gpus, policy=policy, facts=env.facts
            )
            fixture = SimpleNamespace(
                name="x",
                extra_info={},
                stats=SimpleNamespace(stats=SimpleNamespace(data=times)),
            )
            info = pytest_plugin._annotate(
                state, fixture, spans[0][0], spans[-1][1], list(spans), list(times)
            )
            out["pytest"] = _key(info["findings"], info["verdict"])
    return out


def run_span(spans: list[tuple[float, float]]) -> tuple[float, float]:
    return spans[0][0], spans[-1][1]


def region(sim: SimBackend, cycles: float, n: int = 1, **kw: Any) -> list[tuple[float, float]]:
    spans = []
    for _ in range(n):
        t0 = sim.clock.now()
        sim.run_work(0, cycles, **kw)
        spans.append((t0, sim.clock.now()))
    return spans


def assert_agree(out: dict[str, Verdict], *, expect: set[str], verdict: str) -> None:
    first = next(iter(out.values()))
    assert all(v == first for v in out.values()), out
    assert {k for k, _, _ in first[1]} >= expect, first
    assert first[0] == verdict


def test_a_cold_region_is_a_cold_start_through_every_door() -> None:
    out = play("h100", lambda sim: region(sim, 0.05 * H100_HZ, power_intensity=0.3), cold=True)
    assert set(out) == {"stable", "bench", "run", "torch", "pytest"}
    assert_agree(out, expect={"warmup_ramp"}, verdict="annotated")


def test_a_power_capped_region_reads_the_same_through_every_door() -> None:
    out = play("h100", lambda sim: region(sim, 2.0 * H100_HZ))
    assert_agree(out, expect={"power_cap"}, verdict="annotated")


@pytest.mark.parametrize("policy", ["annotate", "reject"])
def test_reps_that_run_into_the_cap_are_judged_alike(policy: str) -> None:
    out = play("h100", lambda sim: region(sim, 0.3 * H100_HZ, n=12), policy=policy)
    assert "torch" not in out  # several reps: torch's adapter sees one region per call
    assert_agree(out, expect={"power_cap"}, verdict="annotated")


def test_thermal_slowdown_on_a_consumer_card_reads_the_same_through_every_door() -> None:
    out = play("rtx4090", lambda sim: region(sim, 12e9, n=40, power_intensity=1.0))
    assert_agree(out, expect={"thermal"}, verdict="annotated")


def test_a_lock_that_stops_holding_is_not_held_through_every_door() -> None:
    out = play("h100", lambda sim: region(sim, 2.0 * H100_HZ), sm=1830, policy="reject")
    assert set(out) == {"stable", "bench", "run", "torch"}
    assert_agree(out, expect={"lock_not_held", "power_cap"}, verdict="rejected")


def test_reps_that_step_to_a_second_level_are_drift_through_every_door() -> None:
    def stepped(sim: SimBackend) -> list[tuple[float, float]]:
        light = {"power_intensity": 0.3}  # no power cap: only the work itself changes
        return region(sim, 0.010 * H100_HZ, n=20, **light) + region(
            sim, 0.0104 * H100_HZ, n=13, **light
        )

    out = play("h100", stepped)
    assert set(out) == {"stable", "bench", "run", "pytest"}
    assert_agree(out, expect={"drift"}, verdict="annotated")
    assert ("drift", "warning", tuple(range(20, 33))) in out["stable"][1]
