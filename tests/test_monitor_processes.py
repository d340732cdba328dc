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
    SORT_KEYS,
    NvitopProcesses,
    ProcView,
    _from_snapshot,
    arrange,
    clean_command,
    process_reader,
    shorten_command,
)
from gpuenv.monitor.streams import stream_record
from gpuenv.monitor.view import render


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (80, "/tmp/t1/venv/bin/python3 /tmp/t1/work/bench.py --size 4096"),
        (40, "/tmp/t1/venv/bin/python3…"),
        (52, "/tmp/t1/venv/bin/python3 /tmp/t1/work/bench.py…"),
        (6, "/tmp/…"),
        (1, "…"),
        (0, ""),
    ],
)
def test_commands_are_shown_from_their_start_cut_at_a_word(width, expected):
    cmd = "/tmp/t1/venv/bin/python3 /tmp/t1/work/bench.py --size 4096"
    assert shorten_command(cmd, width) == expected
    assert len(shorten_command(cmd, width)) <= width


@pytest.mark.parametrize(
    ("cmdline", "shown"),
    [
        # the H100 case: a `python3 -c` script showed as its tail, with \n escapes
        (["/usr/bin/python3", "-c", "import torch\nx = torch.ones(8)\nprint(x)"], "python3 -c ..."),
        (["/usr/bin/python3", "-c", "print(1)"], "python3 -c print(1)"),
        (
            ["/opt/venv/bin/python", "/tmp/bench.py", "--size", "4096"],
            "python /tmp/bench.py --size 4096",
        ),
        ([], ""),
    ],
)
def test_a_command_line_reads_from_its_start_as_nvitop_shows_it(cmdline, shown):
    assert clean_command(cmdline) == shown
    assert "\n" not in clean_command(cmdline)


def test_processes_sort_and_filter_by_nvitops_keys():
    a = ProcView(30, "ann", "a", 100, 5, "C", 1.0, 2.0, 10.0)
    b = ProcView(10, "bob", "b", 300, 50, "G", 9.0, 0.5, 99.0)
    c = ProcView(20, "ann", "c", 200, None, "C+G", None, None, None)
    procs = (a, b, c)
    assert [p.pid for p in arrange(procs)] == [10, 20, 30]
    assert [p.pid for p in arrange(procs, "gpu_memory", reverse=True)] == [10, 20, 30]
    assert [p.pid for p in arrange(procs, "cpu_percent", reverse=True)] == [10, 30, 20]
    assert [p.pid for p in arrange(procs, "sm_utilization")] == [20, 30, 10]  # unknown first
    assert [p.pid for p in arrange(procs, kind="C")] == [20, 30]  # C+G counts as both
    assert [p.pid for p in arrange(procs, kind="G")] == [10, 20]
    assert [p.pid for p in arrange(procs, users=("ann",))] == [20, 30]
    assert [p.pid for p in arrange(procs, pids=(10,))] == [10]
    assert set(SORT_KEYS) >= {"pid", "user", "gpu_memory", "cpu_percent", "memory_percent", "time"}


def test_the_simulated_gpu_names_its_processes_shares_the_sm_and_counts_memory(sim):
    sim.open_context(0)
    sim.set_background_load(0, 0.6)
    for _ in range(3):
        sim.run_work(0, MAX * 0.5, power_intensity=0.3)
    rows = process_reader(sim)(0)
    assert [p.pid for p in rows] == sorted([os.getpid(), 400_000])
    mine, other = (rows[0], rows[1]) if rows[0].pid == os.getpid() else (rows[1], rows[0])
    assert other == ProcView(400_000, "sim", "(simulated) another process, 60% busy", 2048, 60)
    assert mine.kind == "C" and mine.cpu_pct is not None and mine.mem_pct is not None
    assert mine.time_s is not None and mine.time_s > 0  # this process, as psutil sees it
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

        def cpu_percent(self) -> float:
            return 0.0

        def memory_percent(self) -> float:
            return 0.0

    monkeypatch.setattr(psutil, "Process", FakeProcess)
    monkeypatch.setattr(processes, "MAX_NAMES", 8)
    names = processes._HostNames()
    for pid in range(100, 130):
        found = names.lookup(pid)
        assert (found.user, found.command) == ("u", f"job{pid}")
    assert len(names._cache) == 8
    assert set(names._cache) == set(range(122, 130))


def test_a_wide_user_or_command_keeps_the_process_table_aligned(sim, vclock):
    """Columns are measured in display columns (gpuenv.table): a CJK user name or an emoji
    in a command takes two columns a character, and the columns after it stay in place."""
    from gpuenv.table import display_width

    procs = [
        ProcView(101, "ann", "python3 bench.py --size 4096", 100, 5),
        ProcView(102, "山田太郎", "python3 训练脚本.py 🚀 --size 4096 --steps 100", 200, 50),
        ProcView(103, "データサイエンティスト", "python3 評価.py", 300, 7),
    ]
    model = MonitorModel(sim, [0], clock=vclock, processes=lambda i: procs)
    for width in (120, 90, 70):
        lines = plain(render(model.update(), Frame(), width, 30)).splitlines()
        assert all(display_width(line) <= width for line in lines), (width, lines)
        head = next(line for line in lines if "COMMAND" in line)
        rows = [next(line for line in lines if line.lstrip().startswith(str(p.pid))) for p in procs]
        # the command starts in the header's COMMAND column on every row
        at = display_width(head[: head.index("COMMAND")])
        for row, p in zip(rows, procs, strict=True):
            start = next(k for k in range(len(row)) if p.command.startswith(row[k : k + 7]))
            assert display_width(row[:start]) == at, (width, row)
        if width >= 110:  # USER shown: the too-wide name cut to its column with "…"
            assert "山田太郎" in rows[1] and "…" in rows[2]
