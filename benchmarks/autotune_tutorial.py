"""triton's matmul tutorial (03: an `@triton.autotune` kernel inside a perf_report sweep)
bare, under `gpuenv run`, and bare again: each point's verdict from its own reps, the
autotuning kept apart from the points, and how far the TFLOPS move under gpuenv run
against how far they move between two bare runs.

The tutorial runs as it is written (benchmarks/workloads/perf_report_matmul.py: 6 sizes,
256 to 4096, cuBLAS and Triton, `do_bench(quantiles=[0.5, 0.2, 0.8])`, TFLOPS), as a fresh
process, bare, wrapped, bare again. Per point: its TFLOPS in each run (at the small sizes
a triton launch is bound by its Python overhead, and do_bench's number moves by itself),
gpuenv's verdict and findings; then the autotuner's measurements (site `do_bench
(autotune)`, one per config it timed) and how many of them overlap any point's window
(goal 0: no point holds the autotuning). Read-only (gpuenv run without --sm locks nothing); needs a GPU,
torch, triton, pandas and matplotlib.

    GPUENV_READONLY=1 python -m benchmarks.autotune_tutorial
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

TUTORIAL = ROOT / "benchmarks" / "workloads" / "perf_report_matmul.py"
Points = dict[int, tuple[float, float]]  # size -> (cuBLAS TFLOPS, Triton TFLOPS)


def parse_table(stdout: str) -> Points:
    """The table `benchmark.run(print_data=True)` prints: index, M, N, K, cuBLAS, Triton."""
    rows: Points = {}
    for line in stdout.splitlines():
        m = re.fullmatch(r"\s*\d+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s*", line)
        if m:
            rows[int(float(m.group(1)))] = (float(m.group(2)), float(m.group(3)))
    return rows


def _once(wrapped: bool, tmp: Path, tag: str = "") -> tuple[Points, Path | None, float]:
    import time

    env = checkout_env(GPUENV_READONLY="1", MPLBACKEND="Agg")
    saved, out = tmp / f"plots{'w' * wrapped}{tag}", tmp / "run.jsonl"
    saved.mkdir()
    child = [sys.executable, str(TUTORIAL), str(saved)]
    argv = [*GPUENV, "run", "-i", "0", "-o", str(out), "--", *child] if wrapped else child
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    if wrapped:
        print(proc.stderr[-3000:], file=sys.stderr)
    return parse_table(proc.stdout), out if wrapped else None, wall


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print(
            "the tutorial needs a GPU (torch and triton): --sim has nothing to run", file=sys.stderr
        )
        return 2
    from gpuenv.results import load_run

    with tempfile.TemporaryDirectory(prefix="gpuenv-autotune-") as name:
        bare, _, bare_wall = _once(False, Path(name))
        wrapped, out, wrapped_wall = _once(True, Path(name))
        again, _, _ = _once(False, Path(name), "again")
        assert out is not None
        ms = load_run(out).measurements[1:]  # [0] is the (run) region
    tuned = [m for m in ms if "(autotune)" in str(m.extra.get("site", ""))]
    points = [m for m in ms if m not in tuned]
    inside = 0
    for m in points:
        w = m.windows[0]
        inside += sum(1 for t in tuned if t.windows[0].t0 < w.t1 and w.t0 < t.windows[0].t1)
    print(
        f"Bare {bare_wall:.1f} s, under gpuenv run {wrapped_wall:.1f} s "
        "(TFLOPS: do_bench's median):"
    )
    print()
    print(
        "| size | provider | TFLOPS bare | under gpuenv run | change | bare again | change "
        "| verdict | findings |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for m in points:
        found = re.search(r"M=(\d+) .*provider=(\w+)", m.name)
        if not found:
            continue
        size, provider = int(found.group(1)), found.group(2)
        col = 0 if provider == "cublas" else 1
        b = bare.get(size, (float("nan"),) * 2)[col]
        w = wrapped.get(size, (float("nan"),) * 2)[col]
        a = again.get(size, (float("nan"),) * 2)[col]
        kinds = ", ".join(sorted({f.kind for f in m.findings})) or "-"
        print(
            f"| {size} | {provider} | {b:.1f} | {w:.1f} | {100 * (w / b - 1):+.1f}% | "
            f"{a:.1f} | {100 * (a / b - 1):+.1f}% | {m.verdict} | {kinds} |"
        )
    print()
    configs = len({m.name for m in tuned})
    print(
        f"{len(points)} points, each a measurement of its own reps; the autotuner's timing: "
        f"{len(tuned)} measurements of {configs} configs (site `do_bench (autotune)`), "
        f"{inside} of them inside a point's window (goal 0)."
    )
    runner.metric("autotune measurements inside a point's window", inside, "", slack=0.5)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options of its own


if __name__ == "__main__":
    sys.exit(runner.main("autotune_tutorial", __doc__, add_arguments, run))
