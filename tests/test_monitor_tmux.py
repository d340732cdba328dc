"""gpuenv monitor as a user sees it: in a real terminal (tmux), on the simulated GPU.

Each test starts `gpuenv --sim monitor` in a detached tmux session of a fixed
size, reads the screen with capture-pane, resizes the window and presses keys.
Skipped where tmux is not installed.
"""

from __future__ import annotations

import os
import re
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

    def __init__(self, tmp: str, command: str, width: int, height: int, lang: str = "C.UTF-8"):
        self.socket = os.path.join(tmp, "tmux.sock")
        self.name = f"gpuenv-{uuid.uuid4().hex[:8]}"
        self.done = os.path.join(tmp, "exit-code")
        env = {k: v for k, v in os.environ.items() if k.startswith("GPUENV_")}
        env.update(TERM="xterm-256color", LANG=lang, LC_ALL=lang, PYTHONPATH=ROOT)
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

    def start(args: str, width: int = 100, height: int = 30, lang: str = "C.UTF-8") -> Term:
        cmd = f"{shlex.quote(sys.executable)} -c 'from gpuenv.cli import main; main()' {args}"
        t = Term(str(tmp_path), cmd, width, height, lang)
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _fits(text: str, width: int, height: int) -> None:
    rows = text.splitlines()
    assert len(rows) <= height
    assert all(len(line) <= width for line in rows), [r for r in rows if len(r) > width]


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (200, 50)])
def test_memory_processes_and_help_at_each_size(term, width, height):
    t = term("--sim monitor -d 0.25 --scenario shared", width=width, height=height)
    text = t.wait_for(
        lambda s: (
            "400000" in s
            and "512 MiB" in s
            and "60%" in s
            and " history " in s
            and "board" in s
            and "host" in s
        )
    )
    _fits(text, width, height)
    rows = text.splitlines()
    assert rows[0].startswith("gpuenv monitor") and rows[0].rstrip().endswith("? help")
    assert "q quit" in rows[0]  # the key hints stay, shortened where narrow
    assert re.match(r"  host  CPU \d+% of \d+  mem [0-9.]+/[0-9.]+ GiB", rows[1])  # psutil's
    assert re.search(r"memory +[0-9.]+ (MiB|GiB) .*of 79\.6 GiB", text)
    # nvitop's device columns: P-state, fan (an SXM board has none), ECC, persistence
    assert re.search(r"board +P0  fan N/A  ECC 0  persist On  compute Default", text)
    # nvitop's process columns: type, %CPU and %MEM of the host, sorted by PID (marked)
    assert re.search(r"PID. T +.*GPU MEM +SM +%CPU +%MEM .*COMMAND", text)
    assert re.search(r"400000 C .*2\.0 GiB +60% +N/A +N/A", text)
    # ours: the command from its start, as nvitop shows it (python -c ... --scenario)
    ours = next(r for r in rows if "512 MiB" in r)
    assert re.search(r"C .*512 MiB .* [0-9.]+ +[0-9.]+ .*python[0-9.]* -c from gpuenv", ours)
    if width >= 200:
        assert ours.endswith("--scenario shared")
        assert "USER" in text and "TIME" in text and re.search(r"[█░]{100,}", text)
        first = next(k for k, r in enumerate(rows) if r.startswith("    history"))
        end = next(k for k, r in enumerate(rows) if r.startswith("    lock"))
        assert end - first >= 8  # the clock history: a graph as tall as the spare rows allow
        last = max(k for k, r in enumerate(rows) if "--scenario" in r)
        assert last >= 30  # the layout spans the screen, not a third of it
    elif width < 100:
        assert "USER" not in text and "TIME" not in text  # dropped before the command is
    t.tmux("send-keys", "-t", t.name, ".")  # nvitop's key: the next sort column shown
    marker = "USER▲" if width >= 110 else "GPU MEM▲"  # USER is not drawn below 110
    t.wait_for(lambda s: marker in s and "PID▲" not in s)
    t.tmux("send-keys", "-t", t.name, "?")
    shown = t.wait_for(lambda s: "Keys" in s and "this help" in s)
    _fits(shown, width, height)
    assert "q  Esc" in shown and "any key" in shown.splitlines()[0]
    t.tmux("send-keys", "-t", t.name, "x")  # any key closes it
    t.wait_for(lambda s: "Keys" not in s and "COMMAND" in s)
    t.tmux("send-keys", "-t", t.name, "h")
    t.wait_for(lambda s: "Keys" in s)
    t.tmux("send-keys", "-t", t.name, "Escape")
    t.wait_for(lambda s: "Keys" not in s and "COMMAND" in s)
    t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0


def test_sort_reverse_and_filter_keys_reorder_the_processes(term):
    t = term("--sim monitor -d 0.25 --scenario shared", width=120, height=40)
    text = t.wait_for(lambda s: "400000" in s and "512 MiB" in s)
    pids = [int(r.split()[0]) for r in text.splitlines() if re.match(r" +\d+ C ", r)]
    assert pids == sorted(pids) and "PID▲" in text
    t.tmux("send-keys", "-t", t.name, "/")  # reverse: the largest pid first

    def rows(s: str) -> list[int]:
        return [int(r.split()[0]) for r in s.splitlines() if re.match(r" +\d+ C ", r)]

    # the whole frame, not a capture taken while tmux is part-way through drawing it
    rev = t.wait_for(lambda s: "PID▼" in s and rows(s) == pids[::-1])
    assert rows(rev) == pids[::-1]
    for _ in range(2):  # PID -> USER -> GPU MEM
        t.tmux("send-keys", "-t", t.name, ".")
    t.wait_for(lambda s: "GPU MEM▼" in s)
    t.tmux("send-keys", "-t", t.name, "f")  # all -> compute: named from the first press
    t.wait_for(lambda s: re.search(r"COMMAND +compute \(C\) only", s) is not None)
    t.tmux("send-keys", "-t", t.name, "f")  # -> graphics: none here, and it says which
    t.wait_for(lambda s: "none (graphics (G) only)" in s)
    t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0


@pytest.mark.parametrize("mode", ["live", "once"])
def test_with_lang_c_the_view_is_ascii_and_never_a_traceback(term, mode):
    """LANG=C: no UTF-8 anywhere, so every glyph, arrow and ellipsis falls back to ASCII."""
    args = "--sim monitor -d 0.25 --scenario shared" + (" --once" if mode == "once" else "")
    t = term(args, width=80, height=24, lang="C")
    text = t.wait_for(lambda s: "400000" in s and "board" in s)
    assert "Traceback" not in text and all(ord(ch) < 128 for ch in text)
    assert re.search(r"SM +\d+ MHz +#+\.*", text) and "PID^" in text
    if mode == "live":
        t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0


def test_shows_the_gpu_adapts_to_a_resize_and_quits_on_q(term):
    t = term("--sim monitor -d 0.5 --scenario load", width=100, height=30)
    text = t.wait_for(lambda s: "power cap for" in s and "SIMULATED GPU" in s)
    assert "gpuenv monitor" in text and "GPU 0" in text and "q quit" in text
    _fits(text, 100, 30)
    # narrower and shorter: the view re-lays itself out within the new size
    t.tmux("resize-window", "-t", t.name, "-x", "60", "-y", "12")
    small = t.wait_for(lambda s: "SIMULATED GPU" not in s and "? help" in s and "GPU 0" in s)
    assert "SM" in small
    _fits(small, 60, 12)
    # wider again: the source comes back in full
    t.tmux("resize-window", "-t", t.name, "-x", "120", "-y", "30")
    t.wait_for(lambda s: "SIMULATED GPU" in s and "procs" in s)
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
    assert "p resume" in paused and "p pause" not in paused  # the hint says what p does now
    clock = _lines(paused)[0].split()[2]
    time.sleep(1.2)  # the header's clock would have moved at 0.2 s updates
    assert _lines(t.screen())[0].split()[2] == clock
    t.tmux("send-keys", "-t", t.name, "p")
    t.wait_for(lambda s: "PAUSED" not in s and _lines(s)[0].split()[2] != clock)
    assert "p pause" in t.screen()
    t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0


@pytest.fixture(autouse=True)
def _two_gpus_for_the_pause_test(request, monkeypatch):
    if request.node.name.startswith("test_pause"):
        monkeypatch.setenv("GPUENV_SIM_GPUS", "2")


def test_plain_monitor_shows_work_moving_and_names_it(term):
    """The README's `gpuenv --sim monitor`: no scenario asked, nothing else on the GPU, so
    its default runs, boosted off the idle clock, and the header says which and how to stop."""
    t = term("--sim monitor -d 0.25", width=160, height=30)
    text = t.wait_for(lambda s: re.search(r"SM +1\d{3} MHz", s) is not None)
    assert "scenario bursts, the default while nothing else runs" in text
    assert "--scenario none" in text
    t.tmux("send-keys", "-t", t.name, "q")
    assert t.exit_code() == 0
