"""gpuenv.reader: every file gpuenv reads is judged before it is parsed (a regular file,
bounded) and its records after (types, finite numbers); the first bad value is named by
file, line and field. compare and plot refuse such a file the same way (exit 2).

Each case here was a traceback, a hang or a MemoryError on the code before the reader.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuenv
from gpuenv import reader
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.errors import ConfigError
from gpuenv.results import load_runs
from gpuenv.timebase import VirtualClock


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """A FIFO read used to wait forever: fail in 20 s instead of hanging the suite."""

    def hung(*_: object) -> None:
        raise TimeoutError("the reader hung")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results file as gpuenv writes it: a session region with its telemetry trace."""
    path = tmp_path_factory.mktemp("good") / "run.jsonl"
    sim = SimBackend(clock=VirtualClock())
    with gpuenv.stable(backend=sim, output=path, gpus=0) as env:
        sim.open_context(0)
        with env.measure("step"):
            sim.run_work(0, 1e9)
    sim.close()
    return path


def mutated(good: Path, tmp: Path, change: Callable[[dict], None]) -> Path:
    header, line = good.read_text().splitlines()[:2]
    record = json.loads(line)
    change(record)
    out = tmp / "bad.jsonl"
    out.write_text(header + "\n" + json.dumps(record) + "\n")
    return out


CASES: dict[str, tuple[Callable[[dict], None], str, str]] = {
    "NaN time": (lambda r: r["times_s"].__setitem__(0, math.nan), "times_s[0]", "NaN"),
    "string time": (lambda r: r["times_s"].__setitem__(0, "x"), "times_s[0]", '"x"'),
    "windows null": (lambda r: r.__setitem__("windows", None), "windows", "null"),
    "trace value x": (
        lambda r: r["extra"]["trace"]["sm_mhz"].__setitem__(0, "x"),
        "extra.trace.sm_mhz[0]",
        '"x"',
    ),
    "trace value inf": (
        lambda r: r["extra"]["trace"]["power_w"].__setitem__(0, math.inf),
        "extra.trace.power_w[0]",
        "Infinity",
    ),
    "no times": (lambda r: r.pop("times_s"), "times_s", "missing"),
    # a vocabulary (gpuenv.verdict's Literal types) is still checked as a string
    "verdict a number": (lambda r: r.__setitem__("verdict", 3), "verdict", "3"),
    "rejected rep out of range": (
        lambda r: r.__setitem__("rejected_reps", [99]),
        "rejected_reps[0]",
        "rep 99",
    ),
    # compare said "every rep was rejected there"; summary() raised TypeError on a None
    "no times at all": (lambda r: r.__setitem__("times_s", []), "times_s", "no times"),
    # (a one-rep measurement writes its window once: its summary is that window)
    "min null beside mean": (
        lambda r: r["windows"][0].__setitem__("sm_mhz_min", None),
        "windows[0].sm_mhz_min",
        "null beside sm_mhz_mean",
    ),
}


def test_words_a_vocabulary_does_not_hold_still_load(good: Path, tmp_path: Path) -> None:
    """Finding kinds, severities, verdicts and policies are Literal types for mypy; a file
    written with other words (an older or newer gpuenv's) loads as it did."""
    finding = {"kind": "retired_kind", "severity": "notice", "reps": [0], "message": "m"}

    def change(r: dict) -> None:
        r.update(verdict="questionable", policy="someday", findings=[finding])

    (run,) = load_runs(mutated(good, tmp_path, change))
    (m,) = run.measurements
    assert (m.verdict, m.policy) == ("questionable", "someday")
    assert (m.findings[0].kind, m.findings[0].severity) == ("retired_kind", "notice")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_record_is_refused_by_file_line_and_field(
    case: str, good: Path, tmp_path: Path
) -> None:
    change, field, shown = CASES[case]
    bad = mutated(good, tmp_path, change)
    with pytest.raises(reader.BadRecord) as info:
        load_runs(bad)
    assert (info.value.line, info.value.field) == (2, field)
    assert shown in str(info.value)
    for args in (
        ["compare", str(good), str(bad)],
        ["plot", str(bad), "-o", str(tmp_path / "x.png")],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert f"{bad}, line 2, field {field}:" in result.output
    assert not (tmp_path / "x.png").exists()


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_rest_loads(
    good: Path, tmp_path: Path
) -> None:
    torn = tmp_path / "torn.jsonl"
    torn.write_text(good.read_text() + '{"type": "measurement", "na')
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable line\(s\): 3"):
        runs = load_runs(torn)
    assert runs[0].measurements[0].name == "step"


def test_deep_nesting_is_refused_with_a_sentence(tmp_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 200_000 + "\n")
    with pytest.raises(reader.BadRecord, match="line 1: nested deeper than 32 levels"):
        load_runs(deep)
    (tmp_path / "d.jsonl").write_text('{"type": "run", "metadata": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(reader.BadRecord, match="nested deeper"):
        load_runs(tmp_path / "d.jsonl")


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "dir"])
def test_a_device_fifo_or_directory_is_refused_at_once(special: str, tmp_path: Path) -> None:
    path = special
    if special == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif special == "dir":
        path = str(tmp_path)
    kind = {"fifo": "a FIFO", "dir": "a directory"}.get(special, "a character device")
    with pytest.raises(ConfigError, match=f"is {kind}"):
        load_runs(path)
    result = CliRunner().invoke(cli, ["plot", path, "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and f"is {kind}" in result.output, result.output


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(ConfigError, match="over the 0 MiB gpuenv reads"):
        reader.read_bytes(big, what="the thing", max_bytes=1024)


def test_sim_state_that_is_a_device_or_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    for value, needle in (
        ("/dev/full", "is a character device"),
        (str(tmp_path / "no/such/dir/s.json"), "does not exist"),
    ):
        result = CliRunner().invoke(cli, ["--sim", "status"], env={"GPUENV_SIM_STATE": value})
        assert result.exit_code == 2, result.output
        assert needle in result.output and "GPUENV_SIM_STATE" in result.output
    assert not (tmp_path / "no").exists()
    assert not Path("/dev/full.lock").exists()


def test_a_damaged_calibration_names_its_field(tmp_path: Path) -> None:
    from gpuenv.clocks.calibration_store import load_calibration

    folder = tmp_path / "calibration"
    folder.mkdir()
    (folder / "GPU-1.json").write_text(
        json.dumps({"uuid": "GPU-1", "sustained_mhz": "fast", "measured_at": 1.0})
    )
    with pytest.raises(ConfigError, match='field sustained_mhz: "fast" is not a whole number'):
        load_calibration("GPU-1", state_dir=tmp_path)
    os.unlink(folder / "GPU-1.json")
    os.mkfifo(folder / "GPU-1.json")
    with pytest.raises(ConfigError, match="is a FIFO"):
        load_calibration("GPU-1", state_dir=tmp_path)


def test_a_daemon_config_that_is_a_fifo_or_binary_is_one_sentence(tmp_path: Path) -> None:
    from gpuenv.daemon.auth import load_config

    fifo = tmp_path / "conf"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO"):
        load_config(fifo)
    binary = tmp_path / "conf.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"conf.bin is not text .*not an image or archive"):
        load_config(binary)


def test_a_journal_record_that_is_a_fifo_is_damage_not_a_hang(tmp_path: Path) -> None:
    from gpuenv.clocks.journal import Journal, JournalDamaged

    journal = Journal(tmp_path)
    os.mkfifo(tmp_path / "GPU-0.json")
    with pytest.raises(JournalDamaged, match="is a FIFO"):
        journal.get("GPU-0")


def test_a_shells_process_substitution_is_read_once_and_a_named_fifo_still_refused(
    tmp_path: Path,
) -> None:
    # `gpuenv compare <(cat a.jsonl) <(cat b.jsonl)` was refused ("a FIFO, not a file")
    import shutil
    import subprocess
    import sys

    if shutil.which("bash") is None:
        pytest.skip("needs bash for process substitution")
    for name in ("a", "b"):
        out = str(tmp_path / f"{name}.jsonl")
        done = subprocess.run(
            [sys.executable, "-m", "gpuenv", "--sim", "run", "-o", out, "--", "true"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    cmd = f"{sys.executable} -m gpuenv compare <(cat a.jsonl) <(cat b.jsonl)"
    done = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "a: /dev/fd/" in done.stdout and "| (run) |" in done.stdout
    # a pipe is read to its end once; what it holds is judged as a file's would be
    r, w = os.pipe()
    os.write(w, (tmp_path / "a.jsonl").read_bytes())
    os.close(w)
    assert load_runs(f"/dev/fd/{r}")[0].measurements[0].name == "(run)"
    os.close(r)
