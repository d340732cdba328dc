"""Telemetry during timed regions: Sample records, the Sampler, Window summaries.

The sampler reads the cheap values (clocks, power, temperature, reasons: ~2 us
each on an H100) on every tick, and the slow cumulative counters (energy ~3 ms,
time under each reason ~0.6 ms) at most every `slow_period` (1 s) and at region
edges: in real time in a sampler process writing shared memory (a thread where
no other process can open the GPU). A region's `Window` summarises the samples
that cover it, including the ones just before and after it.

The package:
    samples.py   Sample, SlowSample, Gap; the driver refresh, the sampling and hurried periods
    window.py    Window; merge_windows (chunks -> Window)
    summary.py   summarize (samples -> Window), summarize_many (a bench's reps at once)
    held.py      Held: the cheap samples over a region (clocks, temperature, reasons)
    counters.py  Counters: the cumulative reason counters over a region
    reader.py    Reader: what is read when (ticks, slow grids, edge reads), and its loop
    ring.py      the shared-memory rings between the sampler process and its parent
    process.py   the parent's handle on the sampler process (start, wake, pull, stop)
    child.py     the sampler process itself
    buffers.py   the Sampler's rings in this process: records as plain tuples (no GC cost)
    sampler.py   Sampler: process or thread, edge reads (mark), windows
    source.py    SampleSource: what a measurement needs of a sampler (a Protocol)
    trace.py     the trace `gpuenv plot` draws: SampleLog (bounded), TracePieces (a session's)
"""

from __future__ import annotations

from gpuenv.telemetry.reader import (
    DEFAULT_ENERGY_PERIOD_S,
    DEFAULT_PROCESS_PERIOD_S,
    DEFAULT_SLOW_PERIOD_S,
    EDGE_MIN_INTERVAL_S,
)
from gpuenv.telemetry.sampler import (
    DEFAULT_CAPACITY,
    EDGE_WAIT_S,
    SLOW_LOOKBACK_S,
    Sampler,
    choose_mode,
)
from gpuenv.telemetry.samples import (
    DEFAULT_PERIOD_S,
    DRIVER_REFRESH_S,
    HURRY_PERIOD_S,
    Gap,
    Sample,
    SlowSample,
)
from gpuenv.telemetry.source import SampleFeed, SampleSource
from gpuenv.telemetry.summary import ENERGY_EXACT_MIN_S, summarize, summarize_many
from gpuenv.telemetry.trace import MAX_POINTS, SampleLog, TracePieces, trace_record
from gpuenv.telemetry.window import Window, merge_windows

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_ENERGY_PERIOD_S",
    "DEFAULT_PERIOD_S",
    "DEFAULT_PROCESS_PERIOD_S",
    "DEFAULT_SLOW_PERIOD_S",
    "DRIVER_REFRESH_S",
    "EDGE_MIN_INTERVAL_S",
    "EDGE_WAIT_S",
    "ENERGY_EXACT_MIN_S",
    "HURRY_PERIOD_S",
    "MAX_POINTS",
    "SLOW_LOOKBACK_S",
    "Gap",
    "Sample",
    "SampleFeed",
    "SampleLog",
    "SampleSource",
    "Sampler",
    "SlowSample",
    "TracePieces",
    "Window",
    "choose_mode",
    "merge_windows",
    "summarize",
    "summarize_many",
    "trace_record",
]
