"""`gpuenv monitor`: what makes a GPU's numbers lie, read live.

model.py      MonitorModel.update() -> one immutable GpuView per GPU
processes.py  the processes on a GPU (nvitop's process API on a real GPU), sorted
              and filtered by nvitop's keys
host.py       the host line: CPU, memory, swap, load, uptime (psutil)
view.py       GpuViews laid out for a terminal of any size, the help overlay
blocks.py     one GPU's detail block (parts that give way by priority) and row
draw.py       styled lines: glyphs, bars, sparklines, graphs, clipping, plain/ANSI
tui.py        the curses loop and its key handling (Ui)
streams.py    --json / --csv records, like `nvidia-smi dmon`
scenarios.py  SimScenario: a moving simulated GPU, for demos
app.py        what `gpuenv monitor` shows: a stream, a snapshot or the live view
"""

from __future__ import annotations

from gpuenv.monitor.model import (
    BAD_REASONS,
    REASON_SHORT,
    WARN_REASONS,
    GpuView,
    LockView,
    MonitorModel,
    ProcView,
    ReasonView,
    clocks_lock_view,
)
from gpuenv.monitor.scenarios import SCENARIOS, SimScenario
from gpuenv.monitor.streams import STREAM_FIELDS, stream, stream_record

__all__ = [
    "BAD_REASONS",
    "REASON_SHORT",
    "SCENARIOS",
    "STREAM_FIELDS",
    "WARN_REASONS",
    "GpuView",
    "LockView",
    "MonitorModel",
    "ProcView",
    "ReasonView",
    "SimScenario",
    "clocks_lock_view",
    "stream",
    "stream_record",
]
