"""`gpuenv lock` / `gpuenv restore` / `gpuenv unlock` on the simulated GPU (state file shared)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tmpfs_harness import mount_tmpfs

from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.clocks import local_lock as lock
from gpuenv.clocks.journal import Journal

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_SIM_GPUS", "2")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["--sim", *args], obj={})


def state() -> list[tuple[object, ...]]:
    sim = SimBackend.from_env()
    try:
        return [
            (t.locked_sm, t.app_sm_mhz, t.power_limit_w)
            for t in (sim.truth(i) for i in range(sim.device_count()))
        ]
    finally:
        sim.close()


def test_lock_then_restore() -> None:
    before = state()
    res = run("lock", "--sm", "1352", "--power-limit", "500", "-i", "1")
    assert res.exit_code == 0, res.output
    assert "GPU 1 (NVIDIA H100 80GB HBM3): locked SM 1350 MHz, power limit 500 W" in res.output
    assert "was: not locked by gpuenv, power limit 700 W" in res.output
    assert "using 1350 MHz" in res.output and "gpuenv restore" in res.output
    assert state() == [before[0], ((1350, 1350), 1980, 500.0)]
    res = run("restore")
    assert res.exit_code == 0, res.output
    assert "restored GPU 1" in res.output and "power limit back to 700 W" in res.output
    assert state() == before and Journal().entries() == []
    res = run("unlock")  # the alias; idempotent
    assert res.exit_code == 0 and "nothing to restore" in res.output


def test_a_base_lock_says_the_mhz_it_locked() -> None:
    """NVML locks to the base clock by a symbolic value and reports none: the lock says
    what the clock reads under it (1590 MHz on the H100: docs/explanation/what-gpus-do.md),
    not only "the base clock (TDP)"."""
    res = run("lock", "--sm", "base", "-i", "0")
    assert res.exit_code == 0, res.output
    assert "locked SM the base clock (TDP)" in res.output
    assert "GPU 0 (NVIDIA H100 80GB HBM3): the base clock is 1590 MHz" in res.output
    assert state()[0][0] == (1590, 1590)
    assert run("restore").exit_code == 0


def test_without_i_it_locks_this_processs_own_gpus_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    before = state()
    res = run("lock", "--sm", "1350")
    assert res.exit_code == 0, res.output
    assert "gpuenv lock: CUDA_VISIBLE_DEVICES=1 -> GPU 1" in res.output
    assert state() == [before[0], ((1350, 1350), *before[1][1:])]  # GPU 0: another tenant's
    assert run("restore").exit_code == 0
    assert state() == before
    res = run("lock", "--sm", "1350", "-i", "all")
    assert res.exit_code == 0, res.output
    assert "gpuenv lock: -i all -> GPU 0, 1" in res.output
    assert [s[0] for s in state()] == [(1350, 1350)] * 2
    # a restore in the same place puts back its own GPU, and names the lock it leaves
    res = run("restore")
    assert res.exit_code == 0, res.output
    assert "restored GPU 1" in res.output and "restored GPU 0" not in res.output
    assert "left alone: GPU 0" in res.output and "'gpuenv restore -i 0'" in res.output
    assert [s[0] for s in state()] == [(1350, 1350), None]
    assert run("restore", "-i", "all").exit_code == 0
    assert state() == before


def test_conflict_exit_5_names_the_owner_and_force_takes_over() -> None:
    before = state()
    assert run("lock", "--sm", "1350").exit_code == 0
    res = run("lock", "--sm", "1500")
    assert res.exit_code == 5
    import getpass

    assert f"a standing lock ({getpass.getuser()}: " in res.output and "SM 1350 MHz" in res.output
    assert "since" in res.output and "run 'gpuenv restore' to end it" in res.output
    same = run("lock", "--sm", "1350")
    assert same.exit_code == 0 and "now shared" in same.output
    forced = run("lock", "--sm", "1500", "--force")
    assert forced.exit_code == 0 and "took over" in forced.output
    assert state()[0][0] == (1500, 1500)
    assert run("restore").exit_code == 0
    assert state() == before


@pytest.mark.parametrize("flag_first", [True, False])
def test_dry_run_changes_nothing_and_says_what_it_would_do(flag_first: bool) -> None:
    before = state()
    args = (
        ["--dry-run", "lock", "--sm", "1350"]
        if flag_first
        else ["lock", "--sm", "1350", "--dry-run"]
    )
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert "GPU 0 (NVIDIA H100 80GB HBM3): would lock SM clock to 1350 MHz" in res.output
    assert "dry run: nothing was changed" in res.output
    assert state() == before and Journal().entries() == []
    assert run("lock", "--sm", "1350").exit_code == 0
    res = run("restore", "--dry-run")
    assert res.exit_code == 0 and "would restore GPU 0" in res.output
    assert state()[0][0] == (1350, 1350) and len(Journal().entries()) == 2


def test_readonly_env_refuses_with_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    before = state()
    monkeypatch.setenv("GPUENV_READONLY", "1")
    res = run("lock", "--sm", "1350", "-i", "0")
    assert res.exit_code == 2
    assert "would lock SM clock to 1350 MHz" in res.output
    assert "refused to lock clocks (SM 1350 MHz) (GPUENV_READONLY=1)" in res.output
    assert state() == before and Journal().entries() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sm", "99999"], "supports 345-1980 MHz in 15 MHz steps"),
        (["--sm", "fast"], "is not understood"),
        (["--power-limit", "5000"], "accepts 200-700 W"),
        ([], "nothing to lock"),
        (["--sm", "sustained"], "run 'gpuenv calibrate' first"),
    ],
)
def test_bad_input_exit_2_one_line(args: list[str], message: str) -> None:
    res = run("lock", *args)
    assert res.exit_code == 2
    assert message in res.output and res.output.count("\n") == 1
    assert Journal().entries() == []


def test_not_supported_exit_3_as_nvidia_smi() -> None:
    res = run("lock", "--sm", "1350", "--mem", "2619")
    assert res.exit_code == 3
    assert "Hopper" in res.output and res.output.count("\n") == 1
    assert Journal().entries() == []


def test_no_permission_says_root_or_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_SIM_ROOT", "0")
    res = run("lock", "--sm", "1350")
    assert res.exit_code == 4  # as nvidia-smi: no permission
    assert "run as root, or have an admin start gpuenvd ('sudo gpuenv daemon'" in res.output
    assert "under [lock]" in res.output  # the step that makes the daemon serve this user
    # on the simulated GPU, also the machine of one's own that takes locks without either
    # (tests/test_sim_host.py follows it as an ordinary account)
    assert "GPUENV_SIM_STATE=~/gpuenv-sim.json GPUENV_SIM_ROOT=1 gpuenv --sim lock" in (
        " ".join(res.output.split())
    )
    assert Journal().entries() == []


def test_restore_leaves_a_running_owner_alone_unless_all() -> None:
    before = state()
    sim = SimBackend.from_env()
    held = lock(1500, gpus=0, backend=sim, supervise=False)
    try:
        res = run("restore")
        assert res.exit_code == 5
        assert f"held by pid {os.getpid()}" in res.output and "--all" in res.output
        assert state()[0][0] == (1500, 1500)
        res = run("restore", "--all")
        assert res.exit_code == 0 and "restored GPU 0" in res.output
        assert state() == before
    finally:
        held.release()
        sim.close()


def _set_power_limit(index: int, watts: float) -> None:
    """An admin's power limit, set outside gpuenv (nvidia-smi -pl)."""
    sim = SimBackend.from_env()
    try:
        sim.set_power_limit(index, watts)
    finally:
        sim.close()


def test_restore_of_a_gpu_never_locked_exits_0_changes_nothing_and_says_what_it_saw() -> None:
    """Issue 31: a power limit an admin set on purpose made 'gpuenv restore' exit 2 on a GPU
    gpuenv never locked, which fails every cleanup script (a Slurm epilog, a CI teardown)."""
    _set_power_limit(1, 650)
    before = state()
    res = run("restore")
    assert res.exit_code == 0, res.output
    assert "nothing to restore" in res.output
    assert "GPU 1" in res.output and "power limit 650 W (default 700 W)" in res.output
    assert "left as it is" in res.output and "GPU 0" not in res.output  # GPU 0 is at defaults
    assert state() == before


def test_a_second_restore_after_a_first_exits_0() -> None:
    """Issue 31: the CLI chaos run's second restore exited 2 (88 of 120 trials) although every
    GPU was exactly back at its prior state, a power limit other than the default."""
    _set_power_limit(0, 600)
    _set_power_limit(1, 650)
    before = state()
    assert run("lock", "--sm", "1350", "--power-limit", "500").exit_code == 0
    first = run("restore")
    assert first.exit_code == 0, first.output
    assert state() == before
    for _ in range(2):
        again = run("restore")
        assert again.exit_code == 0, again.output
        assert "nothing to restore" in again.output and state() == before


def test_separate_commands_see_each_other() -> None:
    """`gpuenv --sim lock`, `status` and `restore` as separate processes."""
    cmd = [sys.executable, "-c", "from gpuenv.cli import main; main()", "--sim"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = state()

    def gpuenv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=60)

    locked = gpuenv("lock", "--sm", "1350", "-i", "0")
    assert locked.returncode == 0, locked.stderr
    assert state()[0][0] == (1350, 1350)
    status = gpuenv("status")
    assert status.returncode == 0, status.stderr
    assert "1350" in status.stdout
    restored = gpuenv("restore")
    assert restored.returncode == 0 and "restored GPU 0" in restored.stdout
    assert state() == before


def test_the_simulated_machine_keeps_its_gpu_count_with_its_state() -> None:
    """A lock taken with GPUENV_SIM_GPUS=4 is found by commands that do not repeat it: the
    machine's count is kept with its settings, as a real machine keeps its GPUs. Another
    count is refused while a GPU holds a changed setting, and allowed once restored."""
    cmd = [sys.executable, "-c", "from gpuenv.cli import main; main()", "--sim"]
    plain = {k: v for k, v in os.environ.items() if k != "GPUENV_SIM_GPUS"}
    plain["PYTHONPATH"] = str(ROOT)

    def gpuenv(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, *args], env={**plain, **env}, capture_output=True, text=True, timeout=60
        )

    locked = gpuenv("lock", "-i", "2", "--power-limit", "450", GPUENV_SIM_GPUS="4")
    assert locked.returncode == 0, locked.stderr
    status = gpuenv("status")
    assert status.returncode == 0 and "4 GPUs" in status.stdout, status.stdout
    two = gpuenv("status", GPUENV_SIM_GPUS="2")
    assert two.returncode == 2, two.stdout
    assert "has 4 GPUs, and GPU 2 holds a setting gpuenv changed" in two.stderr
    assert "leave GPUENV_SIM_GPUS unset (or set it to 4)" in two.stderr
    restored = gpuenv("restore")
    assert restored.returncode == 0, restored.stderr
    assert "restored GPU 2" in restored.stdout and "power limit back to 700 W" in restored.stdout
    after = gpuenv("status").stdout
    assert "4 GPUs" in after and "/450" not in after, after
    two = gpuenv("status", GPUENV_SIM_GPUS="2")  # nothing changed is kept: another count
    assert two.returncode == 0 and "2 GPUs" in two.stdout, two.stderr


@pytest.mark.gpu
def test_real_gpu_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_READONLY", "1")  # the lent device: nothing may be written
    res = CliRunner().invoke(cli, ["lock", "--sm", "max", "-i", "0", "--dry-run"], obj={})
    assert res.exit_code == 0, res.output
    assert "would lock SM clock to" in res.output and "dry run: nothing was changed" in res.output
    res = CliRunner().invoke(cli, ["lock", "--sm", "max", "-i", "0"], obj={})
    assert res.exit_code == 2 and "refused" in res.output
    res = CliRunner().invoke(cli, ["restore", "--dry-run"], obj={})
    assert res.exit_code == 0 and "nothing to restore" in res.output
    assert Journal().entries() == []


@pytest.fixture(params=["read-only tmpfs", "chattr +i"])
def read_only_journal(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):  # type: ignore[no-untyped-def]
    """GPUENV_STATE_DIR on a tmpfs of its own remounted read-only, or an immutable
    directory (chattr +i): `make_read_only()` turns it so (every write EROFS / EPERM)."""
    if os.geteuid() != 0:
        pytest.skip("a read-only mount or an immutable directory needs root")
    mnt = tmp_path / "mnt"
    journal = mnt / "journal"
    if request.param == "read-only tmpfs":
        mount_tmpfs(mnt, "size=1m,mode=0700")
        turn = ["mount", "-o", "remount,ro", str(mnt)]
        # lazy: this process still holds the journal directory's lock open (gpuenv keeps its
        # flock fd), and a plain umount, busy, left the mount behind in the temp dir
        undo = ["umount", "--lazy", str(mnt)]
    else:
        mnt.mkdir()
        turn, undo = ["chattr", "+i", str(journal)], ["chattr", "-i", str(journal)]
    monkeypatch.setenv("GPUENV_STATE_DIR", str(journal))

    def make_read_only() -> None:
        done = subprocess.run(turn, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"{' '.join(turn)}: {done.stderr.strip()}")

    try:
        yield make_read_only
    finally:
        subprocess.run(undo, capture_output=True, check=False)


def test_restore_on_a_read_only_journal_puts_the_gpu_back_and_says_the_record_stays(
    read_only_journal,  # type: ignore[no-untyped-def]
) -> None:
    before = state()
    assert run("lock", "--sm", "1350").exit_code == 0  # both GPUs: the first one's record
    records = sorted(p.name for p in Path(os.environ["GPUENV_STATE_DIR"]).iterdir())
    read_only_journal()
    res = run("restore")
    assert res.exit_code == 2, res.output  # the record could not be cleared: not "done"
    assert state() == before  # ... but both GPUs are back (it used to stop after the first)
    assert "restored GPU 0" in res.output and "restored GPU 1" in res.output
    assert "the GPUs were restored, but the journal could not be updated" in res.output
    assert os.environ["GPUENV_STATE_DIR"] in res.output
    assert "read-only file system" in res.output or "not permitted" in res.output
    assert "Traceback" not in res.output
    assert sorted(p.name for p in Path(os.environ["GPUENV_STATE_DIR"]).iterdir()) == records
    assert len(Journal().entries()) == 2  # the journal is kept whole, not half-removed
