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
"""

from __future__ import annotations

import pwd
from pathlib import Path

import docs_harness as dx
import pytest
from daemon_harness import local_users

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
