"""The job's collective steps (gpuenv/run/collective.py): regions every rank marks alike
get a row; the GPU that held the step back is named with its state, and the others' wait
for it inferred from the clocks. The last test runs a real torchrun (torch's CPU build,
gloo) on a simulated node of 4 H100s whose GPU 2 has a lower power limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuenv.results import Measurement, load_run
from gpuenv.run.collective import collective_lines, collective_steps
from gpuenv.telemetry import Window

ROOT = Path(__file__).resolve().parent.parent
GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]


def step(
    rank: int,
    mhz: float,
    times: list[float],
    *,
    cap_s: float = 0.0,
    name: str = "step",
    busy: bool = True,
    others: tuple[int, ...] = (),
):
    w = Window(
        gpu=rank,
        t0=0.0,
        t1=sum(times),
        n_samples=10,
        sm_mhz_mean=mhz,
        sm_mhz_busy_mean=mhz if busy else None,
        temp_c_max=60.0,
        reason_s={"power": cap_s} if cap_s else {},
        other_pids=others,
    )
    return rank, Measurement.build(name, times, summary_windows=(w,), gpus=(rank,))


def test_the_gpu_with_the_lowest_clock_is_named_with_its_state_and_the_others_wait():
    pairs = [
        step(0, 1850, [0.050, 0.051]),
        step(1, 1830, [0.0502, 0.0508]),
        step(2, 1480, [0.0501, 0.0509], cap_s=0.04),
        step(3, 1840, [0.0500, 0.0505]),
    ]
    (s,) = collective_steps(pairs)
    assert s.ranks == (0, 1, 2, 3) and s.steps == 2
    assert s.spread_s == pytest.approx(0.00035) and s.spread_max_s == pytest.approx(0.0005)
    assert s.slowest is not None and s.slowest.gpu == 2 and s.others_mhz == 1840
    assert s.slowest.capped_frac == pytest.approx(0.04 / 0.101)
    # the others' share took 1480/f of GPU 2's: at most step * (1 - 1480/1840) waited
    assert s.wait_s == pytest.approx(s.step_s * (1 - 1480 / 1840))
    text = "\n".join(collective_lines([s]))
    assert "GPU 2 (rank 2) held the step back: 1480 MHz while busy" in text
    assert "power-capped 40% of its steps' time" in text and "inferred" in text


def test_gpus_that_agree_name_none_and_regions_marked_differently_are_no_step():
    pairs = [
        step(0, 1850, [0.05] * 3),
        step(1, 1830, [0.05] * 3),
        step(2, 1840, [0.05] * 2),  # another step count: its own kind, of one rank
        step(0, 1850, [0.01], name="eval"),  # one rank only
    ]
    (s,) = collective_steps(pairs)
    assert s.ranks == (0, 1) and s.slowest is None and s.wait_s is None
    assert "no GPU held the step back" in "\n".join(collective_lines([s]))
    # the low end of GPUs that each differ a little stands apart from none: no name
    spread = [step(0, 1850, [0.05]), step(1, 1800, [0.05]), step(2, 1770, [0.05])]
    assert collective_steps(spread)[0].slowest is None


def test_a_gpu_shared_with_another_process_is_named_where_its_clock_cannot_show_it():
    # 4 H100s under a step that caps every GPU alike hold the same clock; a GPU another
    # process shares takes the job's share at that clock, slower: said, not inferred
    pairs = [step(r, 1380 + r, [0.05, 0.05], others=(4242,) if r == 3 else ()) for r in range(4)]
    (s,) = collective_steps(pairs)
    assert s.slowest is None
    text = "\n".join(collective_lines([s]))
    assert "no GPU held the step back by its clock" in text
    assert "GPU 3 (rank 3) ran, beside another process (pid 4242)" in text
    # named by its clock, its state says who shared it
    pairs[3] = step(3, 1200, [0.05, 0.05], others=(4242,))
    text = "\n".join(collective_lines(collective_steps(pairs)))
    assert "GPU 3 (rank 3) held the step back: 1200 MHz while busy" in text
    assert "beside another process (pid 4242)" in text


def _torchrun() -> str:
    pytest.importorskip("torch", reason="torch (its CPU build) runs the real torchrun")
    import shutil

    path = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if path is None:
        pytest.skip("torch is installed without its torchrun script")
    return path


# a data-parallel step: each rank's share of work on its (simulated) GPU, then an
# all-reduce through gloo that waits for the slowest rank
DDP_STEP = """
import os
import torch
import torch.distributed as dist
import gpuenv
from gpuenv.backend.sim import SimBackend

dist.init_process_group("gloo")
gpu = int(os.environ["LOCAL_RANK"])
sim = SimBackend.from_env()
grad = torch.ones(1 << 16)
for _ in range(40):
    with gpuenv.region("step"):
        sim.run_work(gpu, 0.04 * 1.98e9, power_intensity=1.0)  # 40 ms at the top clock
        dist.all_reduce(grad)
sim.close()
dist.destroy_process_group()
"""


def _ddp_job(tmp_path: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    """`argv` (a torchrun of ddp_step.py on 4 ranks) on a simulated node whose GPU 2 is held
    to 450 W; then `gpuenv check --json` on the same node."""
    from gpuenv.backend.sim import SimBackend

    (tmp_path / "ddp_step.py").write_text(textwrap.dedent(DDP_STEP))
    env = dict(os.environ, GPUENV_SIM_GPUS="4", GPUENV_SIM_STATE=str(tmp_path / "sim.json"))
    env.update(PYTHONPATH=str(ROOT), GPUENV_BACKEND="sim", GPUENV_RANKS_DIR=str(tmp_path))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    node = SimBackend(n_gpus=4, state_file=tmp_path / "sim.json")  # held open: the limit stays
    node.set_power_limit(2, 450)
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
        )
        check = subprocess.run(
            [*GPUENV, "--sim", "check", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        node.close()
    assert result.returncode == 0, result.stderr
    assert check.returncode == 1, check.stderr
    return result, json.loads(check.stdout)


def test_torchrun_ddp_step_names_the_gpu_with_the_lower_power_limit(tmp_path):
    torchrun = _torchrun()
    run = [*GPUENV, "--sim", "run", "-o", str(tmp_path / "run.jsonl"), "--", torchrun]
    result, check = _ddp_job(
        tmp_path, [*run, "--standalone", "--nproc-per-node", "4", "ddp_step.py"]
    )
    ms = load_run(tmp_path / "run.jsonl").measurements
    pairs = [(m.extra["rank"], m) for m in ms if "rank" in m.extra]
    (s,) = collective_steps(pairs)
    assert s.ranks == (0, 1, 2, 3) and s.steps == 40
    assert s.slowest is not None and s.slowest.gpu == 2, result.stderr
    assert s.slowest.power_cap_s > 0 and s.wait_s is not None and s.wait_s > 0
    assert "step: GPU 2 (rank 2) held the step back" in result.stderr
    assert check["named"] == [2]  # gpuenv check names the same GPU


def test_each_rank_wrapped_under_summary_rank0_names_it_too(tmp_path):
    import shutil

    torchrun = _torchrun()
    gpuenv = shutil.which("gpuenv", path=os.path.dirname(sys.executable))
    if gpuenv is None:
        pytest.skip("gpuenv is not installed as a command beside this Python")
    argv = [torchrun, "--standalone", "--nproc-per-node", "4", "--no-python", gpuenv, "run"]
    argv += ["--summary", "rank0", "--", sys.executable, "ddp_step.py"]
    result, _ = _ddp_job(tmp_path, argv)
    assert "step: GPU 2 (rank 2) held the step back" in result.stderr


def test_rank0s_table_under_summary_rank0_carries_the_row_and_no_run_step():
    from gpuenv.run.ranks import combined_text

    record = {"command": "python train.py", "state": "clocks not locked", "outcome": "exited 0"}
    record.update(duration_s=1.0, where="GPU 0")
    runs = []
    for rank, mhz in enumerate((1850, 1830, 1480, 1840)):
        _, m = step(rank, mhz, [0.05, 0.05])
        _, whole = step(rank, mhz, [1.0], name="(run)")
        runs.append((rank, record, [whole, m]))
    text = combined_text(runs, [], 60.0)
    assert "step: GPU 2 (rank 2) held the step back" in text
    assert "(run): " not in text.split("regions every rank marked alike")[1]


def test_gpus_idle_through_the_steps_are_said_idle_not_compared():
    # a step that runs nothing on the GPU (the sampled clock is the idle 345 MHz)
    idle = [step(r, 345, [0.05, 0.05], busy=False) for r in range(3)]
    (s,) = collective_steps(idle)
    assert s.gpus == () and s.idle_ranks == (0, 1, 2) and s.slowest is None
    assert "were idle through their steps" in "\n".join(collective_lines([s]))
