"""The simulated driver's shared state: the state file across instances and processes, time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gpuenv.backend.sim import SimBackend


def test_state_file_shared_between_instances(tmp_path, vclock):
    path = tmp_path / "sim.json"
    a = SimBackend(clock=vclock, state_file=path)
    b = SimBackend(clock=vclock, state_file=path)
    assert a.state_file == path
    a.set_locked_sm_clocks(0, 1350, 1350)
    a.set_power_limit(0, 600)
    assert b.truth(0).locked_sm == (1350, 1350)
    assert b.power_limits(0).limit_w == 600
    b.open_context(0)
    b.idle(0.2)
    assert b.read_fast(0).sm_mhz == 1350
    b.reset_locked_sm_clocks(0)
    assert a.truth(0).locked_sm is None and a.power_limits(0).limit_w == 600
    data = json.loads(path.read_text())
    assert data["gpus"][0]["power_limit_w"] == 600


def test_state_file_across_processes(tmp_path):
    path = tmp_path / "sim.json"
    parent = SimBackend(state_file=path)  # open before the child, as a monitor would be
    child = textwrap.dedent(
        f"""
        from gpuenv.backend.sim import SimBackend
        s = SimBackend(state_file={str(path)!r})
        s.set_locked_sm_clocks(0, 1410, 1410)
        s.run_work(0, 1.98e8)  # 0.1 s of heavy work: warms the chip a little
        s.close()
        """
    )
    subprocess.run([sys.executable, "-c", child], check=True, cwd=os.getcwd(), timeout=60)
    assert parent.truth(0).locked_sm == (1410, 1410)
    assert parent.read_fast(0).sm_mhz == 1410  # idle, the clock parks at the lock's floor
    parent.reset_locked_sm_clocks(0)
    parent.close()
    again = SimBackend(state_file=path)
    assert again.truth(0).locked_sm is None
    procs = json.loads(path.with_name("sim.json.run").read_text())["procs"]
    assert [entry["pid"] for entry in procs.values()] == [os.getpid()]  # the child left
    again.close()


def test_state_file_for_another_machine_is_replaced(tmp_path, vclock):
    path = tmp_path / "sim.json"
    a = SimBackend(clock=vclock, state_file=path)
    a.set_power_limit(0, 500)
    a.close()
    b = SimBackend("rtx4090", n_gpus=2, clock=vclock, state_file=path)
    assert b.power_limits(0).limit_w == 450
    b.set_power_limit(1, 400)  # its first change replaces the other machine's settings
    data = json.loads(path.read_text())
    assert data["profile"] == "rtx4090" and len(data["gpus"]) == 2
    path.write_text("not json")
    c = SimBackend(clock=vclock, state_file=path)  # a broken file: start fresh, do not crash
    assert c.power_limits(0).limit_w == 700


def test_real_time_mode_advances_lazily():
    s = SimBackend()  # RealClock: physics catch up with elapsed time at each call
    s.open_context(0)
    s.idle(0.15)
    assert s.read_fast(0).sm_mhz == 1980
    t0 = s.clock.now()
    dt = s.run_work(0, 1.98e6, power_intensity=0.0)
    assert dt == pytest.approx(1e-3, rel=1e-4)  # simulated time: 1 ms at 1980 MHz (ns steps)
    assert s.clock.now() - t0 >= dt  # it slept at least that long


def test_a_process_alone_on_the_shared_machine_runs_at_its_clock(tmp_path):
    """On real time with a state file (the host's processes share the GPU), this process's
    own presence is among the host's: its kernels do not time-slice with themselves (they
    did, at half speed, for a day)."""
    s = SimBackend(state_file=tmp_path / "sim.json")  # RealClock: shares the physics
    try:
        s.open_context(0)
        s.idle(0.15)
        assert s.read_fast(0).sm_mhz == 1980
        dt = s.run_work(0, 1.98e7)  # a heavy kernel: its load is this process's presence
        assert dt == pytest.approx(1e-2, rel=0.05)  # simulated time: 10 ms at 1980 MHz
    finally:
        s.close()


def test_without_persistence_settings_revert_when_the_last_client_leaves(tmp_path, vclock):
    path = tmp_path / "sim.json"
    a = SimBackend(clock=vclock, state_file=path)
    a.set_persistence_mode(0, False)
    a.set_locked_sm_clocks(0, 1350, 1350)
    b = SimBackend(clock=vclock, state_file=path)
    a.close()
    assert b.truth(0).locked_sm == (1350, 1350)  # b is still a client
    b.close()
    c = SimBackend(clock=vclock, state_file=path)
    assert c.truth(0).locked_sm is None and c.persistence_mode(0) is False
    c.set_persistence_mode(0, True)
    c.set_locked_sm_clocks(0, 1350, 1350)
    c.close()
    d = SimBackend(clock=vclock, state_file=path)
    assert d.truth(0).locked_sm == (1350, 1350)


class _StepClock:
    """Real time's rules (processes share the running GPU), moved by hand: not virtual."""

    virtual = False

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)

    def wall(self) -> float:
        return 1.7e9 + self.t


def test_a_reader_takes_over_the_running_gpu_without_writing_it_back_until_due(tmp_path):
    """The running GPU another process wrote is taken over at once, and written back only at
    this process's own driver update: written back at once, `gpuenv run`'s sampler and the
    process it wraps wrote it in turn at every region edge (each write a millisecond of CPU
    on both sides, and the other's next call read and wrote again)."""
    clock = _StepClock()
    path = tmp_path / "sim.json"
    worker = SimBackend(clock=clock, state_file=path)
    sampler = SimBackend(clock=clock, state_file=path)
    run = path.with_name("sim.json.run")
    try:
        worker.run_work(0, 1.98e8)  # 100 ms of a heavy kernel at 1980 MHz
        sampler.read_fast(0)  # its driver update is due: it writes
        clock.t += 0.01
        worker.run_work(0, 1.98e7)
        worker.close_context(0)  # the worker's presence changed: it writes
        written = run.read_bytes()
        sampler.read_fast(0)
        sampler.read_fast(0)
        assert run.read_bytes() == written  # taken over, not written back
        assert sampler.truth(0).energy_mj == pytest.approx(worker.truth(0).energy_mj, rel=1e-3)
        clock.t += 0.1
        sampler.read_fast(0)  # its driver update is due: written back
        assert run.read_bytes() != written
    finally:
        worker.close()
        sampler.close()


def test_a_busy_state_lock_is_tried_again_soon_then_less_often(tmp_path, monkeypatch):
    """A holder keeps the lock under a millisecond: the first tries come within one, then
    back off to every 5 ms (a first wait of 5 ms cost a step's start as much)."""
    import fcntl

    from gpuenv.backend import sim_state

    path = tmp_path / "lockme"
    path.write_bytes(b"")
    holder, waiter = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 8:
            fcntl.flock(holder, fcntl.LOCK_UN)

    monkeypatch.setattr(sim_state.time, "sleep", sleep)
    try:
        sim_state.flock_within(waiter, 5.0, "the test's file")
    finally:
        os.close(holder)
        os.close(waiter)
    assert len(waits) == 8 and waits[0] < 0.001
    assert waits == sorted(waits) and waits[-1] == sim_state._LOCK_POLL_S
