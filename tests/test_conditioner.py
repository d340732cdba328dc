"""One conditioning object that owns its state (gpuenv.conditioning.Conditioner): a
measurement waits for the GPU its function runs on, never a neighbour's; what a session's
measurements learn stays in the session; the knobs are settings, not module constants."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import gpuenv
from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.conditioning import ConditionConfig, Conditioner, process_memory
from gpuenv.errors import ConfigError
from gpuenv.integrations import triton as gt
from gpuenv.session import NotRecoveredWarning
from gpuenv.timebase import VirtualClock
from gpuenv.timing import memo


@pytest.fixture(autouse=True)
def _forget():
    memo.forget()
    yield
    memo.forget()


def two_gpus() -> SimBackend:
    sim = SimBackend(n_gpus=2, clock=VirtualClock())
    for g in (0, 1):
        sim.open_context(g)
    sim.idle(0.5)
    return sim


def test_a_bench_in_a_session_waits_for_its_own_gpu_not_a_loaded_neighbour():
    # 2 H200s: a process measuring on GPU 0 waited 30 s a measurement for another
    # process's matmuls on GPU 1 ("GPU 1 did not return to its cool, uncapped state")
    sim = two_gpus()
    sim.set_background_load(0, 1.0, pid=5555)  # another tenant holds GPU 0 at its cap
    sim.idle(5.0)
    assert sim.read_fast(0).reasons  # held down: capped
    fn = timing.sim_kernel(sim, 1, seconds=0.2e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotRecoveredWarning)
        with gpuenv.stable(backend=sim, gpus="all") as env:
            assert env.gpus == [0, 1]
            t0 = sim.clock.now()
            m = env.bench(fn, gpu=1, reps=20)
            took = sim.clock.now() - t0
    assert m.first_burst.wait_s < 1.0 and took < 5.0
    assert {w.gpu for w in m.windows} == {1}
    assert not [f for f in m.findings if f.kind in ("power_cap", "thermal")]


def test_the_wait_is_for_the_gpus_it_is_given():
    sim = two_gpus()
    sim.set_background_load(0, 1.0)
    sim.idle(5.0)
    with gpuenv.stable(
        backend=sim, gpus="all", mode_config=ConditionConfig(burst_timeout_s=1.0)
    ) as env:
        own = env.conditioner.wait(env.sampler, [1], env.facts)
        both = env.conditioner.wait(env.sampler, [0, 1], env.facts)
    assert own.ready and own.gpus == (1,) and own.waited_s < 0.5
    assert not both.ready and both.pending == (0,) and both.waited_s >= 1.0


def test_what_a_session_learns_stays_in_the_session():
    sim = two_gpus()
    fn = timing.sim_kernel(sim, 0, seconds=0.2e-3)
    with gpuenv.stable(backend=sim, gpus=[0]) as first:
        a1 = first.bench(fn, reps=20)
        a2 = first.bench(fn, reps=20)
    assert a1.warmup.known is False and a2.warmup.known is True  # learned in the session
    with gpuenv.stable(backend=sim, gpus=[0]) as second:
        assert second.conditioner is not first.conditioner
        b1 = second.bench(fn, reps=20)
    assert b1.warmup.known is False  # a new session starts afresh, as the first did
    assert b1.warmup.reps == a1.warmup.reps
    alone = gpuenv.bench(fn, backend=sim, reps=20)
    assert alone.warmup.known is False  # nor does a bench after a session know it
    assert process_memory().warmed(fn, _gpu(sim, 0))  # the bench alone keeps its own


def _gpu(sim: SimBackend, index: int):
    from gpuenv.conditioning.memory import gpu_key

    return gpu_key(sim.clock, str(sim.device_info(index).uuid))


def test_a_bench_alone_learns_into_the_process_memory_and_forgets_on_reset():
    sim = two_gpus()
    fn = timing.sim_kernel(sim, 0, seconds=0.2e-3)
    first = gpuenv.bench(fn, backend=sim, reps=20)
    second = gpuenv.bench(fn, backend=sim, reps=20)
    assert first.warmup.known is False and second.warmup.known is True
    process_memory().forget()
    assert gpuenv.bench(fn, backend=sim, reps=20).warmup.known is False


def test_the_knobs_are_settings_judged_at_the_door():
    with pytest.raises(ConfigError, match="state_clock_gap"):
        ConditionConfig(state_clock_gap=1.5)
    with pytest.raises(ConfigError, match="onset_floor_reps"):
        ConditionConfig(onset_floor_reps=0)
    with pytest.raises(ConfigError, match="unseen_power_frac"):
        ConditionConfig(unseen_power_frac=-1.0)
    with pytest.raises(ConfigError, match="cold_start_fresh"):
        ConditionConfig(cold_start_fresh="yes")  # type: ignore[arg-type]


def test_the_drop_in_takes_its_conditioning_as_a_setting():
    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(0.5)
    heavy = timing.sim_kernel(sim, 0, seconds=2.9e-3)
    short = dataclasses.replace(gt.DROPIN_CONDITIONING, burst_s=0.01)
    gt.do_bench(heavy, backend=sim, conditioning=short)
    m = gt.last_measurement()
    gt.do_bench(heavy, backend=sim)
    default = gt.last_measurement()
    assert m.bursts.bursts > default.bursts.bursts  # shorter bursts, more of them
    assert max(m.bursts.lengths_s[1:] or (0.0,)) <= 0.01 + 3e-3  # a burst ends after a rep
    with pytest.raises(ConfigError, match="ConditionConfig"):
        gt.do_bench(heavy, backend=sim, conditioning={"burst_s": 0.01})  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:the GPU did not reach equilibrium")
def test_the_sustained_condition_is_reached_once_a_session():
    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(0.5)
    fn = timing.sim_kernel(sim, 0, seconds=1e-3)
    with gpuenv.stable(
        backend=sim, mode="sustained", mode_config=ConditionConfig(sustained_timeout_s=20.0)
    ) as env:
        assert env.conditioner.preconditioned  # the simulated GPU's own load, at the start
        t0 = sim.clock.now()
        env.repeat(fn, reps=5)
        with env.measure("step"):
            fn()
        assert sim.clock.now() - t0 < 1.0  # neither preconditioned again


def test_a_conditioner_needs_a_clock_and_keeps_its_own_memory():
    clock = VirtualClock()
    a, b = Conditioner(clock=clock), Conditioner(clock=clock)
    assert a.memory is not b.memory and a.config == ConditionConfig()
    shared = Conditioner(clock=clock, memory=process_memory())
    assert shared.memory is process_memory()


def test_a_session_warning_points_at_the_users_line():
    sim = two_gpus()
    sim.set_background_load(0, 1.0)
    sim.idle(5.0)
    quick = ConditionConfig(burst_timeout_s=0.5)
    with (
        gpuenv.stable(backend=sim, gpus="all", mode_config=quick) as env,
        warnings.catch_warnings(record=True) as seen,
    ):
        warnings.simplefilter("always")
        with env.measure("step"):  # waits for both GPUs: GPU 0 stays capped
            pass
    said = [w for w in seen if issubclass(w.category, NotRecoveredWarning)]
    assert said and said[0].filename == __file__
