"""One way to take a lock (gpuenv/locking.py), end to end as a real unprivileged account.

gpuenvd runs as root on the simulated GPU (a socket and state file in a shared
temp dir); a system user made with `useradd` uses every door: `gpuenv lock`,
`gpuenv status`, `gpuenv restore`, `gpuenv run --sm`, `gpuenv check --sm`,
`gpuenv.lock()` with `gpuenv.restore()`, and `stable(sm=)`. Each lock must show in status
and be put back at every normal and abnormal end (SIGKILL of the client).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from server_harness import wait_for

from gpuenv.backend.sim import SimBackend
from gpuenv.locking import daemon_client, lock_ranges

USER = f"gpuenvt{os.getpid() % 100000}"
ROOT = Path(__file__).resolve().parent.parent
PYTHON: list[str] = [sys.executable]  # the interpreter the account runs (see _user_python)


def cli(*args: str) -> list[str]:
    return [PYTHON[0], "-c", "from gpuenv.cli import main; main()", *args]


def py(code: str) -> list[str]:
    return [PYTHON[0], "-c", code]


@pytest.fixture(scope="module")
def account() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create an unprivileged account with useradd (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", USER],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        who = pwd.getpwnam(USER)
        python = _user_python(who)
        if python is None:
            pytest.skip(f"no Python that imports gpuenv is readable by the account {USER}")
        PYTHON[:] = [python]
        yield who
    finally:
        subprocess.run(["userdel", USER], capture_output=True)


def _user_python(who: pwd.struct_passwd) -> str | None:
    """This interpreter if the account can run it, else the system's of the same version
    (a pyenv under /root is out of its reach), with this checkout and its packages."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        try:
            probe = subprocess.run(
                [exe, "-c", "import gpuenv.cli, click, psutil"],
                user=who.pw_uid,
                group=who.pw_gid,
                extra_groups=[],
                capture_output=True,
                env={"HOME": "/tmp", "PYTHONPATH": _pythonpath()},
            )
        except OSError:  # not there, or not executable by the account
            continue
        if probe.returncode == 0:
            return exe
    return None


def _pythonpath() -> str:
    paths = [str(ROOT), *site.getsitepackages()]
    return os.pathsep.join(p for p in (*paths, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture
def daemon(account: pwd.struct_passwd) -> Iterator[DaemonProcess]:
    shared = Path(tempfile.mkdtemp(prefix="gpuenvd-user-"))
    shared.chmod(0o755)
    d = DaemonProcess(shared, n_gpus=1, config=f"[lock]\nuser:{USER} = all\n")
    # the user's side of the simulated GPU reads (and advances) the same state file
    sim = shared / "sim.json"
    for path in (sim, sim.with_name(sim.name + ".lock")):
        path.touch()
        path.chmod(0o666)
    shared.chmod(0o777)
    # root's journal never lives in a directory every account may write: gpuenv refuses one
    # (another account could swap in records of its choosing)
    private = Path(tempfile.mkdtemp(prefix="gpuenvd-journal-"))
    private.chmod(0o755)  # the account's home is made in it too (_env)
    d.env["GPUENV_STATE_DIR"] = str(private / "journal")
    try:
        d.start()
        yield d
    finally:
        d.close()
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _env(d: DaemonProcess, account: pwd.struct_passwd) -> dict[str, str]:
    home = Path(d.env["GPUENV_STATE_DIR"]).parent / "home"  # not in the 0777 directory
    home.mkdir(exist_ok=True)
    os.chown(home, account.pw_uid, account.pw_gid)
    return {
        **d.env,
        "HOME": str(home),
        "GPUENV_SIM_ROOT": "0",  # this account may not write GPU settings itself
        "GPUENV_STATE_DIR": str(home / "state"),
        "PYTHONPATH": _pythonpath(),
    }


def _as(account: pwd.struct_passwd, d: DaemonProcess) -> dict[str, Any]:
    """subprocess keywords that run a command as `account` in its environment."""
    return {
        "env": _env(d, account),
        "user": account.pw_uid,
        "group": account.pw_gid,
        "extra_groups": [],
        "text": True,
    }


def as_user(
    d: DaemonProcess, account: pwd.struct_passwd, argv: list[str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, timeout=120, **_as(account, d))


def python_as_user(d: DaemonProcess, account: pwd.struct_passwd, body: str) -> str:
    """Run `body` as the account (with `gpuenv` imported and `locked_sm()` reading the
    simulated GPU's locked range); its stdout."""
    head = (
        "import gpuenv\n"
        "from gpuenv.backend.sim import SimBackend\n"
        "def locked_sm():\n"
        "    return SimBackend.from_env().truth(0).locked_sm\n"
    )
    out = as_user(d, account, py(head + body))
    assert out.returncode == 0, out.stderr
    return out.stdout


def start_as_user(d: DaemonProcess, account: pwd.struct_passwd, argv: list[str]) -> Any:
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **_as(account, d),
    )


def locked(d: DaemonProcess) -> object:
    return d.truth(0)[0]


def assert_released_on_sigkill(
    d: DaemonProcess, account: pwd.struct_passwd, argv: list[str]
) -> None:
    """Start `argv` as the account, wait for its lock, SIGKILL it: the GPU comes back."""
    proc = start_as_user(d, account, argv)
    try:
        assert wait_for(lambda: locked(d) == (1350, 1350), timeout=20.0), proc.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the client and anything it started
        proc.wait(timeout=10)
    assert d.wait_pristine(timeout=5.0) is not None


def test_cli_lock_shows_in_status_and_restore_puts_it_back(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    out = as_user(daemon, account, cli("lock", "--sm", "1350"))
    assert out.returncode == 0, out.stderr
    assert locked(daemon) == (1350, 1350)
    assert "locked through gpuenvd" in out.stdout and "until 'gpuenv restore'" in out.stdout
    status = as_user(daemon, account, cli("status"))
    assert status.returncode == 0, status.stderr
    assert "1350" in status.stdout and USER in status.stdout
    back = as_user(daemon, account, cli("restore"))
    assert back.returncode == 0, back.stderr
    assert "restored GPU 0" in back.stdout
    assert daemon.wait_pristine(timeout=5.0) is not None
    assert "granted standing lease" in daemon.log.read_text()


def test_run_sm_locks_for_the_command_and_releases_at_its_end_or_death(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    probe = (
        "from gpuenv.backend.sim import SimBackend; import os; "
        "print('LOCKED', SimBackend.from_env().truth(0).locked_sm)"
    )
    out = as_user(daemon, account, cli("run", "-q", "--sm", "1350", "--", PYTHON[0], "-c", probe))
    assert out.returncode == 0, out.stderr
    assert "LOCKED (1350, 1350)" in out.stdout
    assert daemon.wait_pristine(timeout=5.0) is not None
    # SIGKILL of 'gpuenv run' itself: its connection closes, the daemon restores
    assert_released_on_sigkill(
        daemon, account, cli("run", "-q", "--sm", "1350", "--", "sleep", "60")
    )


def test_check_sm_locks_through_the_daemon_for_the_check_only(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    out = as_user(daemon, account, cli("check", "--sm", "1350", "--alone-only", "--json"))
    assert out.returncode == 0, out.stderr
    assert "locked SM 1350 MHz for the check" in out.stderr
    assert "the lock is released; the GPUs are as before" in out.stderr
    assert "not kept for gpuenvd's gauges: only root's check is" in out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert gpus and all(round(g["alone"]["sm_mhz"]) == 1350 for g in gpus)
    assert daemon.wait_pristine(timeout=5.0) is not None
    assert "granted" in daemon.log.read_text()


def test_python_lock_then_restore_as_in_the_readme(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    out = python_as_user(
        daemon,
        account,
        "lk = gpuenv.lock(sm='base')\n"
        "print('HELD', locked_sm(), lk.gpus)\n"
        "print('RESTORED', gpuenv.restore())\n"
        "print('AFTER', locked_sm())\n",
    )
    assert "HELD None" not in out and "HELD (" in out
    assert "RESTORED [0]" in out and "AFTER None" in out
    assert daemon.pristine()


def test_python_lock_and_stable_are_released_when_the_process_is_killed(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    code = "import gpuenv, time\nlk = gpuenv.lock(sm=1350)\ntime.sleep(60)\n"
    assert_released_on_sigkill(daemon, account, py(code))
    code = "import gpuenv, time\nwith gpuenv.stable(sm=1350):\n    time.sleep(60)\n"
    assert_released_on_sigkill(daemon, account, py(code))


def test_stable_locks_through_the_daemon_and_judges_against_the_lock(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    out = python_as_user(
        daemon,
        account,
        "import warnings\n"
        "warnings.simplefilter('error')\n"  # an ObserveOnlyWarning fails: it must lock
        "with gpuenv.stable(sm=1350, mode='burst') as env:\n"
        "    print('LOCKED', env.locked, locked_sm())\n"
        "    print('RANGES', env._lock_ranges())\n"
        "print('AFTER', locked_sm())\n",
    )
    assert "LOCKED True (1350, 1350)" in out
    assert "RANGES {0: (1350, 1350)}" in out and "AFTER None" in out
    assert daemon.pristine()


def test_root_goes_through_the_daemon_too(daemon: DaemonProcess) -> None:
    """One authority: root's lock is a lease the daemon lists, not a lock beside it."""
    import gpuenv

    backend = SimBackend("h100", n_gpus=1, state_file=daemon.workdir / "sim.json")
    try:
        client = daemon_client(backend, socket=daemon.socket)
        assert client is not None
        client.close()
        with gpuenv.lock(1350, backend=backend, socket=daemon.socket) as lk:
            assert lock_ranges(lk, backend) == {0: (1350, 1350)}
            assert "via gpuenvd" in daemon.log.read_text() or "granted" in daemon.log.read_text()
            assert locked(daemon) == (1350, 1350)
        assert daemon.wait_pristine(timeout=5.0) is not None
    finally:
        backend.close()


def test_calibrate_then_lock_sustained_uses_the_users_own_calibration(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    """'gpuenv calibrate' as the user saves to their state dir; the daemon has none."""
    code = (
        "from gpuenv.backend.sim import SimBackend\n"
        "from gpuenv.clocks import save_calibration\n"
        "save_calibration(SimBackend.from_env().device_info(0).uuid, 1380)\n"
    )
    assert as_user(daemon, account, py(code)).returncode == 0
    out = as_user(daemon, account, cli("lock", "--sm", "sustained"))
    assert out.returncode == 0, out.stderr
    assert locked(daemon) == (1380, 1380)
    assert as_user(daemon, account, cli("restore")).returncode == 0
    assert daemon.wait_pristine(timeout=5.0) is not None


def test_the_readme_daemon_config_passes_check_config_on_the_default_machine(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner
    from docs_harness import find_block

    from gpuenv.cli import cli as main_cli

    block = find_block("ini", "# /etc/gpuenv/gpuenvd.conf\n").text
    import grp

    config = tmp_path / "gpuenvd.conf"
    config.write_text(block)
    args = ["--sim", "daemon", "check-config", "--config", str(config)]
    if "gpubench" not in {g.gr_name for g in grp.getgrall()}:
        # what the daemon would refuse at start, check-config refuses too (it approved it)
        res = CliRunner().invoke(main_cli, args)
        assert res.exit_code == 2 and "socket_group 'gpubench' does not exist" in res.output
        config.write_text(block.replace("socket_group = gpubench", "socket_group = root"))
    res = CliRunner().invoke(main_cli, args)
    assert res.exit_code == 0, res.output
    assert "lock: group:gpubench -> 0" in res.output and "lock: user:alice -> 0" in res.output


def test_a_conflict_tells_a_user_what_they_can_do(
    daemon: DaemonProcess, account: pwd.struct_passwd
) -> None:
    """--force is for admins: the hint a user gets must work when followed."""
    as_root = [sys.executable, "-c", "from gpuenv.cli import main; main()"]
    held = subprocess.run([*as_root, "lock", "--sm", "1500"], env=daemon.env, capture_output=True)
    assert held.returncode == 0  # root's standing lease
    out = as_user(daemon, account, cli("lock", "--sm", "1350"))
    assert out.returncode == 5 and "--force" not in out.stderr
    assert "share it" in out.stderr and "'gpuenv restore --all'" in out.stderr
    same = as_user(daemon, account, cli("lock", "--sm", "1500"))  # following the hint works
    assert same.returncode == 0 and "now shared" in same.stdout, same.stderr
    assert subprocess.run([*as_root, "restore", "--all"], env=daemon.env).returncode == 0
    assert daemon.wait_pristine(timeout=5.0) is not None


@pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to give the socket to root and run as nobody"
)
def test_a_socket_closed_to_this_account_names_its_group_and_how_to_join() -> None:
    # gpuenvd runs, its socket is open to a group this user is not in: the user was told
    # "have an admin start gpuenvd", which sends them the wrong way
    import grp
    import socket

    from daemon_harness import run_as, shared_workdir

    nobody = pwd.getpwnam("nobody")
    work = shared_workdir()
    srv = socket.socket(socket.AF_UNIX)
    try:
        path = work / "gpuenv.sock"
        srv.bind(str(path))
        srv.listen()
        os.chown(path, 0, 0)
        path.chmod(0o660)
        group = grp.getgrgid(0).gr_name
        code = (
            "import sys\nfrom gpuenv.backend.sim import SimBackend\n"
            "from gpuenv.locking import daemon_client\ntry:\n"
            "    daemon_client(SimBackend('h100'), socket=sys.argv[1])\n"
            "except Exception as err:\n    print(type(err).__name__, err, '|', err.hint)\n"
        )
        out = run_as(nobody, code, str(path), env=dict(os.environ)).stdout
    finally:
        srv.close()
        shutil.rmtree(work)
    assert out.startswith("PermissionDenied permission denied on gpuenvd's socket"), out
    assert f"open to the group '{group}', and nobody is not in it" in out
    assert f"sudo usermod -aG {group} nobody" in out and "start gpuenvd" not in out


def test_restoring_a_gpu_releases_no_lock_this_process_holds_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # locking._HELD was matched by GPU index: restoring GPU 0 of one machine released this
    # process's lock on another machine's GPU 0, whose clock then moved under its benchmark
    from gpuenv.clocks.journal import Journal
    from gpuenv.locking import acquire, restore
    from gpuenv.timebase import VirtualClock

    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "state"))
    none = tmp_path / "no.sock"  # no gpuenvd: restored locally, in the state dir above
    mine = SimBackend(clock=VirtualClock(), seed=1)
    other = SimBackend(clock=VirtualClock(), seed=2)
    held = acquire(1350, backend=mine, journal=Journal(tmp_path / "journal"), supervise=False)
    try:
        assert restore([0], backend=other, socket=none) == []
        assert not held.released and mine.truth(0).locked_sm == (1350, 1350)
        assert restore([0], backend=mine, socket=none) == [0]
        assert held.released and mine.truth(0).locked_sm is None
    finally:
        if not held.released:
            held.release()
