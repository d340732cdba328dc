"""gpuenvd's `[lock]` rule `job` under a real Slurm (tests/slurm_harness.py) and two real
accounts (useradd): each job's user locks the GPU of their own running job, from inside it,
with `gpuenv lock`; a lock on the other account's job's GPU, or on a GPU no job of theirs
holds, is refused (exit 4), naming the job and its owner. What gpuenvd knows of each job
comes from the prolog gpuenv ships (its `job_begin`), as on a site's node.

One cluster for the module (start-up ~1.5 s, the first job waits ~3 s for a scheduling pass).
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_harness import MARKS, SlurmCluster, assert_as_before, started

pytestmark = MARKS

# The job locks its own GPU and tries the other one (the node has two), says it is ready,
# waits for the test's word (a file), and puts its own GPU back.
JOB = """
echo "GPUS=$SLURM_JOB_GPUS"
other=$((1 - SLURM_JOB_GPUS))
"$USER_GPUENV" lock --sm 1350 -i "$SLURM_JOB_GPUS"; echo "OWN_RC=$?"
"$USER_GPUENV" lock --sm 1350 -i "$other"; echo "OTHER_RC=$?"
echo READY
while [ ! -e "go-$SLURM_JOB_ID" ]; do sleep 0.1; done
"$USER_GPUENV" restore -i "$SLURM_JOB_GPUS"; echo "RESTORE_RC=$?"
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from started("a one-node Slurm", config="[lock]\n* = job\n")


@pytest.fixture(scope="module")
def users(slurm: SlurmCluster) -> list[pwd.struct_passwd]:
    from daemon_harness import _user_env, _user_python, local_users

    accounts = local_users(2)  # skips, saying why, where it cannot make them
    # the accounts' side of the simulated GPU reads the daemon's state file (a real node: NVML)
    sim = Path(slurm.gpuenvd.env["GPUENV_SIM_STATE"])
    for path in (sim, sim.with_name(sim.name + ".lock")):
        path.touch()
        path.chmod(0o666)
    # gpuenv as the accounts run it: a Python they may run, this checkout and its packages
    python = _user_python(accounts[0])
    assert python is not None  # local_users skips otherwise
    path = _user_env({})["PYTHONPATH"]
    homes = slurm.dir / "home"  # each its own: a shared one (/tmp) may hold another's files
    for who in accounts:
        home = homes / who.pw_name
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, who.pw_uid, who.pw_gid)
        home.chmod(0o700)
    wrapper = slurm.dir / "user-gpuenv"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={path} HOME={homes}/"$(id -un)" exec {python} -m gpuenv "$@"\n'
    )
    wrapper.chmod(0o755)
    slurm.env["USER_GPUENV"] = str(wrapper)  # sbatch passes its environment to the job
    return accounts


def run_job(slurm: SlurmCluster, user: pwd.struct_passwd) -> tuple[str, int, str]:
    """Submit JOB as `user` on one GPU; its id, GPU and output once it is ready."""
    jobid = slurm.sbatch(JOB, "--gres=gpu:1", f"--uid={user.pw_name}")
    out = slurm.wait_output(jobid, "READY", timeout=60)
    found = re.search(r"GPUS=([0-9])\n", out)
    assert found, out
    return jobid, int(found.group(1)), out


def test_a_user_locks_their_own_jobs_gpu_and_not_another_accounts(
    slurm: SlurmCluster, users: list[pwd.struct_passwd]
) -> None:
    alice, bob = users
    first, mine, out = run_job(slurm, alice)
    assert "OWN_RC=0" in out, out + slurm.logs()
    assert slurm.gpuenvd.truth(mine)[0] == (1350, 1350)
    # the other GPU is no job's yet: not hers to lock
    assert "OTHER_RC=4" in out, out
    assert f"none of them is on this GPU (allowed: GPUs [{mine}]) on GPU {1 - mine}" in out
    second, theirs, out = run_job(slurm, bob)
    assert theirs == 1 - mine
    assert "OWN_RC=0" in out, out
    assert "OTHER_RC=4" in out, out
    assert (
        f"{bob.pw_name} may not lock a GPU of {alice.pw_name}'s running Slurm job {first} "
        f"(allowed: GPUs [{theirs}]) on GPU {mine}"
    ) in out
    assert slurm.gpuenvd.truth(mine)[0] == (1350, 1350)  # alice's lock, untouched
    for jobid in (first, second):
        (slurm.dir / "out" / f"go-{jobid}").touch()
    for jobid in (first, second):
        assert slurm.wait_done(jobid) == "COMPLETED"
        assert "RESTORE_RC=0" in slurm.output(jobid), slurm.output(jobid)
    assert_as_before(slurm, [0, 1])
