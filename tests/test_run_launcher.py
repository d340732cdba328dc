"""`gpuenv run -- torchrun ...`: a launcher wrapped whole reaches every worker.

Workers inherit the launcher's environment but not the region pipe's fd (torchrun starts
them with close_fds): they open the named pipe by its path (gpuenv/run/region.py), say
which rank they are, and their regions and calls become measurements with their rank and
GPU. A launcher that clears the environment is named in the summary, with the form that
works. The simulated node has 4 GPUs; torch's CPU build runs the real torchrun.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.results import load_run
from gpuenv.run.ranks import worker_of
from gpuenv.run.region import parse_line, process_line
from gpuenv.run.report import RUN_NAME

ROOT = Path(__file__).resolve().parent.parent
GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]
FAKE_TRITON = """
import time
def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
    t = time.monotonic()
    fn()
    while time.monotonic() - t < 0.02:
        fn()
    return 1.5
"""
WORKER = """
import time
import gpuenv
from triton.testing import do_bench  # a do_bench call is a region by itself
for _ in range(2):
    do_bench(lambda: sum(range(100)))
with gpuenv.region("step"):
    time.sleep(0.05)
"""
# a launcher as torchrun starts workers: subprocess.Popen, environment copied, fds closed
POPEN_LAUNCHER = """
import os, subprocess, sys
n = int(sys.argv[1])
env = lambda r: dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n))
procs = [subprocess.Popen([sys.executable, sys.argv[2]], env=env(r)) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
"""
# a launcher that clears its workers' environment (sudo, env -i, some schedulers)
CLEARING_LAUNCHER = """
import os, subprocess, sys
env = lambda r: {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "PATH": ""}
procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"], env=env(r))
         for r in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def files(tmp_path: Path) -> Path:
    (tmp_path / "fake" / "triton").mkdir(parents=True)
    (tmp_path / "fake" / "triton" / "__init__.py").write_text("")
    (tmp_path / "fake" / "triton" / "testing.py").write_text(FAKE_TRITON)
    for name, text in (
        ("worker.py", WORKER),
        ("popen_launcher.py", POPEN_LAUNCHER),
        ("clearing_launcher.py", CLEARING_LAUNCHER),
    ):
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def gpuenv_run(
    tmp_path: Path, *cmd: str, gpus: int = 4, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUENV_SIM_GPUS=str(gpus))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), str(ROOT)])
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the named pipe's directory is made
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [*GPUENV, "--sim", "run", *args, "-o", str(tmp_path / "run.jsonl"), "--", *cmd],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )


def assert_every_worker(tmp_path: Path, result: subprocess.CompletedProcess, n: int) -> None:
    """Every worker's do_bench calls and region, each with its rank and its GPU alone."""
    assert result.returncode == 0, result.stderr
    ms = load_run(tmp_path / "run.jsonl").measurements
    assert ms[0].name == RUN_NAME and ms[0].gpus == tuple(range(4))  # every GPU, sampled once
    for rank in range(n):
        mine = [m for m in ms[1:] if m.extra.get("rank") == rank]
        assert sorted(m.name for m in mine) == [
            "do_bench worker.py:6 #1",
            "do_bench worker.py:6 #2",
            "step",
        ], result.stderr
        assert all(m.gpus == (rank,) for m in mine), [(m.name, m.gpus) for m in mine]
        assert all(w.sm_mhz_mean for m in mine for w in m.summary_windows)
    assert {m.extra.get("rank") for m in ms[1:]} == set(range(n))
    table = result.stderr.split("the ranks' steps")[0]  # the rank table, not the steps' row
    rows = [ln.split() for ln in table.splitlines() if "step" in ln.split()]
    assert [r[:3] for r in rows] == [[str(k), "step", str(k)] for k in range(n)], result.stderr
    assert "not reached" not in result.stderr
    assert list((tmp_path / "tmp").glob("gpuenv-run-*")) == []  # the named pipe removed


def test_a_launcher_that_closes_fds_reaches_every_worker(tmp_path):
    # no torch needed: a launcher as torchrun starts its workers (fds closed)
    files(tmp_path)
    result = gpuenv_run(tmp_path, sys.executable, "popen_launcher.py", "4", "worker.py")
    assert_every_worker(tmp_path, result, 4)


def test_a_worker_on_a_gpu_not_sampled_gets_no_other_gpus_telemetry(tmp_path):
    files(tmp_path)
    result = gpuenv_run(
        tmp_path, sys.executable, "popen_launcher.py", "2", "worker.py", args=("-i", "0")
    )
    assert result.returncode == 0, result.stderr
    ms = load_run(tmp_path / "run.jsonl").measurements
    assert {m.gpus for m in ms if m.extra.get("rank") == 0} == {(0,)}
    assert {m.gpus for m in ms if m.extra.get("rank") == 1} == {()}  # never GPU 0's
    assert "rank 1 ran on GPU 1, which this run does not sample (-i)" in result.stderr


def _torchrun() -> str:
    pytest.importorskip("torch", reason="torch (its CPU build) runs the real torchrun")
    path = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which(
        "torchrun"
    )
    if path is None:
        pytest.skip("torch is installed without its torchrun script")
    return path


def test_torchrun_wrapped_whole_reaches_every_worker_with_its_rank_and_gpu(tmp_path):
    torchrun = _torchrun()
    files(tmp_path)
    result = gpuenv_run(tmp_path, torchrun, "--standalone", "--nproc-per-node", "4", "worker.py")
    assert_every_worker(tmp_path, result, 4)


def test_python_m_torch_distributed_run_reaches_every_worker(tmp_path):
    _torchrun()
    files(tmp_path)
    result = gpuenv_run(
        tmp_path,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "worker.py",
    )
    assert_every_worker(tmp_path, result, 4)


def test_a_launcher_that_clears_the_environment_is_named_with_the_form_that_works(tmp_path):
    files(tmp_path)
    result = gpuenv_run(tmp_path, sys.executable, "clearing_launcher.py")
    assert result.returncode == 0, result.stderr
    python = os.path.basename(sys.executable)  # python or python3, as the venv names it
    assert f"2 worker(s) of '{python} clearing_launcher.py' not reached" in result.stderr
    assert "gpuenv run as each worker's command" in result.stderr
    assert "--no-python gpuenv run" in result.stderr
    run = load_run(tmp_path / "run.jsonl").measurements[0]
    assert run.extra["unreached_workers"]["count"] == 2


def test_a_workers_process_line_carries_its_rank_variables():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "HOME": "/root"}
    edge = parse_line(process_line(42, env))
    assert edge is not None and edge.kind == "p" and edge.pid == 42
    assert edge.meta == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    assert process_line(42, {"HOME": "/root"}) == ""  # not a launcher's worker: nothing


def test_a_workers_gpu_follows_its_local_rank_through_cuda_visible_devices(vclock):
    backend = SimBackend(n_gpus=4, clock=vclock)
    gpus = [0, 1, 2, 3]
    facts = {"RANK": "4", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "3,1"}
    assert worker_of(facts, backend, gpus) == (4, 3)
    assert worker_of(dict(facts, LOCAL_RANK="1"), backend, gpus) == (4, 1)
    assert worker_of(dict(facts, LOCAL_RANK="1"), backend, [0, 3]) == (4, 1)  # not sampled
    assert worker_of({"RANK": "2", "WORLD_SIZE": "4"}, backend, gpus) == (2, None)  # which GPU?
