"""`gpuenv check` and a launcher wrapped whole on the real GPUs of the node (read-only:
GPUENV_READONLY=1 is fine). No timing is asserted: what runs, on which GPU, with telemetry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - NVML sees a GPU but torch does not
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

from gpuenv.backend import open_backend  # noqa: E402
from gpuenv.check import check_node  # noqa: E402
from gpuenv.results import load_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAFE = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def test_check_runs_every_kernel_on_every_gpu_alone_and_at_once():
    # the process's own GPUs: run with CUDA_VISIBLE_DEVICES=0 on a 2-GPU host, the host's
    # every GPU asked torch for one it cannot see (scripts/device-test on an H200 pair)
    from gpuenv.devices import own_gpus

    backend = open_backend(readonly=True)
    try:
        gpus = list(own_gpus(backend).indices)
        report = check_node(backend, gpus, budget_s=5 * (len(gpus) + 1))
    finally:
        backend.close()
    assert [g.gpu for g in report.gpus] == gpus
    for g in report.gpus:
        assert set(g.alone.times_s) == {"heavy", "copy", "tiny"}
        assert g.alone.sm_mhz and g.alone.sm_mhz > 300 and g.alone.power_w
        assert len(gpus) == 1 or (g.together is not None and g.together.sm_mhz)
        assert not g.named or g.why  # a named GPU always says why


def test_torchrun_wrapped_whole_gives_each_ranks_calls_on_its_gpu(tmp_path):
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("no torchrun")
    n = min(torch.cuda.device_count(), 4)
    env = dict(os.environ, GPUENV_READONLY="1", **SAFE)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    work = [str(ROOT / "benchmarks" / "workloads" / "rank_bench.py"), "--size", "2048"]
    out = tmp_path / "run.jsonl"
    cmd = [sys.executable, "-c", "from gpuenv.cli import main; main()", "run", "-o", str(out)]
    result = subprocess.run(
        [*cmd, "--", torchrun, "--standalone", "--nproc-per-node", str(n), *work],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ms = load_run(out).measurements[1:]
    gpus = set()
    for rank in range(n):
        # one worker is no rank of several (gpuenv.run.ranks.rank_of): its calls are the run's
        mine = [m for m in ms if m.extra.get("rank") == (rank if n > 1 else None)]
        assert sum("site" in m.extra for m in mine) == 2, result.stderr  # its 2 calls
        assert any(m.name == "step" and len(m.times_s) == 3 for m in mine)
        assert len({m.gpus for m in mine}) == 1 and len(mine[0].gpus) == 1  # its one GPU
        assert all(m.summary_windows[0].sm_mhz_mean for m in mine)
        gpus.add(mine[0].gpus)
    assert len(gpus) == n  # a GPU each
