"""The monitor's processes (gpuenv/monitor/processes.py) and device memory: the simulated
GPU's through the backend, a real GPU's through nvitop's process API."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
from monitor_harness import MAX

from gpuenv.errors import BackendError
from gpuenv.monitor import MonitorModel
from gpuenv.monitor.blocks import Frame
from gpuenv.monitor.draw import plain
from gpuenv.monitor.processes import (
    NvitopProcesses,
    ProcView,
    _from_snapshot,
    process_reader,
    shorten_command,
)
from gpuenv.monitor.streams import stream_record
from gpuenv.monitor.view import render


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (80, "/tmp/t1/venv/bin/python3 /tmp/t1/work/bench.py --size 4096"),
        (24, "…/bench.py --size 4096"),
        (30, "…/t1/work/bench.py --size 4096"),
        (14, "…--size 4096"),
        (6, "…4096"),
        (1, "…"),
        (0, ""),
    ],
)
def test_commands_are_cut_from_the_left_at_a_boundary(width, expected):
    cmd = "/tmp/t1/venv/bin/python3 /tmp/t1/work/bench.py --size 4096"
    assert shorten_command(cmd, width) == expected
    assert len(shorten_command(cmd, width)) <= width


def test_the_simulated_gpu_names_its_processes_shares_the_sm_and_counts_memory(sim):
    sim.open_context(0)
    sim.set_background_load(0, 0.6)
    for _ in range(3):
        sim.run_work(0, MAX * 0.5, power_intensity=0.3)
    rows = process_reader(sim)(0)
    assert [p.pid for p in rows] == sorted([os.getpid(), 400_000])
    mine, other = (rows[0], rows[1]) if rows[0].pid == os.getpid() else (rows[1], rows[0])
    assert other == ProcView(400_000, "sim", "(simulated) another process, 60% busy", 2048, 60)
    assert mine.used_memory_mib == 512 and mine.sm_pct == 40
    assert "pytest" in mine.command or "python" in mine.command  # named by the host (psutil)
    mem = sim.memory(0)
    assert mem is not None and (mem.used_mib, mem.total_mib) == (512 + 2048, 81559)


def test_memory_reaches_the_view_and_the_stream(sim, vclock):
    sim.open_context(0)
    model = MonitorModel(sim, [0], clock=vclock)
    view = model.update()[0]
    assert (view.mem_used_mib, view.mem_total_mib) == (512, 81559)
    rec = stream_record(view)
    assert (rec["mem_used_mib"], rec["mem_total_mib"]) == (512, 81559)


def test_a_failing_memory_read_hides_nothing_else(sim, vclock):
    sim.inject_fault(0, "not_supported", op="memory")
    view = MonitorModel(sim, [0], clock=vclock).update()[0]
    assert view.error is None and view.sm_mhz and view.mem_used_mib is None


def test_nvitop_snapshots_become_rows_and_its_na_becomes_unknown():
    from nvitop import NA
    from nvitop.api.utils import Snapshot

    full = Snapshot(
        real=None,
        pid=42,
        username="ada",
        command="python3 train.py",
        gpu_memory=3 * 1024 * 1024 * 1024,
        gpu_sm_utilization=87,
    )
    assert _from_snapshot(full) == ProcView(42, "ada", "python3 train.py", 3072, 87)
    gone = Snapshot(real=None, pid=7, username=NA, command=NA, gpu_memory=NA, gpu_sm_utilization=NA)
    assert _from_snapshot(gone) == ProcView(7, "?", "?", None, None)


def test_nvitop_without_a_driver_is_a_backend_error_the_model_absorbs():
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a real GPU is here: see test_nvitop_lists_the_real_gpus_processes")
    with pytest.raises(BackendError, match="nvitop could not list the processes"):
        NvitopProcesses()(0)


def test_a_process_list_that_cannot_be_read_says_so(sim, vclock):
    sim.inject_fault(0, "permission", op="processes")
    view = MonitorModel(sim, [0], clock=vclock).update()[0]
    assert view.error is None and view.processes == () and view.processes_error
    text = plain(render([view], Frame(), 120, None))
    assert "procs   unknown: " in text and "none" not in text


def test_nvitop_is_not_imported_until_processes_are_read():
    code = (
        "import sys; from gpuenv.cli import cli; import gpuenv.monitor.app, gpuenv.monitor.view;"
        "import gpuenv.monitor.tui; assert 'nvitop' not in sys.modules, 'nvitop imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.gpu
def test_nvitop_lists_the_real_gpus_processes_and_memory_matches_nvidia_smi():
    from gpuenv.backend import open_backend

    backend = open_backend("nvml", readonly=True)
    try:
        mem = backend.memory(0)
        rows = process_reader(backend)(0)
    finally:
        backend.close()
    smi = subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert mem is not None and abs(mem.total_mib - int(smi.stdout.strip())) <= 1
    assert all(p.pid > 0 and p.command for p in rows)


def test_the_host_names_remembered_stay_bounded(monkeypatch):
    """A monitor left running meets a new pid with every process on the GPU: the names it
    keeps stay at MAX_NAMES, the newest kept."""
    import psutil

    from gpuenv.monitor import processes

    class FakeProcess:
        def __init__(self, pid: int):
            self.pid = pid

        def create_time(self) -> float:
            return 1.0

        def oneshot(self):
            return contextlib.nullcontext()

        def username(self) -> str:
            return "u"

        def cmdline(self) -> list[str]:
            return [f"job{self.pid}"]

    monkeypatch.setattr(psutil, "Process", FakeProcess)
    monkeypatch.setattr(processes, "MAX_NAMES", 8)
    names = processes._HostNames()
    for pid in range(100, 130):
        assert names.lookup(pid) == ("u", f"job{pid}")
    assert len(names._cache) == 8
    assert set(names._cache) == set(range(122, 130))
