#!/usr/bin/env python3
"""gpuenvd's memory under load: its RSS at 0, 10k, 50k and 100k requests, of each request
kind alone and of the mix (goal: within 2 MB of the level after the first 10k).

    python -m benchmarks.daemon_memory                 # 100,000 requests a kind (long)
    python -m benchmarks.daemon_memory --quick         # 20,000
    python -m benchmarks.daemon_memory --kinds windows --tree DIR   # one kind, and the
                                                       # daemon of another checkout (the
                                                       # code before a fix), side by side

The kinds are tests/daemon_harness.kind_load's: windows (window_start + window_end), lock
(a lease taken and released), subscribe (subscribe, one event, unsubscribe on a new
connection), status, connections (a new connection's hello, status, close), each from 4
connections at once; and mix, tests/daemon_harness.mixed_load (one long connection asking
status and taking and releasing leases, a new connection every 10 requests, a subscriber
every 100). Each kind gets a fresh gpuenvd on a socket in a temp dir (GPUENV_BACKEND=sim),
driven by a client process. The sampler runs at --sample-period (default 10 s: its rings,
which grow with time until full, not with requests, stay out of the figure; 0.1 is the
daemon's default). tests/test_daemon_memory.py checks smaller runs.
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

from daemon_harness import LOAD_KINDS, DaemonProcess  # noqa: E402

from benchmarks import runner  # noqa: E402
from benchmarks.checkout import add_tree_argument  # noqa: E402
from benchmarks.checkout import trees as checkout_trees  # noqa: E402

LOAD = (
    "import sys\nsys.path.insert(0, sys.argv[3])\nfrom daemon_harness import kind_load\n"
    "kind_load(sys.argv[1], sys.argv[4], int(sys.argv[2]))\n"
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
    kind: str, requests: int, sample_period: float, tree: Path | None
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
                [
                    sys.executable,
                    "-c",
                    LOAD,
                    d.socket,
                    str(mark - done),
                    str(ROOT / "tests"),
                    kind,
                ],
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
    parser.add_argument("--requests", type=int, default=100_000, help="requests of each kind")
    parser.add_argument(
        "--kinds",
        default=",".join(LOAD_KINDS),
        help=f"request kinds, comma-separated (default all: {','.join(LOAD_KINDS)})",
    )
    parser.add_argument("--sample-period", type=float, default=10.0)
    add_tree_argument(parser)


def run(args: argparse.Namespace) -> int:
    trees = checkout_trees(args)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in LOAD_KINDS]
    if bad or not kinds:
        raise SystemExit(f"--kinds: {', '.join(bad) or 'none'}: use some of {LOAD_KINDS}")
    warm_n = args.requests // 10
    heads = " / ".join(f"{n:,}" for n in [0, *marks_of(args.requests)])
    print(f"| kind | daemon | RSS (MB) at {heads} requests | growth after {warm_n:,} | wall (s) |")
    print("|---|---|" + "---:|" * 3)
    worst = 0.0
    for kind in kinds:
        # side by side: every tree's daemon at once, under the same load on the machine (how
        # much a daemon grows depends on how many of its threads overlap, so on that load)
        with ThreadPoolExecutor(len(trees)) as pool:
            runs = [
                pool.submit(measure, kind, args.requests, args.sample_period, t) for _, t in trees
            ]
            rows = [(name, r.result()) for (name, _), r in zip(trees, runs, strict=True)]
        for i, (name, marks) in enumerate(rows):
            warm = next(mb for n, mb, _ in marks if n == warm_n)
            growth = marks[-1][1] - warm
            if i == 0:
                worst = max(worst, growth)
                runner.metric(f"rss_growth_{kind}_mb", growth, "MB", slack=0.5)
            print(
                f"| {kind} | {name} | {' / '.join(f'{mb:.1f}' for _, mb, _ in marks)} | "
                f"{growth:+.1f} MB | {marks[-1][2]:.0f} |"
            )
    runner.metric("rss_growth_after_warmup_mb", worst, "MB", slack=0.5)
    print(
        f"\nrequests of each kind alone (tests/daemon_harness.kind_load, 4 connections at once; "
        f"mix: mixed_load), a fresh gpuenvd each, 1 simulated GPU, sampler at "
        f"{args.sample_period} s; the daemons of each kind ran side by side, at once; "
        f"the goal: growth after {warm_n:,} within 2 MB"
    )
    return 0


def variant(args: argparse.Namespace) -> str:
    """All kinds: daemon_memory.json; some: daemon_memory-<kinds>.json, kept beside it."""
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    return "" if sorted(kinds) == sorted(LOAD_KINDS) else "-".join(kinds)


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "daemon_memory",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            variant=variant,
            quick={"requests": 20_000},
        )
    )
