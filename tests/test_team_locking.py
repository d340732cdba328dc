"""The team-locking walk of docs/tutorials/shared-machine.md (step 4), as the page has it, on
the simulated GPU: root starts gpuenvd with the page's config, a real second account (made
with useradd, in the page's group) locks, looks, lists the leases and restores with the
page's commands, and root sees the same machine all along.

The page's commands and config are read from the page itself, so the walk cannot drift from
what a reader copies. What a reader never sets (where the socket, the journal and the
simulated machine live) is pointed at a temp dir here, as tests/docs_harness.py does.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import ROOT, _user_env, _user_python, local_users

from gpuenv.backend.sim import SimBackend
from gpuenv.daemon.client import daemon_available

PAGE = ROOT / "docs" / "tutorials" / "shared-machine.md"
GROUP = "gpuenv-team"  # stands for the page's gpubench ("a group you are in")


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block of the page, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def _walk() -> tuple[str, list[str], list[str]]:
    """The page's gpuenvd config, root's command that starts it, and the account's commands."""
    blocks = _blocks(PAGE.read_text())
    (config,) = [body for lang, body in blocks if lang == "ini"]
    root = [ln[2:] for _, body in blocks for ln in body.splitlines() if ln.startswith("# gpuenv")]
    user = [
        ln[2:]
        for lang, body in blocks
        if lang == "console" and "--sim lock --sm 1350 -i 0" in body
        for ln in body.splitlines()
        if ln.startswith("$ ")
    ]
    assert len(root) == 1 and "--sim daemon" in root[0], root
    assert user and all(cmd.startswith("gpuenv --sim ") for cmd in user), user
    return config.replace("gpubench", GROUP), shlex.split(root[0]), user


@pytest.fixture
def team() -> Iterator[pwd.struct_passwd]:
    """A second local account in the page's group (made here, and left as it was)."""
    (alice,) = local_users(1)
    if shutil.which("gpasswd") is None or shutil.which("groupadd") is None:
        pytest.skip("gpasswd / groupadd are not installed: cannot make the page's group")
    made = subprocess.run(["groupadd", "--system", GROUP], capture_output=True, text=True)
    if made.returncode not in (0, 9):  # 9: it exists
        pytest.skip(f"groupadd {GROUP} failed: {made.stderr.strip()}")
    try:
        subprocess.run(["gpasswd", "-a", alice.pw_name, GROUP], check=True, capture_output=True)
        yield alice
    finally:
        subprocess.run(["gpasswd", "-d", alice.pw_name, GROUP], capture_output=True)
        subprocess.run(["groupdel", GROUP], capture_output=True)


def test_the_team_locking_walk_runs_as_a_second_account(team: pwd.struct_passwd) -> None:
    config, root_cmd, user_cmds = _walk()
    work = Path(tempfile.mkdtemp(prefix="gpuenv-team-"))
    private = Path(tempfile.mkdtemp(prefix="gpuenv-team-root-"))
    work.chmod(0o755)  # the socket's and the simulated machine's: every account reaches them
    home = work / "home"
    home.mkdir()
    os.chown(home, team.pw_uid, team.pw_gid)
    (work / "gpuenvd.conf").write_text(config)
    where = {
        "GPUENV_SOCKET": str(work / "gpuenvd.sock"),
        "GPUENV_SIM_STATE": str(work / "gpuenv-sim.json"),
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    root_env = {**base, **where, "GPUENV_STATE_DIR": str(private / "journal")}
    root_env["PYTHONPATH"] = str(ROOT)
    user_env = {**_user_env(base), **where, "HOME": str(home)}
    python = _user_python(team) or sys.executable

    def as_user(cmd: str) -> subprocess.CompletedProcess[str]:
        argv = [python, "-m", "gpuenv", *shlex.split(cmd)[1:]]
        return subprocess.run(
            argv,
            cwd=home,
            env=user_env,
            capture_output=True,
            text=True,
            timeout=120,
            user=team.pw_uid,
            group=team.pw_gid,
            extra_groups=[grp.getgrnam(GROUP).gr_gid],
        )

    # before gpuenvd: the account may not change the simulated GPU's settings itself
    alone = as_user("gpuenv --sim lock --sm 1500")
    assert alone.returncode == 4 and "permission denied" in alone.stderr, alone.stderr
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuenv", *root_cmd[1:]],
        cwd=work,
        env=root_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    root_view = SimBackend(state_file=work / "gpuenv-sim.json")
    try:
        deadline = time.monotonic() + 30
        while not daemon_available(where["GPUENV_SOCKET"], timeout=2.0):
            assert daemon.poll() is None and time.monotonic() < deadline, daemon.stderr
            time.sleep(0.1)
        outputs = {}
        for cmd in user_cmds:
            done = as_user(cmd)
            assert done.returncode == 0, f"{cmd}: {done.stdout}{done.stderr}"
            outputs[shlex.split(cmd)[2]] = done.stdout + done.stderr
            if cmd.startswith("gpuenv --sim lock"):
                assert root_view.truth(0).locked_sm == (1350, 1350)  # root sees the lease
                assert "locked through gpuenvd" in outputs["lock"]
        # the account's status: the lock, held (the idle clock parks at it), and its holder
        assert re.search(r"\b1350/1980\b", outputs["status"]), outputs["status"]
        assert team.pw_name in outputs["status"]
        assert team.pw_name in outputs["daemon"]  # gpuenv daemon leases
        assert root_view.truth(0).locked_sm is None  # restore put it back
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        root_view.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
