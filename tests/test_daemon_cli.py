"""`gpuenv daemon` (serves), `gpuenv daemon leases`, `gpuenv daemon check-config`."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from daemon_harness import DaemonProcess

from gpuenv.cli import cli
from gpuenv.daemon.client import Client


@pytest.fixture
def sim_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    monkeypatch.setenv("GPUENV_SIM_GPUS", "2")
    return tmp_path


def test_check_config_says_who_may_lock_what(sim_env: Path) -> None:
    conf = sim_env / "gpuenvd.conf"
    conf.write_text("[lock]\nuser:alice = all\ngroup:bench = 1\n[admin]\ngroups = wheel\n")
    result = CliRunner().invoke(cli, ["daemon", "check-config", "--config", str(conf)])
    assert result.exit_code == 0, result.output
    assert "lock: user:alice -> 0, 1" in result.output
    assert "lock: group:bench -> 1" in result.output
    assert "admins: root, group:wheel" in result.output
    assert "mode 0666" in result.output


def test_check_config_needs_no_driver(tmp_path: Path) -> None:
    # it parses a file: on a machine without NVML it exited 12 (no driver) on a good one
    conf = tmp_path / "gpuenvd.conf"
    conf.write_text("[lock]\nuser:alice = all\ngroup:bench = 1\n")
    result = CliRunner().invoke(cli, ["daemon", "check-config", "--config", str(conf)])
    assert result.exit_code == 0, result.output
    assert "lock: user:alice -> all" in result.output and "lock: group:bench -> 1" in result.output
    assert "no NVIDIA driver here" in result.output


def test_check_config_shows_the_job_rule(sim_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = sim_env / "gpuenvd.conf"
    conf.write_text("[lock]\n* = job\ngroup:ops = job, 1\n")
    for args in (["--sim"], []):  # on the simulated GPU; on this one (the sim, by env)
        result = CliRunner().invoke(cli, [*args, "daemon", "check-config", "--config", str(conf)])
        assert result.exit_code == 0, result.output
        assert (
            "lock: * -> job (the GPUs of the caller's own running Slurm job; outside Slurm, "
            "the GPUs its process's device cgroup limits it to, cgroup v1 only)"
        ) in result.output
        assert "lock: group:ops -> 1, job (the GPUs" in result.output
        assert "job outside Slurm: " in result.output  # this machine's device cgroups
    monkeypatch.delenv("GPUENV_BACKEND")  # no driver here: the rule as written
    result = CliRunner().invoke(cli, ["daemon", "check-config", "--config", str(conf)])
    assert "lock: * -> job\n" in result.output and "lock: group:ops -> job, 1" in result.output
    assert "job outside Slurm" not in result.output  # not this machine's: the file's


def test_check_config_reports_a_bad_file_in_one_line(sim_env: Path) -> None:
    conf = sim_env / "gpuenvd.conf"
    conf.write_text("[lock]\nuser:alice = 9\n")
    result = CliRunner().invoke(cli, ["daemon", "check-config", "--config", str(conf)])
    assert result.exit_code == 2
    assert "names GPU 9, but this machine has 2" in result.output
    assert "Traceback" not in result.output


def test_leases_without_a_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["daemon", "leases", "--socket", str(tmp_path / "x.sock")])
    assert result.exit_code == 2
    assert "cannot reach gpuenvd" in result.output and "sudo gpuenv daemon" in result.output


def test_serve_and_list_leases(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "d", n_gpus=1)
    d.start()
    try:
        with Client(d.socket) as c, c.lock(sm=1350, gpus=[0], label="sweep"):
            result = CliRunner().invoke(cli, ["daemon", "leases", "--socket", d.socket])
        assert result.exit_code == 0, result.output
        me = pwd.getpwuid(os.getuid()).pw_name
        assert f"lease     {me} pid {os.getpid()}  GPU 0  SM 1350 MHz" in result.output
        assert "[sweep]" in result.output and "locked (SM 1350 MHz)" in result.output
        d.stop()  # SIGTERM: a clean stop, the socket goes away
        assert not os.path.exists(d.socket)
        assert "gpuenvd stopped" in d.log.read_text()
    finally:
        d.close()


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A directory no account may add a name to, root included (chattr +i)."""
    place = tmp_path / "sockets"
    place.mkdir()
    if os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(place)]).returncode != 0:
        pytest.skip("an immutable directory needs root and chattr")
    try:
        yield place
    finally:
        subprocess.run(["chattr", "-i", str(place)], check=True)


def test_a_socket_it_cannot_make_names_its_directory_not_a_temporary_name(
    sim_env: Path, unwritable: Path
) -> None:
    """gpuenvd binds in a private directory made beside the socket (a random name), then
    renames the socket out: an account that may not write there is told which directory,
    and what moves the socket, not `.sock.7d2515d4228431bf`."""
    result = CliRunner().invoke(cli, ["daemon", "--socket", str(unwritable / "sock")])
    assert result.exit_code == 4, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("gpuenv: error:")]
    assert f"gpuenvd's socket {unwritable}/sock: operation not permitted on {unwritable}:" in line
    assert "(--socket or GPUENV_SOCKET says where)" in line and ".sock." not in line
