"""gpuenv monitor as a user sees it: in a real terminal (tmux), on the simulated GPU.

Each test starts `gpuenv --sim monitor` in a detached tmux session of a fixed
size, reads the screen with capture-pane, resizes the window and presses keys.
Skipped where tmux is not installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Term:
    """One tmux session running one command; its own server socket, so nothing leaks."""

    def __init__(self, tmp: str, command: str, width: int, height: int):
        self.socket = os.path.join(tmp, "tmux.sock")
        self.name = f"gpuenv-{uuid.uuid4().hex[:8]}"
        self.done = os.path.join(tmp, "exit-code")
        env = {k: v for k, v in os.environ.items() if k.startswith("GPUENV_")}
        env.update(TERM="xterm-256color", LANG="C.UTF-8", LC_ALL="C.UTF-8", PYTHONPATH=ROOT)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # A stale COLUMNS/LINES pair must not pin the view's size. The exit code goes to
        # a file, then the pane stays open so it can be read.
        run = f"env COLUMNS=80 LINES=24 {exports} {command}"
        script = f"cd {shlex.quote(ROOT)} && {run}; echo $? > {self.done}; sleep 30"
        self.tmux("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), script)

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        if out.returncode != 0:
            raise RuntimeError(f"tmux {args[0]} failed: {out.stderr.strip()}")
        return out.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, check: Callable[[str], bool], timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if check(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"screen never matched; last screen:\n{text}")

    def exit_code(self, timeout: float = 5.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.done):
                with open(self.done) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            time.sleep(0.05)
        raise AssertionError(f"the command did not exit; screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def term(tmp_path) -> Iterator[Callable[..., Term]]:
    made: list[Term] = []

    def start(args: str, width: int = 100, height: int = 30) -> Term:
        cmd = f"{shlex.quote(sys.executable)} -c 'from gpuenv.cli import main; main()' {args}"
        t = Term(str(tmp_path), cmd, width, height)
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_shows_the_gpu_adapts_to_a_resize_and_quits_on_q(term):
    t = term("--sim monitor -d 0.5 --scenario load", width=100, height=30)
    text = t.wait_for(lambda s: "power cap for" in s and "SIMULATED GPU" in s)
    assert "gpuenv monitor" in text and "GPU 0" in text and "q quit" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    # narrower and shorter: the view re-lays itself out within the new size
    t.tmux("resize-window", "-t", t.name, "-x", "60", "-y", "12")
    small = t.wait_for(lambda s: len(s.splitlines()) <= 12 and "q quit" not in s)
    assert "GPU 0" in small and "SM" in small
    assert all(len(line) <= 60 for line in small.splitlines())
    # wider again: the key help comes back
    t.tmux("resize-window", "-t", t.name, "-x", "120", "-y", "30")
    t.wait_for(lambda s: "q quit" in s and "procs" in s)
    t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0
    assert "gpuenv monitor" not in t.screen()  # curses gave the screen back


def test_pause_freezes_the_view_and_arrows_pick_a_gpu(term):
    t = term("--sim monitor -d 0.2", width=100, height=14)  # too short for two full GPUs
    text = t.wait_for(lambda s: "GPU 0" in s)
    assert "▶ GPU 0" in text  # compact rows, the first selected
    t.tmux("send-keys", "-t", t.name, "Right")
    t.wait_for(lambda s: "▶ GPU 1" in s)
    t.tmux("send-keys", "-t", t.name, "0")
    t.wait_for(lambda s: "▶ GPU 0" in s)
    t.tmux("send-keys", "-t", t.name, "p")
    paused = t.wait_for(lambda s: "PAUSED" in s)
    clock = _lines(paused)[0].split()[2]
    time.sleep(1.2)  # the header's clock would have moved at 0.2 s updates
    assert _lines(t.screen())[0].split()[2] == clock
    t.tmux("send-keys", "-t", t.name, "p")
    t.wait_for(lambda s: "PAUSED" not in s and _lines(s)[0].split()[2] != clock)
    t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0


@pytest.fixture(autouse=True)
def _two_gpus_for_the_pause_test(request, monkeypatch):
    if request.node.name.startswith("test_pause"):
        monkeypatch.setenv("GPUENV_SIM_GPUS", "2")
