"""gpuenv's Slurm prolog and epilog on a real two-node Slurm (tests/slurm_harness.py with
nodes=2: one slurmctld, two slurmd on this host, each node with its own gpuenvd on its own two
simulated GPUs): a job on both nodes is locked on every GPU of both and restored on both.

One cluster for the module (start-up ~2 s).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_harness import Node, SlurmCluster, unavailable

from gpuenv.daemon.client import Client

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

# each node's step says it runs, then the job waits for the test to look
STEPS = "srun -N2 --ntasks-per-node=1 bash -c 'echo \"READY $SLURMD_NODENAME\"'; sleep 1"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpuenv-slurm2-")), nodes=2)
    try:
        cluster.start()
    except (RuntimeError, OSError) as err:
        cluster.close()
        pytest.skip(f"a two-node Slurm could not start here: {str(err)[:300]}")
    yield cluster
    cluster.close()
    shutil.rmtree(cluster.dir, ignore_errors=True)


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
