"""The simulated GPU's synthetic workload: work at the simulated clocks, other processes."""

from __future__ import annotations

import os

import pytest

from gpuenv.backend import (
    REASON_GPU_IDLE,
    REASON_SW_POWER_CAP,
)


def test_run_work_time_follows_the_clock(sim):
    sim.open_context(0)
    sim.idle(0.5)
    t0 = sim.clock.now()
    dt = sim.run_work(0, 1.98e6, power_intensity=0.0)  # 1 ms at 1980 MHz, no power
    assert dt == pytest.approx(1e-3, rel=1e-6)
    assert sim.clock.now() - t0 == pytest.approx(dt, abs=1e-8)
    sim.set_locked_sm_clocks(0, 990, 990)
    assert sim.run_work(0, 1.98e6, power_intensity=0.0) == pytest.approx(2e-3, rel=1e-6)


def test_run_work_opens_a_context(sim):
    sim.run_work(0, 1e3)
    assert sim.truth(0).contexts == (os.getpid(),)


def test_memory_clock_slows_memory_bound_work(sim):
    sim.open_context(0)
    sim.idle(0.2)
    fast = sim.run_work(0, 0.0, mem_cycles=2.619e6, power_intensity=0.0)  # 1 ms at 2619 MHz
    sim.set_app_clocks(0, 1593, 1980)
    sim.close_context(0)
    sim.open_context(0)
    sim.idle(0.2)
    assert sim.read_fast(0).mem_mhz == 1593
    slow = sim.run_work(0, 0.0, mem_cycles=2.619e6, power_intensity=0.0)
    assert fast == pytest.approx(1e-3) and slow == pytest.approx(2619 / 1593 * 1e-3)


def test_background_load_appears_as_a_process(sim):
    sim.set_background_load(0, 0.5, pid=777)
    sim.idle(1.0)
    assert [p.pid for p in sim.processes(0)] == [777]
    assert sim.utilization(0)[0] == 50
    sim.set_background_load(0, 0.0, pid=777)
    sim.idle(0.2)
    assert sim.processes(0) == [] and sim.read_fast(0).reasons == REASON_GPU_IDLE


def test_a_sampler_on_the_virtual_clock_sees_the_run_as_it_happens(sim, vclock):
    seen: list[tuple[int, int]] = []
    vclock.call_every(
        0.05, lambda: seen.append((sim.read_fast(0).sm_mhz, sim.read_fast(0).reasons))
    )
    sim.open_context(0)
    sim.idle(0.5)
    sim.run_work(0, 1.98e9)  # one long kernel: ~1.3 s under the cap
    clocks = [mhz for mhz, _ in seen]
    assert 1980 in clocks and min(clocks) < 1600  # the ramp down happened while it ran
    assert any(r & REASON_SW_POWER_CAP for _, r in seen)


def test_another_processs_kernels_weigh_on_the_gpu_and_stop_with_its_lease(tmp_path):
    # two backends on one state file, on real time, stand for two processes: the one that
    # only reads (a `gpuenv run` parent) sees the other's kernels (a rank's) in clock, power
    # and the cap, on their GPU alone, and no longer once its kernels stopped (virtual time
    # is a test's own: its backends do not share what runs)
    import time

    from gpuenv.backend.sim import SimBackend

    worker = SimBackend(n_gpus=2, state_file=tmp_path / "sim.json")
    parent = SimBackend(n_gpus=2, state_file=tmp_path / "sim.json")
    try:
        parent.set_power_limit(1, 450)
        assert parent.read_fast(1).reasons == REASON_GPU_IDLE
        for _ in range(12):  # 50 ms steps of a heavy matmul for 0.6 s
            worker.run_work(1, 0.05 * 1.98e9, power_intensity=1.0)
        busy = parent.read_fast(1)
        assert busy.reasons & REASON_SW_POWER_CAP and busy.sm_mhz < 1500
        assert parent.read_fast(0).reasons == REASON_GPU_IDLE  # the other GPU saw nothing
        deadline = time.monotonic() + 10.0  # its lease ends, then the cap lets go
        while parent.read_fast(1).reasons & REASON_SW_POWER_CAP:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        worker.close()
        parent.close()
