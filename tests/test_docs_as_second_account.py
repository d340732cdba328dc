"""README.md, every tutorial and every other page run as written by a second, ordinary
account (issue 32's "Done when": as root and as a second account). tests/test_docs_examples.py
runs every page as this process's account (root in CI); here the same harness runs them as a
real account made with useradd (tests/daemon_harness.py's `local_users`), in a directory it
owns, with its own Python importing gpuenv from this checkout, on a simulated machine that
root's blocks and the account's share, as a host's /tmp/gpuenv-sim.json is shared.

A block that an ordinary account cannot run as written (it writes the GPU's settings
without gpuenvd) carries `<!-- as root: REASON -->` and says "as root" in the prose above
it, so that the reader sees it; the harness runs it as root. Any other block that needs root
fails here, as it fails for the reader.

The README's two commands (its Quick start block, which the page harness does not run: it
makes a venv and installs) run here too, as the account, in a fresh clone of the committed
checkout that the account owns: the main job whole, the test command on a quick part.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import docs_harness as dx
import pytest
from daemon_harness import _user_python, as_user, local_users

PAGES = dx.markdown_files()  # README.md, then every page of docs/


@pytest.fixture
def account() -> pwd.struct_passwd:
    (user,) = local_users(1)  # skips, with the reason, when not root or useradd is missing
    return user


def _ids(path: Path) -> str:
    return str(path.relative_to(dx.ROOT))


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_the_page_runs_as_a_second_account(path: Path, account: pwd.struct_passwd) -> None:
    result = dx.run_file(path, user=account)
    assert not result.failures, "\n".join(str(f) for f in result.failures)
    if result.skipped:
        pytest.skip(f"the other blocks ran; not run here: {'; '.join(result.skipped)}")


def test_a_tutorial_block_that_needs_root_fails_unmarked(
    tmp_path: Path, account: pwd.struct_passwd
) -> None:
    # the shared-machine tutorial without its markers: its root steps fail as the account
    page = tmp_path / "shared-machine.md"
    text = (dx.ROOT / "docs" / "tutorials" / "shared-machine.md").read_text()
    page.write_text("\n".join(ln for ln in text.split("\n") if "<!-- as root:" not in ln))
    result = dx.run_file(page, tmp_path, user=account)
    assert result.failures, "the unmarked root steps ran as the account"
    assert any("exited 4" in f.what and "permission denied" in f.what for f in result.failures), (
        result.failures
    )
    # as root (the page-as-root run) the same unmarked page passes
    assert dx.run_file(page, tmp_path).failures == []


def _page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_blocks_run_as_the_account_and_marked_ones_as_root_on_one_machine(
    tmp_path: Path, account: pwd.struct_passwd
) -> None:
    sim = "from gpuenv.backend.sim import SimBackend\nimport os\n"
    truth = "SimBackend(state_file=os.environ['GPUENV_SIM_STATE']).truth(0).locked_sm"
    page = _page(
        tmp_path,
        f"```python\nimport os\nassert os.geteuid() == {account.pw_uid}, os.geteuid()\n"
        f"{sim}assert {truth} is None\n```\n\n"  # 1: the account, a fresh machine
        "As root:\n\n<!-- as root: locks -->\n```console\n"
        "$ test $(id -u) = 0\n$ gpuenv --sim lock --sm 1350\n```\n\n"  # 8: root locks
        f"```python\n{sim}assert {truth} == (1350, 1350), {truth}\n```\n\n"  # 13: seen
        '```console\n$ gpuenv --sim lock --sm 1500; echo "exit $?"\nexit 4\n'  # 18: no
        "$ touch mine\n```\n\n"  # settings for the account; its own directory, yes
        "Then as root again:\n\n<!-- as root: restores -->\n```bash\n"
        "gpuenv --sim restore\n```\n",  # 26
    )
    result = dx.run_file(page, tmp_path, user=account)
    assert result.failures == [], result.failures
    # the next run starts on a fresh machine of its own: block 1 sees no lock again
    assert dx.run_file(page, tmp_path, user=account).failures == []
    # a lock left by a root block is found in root's journal
    left = _page(
        tmp_path, "As root:\n\n<!-- as root: locks -->\n```bash\ngpuenv --sim lock --sm 1350\n```\n"
    )
    (failure,) = dx.run_file(left, tmp_path, user=account).failures
    assert "left a lock" in failure.what


def test_an_as_root_marker_must_be_said_in_the_prose(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "Lock it:\n\n<!-- as root: locks -->\n```bash\ngpuenv --sim lock\n```\n\n"
        "Lock it, as root:\n<!-- as root: locks -->\n```bash\ngpuenv --sim lock\n```\n\n"
        "As root:\n\n<!-- as root: -->\n```bash\ngpuenv --sim lock\n```\n",
    )
    first, second, third = dx.blocks(page, tmp_path)
    with pytest.raises(dx.ConventionError, match="say 'as root' in the prose"):
        first.kind()
    assert second.kind() == "bash" and second.as_root()
    with pytest.raises(dx.ConventionError, match=r"write `<!-- as root: REASON -->`"):
        third.kind()
    assert not dx.Block("p.md", 1, "bash", "x\n").as_root()


# The test command's quick part: the README's `pytest` runs them all (minutes on 2 cores;
# CI's stage 1 runs it whole, as root); these show the account's clone and venv test, and
# that the suite's locks work for an ordinary account (on each test's own simulated machine:
# 51 tests failed so when the suite was run whole as one, tests/test_cli_lock.py among them)
QUICK_TESTS = (
    "tests/test_cli.py",
    "tests/test_status.py",
    "tests/test_sim_reads.py",
    "tests/test_cli_lock.py",
)
# what pip says when no package index answers (tests/test_packaging.py's list)
OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Could not fetch URL",
)


def _quick_start() -> list[str]:
    """The README's two commands, from its Quick start block, as a reader copies them."""
    (block,) = [b for b in dx.blocks(dx.ROOT / "README.md") if "# 1. the main job" in b.text]
    return [c.text for c in dx.commands(block)]


def _as_account(
    user: pwd.struct_passwd, command: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`command` in a fresh bash as `user`: skipped, saying so, where it needs a package
    index that does not answer."""
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        **as_user(user),
    )
    text = done.stdout + done.stderr
    offline = [s for s in OFFLINE if s in text]
    if done.returncode != 0 and offline:
        pytest.skip(f"{command!r} needs a package index, and none answers ({offline[0]})")
    return done


@pytest.mark.slow
def test_the_readmes_two_commands_run_as_a_second_account_on_a_fresh_clone(
    account: pwd.struct_passwd,
) -> None:
    """A fresh clone the account owns, its own venv: the main job (`gpuenv demo`) whole, and
    the test command with a quick part of the tests."""
    main_job, tests = _quick_start()
    assert main_job.endswith("&& gpuenv demo") and tests.endswith("&& pytest"), (main_job, tests)
    if shutil.which("git") is None:
        pytest.skip("git is not installed: no fresh clone to make")
    python = _user_python(account)
    assert python is not None  # local_users skips otherwise
    base = Path(tempfile.mkdtemp(prefix="gpuenv-readme-"))
    try:
        base.chmod(0o755)
        clone, home, bindir = base / "gpuenv", base / "home", base / "bin"
        subprocess.run(["git", "clone", "-q", str(dx.ROOT), str(clone)], check=True)
        home.mkdir()
        bindir.mkdir()
        (bindir / "python3").symlink_to(python)  # the reader's python3, one it may run
        for where, _, names in os.walk(base):
            for name in [where, *(os.path.join(where, n) for n in names)]:
                os.chown(name, account.pw_uid, account.pw_gid, follow_symlinks=False)
        env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "USER": account.pw_name,
            "LOGNAME": account.pw_name,
            # pip's own settings, as the runner has them; no bytecode compiled at install
            # and no version check (seconds of each run, nothing the reader's commands test)
            "PIP_NO_COMPILE": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
            # the page harness's isolation, not what a reader sets: this run's own simulated
            # machine, journal and (absent) gpuenvd, so that runs side by side do not meet
            "GPUENV_SIM_STATE": str(home / "gpuenv-sim.json"),
            "GPUENV_STATE_DIR": str(home / "state"),
            "GPUENV_SOCKET": str(home / "no-daemon.sock"),
        }
        demo = _as_account(account, main_job, clone, env)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "What gpuenv does about it" in demo.stdout, demo.stdout[-3000:]
        quick = (
            tests.removesuffix("pytest") + "pytest -q -p no:cacheprovider " + " ".join(QUICK_TESTS)
        )
        ran = _as_account(account, quick, clone, env)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert " passed" in ran.stdout and " failed" not in ran.stdout, ran.stdout[-3000:]
    finally:
        shutil.rmtree(base, ignore_errors=True)
