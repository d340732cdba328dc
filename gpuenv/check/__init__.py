"""`gpuenv check`: the GPUs of one node side by side, and the one that is slower named.

    report = check_node(backend, [0, 1, 2, 3])
    print(report_text(report))

The same kernels (a heavy bf16 matmul, a memory-bound copy, a tiny kernel, then the
matmul sustained) run on every GPU, one GPU at a time and then all at once; the GPUs
are ranked by time and by the clock each holds under the sustained load, and a GPU
more than 2% slower than the median of the others (the matmul's short reps, read in the
power cap's onset, are shown but not compared), or holding a lower sustained clock, is
named with the telemetry that explains it (a lower power limit, the power
cap, thermal slowdown, another process). Read-only on the GPU: it only runs work and
reads telemetry (`gpuenv check --sm ...` locks around it, as `gpuenv run` does). Bounded: `budget_s` (60 s) covers every phase on up to 8 GPUs.

    kernels.py  what runs on a GPU (torch on CUDA, the simulator's own work), and how
                GPUs run at once
    node.py     the phases, their telemetry, the ranking and the named GPUs
    report.py   the records, the table and the JSON
    store.py    root's last check, one file a GPU, kept for gpuenvd's gauges
"""

from __future__ import annotations

from gpuenv.check.node import check_node
from gpuenv.check.report import GpuCheck, NodeCheck, PhaseResult, report_text

__all__ = ["GpuCheck", "NodeCheck", "PhaseResult", "check_node", "report_text"]
