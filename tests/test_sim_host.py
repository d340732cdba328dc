"""One simulated machine per host (gpuenv/backend/sim_host.py, sim_state.py): what one process
runs or sets, every other process and account sees; only root writes its settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import ROOT, local_users, run_as, shared_workdir

from gpuenv.backend import REASON_GPU_IDLE, REASON_SW_POWER_CAP
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError, PermissionDenied

LOAD = (
    "import sys\n"
    "from gpuenv.backend.sim import SimBackend\n"
    "s = SimBackend(state_file=sys.argv[1])\n"
    "s.set_background_load(0, 1.0)\n"
    "print('running', flush=True)\n"
    "sys.stdin.read()\n"  # until the test closes it
    "s.close()\n"
)


@pytest.fixture
def work() -> Iterator[Path]:
    path = shared_workdir()  # other accounts may traverse it, as they may /tmp
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _until(what, timeout: float = 20.0) -> bool:
    """Poll `what()` (real time: another process drives the GPU) until true or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.05)
    return False


def _start_load(state: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
    return proc


def test_a_load_in_another_process_caps_the_gpu_here_and_ends_with_it(work: Path) -> None:
    state = work / "sim.json"
    here = SimBackend(state_file=state)  # open first, as a monitor in another terminal is
    load = _start_load(state)
    try:
        assert _until(lambda: here.read_fast(0).reasons & REASON_SW_POWER_CAP)
        assert load.pid in [p.pid for p in here.processes(0)]
        late = SimBackend(state_file=state)  # opened now, as `gpuenv status` is: no ramp
        reading = late.read_fast(0)
        assert reading.reasons & REASON_SW_POWER_CAP and reading.sm_mhz < 1980
        late.close()
    finally:
        assert load.stdin is not None
        load.stdin.close()
        load.wait(timeout=30)
    assert _until(lambda: here.read_fast(0).reasons & REASON_GPU_IDLE)
    assert load.pid not in [p.pid for p in here.processes(0)]
    here.close()


def test_a_monitor_scenario_caps_the_gpu_that_status_shows(work: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUENV_SIM_STATE": str(work / "sim.json")}
    gpuenv = [sys.executable, "-m", "gpuenv", "--sim"]
    monitor = subprocess.Popen(
        [*gpuenv, "monitor", "--scenario", "load", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert monitor.stdout is not None and json.loads(monitor.stdout.readline())["gpu"] == 0

        def status_shows_the_cap() -> bool:
            out = subprocess.run([*gpuenv, "status"], env=env, capture_output=True, text=True)
            return "SwPowerCap" in out.stdout

        assert _until(status_shows_the_cap, timeout=60.0)
    finally:
        monitor.terminate()
        monitor.wait(timeout=30)


def test_an_ordinary_account_sees_roots_lock_runs_work_and_cannot_set_clocks(
    work: Path,
) -> None:
    (mallory,) = local_users(1)
    state = work / "sim.json"
    root = SimBackend(state_file=state)
    root.set_locked_sm_clocks(0, 1350, 1350)
    code = (
        "import os, sys\n"
        "from gpuenv.backend.sim import SimBackend\n"
        "from gpuenv.errors import ConfigError, PermissionDenied\n"
        "s = SimBackend.from_env()\n"
        "print(s.capabilities.privileged, s.truth(0).locked_sm)\n"
        "try:\n"
        "    s.set_locked_sm_clocks(0, 1500, 1500)\n"
        "except PermissionDenied:\n"
        "    print('denied')\n"
        "s.set_background_load(0, 1.0)  # any account runs kernels\n"
        "print(os.getpid(), flush=True)\n"
        "os.environ['GPUENV_SIM_ROOT'] = '1'\n"
        "try:\n"
        "    SimBackend.from_env()\n"
        "except ConfigError as err:\n"
        "    print('refused:', err.hint)\n"
    )
    env = {**os.environ, "GPUENV_SIM_STATE": str(state)}
    env.pop("GPUENV_SIM_ROOT", None)
    out = run_as(mallory, code, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "False (1350, 1350)" and lines[1] == "denied"
    assert "gpuenvd" in lines[3]
    assert root.truth(0).locked_sm == (1350, 1350)  # the account changed nothing
    assert oct(state.stat().st_mode & 0o777) == "0o644"
    assert oct(Path(f"{state}.run").stat().st_mode & 0o777) == "0o666"
    root.close()


def test_an_ordinary_account_follows_the_hint_to_a_machine_of_its_own(work: Path) -> None:
    """What an ordinary account's refused `gpuenv --sim lock` says to try, as written (with
    its home for ~): the lock is taken and restored on its own machine, none on the host's."""
    (mallory,) = local_users(1)
    home = work / "home"
    home.mkdir()
    os.chown(home, mallory.pw_uid, mallory.pw_gid)
    host = work / "host-sim.json"
    # the test's isolation, where root's would be out of the account's reach: no gpuenvd
    env = {**os.environ, "GPUENV_SIM_STATE": str(host), "GPUENV_SOCKET": str(work / "none")}
    env.pop("GPUENV_SIM_ROOT", None)
    code = (
        "import os, subprocess, sys\n"
        "os.environ['HOME'] = sys.argv[1]  # the account's own (run_as gives it /tmp)\n"
        "gpuenv = [sys.executable, '-c', 'from gpuenv.cli import main; main()']\n"
        "def run(*a, env=None):\n"
        "    import os\n"
        "    e = {**os.environ, **(env or {})}\n"
        "    e['GPUENV_STATE_DIR'] = os.path.expanduser('~/state')\n"
        "    return subprocess.run([*gpuenv, *a], env=e, capture_output=True, text=True)\n"
        "refused = run('--sim', 'lock', '--sm', '1350')\n"
        "print(refused.returncode)\n"
        "import os\n"
        "own = {'GPUENV_SIM_STATE': os.path.expanduser('~/gpuenv-sim.json'),\n"
        "       'GPUENV_SIM_ROOT': '1'}\n"
        "print(run('--sim', 'lock', '--sm', '1350', env=own).returncode)\n"
        "print(run('--sim', 'restore', env=own).returncode)\n"
    )
    out = run_as(mallory, code, str(home), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "0", "0"], out.stdout + out.stderr
    assert (home / "gpuenv-sim.json").exists() and not host.exists()


def test_the_default_privilege_is_the_accounts(work: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUENV_SIM_STATE", str(work / "sim.json"))
    monkeypatch.delenv("GPUENV_SIM_ROOT", raising=False)
    sim = SimBackend.from_env()
    assert sim.capabilities.privileged is (os.geteuid() == 0)
    sim.close()
    monkeypatch.setenv("GPUENV_SIM_ROOT", "0")
    sim = SimBackend.from_env()
    with pytest.raises(PermissionDenied, match="gpuenv daemon"):
        sim.set_locked_sm_clocks(0, 1350, 1350)
    sim.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another account")
def test_settings_another_account_left_are_not_the_drivers(work: Path) -> None:
    state = work / "sim.json"
    writer = SimBackend(state_file=state)
    writer.set_locked_sm_clocks(0, 1350, 1350)
    writer.close()
    os.chown(state, 4242, 4242)  # as if an account had planted it in /tmp (root-owned dir)
    reader = SimBackend(state_file=state)
    assert reader.truth(0).locked_sm is None
    reader.close()


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_link_planted_as_the_running_state_is_refused(work: Path, kind: str) -> None:
    state = work / "sim.json"
    target = work / "elsewhere"
    target.write_text("precious\n")
    run = Path(f"{state}.run")
    (run.symlink_to if kind == "symlink" else run.hardlink_to)(target)
    with pytest.raises(ConfigError, match="remove it"):
        SimBackend(state_file=state)
    assert target.read_text() == "precious\n"


def test_gpuenv_run_samples_the_load_another_process_runs(work: Path) -> None:
    state = work / "sim.json"
    load = _start_load(state)
    try:
        watch = SimBackend(state_file=state)  # the load is under way: its context no longer new
        assert _until(lambda: watch.read_fast(0).reasons & REASON_SW_POWER_CAP)
        watch.close()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUENV_SIM_STATE": str(state)}
        wrapped = [sys.executable, "-c", "import time; time.sleep(1.5)"]
        out = subprocess.run(
            [sys.executable, "-m", "gpuenv", "--sim", "run", "--", *wrapped],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        assert load.stdin is not None
        load.stdin.close()
        load.wait(timeout=30)
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stderr.splitlines() if ln.strip().startswith("(run) ")]
    assert len(rows) == 1, out.stderr
    row = rows[0]
    assert "power cap" in row and "idle" not in row, out.stderr  # not the idle GPU of old
    # named with its user (the host's) and the memory its context holds (the model's)
    import getpass

    assert (
        f"other_process: another process used GPU 0 during the region (pid {load.pid}, "
        f"user {getpass.getuser()}, "
    ) in out.stderr and " MiB)" in out.stderr


def test_a_process_holding_the_running_state_cannot_hang_the_others(work: Path) -> None:
    state = work / "sim.json"
    SimBackend(state_file=state).close()  # the running state exists
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
            f"{state}.run",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"held by pid {holder.pid}"):
            SimBackend(state_file=state)
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.mark.parametrize("damage", ["future", "no_counters", "not_json"])
def test_a_running_state_that_is_not_one_is_a_fresh_gpu(work: Path, damage: str) -> None:
    state = work / "sim.json"
    run = Path(f"{state}.run")
    first = SimBackend(state_file=state)
    first.open_context(0)
    first.close()  # leaves its running state behind, as any process does
    doc = json.loads(run.read_text())
    if damage == "future":  # would freeze every process's GPU until then
        doc["gpus"][0]["t_ns"] = 10**30
    elif damage == "no_counters":  # would fail every later step of the model
        del doc["gpus"][0]["reason_ns"]["power"]
    run.write_text("{not json" if damage == "not_json" else json.dumps(doc))
    sim = SimBackend(state_file=state)
    sim.open_context(0)
    assert _until(lambda: sim.read_fast(0).sm_mhz == 1980, timeout=5.0)  # it runs on
    sim.close()
