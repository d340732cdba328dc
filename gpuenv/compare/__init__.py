"""Compare two sets of runs: what changed in the numbers, and was the GPU in the same state.

    report = compare_files(["a.jsonl"], ["b-rank0.jsonl", "b-rank1.jsonl"])
    print(format_report(report))

report.py compares (outcomes: faster, slower, no change, can't tell) and
writes the text; state.py says what the GPU did on each side (clock, power cap,
temperature, lock: claimed only for the measurements taken under it) and what
differs; files.py reads each side's files and their environment.
"""

from gpuenv.compare.files import expand_paths, load_side
from gpuenv.compare.report import (
    OUTCOMES,
    CompareReport,
    Comparison,
    compare_files,
    compare_runs,
    format_report,
)
from gpuenv.compare.state import GpuState

__all__ = [
    "OUTCOMES",
    "CompareReport",
    "Comparison",
    "GpuState",
    "compare_files",
    "compare_runs",
    "expand_paths",
    "format_report",
    "load_side",
]
