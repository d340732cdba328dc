"""`gpuenv run` SIGKILLed: its command must not live on, unlocked and unobserved
(gpuenv/run/runner.py: `dies_with_us`, PR_SET_PDEATHSIG through setpriv)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuenv.clocks.journal import process_alive
from gpuenv.run.runner import _setpriv

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(_setpriv() is None, reason="needs util-linux setpriv with --pdeathsig")
@pytest.mark.parametrize("lock", [[], ["--sm", "1350"]], ids=["no-lock", "locked"])
def test_sigkill_of_gpuenv_run_takes_the_command_with_it(tmp_path: Path, lock: list[str]) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    env = dict(os.environ, GPUENV_SIM_STATE=str(tmp_path / "sim.json"), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuenv", "--sim", "run", *lock, "--", sys.executable, "-c", code],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a stray command could then still be found and ended
    )
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the command never ran"
            time.sleep(0.02)
        child = int(pid_file.read_text())
        assert process_alive(child, None)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while process_alive(child, None) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not process_alive(child, None), "the command outlived gpuenv run"
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(OSError):  # whatever is left of the group it started
            os.killpg(proc.pid, signal.SIGKILL)
