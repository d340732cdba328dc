"""What one bench() learns is kept for the next call of the same function in the process
(gpuenv.timing.memo, gpuenv.conditioning.memory), and the default schedule's first burst
starts with bench when the warmup was short (issue 22: time to a trustworthy number)."""

from __future__ import annotations

import gc

import pytest

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.conditioning.memory import gpu_key, process_memory
from gpuenv.timebase import VirtualClock
from gpuenv.timing import memo
from gpuenv.timing.harness import WARMUP_KNOWN_WINDOW, WARMUP_WINDOW


@pytest.fixture(autouse=True)
def _forget():
    memo.forget()
    yield
    memo.forget()


def sim(hot: bool = False) -> SimBackend:
    s = SimBackend(clock=VirtualClock())
    s.open_context(0)
    s.idle(10.0)
    if hot:
        timing.sim_kernel(s, 0, seconds=20.0)()
    return s


def test_remembered_per_function_and_forgotten_with_it():
    def fn():
        return None

    memo.remember(fn, "k", 3)
    assert memo.recall(fn, "k") == 3 and memo.recall(fn, "other") is None
    assert memo.recall(lambda: None, "k") is None  # another function knows nothing

    class Slotted:
        __slots__ = ()

        def __call__(self) -> None:
            return None

    no_ref = Slotted()  # cannot be weakly referenced: not remembered, no error
    memo.remember(no_ref, "k", 1)
    assert memo.recall(no_ref, "k") is None
    del fn
    gc.collect()
    assert len(memo._BY_FN) == 0  # the entry went with the function


def test_the_second_call_of_a_function_warms_up_shorter_and_agrees():
    s = sim()
    fn = timing.sim_kernel(s, 0, seconds=0.2e-3)
    first = timing.bench(fn, backend=s, keep_trace=False)
    s.idle(2.0)
    second = timing.bench(fn, backend=s, keep_trace=False)
    assert first.extra["warmup_known"] is False and second.extra["warmup_known"] is True
    assert first.extra["warmup_reps"] >= WARMUP_WINDOW
    assert WARMUP_KNOWN_WINDOW <= second.extra["warmup_reps"] < first.extra["warmup_reps"]
    assert second.median_s == pytest.approx(first.median_s, rel=0.01)
    other = timing.bench(timing.sim_kernel(s, 0, seconds=0.2e-3), backend=s, keep_trace=False)
    assert other.extra["warmup_known"] is False  # a new function is warmed up in full


def test_a_short_warmup_starts_the_first_burst_and_a_cool_gpu_is_not_waited_for():
    m = timing.bench(timing.sim_kernel(sim(), 0, seconds=0.2e-3), backend=sim(), keep_trace=False)
    assert m.extra["burst_from_start"] is True
    assert m.extra["burst_first_wait_s"] < 0.05  # not a driver refresh and two samples


def test_a_short_warmup_on_a_capped_gpu_still_waits_for_the_cap_to_clear():
    s = sim(hot=True)
    hot = timing.bench(timing.sim_kernel(s, 0, seconds=0.2e-3), backend=s, keep_trace=False)
    cold_s = sim()
    cold = timing.bench(
        timing.sim_kernel(cold_s, 0, seconds=0.2e-3), backend=cold_s, keep_trace=False
    )
    assert hot.extra["burst_from_start"] is True and hot.extra["burst_first_wait_s"] > 0.05
    assert hot.median_s == pytest.approx(cold.median_s, rel=0.01)


def test_an_explicit_fresh_wait_keeps_the_refresh_after_the_warmup():
    from gpuenv.conditioning import ConditionConfig

    s = sim()
    m = timing.bench(
        timing.sim_kernel(s, 0, seconds=0.2e-3),
        backend=s,
        keep_trace=False,
        conditioning=ConditionConfig(),
    )
    assert m.extra["burst_from_start"] is False
    assert m.extra["burst_first_wait_s"] >= 0.1  # samples one driver refresh after the warmup


def test_a_function_warmed_up_on_another_gpu_warms_up_in_full_here():
    # "warmed" was kept per function only: the same function, warmed up on one simulated
    # GPU, warmed up short (WARMUP_KNOWN_WINDOW) on the next GPU it met in the process
    where = {"gpu": sim()}
    cycles = where["gpu"].clock_limits(0).max_sm_mhz * 1e6 * 0.2e-3

    def fn() -> float:  # runs on the current GPU, as a torch function does
        return float(where["gpu"].run_work(0, cycles))

    timing.bench(fn, backend=where["gpu"], keep_trace=False)
    where["gpu"] = fresh = sim()
    after = timing.bench(fn, backend=fresh, keep_trace=False)
    memo.forget()
    where["gpu"] = alone_gpu = sim()
    alone = timing.bench(fn, backend=alone_gpu, keep_trace=False)
    assert after.extra["warmup_known"] is False
    assert after.extra["warmup_reps"] == alone.extra["warmup_reps"]
    assert after.times_s == alone.times_s


def test_the_same_gpu_through_another_backend_object_is_still_known():
    # every real GPU is on the one real clock, and gpuenv.bench opens a backend a call:
    # the UUID finds the entry again
    from gpuenv.timebase import REAL_CLOCK

    fn = timing.sim_kernel(sim(), 0, seconds=0.2e-3)
    mem = process_memory()
    mem.remember_warmed(fn, gpu_key(REAL_CLOCK, "GPU-a"), 1e-3)
    assert mem.warmed(fn, gpu_key(REAL_CLOCK, "GPU-a"))
    assert not mem.warmed(fn, gpu_key(REAL_CLOCK, "GPU-b"))
    assert not mem.warmed(fn, gpu_key(VirtualClock(), "GPU-a"))
