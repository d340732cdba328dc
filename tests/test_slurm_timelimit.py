"""The one-node Slurm's job past its time limit (tests/conftest.py's `timed_out`, started
with tests/test_slurm.py's first test): Slurm ends it TIMEOUT and the epilog puts its GPU
back exactly. Judged in a module of its own, after tests/test_slurm_nodes.py (modules run
by name), so that slurmctld's 60-90 s to end the job pass while other tests run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_harness import MARKS, NODE, SlurmCluster, assert_as_before

pytestmark = MARKS


@pytest.fixture(scope="module", autouse=True)
def _stopped_after(slurm_one: SlurmCluster) -> Iterator[None]:
    yield
    slurm_one.close()  # no later test needs it: not left running through the rest of the run


def test_the_job_past_its_time_limit_is_restored(
    slurm_one: SlurmCluster, timed_out: dict[str, object]
) -> None:
    jobid = str(timed_out["job"])
    assert slurm_one.wait_done(jobid, timeout=120) == "TIMEOUT"
    assert_as_before(slurm_one, list(timed_out["gpus"]))  # type: ignore[call-overload]
    assert NODE in slurm_one.job(jobid).get("NodeList", "")
