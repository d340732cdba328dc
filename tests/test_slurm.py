"""The Slurm prolog and epilog gpuenv ships (gpuenv/ops/slurm/) under a real slurmctld +
slurmd (tests/slurm_harness.py): a job that asks is locked through gpuenvd and sees it, and
whatever ends the job (its end, scancel, its time limit, slurmd killed and restarted) leaves
every GPU as it was.

One cluster (start-up ~1.5 s, the first job waits ~3 s for a scheduling pass), the session's
(tests/conftest.py's `slurm_one`). A job past its time limit is killed only on slurmctld's 30 s
check, ~60-90 s after it started: that job (`timed_out`) runs on one GPU beside these tests
and tests/test_slurm_nodes.py's, and tests/test_slurm_timelimit.py judges it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_harness import MARKS, SHOW, SlurmCluster, assert_as_before, assert_locked_in_job

from gpuenv.daemon.client import Client

pytestmark = MARKS


@pytest.fixture(scope="module")
def slurm(slurm_one: SlurmCluster) -> SlurmCluster:
    return slurm_one  # the session's (tests/conftest.py), for the job past its time limit


def test_a_job_that_asks_is_locked_sees_it_and_is_restored_exactly(slurm: SlurmCluster) -> None:
    jobid = slurm.sbatch(SHOW + "sleep 1", "--gres=gpu:2", "--comment", "gpuenv:sm=1350")
    assert assert_locked_in_job(slurm, jobid, 1350) == [0, 1]
    assert slurm.wait_done(jobid) == "COMPLETED"
    assert_as_before(slurm, [0, 1])
    # gpuenvd kept the job's report; the epilog appended its verdict to the job's output
    report = job_report(slurm, jobid)
    assert report["lock"] == "locked sm=1350" and report["ended"] is not None
    for entry in report["gpus_report"]:
        # an idle GPU's lock is not judged (tests/test_daemon_jobs.py judges a busy one)
        assert entry["window"]["lock_held"] is not False
        assert entry["window"]["lock_range_mhz"] == [1350, 1350]
        assert entry["sm_quantiles"]["p50"] == 1350
    last = slurm.output(jobid).splitlines()[-1]
    assert last == report["verdict"] and last.startswith(f"gpuenv: job {jobid} GPUs 0,1: locked")
    shown = slurm.cmd(str(slurm.dir / "gpuenv"), "job", jobid)
    assert f"job {jobid} of root (ended" in shown and "SM clock p5/p50/p95: 1350/1350/1350" in shown


def job_report(slurm: SlurmCluster, jobid: str) -> dict:
    """What `gpuenv job JOBID --json` prints on the node."""
    return dict(json.loads(slurm.cmd(str(slurm.dir / "gpuenv"), "job", jobid, "--json")))


def test_a_job_that_did_not_ask_changes_nothing_and_is_reported(slurm: SlurmCluster) -> None:
    jobid = slurm.sbatch(SHOW + "true", "--gres=gpu:2", "--comment", "a job gpuenv: not asked")
    assert slurm.wait_done(jobid) == "COMPLETED"
    assert "locked (SM" not in slurm.output(jobid)
    assert_as_before(slurm, [0, 1])
    report = job_report(slurm, jobid)  # the prolog and epilog ran: the job is on record
    assert report["lock"] == "not asked" and report["gpus"] == [0, 1]
    assert all(e["window"]["lock_held"] is None for e in report["gpus_report"])


def test_a_lock_whose_epilog_never_ran_is_put_back_by_the_next_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """slurmd killed while a job ends can lose its epilog for good (Slurm does not run it
    again: benchmarks/slurm.py met it). The next job on those GPUs puts them back."""
    from slurm_harness import EPILOG, PROLOG

    lost = tmp_path / "lost-epilog.sh"
    lost.write_text("exit 0\n")
    slurm.set_scripts(PROLOG, lost)
    try:
        first = slurm.sbatch(SHOW + "true", "--gres=gpu:2", "--comment", "gpuenv:sm=1410")
        assert slurm.wait_done(first) == "COMPLETED"
    finally:
        slurm.set_scripts(PROLOG, EPILOG)
    assert slurm.gpuenvd.truth(0)[0] == (1410, 1410)  # left locked: no epilog put it back
    second = slurm.sbatch(SHOW + "true", "--gres=gpu:2", "--comment", "gpuenv:sm=1350")
    assert assert_locked_in_job(slurm, second, 1350) == [0, 1]
    assert slurm.wait_done(second) == "COMPLETED"
    assert_as_before(slurm, [0, 1])
    log = (slurm.records / "gpuenv-slurm.log").read_text()
    assert f"job {second}: job {first}'s epilog never ran: restored GPUs 0,1" in log, log
    assert job_report(slurm, first)["ended_by"].startswith(f"job {second}'s prolog")


BENCH = """\
import os, sys, time
import gpuenv
with gpuenv.region("step"):
    time.sleep(0.3)
if "die" in sys.argv and os.environ["SLURM_PROCID"] == "1":
    os.kill(os.getppid(), 9)  # rank 1's gpuenv run itself dies: it never reports
"""


def srun_bench(slurm: SlurmCluster, tmp_path: Path, *args: str) -> tuple[str, list[dict]]:
    """`srun --ntasks-per-node=2 gpuenv run --summary rank0 -o run.jsonl -- python bench.py`:
    what the ranks printed, and each rank's run record."""
    (tmp_path / "bench.py").write_text(BENCH)
    tmp_path.chmod(0o755)
    done = subprocess.run(
        [
            "srun",
            "--ntasks-per-node=2",
            "--gres=gpu:2",
            f"--chdir={tmp_path}",
            str(slurm.dir / "gpuenv"),
            "run",
            "--summary",
            "rank0",
            "-o",
            "run.jsonl",
            "--",
            sys.executable,
            "bench.py",
            *args,
        ],
        env={**slurm.env, "GPUENV_RANKS_WAIT_S": "3", "GPUENV_RANKS_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    runs = []
    for rank in (0, 1):
        path = tmp_path / f"run.rank{rank}.jsonl"
        if path.exists():
            runs.append(json.loads(path.read_text().splitlines()[0]))
    return done.stdout + done.stderr, runs


def test_srun_ranks_each_on_its_gpu_one_table_with_the_job_id(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    out, runs = srun_bench(slurm, tmp_path)
    assert "on 2 ranks" in out and out.count("gpuenv run: ") == 1, out  # one table, rank 0's
    assert "rank 0" in out and "rank 1" in out, out
    assert [[g["index"] for g in r["metadata"]["gpus"]] for r in runs] == [[0], [1]]
    jobs = [r["metadata"]["job"] for r in runs]
    assert jobs[0]["scheduler"] == "slurm" and jobs[0]["job_id"] == jobs[1]["job_id"]
    assert [j["rank"] for j in jobs] == ["0", "1"]
    assert_as_before(slurm, [0, 1])


def test_a_rank_that_dies_does_not_hang_the_summary(slurm: SlurmCluster, tmp_path: Path) -> None:
    t0 = time.monotonic()
    out, runs = srun_bench(slurm, tmp_path, "die")
    assert time.monotonic() - t0 < 30
    assert "rank 1: no summary within 3 s" in out, out
    assert len(runs) >= 1 and runs[0]["metadata"]["job"]["rank"] == "0"


def test_a_job_past_its_time_limit_starts_locked(timed_out: dict[str, object]) -> None:
    assert timed_out["gpus"] in ([0], [1])


def test_scancel_mid_job_restores(
    slurm: SlurmCluster, timed_out: dict[str, object], tmp_path: Path
) -> None:
    verdicts = tmp_path / "verdicts.txt"  # the job names where its verdict goes
    tmp_path.chmod(0o755)
    jobid = slurm.sbatch(
        SHOW + "sleep 300", "--gres=gpu:1", "--comment", f"gpuenv:sm=1350,report={verdicts}"
    )
    gpus = assert_locked_in_job(slurm, jobid, 1350)
    assert gpus != timed_out["gpus"]
    slurm.cmd("scancel", jobid)
    assert slurm.wait_done(jobid) == "CANCELLED"
    assert_as_before(slurm, gpus)
    assert verdicts.read_text() == job_report(slurm, jobid)["verdict"] + "\n"
    assert "gpuenv: job" not in slurm.output(jobid)  # there, not in the job's output


def test_a_users_job_is_theirs_in_the_report_and_its_verdict_written_as_them(
    slurm: SlurmCluster,
) -> None:
    """The epilog runs as root but appends to a path the job names as the job's user: a
    path the user could not write stays unwritten (no root write through a user's name)."""
    from daemon_harness import local_users

    (user,) = local_users(1)
    mine = slurm.dir / "out" / f"{user.pw_name}-{time.monotonic_ns()}"
    mine.mkdir()
    os.chown(mine, user.pw_uid, user.pw_gid)
    for target, allowed in ((mine / "verdict.txt", True), (slurm.dir / "root-only.txt", False)):
        jobid = slurm.sbatch(
            "true",
            "--gres=gpu:1",
            f"--uid={user.pw_name}",
            "--comment",
            f"gpuenv:sm=1350,report={target}",
        )
        assert slurm.wait_done(jobid) == "COMPLETED"
        report = job_report(slurm, jobid)
        assert report["user"] == user.pw_name and report["lock"].startswith("locked sm=1350")
        assert target.exists() == allowed
        if allowed:
            assert target.stat().st_uid == user.pw_uid
            assert target.read_text() == report["verdict"] + "\n"


def test_slurmd_killed_mid_job_and_restarted_after_it_ended(slurm: SlurmCluster) -> None:
    """The job ends while slurmd is dead: the new slurmd runs the epilog, which restores."""
    jobid = slurm.sbatch(SHOW + "sleep 2", "--gres=gpu:1", "--comment", "gpuenv:sm=1350")
    gpus = assert_locked_in_job(slurm, jobid, 1350)
    slurm.kill_slurmd()
    time.sleep(3)  # the job ends meanwhile: COMPLETING until a slurmd runs its epilog
    assert slurm.gpuenvd.truth(gpus[0])[0] == (1350, 1350)
    slurm.start_slurmd()
    assert slurm.wait_done(jobid, timeout=60) == "COMPLETED"
    assert_as_before(slurm, gpus)


def test_a_prolog_that_cannot_lock_runs_the_job_unlocked_and_logs_it(
    slurm: SlurmCluster, timed_out: dict[str, object]
) -> None:
    free = [g for g in (0, 1) if [g] != timed_out["gpus"]]
    with Client(slurm.gpuenvd.socket) as other, other.lock(sm=1200, gpus=free):
        held = slurm.gpuenvd.truth(free[0])
        jobid = slurm.sbatch(SHOW + "true", "--gres=gpu:1", "--comment", "gpuenv:sm=1350")
        assert slurm.wait_done(jobid) == "COMPLETED"
        out = slurm.output(jobid)
        assert f"GPU {free[0]}: locked (SM 1200 MHz)" in out, out  # the other owner's lock
        assert slurm.gpuenvd.truth(free[0]) == held
    log = (slurm.records / "gpuenv-slurm.log").read_text()
    assert f"job {jobid}: could not lock GPUs {free[0]} (sm=1350)" in log, log
    report = job_report(slurm, jobid)
    assert report["lock"].startswith(f"not locked: could not lock GPUs {free[0]}"), report
    assert slurm.output(jobid).splitlines()[-1].endswith(report["verdict"].split(": ", 1)[1])
    assert_as_before(slurm, free)


def test_strict_mode_drains_the_node_and_never_runs_the_job_unlocked(
    slurm: SlurmCluster, timed_out: dict[str, object]
) -> None:
    free = [g for g in (0, 1) if [g] != timed_out["gpus"]]
    from slurm_harness import EPILOG, PROLOG

    slurm.set_scripts(PROLOG, EPILOG, GPUENV_SLURM_STRICT="1")
    try:
        with Client(slurm.gpuenvd.socket) as other, other.lock(sm=1200, gpus=free):
            jobid = slurm.sbatch(SHOW + "true", "--gres=gpu:1", "--comment", "gpuenv:sm=1350")
            slurm._wait(lambda: "DRAIN" in slurm.node_state(), 30, "the node to drain")
            reason = slurm.node().get("Reason", "")
            slurm.cmd("scancel", jobid)
        assert reason.startswith(f"gpuenv: job {jobid} could not lock"), slurm.node()
        assert "READY" not in slurm.output(jobid)
    finally:
        slurm.set_scripts(PROLOG, EPILOG)
        slurm.resume()
    assert_as_before(slurm, free)
