"""The sampler process: chosen where it can run, the same windows as the thread sampler,
never outliving its parent, and a gap (not an exception) when it dies. Real time, on the
simulated GPU with a state file (another process can open it: `spec()`); no timing is
asserted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuenv.backend import Capabilities
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.telemetry import Sampler, Window, choose_mode, process
from gpuenv.timebase import RealClock, VirtualClock
from gpuenv.verdict import assess


@pytest.fixture
def spec_sim(tmp_path: Path):
    """A simulated H100 on real time whose state another process can open."""
    sim = SimBackend("h100", state_file=tmp_path / "sim.json")
    yield sim
    sim.close()


@pytest.fixture(autouse=True)
def _no_lingering_sampler_process():
    yield
    process.close_idle()


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before, or between open and read
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_until(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


# -- which sampler runs --------------------------------------------------------------------


class _RealGpuLike:
    """What choose_mode asks of a backend: a real GPU another process can open."""

    capabilities = Capabilities(simulated=False, privileged=False)

    def spec(self) -> dict[str, Any] | None:
        return {"kind": "nvml"}


def test_a_real_gpu_with_a_spec_on_real_time_gets_the_process(monkeypatch, spec_sim):
    assert choose_mode(_RealGpuLike(), RealClock())[0] == "process"  # type: ignore[arg-type]
    monkeypatch.setenv("GPUENV_SAMPLER", "thread")
    assert choose_mode(_RealGpuLike(), RealClock()) == ("thread", "asked for")  # type: ignore[arg-type]


def test_virtual_time_a_memory_sim_and_a_simulated_gpu_keep_the_thread(monkeypatch, spec_sim):
    monkeypatch.setenv("GPUENV_SAMPLER", "process")
    assert choose_mode(_RealGpuLike(), VirtualClock())[0] == "thread"  # type: ignore[arg-type]
    memory_sim = SimBackend("h100")
    assert choose_mode(memory_sim, RealClock())[0] == "thread"  # no spec: nobody can reopen it
    assert choose_mode(spec_sim, RealClock())[0] == "process"  # asked for, and it can
    monkeypatch.delenv("GPUENV_SAMPLER")
    # by default a simulated GPU stays on a thread: its load is invisible to other processes
    mode, why = choose_mode(spec_sim, RealClock())
    assert mode == "thread" and "simulated" in why


def test_an_unknown_sampler_mode_is_refused(monkeypatch, spec_sim):
    monkeypatch.setenv("GPUENV_SAMPLER", "fork")
    with pytest.raises(ConfigError, match=r"GPUENV_SAMPLER='fork'.*thread or process"):
        Sampler(spec_sim, [0])
    with pytest.raises(ConfigError, match="mode='green'"):
        Sampler(spec_sim, [0], mode="green")


# -- the same telemetry as the thread -------------------------------------------------------


def _scripted(sim: SimBackend, sampler: Sampler) -> list[Window]:
    """Idle, then two SM locks, then unlocked: a window per phase. The clock settings live
    in the simulated driver's state, so every process sees them (the load of a process
    does not: see choose_mode)."""
    phases = []
    for lock in (None, 1500, 1200, None):
        if lock is None:
            sim.reset_locked_sm_clocks(0)
        else:
            sim.set_locked_sm_clocks(0, lock, lock)
        time.sleep(0.1)  # the sampler process notices the change on its next read
        t0 = sampler.mark()
        time.sleep(0.4)
        phases.append((t0, sampler.mark()))
        time.sleep(0.15)  # summarize counts the reading just after: let it show this lock
    return sampler.windows(phases)


def test_the_process_sampler_sees_what_the_thread_sampler_sees(spec_sim):
    runs = {}
    for mode in ("thread", "process"):
        with Sampler(spec_sim, [0], mode=mode) as sampler:
            assert sampler.mode == mode
            runs[mode] = _scripted(spec_sim, sampler)
    for thread_w, proc_w in zip(runs["thread"], runs["process"], strict=True):
        for w in (thread_w, proc_w):
            assert w.n_samples > 0 and not w.gap
            assert w.energy_j is not None and w.energy_j > 0
        assert proc_w.sm_mhz_start == thread_w.sm_mhz_start
        assert proc_w.sm_mhz_mean == pytest.approx(thread_w.sm_mhz_mean, rel=0.02)
        assert proc_w.reasons == thread_w.reasons
        assert set(proc_w.reason_s) == set(thread_w.reason_s)
    locked = [w.sm_mhz_mean for w in runs["process"]][1:3]
    assert locked == [pytest.approx(1500.0, rel=0.02), pytest.approx(1200.0, rel=0.02)]
    kinds = {m: sorted(f.kind for f in assess(ws)) for m, ws in runs.items()}
    assert kinds["process"] == kinds["thread"]


def test_the_process_sampler_adds_no_thread_and_serves_edge_reads(spec_sim):
    threads = threading.active_count()
    with Sampler(spec_sim, [0], mode="process", period=0.01) as sampler:
        assert threading.active_count() == threads  # nothing in this process on a timer
        assert sampler.child_pid is not None and sampler.latest() is not None
        t0 = sampler.mark()
        time.sleep(0.05)
        t1 = sampler.mark()
        w = sampler.window(t0, t1)  # waits for the sampler process's end-edge read
        assert any(s.t >= t1 and s.edge for s in sampler.slow_samples())
        assert w.sm_mhz_mean is not None
        assert sampler.ticks > 0
    assert not sampler.running
    assert sampler.samples()  # what it read stays readable after stop
    assert not sampler.gaps  # a stop is not a death


class _Unopenable:
    """A backend whose spec another process cannot open."""

    def __init__(self, inner: SimBackend):
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def spec(self) -> dict[str, Any]:
        return {**self.inner.spec(), "profile": "no-such-gpu"}  # type: ignore[dict-item]


def test_a_sampler_process_that_cannot_start_falls_back_to_a_thread(spec_sim, caplog):
    sampler = Sampler(_Unopenable(spec_sim), [0], mode="process")  # type: ignore[arg-type]
    with sampler:
        assert sampler.mode == "thread" and "no-such-gpu" in sampler.mode_reason
        assert _wait_until(lambda: sampler.latest() is not None)
    assert "sampling on a thread instead" in caplog.text


# -- its death ------------------------------------------------------------------------------


def test_a_killed_sampler_process_is_a_telemetry_gap_not_an_exception(spec_sim):
    with Sampler(spec_sim, [0], mode="process") as sampler:
        t0 = sampler.mark()
        time.sleep(0.1)
        before = sampler.window(t0, sampler.mark())
        pid = sampler.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert _wait_until(lambda: _gone(pid))
        t1 = sampler.mark()
        time.sleep(0.1)
        after = sampler.window(t1, sampler.mark())
        assert sampler.latest() is not None  # what it read before dying is still there
    assert not before.gap and after.gap
    died = [g for g in sampler.gaps if g.op == "sampler"]
    assert died and "signal 9" in died[0].error
    assert [f.kind for f in assess([after])] == ["telemetry_gap"]


_PARENT = """
import os, sys, time
from gpuenv.backend.sim import SimBackend
from gpuenv.telemetry import Sampler
sampler = Sampler(SimBackend("h100", state_file=sys.argv[1]), [0], mode="process")
sampler.start()
fork = sys.argv[2] == "fork" and os.fork()  # a forked copy holds the pipe's write end too
if fork == 0 and sys.argv[2] == "fork":
    time.sleep(120)
    os._exit(0)
print(sampler.child_pid, fork or 0, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("fork", ["no fork", "fork"])
def test_the_sampler_process_dies_when_its_parent_is_killed(tmp_path, fork):
    # without a fork both the pipe's EOF and the parent-death signal end it; with a forked
    # copy of the parent holding the pipe open, the signal alone
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "sim.json"), fork],
        stdout=subprocess.PIPE,
    )
    forked = 0
    try:
        assert parent.stdout is not None
        child, forked = map(int, parent.stdout.readline().split())
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait_until(lambda: _gone(child), timeout=10.0), f"sampler pid {child} outlived"
        assert not forked or not _gone(forked)  # the copy still held the pipe open
    finally:
        parent.kill()
        parent.wait()
        if forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(forked, signal.SIGKILL)


def test_the_sampler_process_outlives_the_thread_that_started_it(spec_sim):
    # PR_SET_PDEATHSIG fires when the starting thread ends: a live parent keeps it running
    sampler = Sampler(spec_sim, [0], mode="process", period=0.01)
    starter = threading.Thread(target=sampler.start)
    starter.start()
    starter.join()
    try:
        ticks = sampler.ticks
        assert _wait_until(lambda: sampler.ticks > ticks + 5)
        assert sampler.child_pid is not None and not _gone(sampler.child_pid)
        assert not sampler.gaps
    finally:
        sampler.stop()


# -- one sampler process for many Samplers ---------------------------------------------------


def test_samplers_one_after_another_share_one_sampler_process(spec_sim):
    with Sampler(spec_sim, [0], mode="process") as first:
        pid = first.child_pid
        first.window(first.mark(), first.mark())
    with Sampler(spec_sim, [0], mode="process") as second:
        assert second.child_pid == pid  # attached, not spawned
        assert second.latest() is not None  # at once: the last reading before it started
        t0 = second.mark()
        time.sleep(0.05)
        w = second.window(t0, second.mark())
    assert w.n_samples > 0 and not w.gap
    with Sampler(spec_sim, [0], mode="process", period=0.05) as other:
        assert other.child_pid != pid  # sampling another way: its own process
    assert process.close_idle() == 2
    assert _wait_until(lambda: _gone(pid))


def test_a_sampler_of_some_gpus_joins_a_process_that_samples_them_among_others(tmp_path):
    # a gpuenv.bench call inside a stable() session of every GPU of a 4-GPU host spawned a
    # process of its own, a few hundred ms a call, every call more than LINGER_S apart
    sim = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    try:
        with Sampler(sim, [0, 1], mode="process") as session:
            pid = session.child_pid
            with Sampler(sim, [1], mode="process") as one:
                assert one.child_pid == pid  # joined, not spawned
                t0 = one.mark()
                time.sleep(0.05)
                w = one.window(t0, one.mark(), 1)
                assert w.n_samples > 0 and not w.gap
                assert {s.gpu for s in one.samples()} == {1}  # its own GPU's samples only
                with pytest.raises(ConfigError):
                    one.samples(gpu=0)
            assert {s.gpu for s in session.samples()} == {0, 1}
        with Sampler(sim, [0], mode="process", period=0.05) as other:
            assert other.child_pid != pid  # sampling another way: its own process
    finally:
        sim.close()


def test_an_unused_sampler_process_ends_after_lingering(spec_sim, monkeypatch):
    monkeypatch.setattr(process, "LINGER_S", 0.2)
    with Sampler(spec_sim, [0], mode="process") as sampler:
        pid = sampler.child_pid
    assert pid is not None
    assert _wait_until(lambda: _gone(pid))
    with Sampler(spec_sim, [0], mode="process") as again:
        assert again.child_pid != pid and again.latest() is not None


def test_a_sampler_after_a_dead_sampler_process_gets_a_new_one(spec_sim):
    with Sampler(spec_sim, [0], mode="process") as sampler:
        pid = sampler.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert _wait_until(lambda: _gone(pid))
    with Sampler(spec_sim, [0], mode="process") as again:
        assert again.child_pid not in (None, pid)
        t0 = again.mark()
        time.sleep(0.05)
        assert not again.window(t0, again.mark()).gap
        assert not again.gaps  # the old process's death was the other Sampler's
