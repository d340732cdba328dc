"""gpuenv monitor's reads per frame: what does not change each second is not read each second.

Counted through a proxy on the simulated GPU (the same Backend protocol as NVML), one
update a virtual second, as the live view runs at its default interval."""

from __future__ import annotations

import collections
from typing import Any

from gpuenv.backend import GpuProcess
from gpuenv.monitor import MonitorModel
from gpuenv.monitor.processes import ProcView, process_reader


class Counted:
    """`inner`'s methods, each call counted by name (with its keyword arguments kept)."""

    def __init__(self, inner: Any, listed: list[GpuProcess] | None = None):
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()
        self.kwargs: list[tuple[str, dict[str, Any]]] = []
        self.listed = listed  # what processes() says instead of the sim, when set

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self.inner, attr)
        if attr.startswith("_") or not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[attr] += 1
            self.kwargs.append((attr, kwargs))
            if attr == "processes" and self.listed is not None:
                return list(self.listed)
            return value(*args, **kwargs)

        return counted


def run(model: MonitorModel, vclock: Any, frames: int) -> None:
    for _ in range(frames):
        model.update()
        vclock.advance(1.0)


def test_the_board_and_the_limits_are_read_every_few_seconds_not_each_frame(sim, vclock):
    counted = Counted(sim)
    model = MonitorModel(counted, [0], clock=vclock, processes=False, lock_lookup=None)
    run(model, vclock, 20)
    c = counted.calls
    assert c["read_fast"] == c["performance_state"] == c["utilization"] == c["memory"] == 20
    # fan, ECC, compute mode (a few dozen NVML calls) and persistence: every 10 s
    assert c["details"] == c["persistence_mode"] == 2
    assert c["power_limits"] == c["read_slow"] == 10  # every 2 s
    assert c["device_info"] == c["clock_limits"] == c["thresholds"] == 1  # once
    # the reason counters without the ~3 ms energy counter the monitor does not show
    assert all(kw == {"energy": False} for name, kw in counted.kwargs if name == "read_slow")


def test_process_snapshots_follow_the_pids_and_rows_take_each_frames_memory(sim, vclock):
    counted = Counted(sim, listed=[GpuProcess(7, 100, "compute")])
    snaps: list[int] = []

    def reader(i: int) -> tuple[ProcView, ...]:  # the host's view (nvitop, psutil): costly
        snaps.append(i)
        return tuple(
            ProcView(p.pid, "ann", "python3 x.py", p.used_memory_mib, 5)
            for p in counted.listed or ()
        )

    model = MonitorModel(counted, [0], clock=vclock, processes=reader, lock_lookup=None)
    (v,) = model.update()
    assert len(snaps) == 1 and v.processes[0].used_memory_mib == 100
    vclock.advance(1.0)
    counted.listed = [GpuProcess(7, 300, "compute")]  # the same process, more memory
    (v,) = model.update()
    assert len(snaps) == 1  # no new snapshot: the pids are the same
    assert (v.processes[0].pid, v.processes[0].user, v.processes[0].used_memory_mib) == (
        7,
        "ann",
        300,
    )
    vclock.advance(1.0)
    (v,) = model.update()
    assert len(snaps) == 2  # process_period (2 s) after the last: %CPU, TIME move on
    vclock.advance(1.0)
    counted.listed = [GpuProcess(7, 300, "compute"), GpuProcess(8, 50, "compute")]
    (v,) = model.update()
    assert len(snaps) == 3 and [p.pid for p in v.processes] == [7, 8]  # a new pid: at once
    vclock.advance(1.0)
    counted.listed = [GpuProcess(8, 50, "compute")]
    (v,) = model.update()
    assert len(snaps) == 4 and [p.pid for p in v.processes] == [8]  # one gone: at once


def test_the_simulated_gpus_process_rows_are_snapshotted_every_two_seconds(sim, vclock):
    sim.open_context(0)
    counted = Counted(sim)
    inner = process_reader(sim)
    snaps = []

    def reader(i: int) -> tuple[ProcView, ...]:
        snaps.append(i)
        return inner(i)

    model = MonitorModel(counted, [0], clock=vclock, processes=reader, lock_lookup=None)
    run(model, vclock, 10)
    assert len(snaps) == 5
    (v,) = model.update()
    assert v.processes and v.processes[0].used_memory_mib == 512
