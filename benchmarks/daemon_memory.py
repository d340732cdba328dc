#!/usr/bin/env python3
"""gpuenvd's memory under load: its RSS at 0, 10k, 50k and 100k requests of a mixed load.

    python -m benchmarks.daemon_memory                 # 100,000 requests (some minutes)
    python -m benchmarks.daemon_memory --quick         # 20,000
    python -m benchmarks.daemon_memory --tree DIR      # also the daemon of another checkout
                                                       # (the code before a fix), side by side

The load is tests/daemon_harness.mixed_load (one long connection asking status and taking
and releasing leases, a new connection every 10 requests, a subscriber every 100), from a
client process at a gpuenvd on a socket in a temp dir (GPUENV_BACKEND=sim). The sampler
runs at --sample-period (default 10 s: its rings, which grow with time until full, not with
requests, stay out of the figure; 0.1 is the daemon's default). tests/test_daemon_memory.py
checks a smaller run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from daemon_harness import DaemonProcess  # noqa: E402

from benchmarks import runner  # noqa: E402
from benchmarks.checkout import add_tree_argument  # noqa: E402
from benchmarks.checkout import trees as checkout_trees  # noqa: E402

LOAD = (
    "import sys\nsys.path.insert(0, sys.argv[3])\nfrom daemon_harness import mixed_load\n"
    "mixed_load(sys.argv[1], int(sys.argv[2]))\n"
)


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", text)
    if found is None:
        raise RuntimeError(f"no VmRSS in /proc/{pid}/status")
    return int(found.group(1)) / 1024


def marks_of(requests: int) -> list[int]:
    """Where RSS is read: 10%, 50% and 100% of the run (10k, 50k, 100k of 100,000)."""
    return sorted({requests // 10, requests // 2, requests})


def measure(
    requests: int, sample_period: float, tree: Path | None
) -> list[tuple[int, float, float]]:
    """(requests done, daemon RSS MB, seconds) at 0 and at each mark."""
    work = Path(tempfile.mkdtemp(prefix="gpuenv-mem-"))
    d = DaemonProcess(work, n_gpus=1, sample_period=sample_period)
    if tree is not None:
        d.env["PYTHONPATH"] = str(tree)
    try:
        d.start()
        assert d.proc is not None
        time.sleep(1.0)  # past start-up's own allocations
        out = [(0, rss_mb(d.proc.pid), 0.0)]
        t0, done = time.monotonic(), 0
        for mark in marks_of(requests):
            subprocess.run(
                [sys.executable, "-c", LOAD, d.socket, str(mark - done), str(ROOT / "tests")],
                env=d.env,
                check=True,
                timeout=3600,
            )
            done = mark
            out.append((done, rss_mb(d.proc.pid), time.monotonic() - t0))
        return out
    finally:
        d.close()
        shutil.rmtree(work, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--sample-period", type=float, default=10.0)
    add_tree_argument(parser)


def run(args: argparse.Namespace) -> int:
    trees = checkout_trees(args)
    # side by side: every tree's daemon at once, under the same load on the machine (how
    # much a daemon grows depends on how many of its threads overlap, so on that load)
    with ThreadPoolExecutor(len(trees)) as pool:
        runs = [pool.submit(measure, args.requests, args.sample_period, t) for _, t in trees]
        rows = [(name, run.result()) for (name, _), run in zip(trees, runs, strict=True)]
    marks = rows[0][1]
    after = next(mb for n, mb, _ in marks if n == args.requests // 10)
    runner.metric("rss_growth_after_warmup_mb", marks[-1][1] - after, "MB", slack=0.5)
    heads = " / ".join(f"{n:,}" for n, _, _ in rows[0][1])
    print(
        f"| daemon | RSS (MB) at {heads} requests | growth after {args.requests // 10:,} | "
        "wall (s) |"
    )
    print("|---|" + "---:|" * 3)
    for name, marks in rows:
        warm = next(mb for n, mb, _ in marks if n == args.requests // 10)
        print(
            f"| {name} | {' / '.join(f'{mb:.1f}' for _, mb, _ in marks)} | "
            f"{marks[-1][1] - warm:+.1f} MB | {marks[-1][2]:.0f} |"
        )
    print(
        f"\nmixed load (tests/daemon_harness.mixed_load), 1 simulated GPU, sampler at "
        f"{args.sample_period} s; the daemons ran side by side, at once"
    )
    return 0


if __name__ == "__main__":
    sys.exit(runner.main("daemon_memory", __doc__, add_arguments, run, quick={"requests": 20_000}))
