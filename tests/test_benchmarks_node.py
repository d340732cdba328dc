"""The multi-GPU node's benchmarks on the simulated node (issue 33 items 3 and 5), so their
code path is tested before the device runs them: `benchmarks.collective` (a data-parallel
step under a wrapped torchrun, control and one GPU preheated) and
`benchmarks.node_concurrent` (one process per GPU at once vs alone). Nothing is timed
here: what is checked is what each run reports, not how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(module: str, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "GPUENV_SIM_STATE"):
        env.pop(k, None)
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--sim", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result, json.loads(out.read_text())


def table(record: dict) -> dict:
    (first,) = [b["table"] for b in record["blocks"] if "table" in b][:1]
    return first


def test_collective_runs_both_jobs_and_reports_the_row_for_each(tmp_path):
    pytest.importorskip("torch", reason="torch (its CPU build) runs the real torchrun")
    args = ("--gpus", "2", "--steps", "6", "--warmup", "1", "--preheat-s", "1")
    result, record = bench("collective", tmp_path / "c.json", *args)
    rows = table(record)["rows"]
    assert [r[0] for r in rows] == ["control", "GPU 1 preheated"], result.stdout
    assert all(r[1].endswith(" ms") for r in rows), rows  # each job's step kind was found
    assert set(record["metrics"]) == {"named_preheated", "control_named_none"}
    assert "the ranks' steps (regions every rank marked alike)" in result.stdout


def test_node_concurrent_gives_every_process_the_gpu_it_was_given(tmp_path):
    result, record = bench("node_concurrent", tmp_path / "n.json", "--gpus", "2", "--budget", "0.3")
    rows = table(record)["rows"]
    assert [r[0] for r in rows] == ["0", "1"]
    assert all(r[1].endswith("... yes") for r in rows), result.stdout  # by UUID, any order
    assert set(record["metrics"]) == {"heavy_worst_rel", "tiny_worst_rel"}
