"""`gpuenv run --summary rank0`: the ranks of a job, one table (gpuenv/run/ranks.py).

Each test starts one `gpuenv --sim run` per rank, as torchrun would with
`--no-python gpuenv run ...`, with the rank variables torchrun sets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpuenv.run.ranks import job_key, publish, ranks_dir, world_size

ROOT = Path(__file__).resolve().parent.parent
GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]
CHILD = """
import os, time
import gpuenv
with gpuenv.region("step"):
    time.sleep(0.05 * (1 + int(os.environ["RANK"])))
"""


def start_rank(rank: int, world: int, tmp_path: Path, *args: str, **env: str) -> subprocess.Popen:
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(CHILD))
    full = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29517",
        TORCHELASTIC_RUN_ID="t1",
        GPUENV_SIM_GPUS=str(world),
        GPUENV_RANKS_DIR=str(tmp_path / "ranks"),
    )
    full.update(env)
    return subprocess.Popen(
        [*GPUENV, "--sim", "run", "--summary", "rank0", *args, "--", sys.executable, str(child)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_rank0_prints_one_table_for_all_ranks_and_the_others_none(tmp_path):
    procs = [start_rank(r, 3, tmp_path, "-o", str(tmp_path / "run.jsonl")) for r in (2, 1, 0)]
    (c2, e2), (c1, e1), (c0, e0) = (finish(p) for p in procs)
    assert (c0, c1, c2) == (0, 0, 0), e0 + e1 + e2
    assert "gpuenv run" not in e1 and "gpuenv run" not in e2  # no interleaved tables
    lines = e0.splitlines()
    assert lines[0].startswith("gpuenv run: ") and "on 3 ranks" in lines[0]
    for r in range(3):
        assert any(
            ln.startswith(f"  rank {r} (") and "exited with 0" in ln and f"GPU {r}" in ln
            for ln in lines
        ), e0
        assert f"rank {r}: results: {tmp_path / f'run.rank{r}.jsonl'}" in e0
    header = next(ln for ln in lines if "region" in ln and "verdict" in ln)
    assert header.split()[:2] == ["rank", "region"]
    rows = [ln.split() for ln in lines if ln.split()[1:2] == ["step"]]
    assert sorted(r[0] for r in rows) == ["0", "1", "2"]
    assert list((tmp_path / "ranks").iterdir()) == []  # rank 0 cleaned up


def test_rank0_waits_a_bounded_time_and_names_the_ranks_that_did_not_report(tmp_path):
    t0 = time.monotonic()
    code, err = finish(start_rank(0, 3, tmp_path, GPUENV_RANKS_WAIT_S="1"))
    assert code == 0, err
    assert time.monotonic() - t0 < 30
    assert "rank 1, 2: no summary within 1 s" in err and "GPUENV_RANKS_DIR" in err


def test_a_stale_summary_of_an_earlier_job_is_not_read(tmp_path):
    env = {
        "TORCHELASTIC_RUN_ID": "t1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29517",
        "GPUENV_RANKS_DIR": str(tmp_path / "ranks"),
    }
    old = publish(
        ranks_dir(env),
        {
            "rank": 1,
            "command": "x",
            "outcome": "exited with 0",
            "duration_s": 1.0,
            "where": "GPU 1",
            "state": "-",
        },
        [],
    )
    past = time.time() - 3600
    data = json.loads(old.read_text())
    data["ended_at"] = past
    old.write_text(json.dumps(data))
    code, err = finish(start_rank(0, 2, tmp_path, GPUENV_RANKS_WAIT_S="0.5"))
    assert code == 0, err
    assert "rank 1: no summary within 0.5 s" in err


def test_without_a_job_the_option_changes_nothing(tmp_path):
    child = tmp_path / "c.py"
    child.write_text("pass\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [*GPUENV, "--sim", "run", "--summary", "rank0", "--", sys.executable, str(child)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0 and result.stderr.startswith("gpuenv run: "), result.stderr
    assert "rank" not in result.stderr


def test_job_keys_and_world_size():
    torch_a = {"TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    torch_b = dict(torch_a, MASTER_PORT="29501")
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "MASTER_PORT": "29500"}
    keys = {job_key(e) for e in (torch_a, torch_b, slurm)}
    assert len(keys) == 3 and job_key(slurm) == "slurm-77-0"
    assert job_key({"MASTER_ADDR": "a/../b"}).count("/") == 0  # a file name, never a path
    assert world_size({"WORLD_SIZE": "8"}) == 8 and world_size({"SLURM_NTASKS": "4"}) == 4
    assert world_size({}) is None


def test_rank0s_table_carries_every_ranks_telemetry(tmp_path):
    # each rank's own windows travel with its summary: no "-" row for ranks 1.. (issue 33)
    procs = [start_rank(r, 3, tmp_path) for r in (2, 1, 0)]
    (c2, e2), (c1, e1), (c0, e0) = (finish(p) for p in procs)
    assert (c0, c1, c2) == (0, 0, 0), e0 + e1 + e2
    rows = {}
    for ln in e0.splitlines():
        cells = ln.split()
        if len(cells) > 2 and cells[0].isdigit() and cells[1] in ("(run)", "step"):
            rows[int(cells[0]), cells[1]] = cells
    assert sorted(rows) == [(r, n) for r in range(3) for n in ("(run)", "step")], e0
    for (rank, _), cells in rows.items():
        assert cells[2] == str(rank), e0  # its own GPU
        # SM MHz, power, energy and temperature, where "-" stood before; the time under a
        # reason is what the samples inside the region saw: a 50 ms step between two of the
        # sampler's 100 ms ticks saw none ("-"), on rank 0's own row as on the others', and
        # one that caught a tick's edge a part of a ms ("idle 595.2 us", on 2 busy cores)
        line = " ".join(cells) + " "
        assert re.search(r" \d+ +\d+ W +~?[\d.]+ J +\d+-\d+ +(idle [\d.]+ [mu]?s|-) ", line), e0


def test_ranks_of_two_nodes_each_gpu_0_are_two_rows_named_by_node_and_uuid(tmp_path):
    """Two ranks, each on GPU 0 of a node of its own (Slurm's SLURMD_NODENAME; each its own
    simulated machine): rank 0's table has a node column, and each rank's line its GPU's
    UUID, which differ (tests/test_slurm_nodes.py runs this under a real 2-node srun)."""
    from gpuenv.backend.sim import SimBackend

    uuids = []
    for seed in (0, 1):
        with SimBackend("h100", n_gpus=1, seed=seed, state_file=tmp_path / f"sim{seed}") as b:
            uuids.append(b.device_info(0).uuid)
    assert uuids[0] != uuids[1]
    procs = [
        start_rank(
            r,
            2,
            tmp_path,
            LOCAL_RANK="0",
            GPUENV_SIM_GPUS="1",
            GPUENV_SIM_STATE=str(tmp_path / f"sim{r}"),
            GPUENV_SIM_SEED=str(r),
            SLURMD_NODENAME=f"gpu0{r + 1}",
        )
        for r in (1, 0)
    ]
    (c1, e1), (c0, e0) = (finish(p) for p in procs)
    assert (c0, c1) == (0, 0), e0 + e1
    for r in (0, 1):
        line = next(ln for ln in e0.splitlines() if ln.startswith(f"  rank {r} ("))
        assert line.startswith(f"  rank {r} (gpu0{r + 1}): exited with 0"), e0
        assert line.endswith(f"on GPU 0 (NVIDIA H100 80GB HBM3) [{uuids[r]}]"), e0
    header = next(ln for ln in e0.splitlines() if "region" in ln and "verdict" in ln)
    assert header.split()[:4] == ["rank", "node", "region", "gpu"], e0
    rows = sorted(ln.split()[:4] for ln in e0.splitlines() if ln.split()[2:3] == ["step"])
    assert rows == [["0", "gpu01", "step", "0"], ["1", "gpu02", "step", "0"]], e0
