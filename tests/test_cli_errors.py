"""Every bad input a sentence (gpuenv/cli/_common.py `guarded`): binary files, missing
directories, unknown image formats, a full or closed standard output, unwritable state,
Ctrl-C; each with its documented exit code, no traceback, no file or directory left."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli import cli
from gpuenv.clocks.journal import KEPT
from gpuenv.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def one_error(result, code: int, *needles: str) -> str:
    """The result exited `code` with one 'gpuenv: error:' line holding each needle."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("gpuenv: error: ")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def gpuenv(*args: str, tmp: Path, stdout=subprocess.PIPE, **env: str):
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-m", "gpuenv", *args],
        env=full,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=60,
        cwd=tmp,
        check=False,
    )


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results file 'gpuenv run' wrote on the simulated GPU (GPU 0 only)."""
    tmp = tmp_path_factory.mktemp("good")
    path = tmp / "good.jsonl"
    proc = gpuenv(
        "--sim",
        "run",
        "-o",
        str(path),
        "--",
        "true",
        tmp=tmp,
        GPUENV_STATE_DIR=str(tmp / "state"),
        GPUENV_SIM_STATE=str(tmp / "sim.json"),
    )
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture
def png(tmp_path: Path) -> Path:
    path = tmp_path / "run.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return path


# -- input files -------------------------------------------------------------------------------


def test_compare_and_plot_of_a_binary_file_say_it_is_not_a_results_file(png: Path) -> None:
    one_error(run("compare", str(png), str(png)), 2, str(png), "not a results file")
    one_error(run("plot", str(png)), 2, str(png), "not a results file")


def test_plot_into_a_missing_directory_creates_nothing(good_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "no" / "dir" / "x.png"
    one_error(run("plot", str(good_run), "-o", str(out)), 2, "does not exist", "mkdir -p")
    assert not (tmp_path / "no").exists()


def test_plot_to_an_unknown_format_names_the_ones_it_writes(good_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.bmpx"
    one_error(run("plot", str(good_run), "-o", str(out)), 2, "bmpx", ".png", ".svg")
    assert list(tmp_path.iterdir()) == []


def test_plot_of_a_gpu_the_run_did_not_measure_is_an_error(good_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    one_error(run("plot", str(good_run), "--gpu", "5", "-o", str(out)), 2, "GPU 5", "GPU 0")
    assert not out.exists()
    pytest.importorskip("matplotlib")
    assert run("plot", str(good_run), "--gpu", "0", "-o", str(out)).exit_code == 0
    assert out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_compare_fail_above_does_not_pass_when_nothing_matched(
    good_run: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text(good_run.read_text().replace('"name":"(run)"', '"name":"train"'))
    one_error(
        run("compare", str(good_run), str(other), "--fail-above", "0.05"), 2, "nothing was gated"
    )
    assert run("compare", str(good_run), str(good_run), "--fail-above", "0.05").exit_code == 0


# -- directories nobody asked for -----------------------------------------------------------------


def test_run_output_in_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out = tmp_path / "no" / "dir" / "r.jsonl"
    result = run("--sim", "run", "-o", str(out), "--", "touch", str(marker))
    one_error(result, 2, str(out.parent), "does not exist")
    assert not (tmp_path / "no").exists() and not marker.exists()


def test_daemon_socket_in_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    sock = tmp_path / "nonexistent-dir" / "x" / "y.sock"
    proc = gpuenv(
        "--sim",
        "daemon",
        "--socket",
        str(sock),
        tmp=tmp_path,
        GPUENV_STATE_DIR=str(tmp_path / "state"),
        GPUENV_SIM_STATE=str(tmp_path / "sim.json"),
    )
    assert proc.returncode == 2, proc.stderr
    assert b"does not exist" in proc.stderr and b"Traceback" not in proc.stderr
    assert not (tmp_path / "nonexistent-dir").exists()


# -- flags ---------------------------------------------------------------------------------------


def test_sim_and_dry_run_are_accepted_after_the_command() -> None:
    assert run("status", "--sim").exit_code == 0
    result = run("lock", "--sm", "1350", "--sim", "--dry-run")
    assert result.exit_code == 0 and "dry run: nothing was changed" in result.output
    result = run("run", "--sim", "--dry-run", "--", "true")
    assert result.exit_code == 0 and "would run: true" in result.output


@pytest.mark.parametrize("where", ["before", "after"])
def test_sim_reaches_the_command_run_wraps(tmp_path: Path, where: str) -> None:
    # `--sim` is GPUENV_BACKEND=sim, for what `gpuenv run` starts too: the wrapped program
    # opens the simulated GPU, where it used to get no backend and die of NvmlUnavailable
    child = "import gpuenv.backend as b; print('child sees', b.open_backend().device_info(0).name)"
    flags = ["--sim", "run", "-q"] if where == "before" else ["run", "--sim", "-q"]
    proc = gpuenv(*flags, "--", sys.executable, "-c", child, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert b"child sees " in proc.stdout, proc.stdout


def test_run_writes_one_run_per_file_and_a_failed_command_is_no_ok(tmp_path: Path) -> None:
    from gpuenv.results import load_runs

    out = tmp_path / "run.jsonl"
    fails = [sys.executable, "-c", "raise SystemExit(3)"]
    proc = gpuenv("--sim", "run", "-q", "-o", str(out), "--", *fails, tmp=tmp_path)
    assert proc.returncode == 3, proc.stderr
    (run,) = load_runs(out)
    whole = run.measurements[0]  # "(run)": its verdict says the command failed
    assert whole.verdict != "ok" and [f.kind for f in whole.findings] == ["command_failed"]
    assert "the command exited 3" in whole.findings[0].message
    # a second run into the same file is refused before the command runs
    marker = tmp_path / "ran"
    touch = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    proc = gpuenv("--sim", "run", "-q", "-o", str(out), "--", *touch, tmp=tmp_path)
    assert proc.returncode == 2 and not marker.exists(), proc.stderr
    assert b"already holds results: -o writes one run per file" in proc.stderr
    assert b"--append" in proc.stderr and b"Traceback" not in proc.stderr
    proc = gpuenv("--sim", "run", "-q", "--append", "-o", str(out), "--", *touch, tmp=tmp_path)
    assert proc.returncode == 0 and marker.exists(), proc.stderr
    assert [r.measurements[0].verdict for r in load_runs(out)] == ["annotated", "ok"]
    # a reader of a file that holds several runs takes the last and says so
    proc = gpuenv("plot", str(out), "-o", str(tmp_path / "run.png"), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert b"gpuenv: warning: " in proc.stderr and b"holds 2 runs" in proc.stderr


def test_monitor_refuses_json_and_csv_together() -> None:
    one_error(run("--sim", "monitor", "--json", "--csv", "-n", "1"), 2, "--json and --csv")


def test_ctrl_c_during_calibrate_exits_130_not_the_unsettled_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpuenv.clocks.calibration as calibration

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration, "calibrate", interrupted)
    result = run("--sim", "calibrate", "--duration", "1")
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "Traceback" not in result.output


# -- standard output and state directories that fail ---------------------------------------------


@pytest.mark.parametrize(
    "args", [["status", "--json"], ["monitor", "--json", "-n", "1"]], ids=["status", "monitor"]
)
def test_a_full_standard_output_is_a_sentence(args: list[str], tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        proc = gpuenv(
            "--sim", *args, tmp=tmp_path, stdout=full, GPUENV_SIM_STATE=str(tmp_path / "sim.json")
        )
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("gpuenv: error: cannot write to standard output")
    assert b"Traceback" not in proc.stderr and proc.stderr.count(b"\n") == 1


def test_a_closed_pipe_exits_141_quietly(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPUENV_SIM_STATE=str(tmp_path / "sim.json"))
    script = f"{sys.executable} -m gpuenv --sim status --json -i 0,0,0,0,0,0,0,0,0,0 | head -c 1"
    proc = subprocess.run(
        ["bash", "-c", script + "; echo ${PIPESTATUS[0]} >&2"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    code = int(proc.stderr.decode().strip().splitlines()[-1])
    assert code in (0, 141)  # 0 when everything fitted in the pipe before head left
    assert b"Traceback" not in proc.stderr and b"Exception ignored" not in proc.stderr


def _unwritable(tmp_path: Path) -> tuple[Path, int]:
    """A directory this process cannot write in, and the exit code that refusal gets: 4
    (no permission) where the kernel says EACCES/EPERM, 2 where it says EROFS."""
    if os.geteuid() == 0:
        path = Path("/sys/gpuenv-test")  # refuses even root
    else:
        path = tmp_path / "ro"
        path.mkdir()
        path.chmod(0o555)
    try:
        (path / "probe").mkdir(parents=True)
    except OSError as err:
        return path, 4 if err.errno in (errno.EACCES, errno.EPERM) else 2
    pytest.skip(f"{path} is writable here")


def test_an_unwritable_state_dir_refuses_the_lock_and_names_the_variable(tmp_path: Path) -> None:
    base, code = _unwritable(tmp_path)
    env = {"GPUENV_STATE_DIR": str(base / "state"), "GPUENV_SIM_STATE": str(tmp_path / "sim.json")}
    line = one_error(run("--sim", "lock", "--sm", "1350", env=env), code, "GPUENV_STATE_DIR")
    assert str(base) in line


def test_an_unwritable_sim_state_dir_names_the_sim_state_variable(tmp_path: Path) -> None:
    folder, code = _unwritable(tmp_path)
    if os.geteuid() == 0:
        folder = folder.parent  # /sys exists: a state file there cannot be made
    env = {"GPUENV_SIM_STATE": str(folder / "sim.json")}
    one_error(run("--sim", "status", env=env), code, "GPUENV_SIM_STATE")


def test_a_file_size_limit_fails_the_lock_before_any_setting_changes(tmp_path: Path) -> None:
    import resource

    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        GPUENV_STATE_DIR=str(tmp_path / "state"),
        GPUENV_SIM_STATE=str(tmp_path / "sim.json"),
        GPUENV_SIM_GPUS="1",
    )
    base = [sys.executable, "-m", "gpuenv", "--sim"]
    subprocess.run(
        [*base, "lock", "--power-limit", "650"], env=env, check=True, capture_output=True
    )
    subprocess.run([*base, "restore"], env=env, check=True, capture_output=True)
    before = subprocess.run([*base, "status", "--json"], env=env, capture_output=True).stdout

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (700, 700))

    proc = subprocess.run(
        [*base, "lock", "--sm", "1350", "--power-limit", "500"],
        env=env,
        capture_output=True,
        preexec_fn=limit,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert b"size limit" in proc.stderr and b"Traceback" not in proc.stderr
    after = subprocess.run([*base, "status", "--json"], env=env, capture_output=True).stdout
    assert _settings(after) == _settings(before)
    own = (".lock", ".lock-private")  # the journal's lock file
    state = tmp_path / "state"  # no record, no temporary file (the kept originals' included)
    assert not [p for p in state.rglob("*") if p.name not in own and not p.is_dir()]


def _settings(status_json: bytes) -> list[tuple[object, ...]]:
    import json

    return [
        (g["lock"]["state"], g["power_limit_w"], g["sm_mhz"])
        for g in json.loads(status_json)["gpus"]
    ]


# -- a lost journal --------------------------------------------------------------------------------


def test_a_deleted_journal_is_seen_and_restore_defaults_resets(tmp_path: Path) -> None:
    env = {
        "GPUENV_STATE_DIR": str(tmp_path / "state"),
        "GPUENV_SIM_STATE": str(tmp_path / "sim.json"),
    }
    assert run("--sim", "lock", "--sm", "1350", "--power-limit", "500", env=env).exit_code == 0
    state = tmp_path / "state"
    for p in [*state.glob("GPU-*"), *(state / KEPT).glob("GPU-*")]:
        p.unlink()  # as the old error message advised, and the original kept at lock time
    status = run("--sim", "status", env=env)
    assert "no (pinned?)" in status.output and "restore --defaults" in status.output
    result = run("--sim", "restore", env=env)
    # both copies gone: nothing of gpuenv's to put back, so restore changes nothing and exits
    # 0 (issue 31: it can be run any number of times), but it says what it saw (issue 21)
    # and what would help
    assert result.exit_code == 0, result.output
    assert "nothing to restore" in result.output and "looks locked" in result.output
    assert "left as it is: GPU 0" in result.output and "no journal record" in result.output
    assert "power limit 500 W (default 700 W)" in result.output
    assert "'gpuenv restore --defaults -i 0' would: reset locked clocks" in result.output
    result = run("--sim", "restore", "--defaults", env=env)
    assert result.exit_code == 0, result.output
    assert "reset to driver defaults" in result.output
    assert "not necessarily what was there" in result.output
    status = run("--sim", "status", "--json", env=env)
    assert '"pinned": false' in status.output and '"power_limit_w": 700.0' in status.output


def test_a_damaged_record_of_gpu_1_blocks_only_gpu_1(tmp_path: Path) -> None:
    env = {
        "GPUENV_STATE_DIR": str(tmp_path / "state"),
        "GPUENV_SIM_STATE": str(tmp_path / "sim.json"),
        "GPUENV_SIM_GPUS": "2",
    }
    assert run("--sim", "lock", "--sm", "1350", env=env).exit_code == 0
    status = run("--sim", "status", "--json", env=env).output
    uuid1 = re.findall(r'"uuid": "(GPU-[^"]+)"', status)[1]
    kept = tmp_path / "state" / KEPT / f"{uuid1}.json"
    for p in [*(tmp_path / "state").glob(f"{uuid1}*"), kept]:
        p.write_text('{"version": 2, "uuid": "' + uuid1 + '", "orig')
    doctor = run("--sim", "doctor", "--json", env=env).output
    assert "is damaged" in doctor and "restore --defaults" in doctor
    result = run("--sim", "restore", "-i", "0", env=env)
    assert result.exit_code == 0 and "restored GPU 0" in result.output
    line = one_error(run("--sim", "restore", env=env), 2, "damaged", "restore --defaults")
    assert uuid1 in line
    result = run("--sim", "restore", "-i", "1", "--defaults", env=env)
    assert result.exit_code == 0 and "GPU 1" in result.output
    assert run("--sim", "restore", env=env).output.startswith("nothing to restore")


# -- the table ------------------------------------------------------------------------------------


def test_every_exit_code_is_in_the_documented_table() -> None:
    readme = (ROOT / "docs" / "reference" / "exit-codes.md").read_text()  # the README's, moved
    table = readme[
        readme.index("<!-- section:exit-codes -->") : readme.index("<!-- /section:exit-codes -->")
    ]
    for code in EXIT_CODES:
        assert re.search(rf"^\| {code} \|", table, re.M), f"exit code {code} not in the table"
