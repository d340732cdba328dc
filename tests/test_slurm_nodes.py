"""gpuenv's Slurm prolog and epilog on a real two-node Slurm (tests/slurm_harness.py with
nodes=2: one slurmctld, two slurmd on this host, each node with its own gpuenvd on its own two
simulated GPUs, and slurmdbd on MariaDB where Debian's are installed): a job on both nodes is
locked on every GPU of both and restored on both; `gpuenv job` shows both nodes from the
shared jobs directory and names a node whose epilog lost its report; both nodes' lines are in
the job's AdminComment, the prolog's in slurmctld's record, the epilog's verdict in
slurmdbd's.

One cluster for the module (start-up ~2 s, ~5 s more with slurmdbd: MariaDB's datadir).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_harness import (
    EPILOG,
    MARKS,
    PROLOG,
    Node,
    SlurmCluster,
    accounting_unavailable,
    started,
)

from gpuenv.daemon.client import Client

pytestmark = MARKS

# each node's step says it runs, then the job waits for the test to look
STEPS = "srun -N2 --ntasks-per-node=1 bash -c 'echo \"READY $SLURMD_NODENAME\"'; sleep 1"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from started("a two-node Slurm", nodes=2, accounting=accounting_unavailable() is None)


def assert_as_before(node: Node) -> None:
    for g in (0, 1):
        assert node.gpuenvd.truth(g) == node.gpuenvd.original[g], (node.name, g)
    with Client(node.gpuenvd.socket) as c:
        assert c.status()["leases"] == [], node.name


def test_a_two_node_job_is_locked_on_both_nodes_and_restored_on_both(
    slurm: SlurmCluster,
) -> None:
    jobid = slurm.sbatch(STEPS, "-N2", "--gres=gpu:2", "--comment", "gpuenv:sm=1350")
    out = slurm.wait_output(jobid, "READY gpunode1")
    assert "READY gpunode0" in slurm.wait_output(jobid, "READY gpunode0"), out
    for node in slurm.nodes:  # each node's own gpuenvd locked its own GPUs
        assert [node.gpuenvd.truth(g)[0] for g in (0, 1)] == [(1350, 1350)] * 2, node.name
    assert slurm.job(jobid)["NodeList"] == "gpunode[0-1]"
    assert slurm.wait_done(jobid) == "COMPLETED"
    for node in slurm.nodes:
        assert_as_before(node)
        log = (node.records / "gpuenv-slurm.log").read_text()
        assert f"job {jobid}: locked GPUs 0,1 (sm=1350)" in log, log
        assert f"job {jobid}: restored GPUs 0,1" in log, log
    # `gpuenv job` on any node shows both nodes' GPUs, from the shared jobs directory
    shown = gpuenv_job(slurm, jobid)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"gpuenv: job {jobid}: 2 of 2 nodes reported" in shown.stdout, shown.stdout
    for node in ("gpunode0", "gpunode1"):
        assert f"node {node}: restored" in shown.stdout, shown.stdout
    gathered = json.loads(gpuenv_job(slurm, jobid, "--json").stdout)
    assert gathered["missing"] == {} and gathered["nodes"] == ["gpunode0", "gpunode1"]
    for entry in gathered["entries"].values():
        report = entry["report"]
        assert entry["restored"] == "yes" and report["lock"] == "locked sm=1350"
        assert [e["window"]["lock_range_mhz"] for e in report["gpus_report"]] == [[1350, 1350]] * 2
    # each node's prolog put its line into Slurm's own record of the job (slurmctld takes
    # no update once the job ended: the epilog's verdict goes to slurmdbd, where one runs)
    assert admin_comment(slurm, jobid) == [
        f"gpuenv {node} GPUs 0,1: locked sm=1350; running" for node in ("gpunode0", "gpunode1")
    ]


def gpuenv_job(slurm: SlurmCluster, jobid: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuenv job JOBID` as on any node: it reads the shared jobs directory."""
    return subprocess.run(
        [str(slurm.dir / "gpuenv"), "job", jobid, *args],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def admin_comment(slurm: SlurmCluster, jobid: str) -> list[str]:
    """The job's AdminComment as `scontrol show job` prints it, one entry per node."""
    shown = slurm.cmd("scontrol", "show", "job", jobid)
    found = re.search(r"AdminComment=(.*)$", shown, re.M)
    assert found, shown
    return sorted(found.group(1).strip().split(" | "))


def test_a_node_whose_epilog_lost_its_report_is_named(slurm: SlurmCluster, tmp_path: Path) -> None:
    """gpunode1's epilog does nothing (slurmd killed as the job ended can lose it for good):
    `gpuenv job` names gpunode1 and why, and shows gpunode0's report."""
    lost = tmp_path / "lost-epilog.sh"
    lost.write_text("exit 0\n")
    slurm.set_scripts(PROLOG, lost, only=("gpunode1",))
    try:
        jobid = slurm.sbatch(STEPS, "-N2", "--gres=gpu:2", "--comment", "gpuenv:sm=1410")
        assert slurm.wait_done(jobid) == "COMPLETED"
    finally:
        slurm.set_scripts(PROLOG, EPILOG)
    shown = gpuenv_job(slurm, jobid)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    why = "its epilog lost the report (the prolog recorded the job; no epilog reported)"
    assert f"node gpunode1: did not report: {why}" in shown.stdout, shown.stdout
    assert "  at its prolog: GPUs 0,1, locked sm=1410" in shown.stdout, shown.stdout
    assert "node gpunode0: restored" in shown.stdout, shown.stdout
    assert f"1 of 2 nodes reported; did not: gpunode1 ({why})" in shown.stdout
    # gpunode1 was left locked: the next job's prolog there puts it back (tests/test_slurm.py)
    node1 = slurm.nodes[1]
    assert node1.gpuenvd.truth(0)[0] == (1410, 1410)
    assert_as_before(slurm.nodes[0])
    after = slurm.sbatch(STEPS, "-N2", "--gres=gpu:2")
    assert slurm.wait_done(after) == "COMPLETED"
    for node in slurm.nodes:
        assert_as_before(node)


def test_each_nodes_verdict_is_in_slurmdbds_record_of_the_job(slurm: SlurmCluster) -> None:
    """The epilogs of both nodes, writing at once, each leave their verdict in the job's
    AdminComment as slurmdbd keeps it (`sacct`): slurmctld's record takes none after the end."""
    if not slurm.accounting:
        pytest.skip(str(accounting_unavailable()))
    jobid = slurm.sbatch("srun -N2 true", "-N2", "--gres=gpu:2", "--comment", "gpuenv:sm=1350")
    assert slurm.wait_done(jobid) == "COMPLETED"
    gathered = json.loads(gpuenv_job(slurm, jobid, "--json").stdout)
    # sacctmgr before Slurm 23.02 (Debian 12 has 22.05) stores it lower-cased
    lines = slurm.cmd("sacct", "-j", jobid, "-X", "-n", "-P", "-o", "AdminComment").lower()
    assert sorted(lines.split(" | ")) == [
        f"gpuenv {node} "
        + gathered["entries"][node]["report"]["verdict"].split(f"job {jobid} ", 1)[1].lower()
        + "; restored"
        for node in ("gpunode0", "gpunode1")
    ], lines
    for line in lines.split(" | "):
        # an idle GPU's lock is not judged (tests/test_daemon_jobs.py judges a busy one)
        assert "gpus 0,1: locked sm=1350; sm p50 1350 mhz; " in line, line


def test_a_node_down_is_named_and_its_gpus_are_put_back_by_the_next_job(
    slurm: SlurmCluster,
) -> None:
    """gpunode1's slurmd dies mid-job and stays dead: the node is marked down and the job
    ends (NODE_FAIL); `gpuenv job` shows gpunode0's report and
    names gpunode1 as down. Back up, gpunode1's slurmd may run that job's epilog late, or never
    (both seen): the late epilog or the next job's prolog there puts its GPUs back, whichever
    comes first, and the other finds nothing to do: the node is not drained."""
    jobid = slurm.sbatch(
        STEPS + "; sleep 300", "-N2", "--no-requeue", "--gres=gpu:2", "--comment", "gpuenv:sm=1410"
    )
    slurm.wait_output(jobid, "READY gpunode1")
    slurm.kill_slurmd("gpunode1")
    # What slurmctld does by itself once gpunode1 is silent for SlurmdTimeout (~30 s of a CI
    # run with SlurmdTimeout=6, the same DOWN and NODE_FAIL), done now as an admin does it
    slurm.cmd("scontrol", "update", "nodename=gpunode1", "state=down", "reason=slurmd killed")
    try:
        assert slurm.wait_done(jobid, timeout=90) == "NODE_FAIL"
        shown = gpuenv_job(slurm, jobid)
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert "node gpunode0: restored" in shown.stdout, shown.stdout
        down = re.search(r"node gpunode1: did not report: node down \(DOWN[^)]*\)", shown.stdout)
        assert down, shown.stdout
        assert_as_before(slurm.nodes[0])
    finally:
        slurm.start_slurmd("gpunode1")

        def back() -> bool:  # its slurmd registered, and the admin's DOWN lifted
            state = slurm.node_state("gpunode1")
            if "DOWN" in state:
                slurm.resume("gpunode1")
            return not any(s in state for s in ("DOWN", "NOT_RESPONDING"))

        slurm._wait(back, 30, "gpunode1 back up")
    # held as the prolog left it, or put back already by a late epilog
    assert slurm.nodes[1].gpuenvd.truth(0)[0] in ((1410, 1410), None)
    after = slurm.sbatch(STEPS, "-N2", "--gres=gpu:2")
    assert slurm.wait_done(after) == "COMPLETED"
    for node in slurm.nodes:
        assert_as_before(node)
    for name in ("gpunode0", "gpunode1"):  # a late epilog that failed would drain its node
        slurm._wait(lambda n=name: "COMPLETING" not in slurm.node_state(n), 30, name)
        assert "DRAIN" not in slurm.node_state(name), slurm.logs()


# each rank's share of a data-parallel step on its node's simulated GPU (its SLURM_LOCALID's:
# srun gives a task of 2 on a node of 2 GPUs both GPUs, and `gpuenv run` picks its local id's)
RANK = """\
import os
import gpuenv
from gpuenv.backend.sim import SimBackend

sim = SimBackend.from_env()  # the task's node's GPUs: the TaskProlog set GPUENV_SIM_STATE
gpu = int(os.environ["SLURM_LOCALID"])
for _ in range(25):
    with gpuenv.region("step"):
        sim.run_work(gpu, 0.03 * 1.98e9, power_intensity=1.0)  # 30 ms at 1980 MHz
sim.close()
"""


def test_ranks_on_two_nodes_give_one_table_with_each_ranks_node_and_gpu(
    slurm: SlurmCluster,
) -> None:
    """`srun -N2 --ntasks-per-node=2 gpuenv run --summary rank0`: each task samples its own
    node's GPU (gpunode1's GPU 1 held to 450 W is named, on its node, by its rank), its
    summary reaches rank 0 on gpunode0 through a directory both nodes see, and rank 0 prints
    one table: every rank's node, its GPU by index and UUID (GPU 0 of two nodes is two
    GPUs), its telemetry."""
    shared = slurm.dir / "shared-ranks"  # what a cluster's shared file system is
    script = slurm.dir / "out" / "rank.py"
    script.write_text(RANK)
    slow = slurm.nodes[1].gpuenvd.backend
    before = slow.power_limits(1).limit_w
    slow.set_power_limit(1, 450)
    try:
        jobid = slurm.sbatch(
            f"export GPUENV_RANKS_DIR={shared} GPUENV_RANKS_WAIT_S=30\n"
            f"srun -N2 --ntasks-per-node=2 {slurm.dir}/gpuenv run --summary rank0 "
            f"-- {sys.executable} {script}",
            "-N2",
            "--ntasks-per-node=2",
            "--gres=gpu:2",
        )
        assert slurm.wait_done(jobid, timeout=120) == "COMPLETED", slurm.output(jobid)
    finally:
        slow.set_power_limit(1, before)
    out = slurm.output(jobid)
    assert "on 4 ranks; clocks not locked" in out, out
    uuid = {(n.name, g): n.gpuenvd.backend.device_info(g).uuid for n in slurm.nodes for g in (0, 1)}
    assert len(set(uuid.values())) == 4  # each node a machine of its own
    for rank, (node, gpu) in enumerate([(n.name, g) for n in slurm.nodes for g in (0, 1)]):
        line = re.search(
            rf"^  rank {rank} \({node}\): exited with 0 after .* on GPU {gpu} .*$", out, re.M
        )
        assert line, out
        assert f"[{uuid[node, gpu]}]" in line.group(0), line.group(0)  # that node's GPU
    # one table: a row per rank, with its node and GPU and its own telemetry
    rows = {
        (cells[0], cells[1], cells[3]): cells
        for line in out.splitlines()
        if len(cells := line.split()) > 6 and cells[0] in "0123" and cells[2] == "step"
    }
    assert set(rows) == {
        ("0", "gpunode0", "0"),
        ("1", "gpunode0", "1"),
        ("2", "gpunode1", "0"),
        ("3", "gpunode1", "1"),
    }, out
    # the handicapped GPU, sampled by gpunode1's own process, is the one named
    assert re.search(r"step: GPU 1 \(rank 3, gpunode1\) held the step back", out), out
    assert not list(shared.glob("gpuenv-ranks-*/*.json")), "rank 0 read and removed them all"
    for node in slurm.nodes:
        assert_as_before(node)


def test_a_node_whose_gpuenvd_restarts_mid_job_still_reports_every_gpu(
    slurm: SlurmCluster,
) -> None:
    """gpunode1 "reboots" mid-job: its gpuenvd is SIGKILLed and started again (all it held in
    memory lost) while the job runs, before the epilog. The job keeps its lock there (the
    prolog's standing lease is in the journal), the epilog still closes and publishes
    gpunode1's report, and `gpuenv job` accounts for all 4 GPUs of both nodes, naming the
    telemetry the restart lost; every GPU is put back."""
    go = slurm.dir / "out" / "go-on"
    go.unlink(missing_ok=True)
    # each node's step waits (bounded) until the test has restarted gpunode1's gpuenvd
    wait = f"for _ in $(seq 600); do [ -e {go} ] && break; sleep 0.1; done"
    steps = f"srun -N2 --ntasks-per-node=1 bash -c 'echo \"READY $SLURMD_NODENAME\"; {wait}'"
    jobid = slurm.sbatch(steps, "-N2", "--gres=gpu:2", "--comment", "gpuenv:sm=1350")
    try:
        slurm.wait_output(jobid, "READY gpunode0")
        slurm.wait_output(jobid, "READY gpunode1")
        rebooted = slurm.nodes[1].gpuenvd
        rebooted.kill()
        rebooted.start()
        # the lock outlived the daemon: the new one adopted the prolog's standing lease
        assert [rebooted.truth(g)[0] for g in (0, 1)] == [(1350, 1350)] * 2
    finally:
        go.touch()
    assert slurm.wait_done(jobid) == "COMPLETED"
    for node in slurm.nodes:
        assert_as_before(node)
    shown = gpuenv_job(slurm, jobid)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"gpuenv: job {jobid}: 2 of 2 nodes reported" in shown.stdout, shown.stdout
    gathered = json.loads(gpuenv_job(slurm, jobid, "--json").stdout)
    assert gathered["missing"] == {}
    gpus = {
        (node, e["gpu"]): e
        for node, entry in gathered["entries"].items()
        for e in entry["report"]["gpus_report"]
    }
    assert sorted(gpus) == [(n, g) for n in ("gpunode0", "gpunode1") for g in (0, 1)]
    for (node, g), e in gpus.items():
        assert gathered["entries"][node]["restored"] == "yes", node
        lost = [f for f in e["findings"] if f["kind"] == "telemetry_gap"]
        # each node's daemon saw the lock in force (gpunode1's new one: the rest of the job)
        assert e["window"]["lock_range_mhz"] == [1350, 1350] and e["sm_quantiles"]["p50"] == 1350
        if node == "gpunode0":  # its gpuenvd ran throughout: the whole job is seen
            assert lost == [], e["findings"]
            continue
        assert len(lost) == 1 and lost[0]["severity"] == "warning", e["findings"]
        assert f"gpuenvd restarted while job {jobid} ran: GPU {g}'s telemetry" in lost[0]["message"]
    assert f"gpuenv: job {jobid} GPUs 0,1: locked sm=1350; SM p50 1350 MHz; " in shown.stdout
    assert "check: GPU 0 telemetry_gap, GPU 1 telemetry_gap" in shown.stdout, shown.stdout
