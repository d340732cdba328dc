"""Root's lock, as every other account sees it: the notice beside gpuenvd's socket
(gpuenv/clocks/notice.py), read by `gpuenv status` and `gpuenv restore` of a second,
real account (made with useradd: tests/daemon_harness.py's `local_users`)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import local_users, run_as

from gpuenv.clocks import notice
from gpuenv.clocks.journal import Journal
from gpuenv.clocks.records import Applied, ClockState, JournalEntry, Owner

CLI = "from gpuenv.cli import main; main()"  # `gpuenv ARGS` for the account (`-c CODE ARGS`)
UUID = "GPU-00000000-0000-0000-0000-000000000001"


def _entry(kind: str = "standing") -> JournalEntry:
    state = ClockState(UUID, None, None, False, 1980, 2619, 700.0, True)
    return JournalEntry(
        uuid=UUID,
        index=0,
        name="GPU 0 (NVIDIA H100 80GB HBM3)",
        backend="sim",
        original=state,
        applied=Applied(locked_sm=(1350, 1350)),
        owners=(Owner.current(kind=kind, request="SM 1350 MHz", command="gpuenv lock --sm 1350"),),
    )


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("only root posts a notice of its lock (CI runs as root)")


def test_a_journal_record_is_posted_for_every_account_and_withdrawn_with_it(
    tmp_path: Path, as_root: None
) -> None:
    journal = Journal(tmp_path / "journal")
    journal.put(_entry())
    found = notice.read(UUID)
    assert found is not None
    path, data = found
    assert path.parent == notice.notice_dir() == Path(os.environ["GPUENV_SOCKET"]).parent / "locks"
    assert json.loads(data)["applied"]["locked_sm"] == [1350, 1350]
    assert path.stat().st_mode & 0o777 == 0o644  # readable by all, whatever the umask
    journal.remove(UUID)
    assert notice.read(UUID) is None


def test_a_notice_anyone_could_have_written_is_not_believed(tmp_path: Path, as_root: None) -> None:
    Journal(tmp_path / "journal").put(_entry())
    place = notice.notice_dir()
    place.chmod(0o777)  # anyone may plant or swap a notice here: none is read
    assert notice.read(UUID) is None
    place.chmod(0o755)
    (place / f"{UUID}.json").chmod(0o666)
    assert notice.read(UUID) is None


@pytest.fixture
def host() -> Iterator[tuple[pwd.struct_passwd, dict[str, str], dict[str, str]]]:
    """A second account, and root's and its environments on one simulated machine: the
    host's /tmp for the machine's file, root's socket directory (where the notices are),
    each account's own state directory."""
    (user,) = local_users(1)  # skips, with the reason, when not root or useradd is missing
    base = Path(tempfile.mkdtemp(prefix="gpuenv-notice-"))
    try:
        base.chmod(0o755)
        (base / "sim").mkdir(mode=0o1777)
        (base / "sim").chmod(0o1777)
        (base / "run").mkdir(mode=0o755)
        (base / "home").mkdir()
        os.chown(base / "home", user.pw_uid, user.pw_gid)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
        shared = {
            "GPUENV_SIM_STATE": str(base / "sim" / "gpuenv-sim.json"),
            "GPUENV_SOCKET": str(base / "run" / "gpuenv.sock"),  # no gpuenvd behind it
        }
        root = {**clean, **shared, "GPUENV_STATE_DIR": str(base / "root-state")}
        account = {
            **clean,
            **shared,
            "HOME": str(base / "home"),
            "GPUENV_STATE_DIR": str(base / "home" / "state"),
        }
        yield user, root, account
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _lock_column(table: str) -> str:
    """GPU 0's LOCK cell of `gpuenv status`'s table."""
    lines = table.splitlines()
    at = lines[1].index("LOCK")
    return lines[2][at:].split("  ")[0].strip()


def _root(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuenv", *args], env=env, capture_output=True, text=True
    )


def test_roots_local_lock_says_whose_it_is_and_who_can_release_it_to_another_account(
    host: tuple[pwd.struct_passwd, dict[str, str], dict[str, str]],
) -> None:
    user, root, account = host
    locked = _root(root, "--sim", "lock", "--sm", "1350")
    assert locked.returncode == 0, locked.stderr
    try:
        status = run_as(user, CLI, "--sim", "status", env=account)
        assert status.returncode == 0, status.stderr
        assert _lock_column(status.stdout) == "1350", status.stdout  # not "no (pinned?)"
        assert "pinned" not in status.stdout and "looks locked" not in status.stdout
        line = status.stdout.splitlines()[-1]
        assert "locked (SM 1350 MHz) by root's standing lock (" in line, line
        assert "--sim lock --sm 1350, since " in line, line
        assert "ask root" in line and "'gpuenv restore'" in line, line
        snap = json.loads(run_as(user, CLI, "--sim", "status", "--json", env=account).stdout)
        lock = snap["gpus"][0]["lock"]
        assert lock["state"] == "locked" and lock["sm_mhz"] == [1350, 1350] and lock["holds"]
        # the account's restore has nothing of its own to put back, and says whose it is
        mine = run_as(user, CLI, "--sim", "restore", env=account)
        assert mine.returncode == 0, mine.stderr
        assert "root's standing lock" in mine.stdout and "ask root" in mine.stdout
    finally:
        restored = _root(root, "--sim", "restore")
    assert restored.returncode == 0, restored.stderr
    after = run_as(user, CLI, "--sim", "status", env=account)
    assert _lock_column(after.stdout) == "no", after.stdout


def test_a_socket_directory_that_does_not_exist_is_not_made_for_a_notice(
    tmp_path: Path, as_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUENV_SOCKET", str(tmp_path / "typo" / "gpuenv.sock"))
    Journal(tmp_path / "journal").put(_entry())  # the lock itself is journaled as ever
    assert not (tmp_path / "typo").exists() and notice.read(UUID) is None
