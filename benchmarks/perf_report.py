"""triton's vector-add tutorial (perf_report) bare and under `gpuenv run`, side by side.

The GB/s it prints, and gpuenv's verdict on each point.

The tutorial runs unmodified (benchmarks/workloads/perf_report_vadd.py: 16 sizes x
triton / torch, `do_bench(quantiles=[0.5, 0.2, 0.8])`), as a fresh process, bare then
wrapped, `--pairs` times; the table gives each size's GB/s of the first pair, the
change under `gpuenv run`, and the verdict gpuenv gave the point. Read-only (gpuenv run
without --sm locks nothing); needs a GPU, torch, triton, pandas and matplotlib.

    GPUENV_READONLY=1 python -m benchmarks.perf_report          # results perf_report.json
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env

TUTORIAL = ROOT / "benchmarks" / "workloads" / "perf_report_vadd.py"
Points = dict[int, tuple[float, float]]  # size -> (triton GB/s, torch GB/s)


def parse_table(stdout: str) -> Points:
    """The table triton's `benchmark.run(print_data=True)` prints: index, size, Triton, Torch."""
    rows: Points = {}
    for line in stdout.splitlines():
        m = re.fullmatch(r"\s*\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*", line)
        if m:
            rows[int(float(m.group(1)))] = (float(m.group(2)), float(m.group(3)))
    return rows


def table(bare: Points, wrapped: Points, verdicts: dict[tuple[int, str], str]) -> list[str]:
    """The markdown table of one pair: GB/s bare and wrapped, the change, gpuenv's verdicts."""
    lines = [
        "| size | triton bare | triton under gpuenv run | change | torch bare | "
        "torch under gpuenv run | change | gpuenv's verdicts (triton / torch) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for size in sorted(bare):
        (tb, ob), (tw, ow) = bare[size], wrapped.get(size, (float("nan"), float("nan")))
        v = " / ".join(verdicts.get((size, p), "-") for p in ("triton", "torch"))
        lines.append(
            f"| {size} | {tb:.1f} | {tw:.1f} | {100 * (tw / tb - 1):+.1f}% | {ob:.1f} | "
            f"{ow:.1f} | {100 * (ow / ob - 1):+.1f}% | {v} |"
        )
    return lines


def largest_change(bare: Points, wrapped: Points, from_size: int = 2**21) -> float:
    """The largest |change| in % from `from_size` elements up (smaller kernels move by more
    than that from run to run in do_bench itself)."""
    sizes = [s for s in bare if s >= from_size and s in wrapped]
    pairs = [bw for s in sizes for bw in zip(bare[s], wrapped[s], strict=True)]
    return max((abs(100 * (w / b - 1)) for b, w in pairs), default=float("nan"))


def _once(wrapped: bool, tmp: Path, k: int) -> tuple[Points, dict[tuple[int, str], str]]:
    env = checkout_env(GPUENV_READONLY="1", MPLBACKEND="Agg")
    saved, out = tmp / f"plots{k}{'w' * wrapped}", tmp / f"run{k}.jsonl"
    saved.mkdir()
    child = [sys.executable, str(TUTORIAL), str(saved)]
    argv = [*GPUENV, "run", "-i", "0", "-o", str(out), "--", *child] if wrapped else child
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    verdicts: dict[tuple[int, str], str] = {}
    if wrapped:
        from gpuenv.results import load_run

        for m in load_run(out).measurements[1:]:
            found = re.search(r"size=(\d+) provider=(\w+)", m.name)
            if found:
                verdicts[int(found.group(1)), found.group(2)] = str(m.verdict)
    return parse_table(proc.stdout), verdicts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=2, help="bare/wrapped pairs, alternately")


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print(
            "the tutorial needs a GPU (torch and triton): --sim has nothing to run", file=sys.stderr
        )
        return 2
    changes = []
    with tempfile.TemporaryDirectory(prefix="gpuenv-perf-report-") as name:
        for k in range(args.pairs):
            bare, _ = _once(False, Path(name), k)
            wrapped, verdicts = _once(True, Path(name), k)
            changes.append(largest_change(bare, wrapped))
            if k == 0:
                print(f"Pair 1 of {args.pairs} (GB/s, median of do_bench's reps):\n")
                print("\n".join(table(bare, wrapped, verdicts)))
    print(
        "\nLargest change under gpuenv run from 2M elements up, each pair: "
        + ", ".join(f"{c:.1f}%" for c in changes)
    )
    runner.metric("largest_change_from_2m_pct", max(changes), "%", slack=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("perf_report", __doc__, add_arguments, run, quick={"pairs": 1}))
