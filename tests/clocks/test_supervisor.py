"""The watchdog, across real processes on a simulated GPU whose state file they share.

Owners are killed for real (SIGKILL, SIGTERM, os._exit); the tests wait until the
GPUs equal their state before the lock, never asserting wall-clock timings
(`python -m benchmarks.chaos` measures those).
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import local_lock as lock
from gpuenv.clocks import restore, standing_lock
from gpuenv.clocks.journal import Journal, process_alive
from gpuenv.clocks.supervisor import backend_spec

ROOT = Path(__file__).resolve().parents[2]


def _load_bench() -> object:
    return importlib.import_module("benchmarks.chaos")


bench = _load_bench()

CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks import local_lock as lock
    from gpuenv.clocks.journal import Journal
    state_file, state_dir, sm, force, end = sys.argv[1:6]
    sim = SimBackend(n_gpus=2, state_file=state_file)
    journal = Journal(state_dir)
    with lock(int(sm), power_limit_w=500, backend=sim, journal=journal, force=force == "1"):
        print("LOCKED", flush=True)
        if end == "crash":
            os._exit(3)  # no finally, no atexit: an interpreter crash
        time.sleep(60)
    """
).format(root=str(ROOT))


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[tuple[SimBackend, Journal, Path]]:
    state_file = tmp_path / "sim.json"
    sim = SimBackend(n_gpus=2, state_file=state_file)
    sim.set_app_clocks(0, 1593, 1755)  # a non-default prior state to get back exactly
    sim.set_power_limit(1, 650.0)
    yield sim, Journal(tmp_path / "journal"), state_file
    sim.close()


def settings(sim: SimBackend) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for i in range(sim.device_count()):
        t = sim.truth(i)
        out.append((t.locked_sm, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w))
    return out


def wait_until(pred: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def start_child(
    state_file: Path, journal: Journal, sm: int = 1350, *, force: bool = False, end: str = "sleep"
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            str(state_file),
            str(journal.path),
            str(sm),
            str(int(force)),
            end,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "LOCKED"
    return proc


def test_backend_spec_only_for_backends_another_process_can_open(tmp_path: Path) -> None:
    assert backend_spec(SimBackend()) is None  # in memory: no watchdog can reach it
    spec = backend_spec(SimBackend(n_gpus=3, state_file=tmp_path / "s.json"))
    assert spec is not None and spec["kind"] == "sim" and spec["n_gpus"] == 3


@pytest.mark.parametrize(
    ("how", "kill_after_s"),
    [(p, 0.0) for p in bench.PAUSE_POINTS]  # type: ignore[attr-defined]
    + [("locked", 0.0), ("random", 0.05), ("random", 0.3), ("random", 0.5)],
)
def test_chaos_sigkill_leaves_nothing_changed(
    tmp_path: Path, how: str, kill_after_s: float
) -> None:
    """SIGKILL between journal write and NVML call, halfway through a 2-GPU apply, while
    locked, halfway through release, or at a random moment: the GPUs come back."""
    trial = bench.run_trial(tmp_path, how, kill_after_s=kill_after_s, restore_timeout_s=15.0)  # type: ignore[attr-defined]
    assert trial.left_changed == 0
    if trial.changed_at_kill:
        assert trial.restored_by_watchdog  # not just by the 'gpuenv restore' fallback
    if how != "random":
        assert trial.changed_at_kill  # the pause point was inside the lock's lifetime


@pytest.mark.parametrize("end", ["sigterm", "crash", "sigint"])
def test_owner_ending_any_way_is_restored(
    machine: tuple[SimBackend, Journal, Path], end: str
) -> None:
    sim, journal, state_file = machine
    before = settings(sim)
    proc = start_child(state_file, journal, end="crash" if end == "crash" else "sleep")
    if end == "sigterm":
        proc.send_signal(signal.SIGTERM)  # default action: dies without finally
    elif end == "sigint":
        proc.send_signal(signal.SIGINT)  # KeyboardInterrupt: the with block restores
    proc.wait(30)
    assert wait_until(lambda: settings(sim) == before and not journal.entries())


def test_watchdog_is_out_of_reach_of_ctrl_c_and_exits_quietly_on_release(
    machine: tuple[SimBackend, Journal, Path],
) -> None:
    sim, journal, _ = machine
    lk = lock(1350, backend=sim, journal=journal)
    dog = lk._watchdog
    assert dog is not None and dog.alive()
    assert os.getsid(dog.pid) == dog.pid != os.getsid(0)  # its own session: no terminal SIGINT
    entry = journal.entries()[0]
    assert entry.owners[0].watchdog_pid == dog.pid
    lk.release()
    assert dog.proc.returncode == 0
    other = standing_lock(1500, backend=sim, journal=journal)  # after the watchdog left
    time.sleep(0.2)
    assert sim.truth(0).locked_sm == (1500, 1500)  # it touched nothing
    other.release()


def test_shared_lock_outlives_one_owner(machine: tuple[SimBackend, Journal, Path]) -> None:
    sim, journal, state_file = machine
    before = settings(sim)
    a = start_child(state_file, journal)
    b = start_child(state_file, journal)
    assert len(journal.entries()[0].owners) == 2
    a.kill()
    a.wait()
    assert wait_until(lambda: all(len(e.owners) == 1 for e in journal.entries()))
    assert sim.truth(0).locked_sm == (1350, 1350)  # b still holds it
    b.kill()
    b.wait()
    assert wait_until(lambda: settings(sim) == before and not journal.entries())


def test_forced_out_owner_dying_does_not_touch_the_new_lock(
    machine: tuple[SimBackend, Journal, Path],
) -> None:
    sim, journal, state_file = machine
    before = settings(sim)
    a = start_child(state_file, journal, sm=1500)
    dog_a = journal.entries()[0].owners[0].watchdog_pid
    b = lock(1350, backend=sim, journal=journal, force=True)
    a.kill()
    a.wait()
    assert wait_until(lambda: not process_alive(dog_a, None))
    assert sim.truth(0).locked_sm == (1350, 1350)
    b.release()
    assert settings(sim) == before and not journal.entries()


RACER = textwrap.dedent(
    """
    import os, random, sys, time
    sys.path.insert(0, {root!r})
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks import local_lock as lock
    from gpuenv.clocks import restore, standing_lock
    from gpuenv.errors import LockConflict
    from gpuenv.clocks.journal import Journal
    state_file, state_dir, seed, go = sys.argv[1:5]
    rng = random.Random(int(seed))
    sim = SimBackend(n_gpus=2, state_file=state_file)
    journal = Journal(state_dir)
    print("READY", flush=True)
    while not os.path.exists(go):  # all start together
        time.sleep(0.005)
    for _ in range(4):
        sm = rng.choice([1350, 1500])
        try:
            if rng.random() < 0.6:
                with lock(sm, backend=sim, journal=journal):
                    time.sleep(rng.uniform(0.0, 0.1))
            else:
                standing_lock(sm, backend=sim, journal=journal)
                time.sleep(rng.uniform(0.0, 0.1))
                restore(backend=sim, journal=journal)
        except LockConflict as err:
            print("REFUSED", err, flush=True)
    print("DONE", flush=True)
    """
).format(root=str(ROOT))


def test_racing_processes_lose_no_restore(machine: tuple[SimBackend, Journal, Path]) -> None:
    sim, journal, state_file = machine
    before = settings(sim)
    holder = start_child(state_file, journal, sm=1605)  # racers' first tries must meet it
    go = state_file.with_name("go")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(state_file), str(journal.path), str(seed), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "READY"
    go.touch()
    time.sleep(0.3)
    holder.send_signal(signal.SIGINT)
    holder.wait(30)
    outputs = [p.communicate(timeout=90)[0] for p in procs]  # no deadlock
    assert [p.returncode for p in procs] == [0] * 4
    assert all(out.rstrip().endswith("DONE") for out in outputs)
    refusals = [line for out in outputs for line in out.splitlines() if line.startswith("REFUSED")]
    assert refusals
    for line in refusals:  # every refusal names the owner
        assert "pid " in line or "standing lock" in line
        assert "since" in line
    # what remains journaled is only standing locks whose restore a live holder refused
    for entry in journal.entries():
        assert any(o.kind == "standing" for o in entry.owners)
    restore(backend=sim, journal=journal)
    assert settings(sim) == before and not journal.entries()
