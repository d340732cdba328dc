"""gpuenv.progress on a real terminal (a pty), and silent where it must be."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = """
import time
from gpuenv.progress import Progress
with Progress("starting", delay_s=0) as p:
    for k in range(3):
        p.update(f"step {k} of 3")
        time.sleep(0.15)
print("done")
"""


def on_a_terminal(argv: list[str], **env: str) -> tuple[int, str, bytes]:
    """Run `argv` with stderr on a pty; (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=60), out, seen


def test_the_line_is_redrawn_in_place_and_removed_at_the_end() -> None:
    code, out, seen = on_a_terminal([sys.executable, "-c", STEPS])
    assert code == 0 and out == "done\n"
    # carriage return, the text and its seconds, erase to the end of the line
    assert seen.startswith(b"\rstarting \xc2\xb7 0 s\x1b[K")
    assert re.search(rb"\rstep [12] of 3 \xc2\xb7 \d s\x1b\[K", seen), seen
    assert b"\n" not in seen  # one line, never scrolled
    assert seen.endswith(b"\r\x1b[K")  # gone before the command's own output


def test_quiet_or_not_a_terminal_draws_nothing() -> None:
    code, _, seen = on_a_terminal([sys.executable, "-c", STEPS], GPUENV_QUIET="1")
    assert code == 0 and seen == b""
    piped = subprocess.run(
        [sys.executable, "-c", STEPS],
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert piped.stderr == b"" and piped.stdout == b"done\n"


def test_a_line_wider_than_the_terminal_is_cut_not_wrapped() -> None:
    code = """
import fcntl, struct, sys, termios
fcntl.ioctl(2, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
from gpuenv.progress import Progress
with Progress("x" * 200, delay_s=0):
    pass
"""
    _, _, seen = on_a_terminal([sys.executable, "-c", code])
    drawn = seen.split(b"\r")[1].split(b"\x1b[K")[0].decode()
    assert len(drawn) == 39 and drawn.endswith("…")


def test_a_terminal_that_went_away_turns_the_line_off_not_the_work() -> None:
    from gpuenv.progress import Progress

    class Gone:
        def write(self, _s: str) -> int:
            raise OSError(5, "Input/output error")

        def flush(self) -> None:
            pass

    p = Progress(stream=Gone(), delay_s=0, show=True)  # type: ignore[arg-type]
    p.update("still working")
    assert p.on is False
    p.update("and more")
    p.clear()


def test_gpuenv_plot_says_what_it_is_doing_on_a_terminal(tmp_path: Path) -> None:
    """The CLI's wiring: plot with the line due at once (GPUENV_PROGRESS_DELAY_S=0)."""
    import pytest

    pytest.importorskip("matplotlib")
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuenv",
            "--sim",
            "run",
            "-q",
            "-o",
            str(tmp_path / "r.jsonl"),
            "--",
            "sleep",
            "0.3",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GPUENV_SIM_STATE": "none"},
        capture_output=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    code, out, seen = on_a_terminal(
        [
            sys.executable,
            "-m",
            "gpuenv",
            "plot",
            str(tmp_path / "r.jsonl"),
            "-o",
            str(tmp_path / "r.png"),
        ],
        GPUENV_PROGRESS_DELAY_S="0",
    )
    assert code == 0 and out.strip() == str(tmp_path / "r.png")
    assert b"\rgpuenv plot: reading " + str(tmp_path).encode()[:20] in seen  # cut at 80 columns
    assert seen.endswith(b"\r\x1b[K")
    for quiet in (["--quiet", "plot"], ["plot", "--quiet"]):  # the group's flag, either side
        code, _, seen = on_a_terminal(
            [
                sys.executable,
                "-m",
                "gpuenv",
                *quiet,
                str(tmp_path / "r.jsonl"),
                "-o",
                str(tmp_path / "q.png"),
            ],
            GPUENV_PROGRESS_DELAY_S="0",
        )
        assert code == 0 and seen == b""


def test_a_wait_for_the_gpu_says_which_clock_it_waits_for() -> None:
    from gpuenv.conditioning.burst import _waiting
    from gpuenv.reasons import Reason
    from gpuenv.telemetry import Sample
    from gpuenv.verdict import GpuFacts

    class Latest:
        def __init__(self, sample: Sample | None) -> None:
            self.sample = sample

        def latest(self, gpu: int) -> Sample | None:
            return self.sample

    capped = Sample(
        t=1.0,
        gpu=0,
        sm_mhz=1420,
        mem_mhz=2619,
        power_w=699.0,
        temp_c=61.0,
        reasons=int(Reason.SW_POWER_CAP),
    )
    line = _waiting(Latest(capped), 0, {0: GpuFacts(max_sm_mhz=1980)}, 30.0)
    assert line.startswith("gpuenv: waiting for GPU 0 to recover (at most 30 s)")
    assert "clock 1420 -> 1980 MHz, 61 C, power cap" in line, line
    locked = _waiting(Latest(capped), 0, {0: GpuFacts(lock_range_mhz=(1350, 1350))}, 30.0)
    assert "clock 1420 -> 1350 MHz" in locked
    no_sample = _waiting(Latest(None), 2, None, 5.0)
    assert no_sample == "gpuenv: waiting for GPU 2 to recover (at most 5 s)"


def test_gpuenv_calibrate_redraws_one_line_on_a_terminal(tmp_path: Path) -> None:
    code, out, seen = on_a_terminal(
        [sys.executable, "-m", "gpuenv", "--sim", "calibrate", "--no-save"],
        GPUENV_SIM_STATE="none",
        GPUENV_STATE_DIR=str(tmp_path / "state"),
    )
    assert code == 0, (out, seen[-300:])
    assert b"\rgpuenv calibrate GPU 0: load" in seen and seen.endswith(b"\r\x1b[K")
    assert b"\n" not in seen  # the lines every 5 s are for a log, not a terminal


def test_a_silent_daemon_socket_is_waited_for_with_a_word(tmp_path: Path) -> None:
    """A socket that accepts and never answers: `gpuenv status` waits its 3 s saying so."""
    import socket

    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)  # the kernel accepts; nobody ever answers
    try:
        code, _, seen = on_a_terminal(
            [sys.executable, "-m", "gpuenv", "--sim", "status"],
            GPUENV_SOCKET=str(path),
            GPUENV_SIM_STATE="none",
            GPUENV_PROGRESS_DELAY_S="0",
        )
    finally:
        server.close()
    assert code == 0, seen[-400:]
    assert b"\rgpuenv: waiting for gpuenvd at " in seen, seen[-400:]
    assert b"(at most 3 s)" in seen or b"\xe2\x80\xa6" in seen  # whole, or cut at 80 columns


def test_a_bench_says_how_far_it_is_on_a_terminal() -> None:
    """gpuenv.bench of a slow function used to run 18 s without a word."""
    script = """
from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.timebase import VirtualClock
sim = SimBackend(clock=VirtualClock())
m = timing.bench(timing.sim_kernel(sim, 0, seconds=2e-3), name="gemm", backend=sim, budget_s=1)
print(m.stats.n > 0)
"""
    code, out, seen = on_a_terminal([sys.executable, "-c", script], GPUENV_PROGRESS_DELAY_S="0")
    assert code == 0 and out == "True\n", seen[-300:]
    assert b"\rgpuenv.bench gemm: warming up" in seen
    assert re.search(rb"\rgpuenv\.bench gemm: \d+ reps, [\d.]+ s of 1 s", seen), seen[-300:]
    assert seen.endswith(b"\r\x1b[K")


def test_a_warning_while_the_line_shows_gets_a_line_of_its_own() -> None:
    script = """
import time, warnings
from gpuenv.cli import _show_warning
from gpuenv.progress import Progress
warnings.showwarning = _show_warning
with Progress("busy", delay_s=0) as p:
    warnings.warn("the clock fell")
    time.sleep(0.15)
    p.update("still busy")
"""
    code, _, seen = on_a_terminal([sys.executable, "-c", script])
    assert code == 0, seen
    before, after = seen.split(b"gpuenv: warning: the clock fell")
    assert before.endswith(b"\r\x1b[K")  # the line was taken off first
    assert after.startswith(b"\r\n") or after.startswith(b"\n")
    assert b"\rstill busy" in after  # and drawn again below it


def test_a_scripts_warning_or_log_record_gets_a_line_of_its_own() -> None:
    """In a Python script (not the CLI: Python's own showwarning, the logging module's
    last-resort handler) a warning and a gpuenv log record written while the line shows
    each start on a clean line, and warnings are shown as before once the line is gone."""
    script = """
import logging, time, warnings
from gpuenv.progress import Progress
plain = warnings.showwarning
with Progress("busy", delay_s=0) as p:
    warnings.warn("the clock fell")
    logging.getLogger("gpuenv.timing").warning("timing without telemetry")
    time.sleep(0.15)
    p.update("still busy")
print(warnings.showwarning is plain, logging.getLogger("gpuenv").filters == [])
"""
    code, out, seen = on_a_terminal([sys.executable, "-c", script])
    assert code == 0 and out == "True True\n", (out, seen)
    before, after = seen.split(b"UserWarning: the clock fell")
    line_start = before.rsplit(b"\r\x1b[K", 1)[1]
    assert b"busy" not in line_start, seen  # the line was taken off before the warning
    before, after = after.split(b"timing without telemetry")
    assert before.endswith(b"\r\x1b[K") or before.endswith(b"\n"), seen
    assert b"\rstill busy" in after  # and drawn again below them


def test_a_line_of_wide_characters_is_cut_to_the_terminals_columns(monkeypatch) -> None:
    """A path in CJK takes two columns a character: cut by len() it wrapped, and a wrapped
    line cannot be redrawn in place."""
    import io

    from gpuenv.progress import Progress
    from gpuenv.table import display_width

    out = io.StringIO()
    monkeypatch.setattr(Progress, "_columns", lambda self: 21)
    p = Progress(stream=out, delay_s=0, show=True)
    p.update("読み込み中 " * 10)
    line = out.getvalue().split("\r")[-1].replace("\x1b[K", "")
    assert line.endswith("…") and 18 <= display_width(line) <= 20
