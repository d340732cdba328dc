"""`gpuenv status -l/-lms`: loops on a fixed schedule, header once, ended by Ctrl-C or `| head`."""

from __future__ import annotations

import datetime
import io
import itertools
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.errors import ConfigError
from gpuenv.status.show import StatusOptions, check, interval, show
from gpuenv.timebase import VirtualClock

pytestmark = pytest.mark.sim_gpus(2)

GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]


def _stamp(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f")


def test_a_query_loop_prints_the_header_once_and_a_row_per_gpu_per_tick(sim: SimBackend) -> None:
    out, err = io.StringIO(), io.StringIO()
    opts = StatusOptions(query_gpu="timestamp,index,clocks.sm", interval_s=0.5, count=3)
    assert show(sim, [0, 1], opts, out, err) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "timestamp, index, clocks.current.sm [MHz]"
    assert len(lines) == 1 + 3 * 2 and lines.count(lines[0]) == 1
    stamps = [_stamp(line.split(", ")[0]) for line in lines[1::2]]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)] == [0.5, 0.5]
    assert err.getvalue() == ""


def test_the_schedule_does_not_drift_when_a_tick_is_slow(sim: SimBackend) -> None:
    out = io.StringIO()
    real_read = sim.read_fast

    def slow_read(index: int):  # each tick costs 0.3 s of (virtual) time
        sim.clock.sleep(0.3)
        return real_read(index)

    sim.read_fast = slow_read  # type: ignore[method-assign]
    show(
        sim,
        [0],
        StatusOptions(query_gpu="timestamp,clocks.sm", interval_s=1.0, count=3),
        out,
        io.StringIO(),
    )
    stamps = [_stamp(line.split(", ")[0]) for line in out.getvalue().splitlines()[1:]]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)] == [1.0, 1.0]


def test_a_looping_table_repeats_whole_and_json_becomes_one_line_each(sim: SimBackend) -> None:
    out = io.StringIO()
    show(sim, [0], StatusOptions(interval_s=1.0, count=2), out, io.StringIO())
    assert out.getvalue().count("sim backend, driver") == 2
    out = io.StringIO()
    show(sim, [0], StatusOptions(as_json=True, interval_s=1.0, count=2), out, io.StringIO())
    import json

    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(docs) == 2 and all(d["gpus"][0]["index"] == 0 for d in docs)


class _CtrlC(VirtualClock):
    """Virtual time whose second sleep is interrupted, as Ctrl-C interrupts a real one."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps = 0

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps == 2:
            raise KeyboardInterrupt
        super().sleep(seconds)


def test_ctrl_c_ends_a_loop_with_exit_code_0() -> None:
    clock = _CtrlC()
    with SimBackend(clock=clock) as sim:
        out = io.StringIO()
        code = show(sim, [0], StatusOptions(query_gpu="index", interval_s=1.0), out, io.StringIO())
    assert code == 0
    assert out.getvalue() == "index\n0\n0\n"


class _ClosedAfter(io.StringIO):
    """A pipe whose reader leaves after `n` writes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def write(self, text: str) -> int:
        if self.left == 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.left -= 1
        return super().write(text)


def test_a_closed_pipe_ends_a_loop_quietly_with_exit_code_0(sim: SimBackend) -> None:
    out, err = _ClosedAfter(3), io.StringIO()
    assert show(sim, [0], StatusOptions(query_gpu="index", interval_s=1.0), out, err) == 0
    assert out.getvalue() == "index\n0\n0\n0\n" and err.getvalue() == ""  # 3 ticks, no more


def test_without_a_loop_a_failed_gpu_exits_2_and_says_why_on_stderr(sim: SimBackend) -> None:
    sim.inject_fault(1, "gpu_lost")
    out, err = io.StringIO(), io.StringIO()
    assert show(sim, [0, 1], StatusOptions(query_gpu="index,clocks.sm"), out, err) == 2
    assert out.getvalue().splitlines()[-1] == "1, [GPU is lost]"
    assert err.getvalue().startswith("gpuenv: error: GPU 1:")


@pytest.mark.parametrize(
    ("loop_s", "loop_ms", "want"),
    [(None, None, None), (2.0, None, 2.0), (None, 250, 0.25)],
)
def test_interval_from_l_or_lms(loop_s, loop_ms, want) -> None:
    assert interval(loop_s, loop_ms) == want


@pytest.mark.parametrize(
    ("loop_s", "loop_ms", "text"),
    [
        (1.0, 100, "disagree"),
        (0.0, None, "-l 0 is not a positive"),
        (None, -5, "-lms -5 is not a positive"),
    ],
)
def test_bad_intervals_are_refused(loop_s, loop_ms, text) -> None:
    with pytest.raises(ConfigError, match=text):
        interval(loop_s, loop_ms)


def test_check_refuses_options_that_disagree() -> None:
    with pytest.raises(ConfigError, match="--json and --format disagree"):
        check(StatusOptions(supported_clocks=True, as_json=True, fmt="csv"))
    check(StatusOptions(supported_clocks=True, fmt="csv"))  # a CSV of the supported clocks


# -- the command, as a user runs it --------------------------------------------------------


@pytest.mark.parametrize(
    "args", [["-l", "0.5"], ["--loop=0.5"], ["--interval", "0.5"], ["-lms", "500"]]
)
def test_cli_every_loop_spelling_means_the_same_period(args: list[str]) -> None:
    from gpuenv.cli.status import status

    ctx = status.make_context("status", list(args))
    assert interval(ctx.params["loop_s"], ctx.params["loop_ms"]) == 0.5


def test_cli_l_and_lms_together_are_refused() -> None:
    result = CliRunner().invoke(cli, ["--sim", "status", "-l", "1", "-lms", "5"])
    assert result.exit_code == 2 and "-l and -lms disagree" in result.output


def _env() -> dict[str, str]:
    return {**os.environ, "GPUENV_BACKEND": "sim", "GPUENV_SIM_STATE": "none"}


@pytest.mark.parametrize("loop", [["-lms", "20"], ["-l", "0.02"], ["--interval", "0.02"]])
def test_cli_loop_into_head_ends_cleanly(loop: list[str]) -> None:
    cmd = [*GPUENV, "status", "--query-gpu=index,clocks.sm", "--format=csv,noheader", *loop]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    lines = [proc.stdout.readline() for _ in range(3)]  # what `| head -3` reads
    proc.stdout.close()  # ... and then it leaves
    code = proc.wait(timeout=60)
    assert lines == [b"0, 345 MHz\n"] * 3
    assert code == 0, proc.stderr.read()
    assert b"Traceback" not in proc.stderr.read()


def test_cli_ctrl_c_ends_a_loop_with_exit_code_0() -> None:
    cmd = [*GPUENV, "status", "-lms", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the loop has started
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert first.startswith(b"sim backend")
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"interrupted" not in err


def test_ctrl_c_during_a_single_report_is_an_interruption_not_a_clean_end(
    sim: SimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(index: int):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim, "read_fast", interrupted)
    once = StatusOptions(query_gpu="clocks.sm")
    with pytest.raises(KeyboardInterrupt):  # guarded() turns it into exit 130
        show(sim, [0], once, io.StringIO(), io.StringIO())
    looping = StatusOptions(query_gpu="clocks.sm", interval_s=1.0)
    assert show(sim, [0], looping, io.StringIO(), io.StringIO()) == 0
