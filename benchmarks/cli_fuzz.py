#!/usr/bin/env python3
"""Bad CLI inputs tried / tracebacks (goal: 0 of >= 500).

Generates cases over every command, flag and environment variable, with file-system
faults (an unwritable state or sim directory, standard output on /dev/full, a
file-size limit, binary and truncated input files), runs each in process or in a
fresh interpreter, and counts what went wrong (tests/cli_fuzz_harness.py judges:
a traceback, an undocumented exit code, a GPU setting left changed, a file left
behind). Prints a markdown table; each problem case is listed below it.

    python -m benchmarks.cli_fuzz --cases 600 --seed 13
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cli_fuzz_harness import Workspace, check, sample  # noqa: E402

from benchmarks import runner  # noqa: E402


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--process-share",
        type=float,
        default=0.4,
        help="share of cases run in a fresh interpreter (the process faults)",
    )


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuenv-fuzz-") as tmp:
        ws = Workspace(Path(tmp))
        ws.make_good_run()
        ws.prepare()
        counts: collections.Counter[str] = collections.Counter()
        codes: collections.Counter[int] = collections.Counter()
        bad: list[str] = []
        for case, in_process in sample(args.cases, args.seed, process_share=args.process_share):
            outcome, found = check(ws, case, in_process=in_process)
            counts["tried"] += 1
            counts["in a fresh interpreter"] += not in_process
            counts[f"fault: {case.fault}"] += 1
            codes[outcome.code] += 1
            for what in found:
                counts["traceback" if what == "a traceback" else "other problem"] += 1
            if found:
                bad.append(f"- `{case.describe()}`: {'; '.join(found)}")
    wall = time.monotonic() - t0
    print("| bad CLI inputs tried | tracebacks | other problems | wall |")
    print("| ---: | ---: | ---: | ---: |")
    print(
        f"| {counts['tried']} | {counts['traceback']} | {counts['other problem']} | {wall:.0f} s |"
    )
    print()
    print("| faults | cases |")
    print("| --- | ---: |")
    for key in sorted(k for k in counts if k.startswith("fault: ")):
        print(f"| {key[7:]} | {counts[key]} |")
    print(f"| (run in a fresh interpreter) | {counts['in a fresh interpreter']} |")
    print()
    print("exit codes: " + ", ".join(f"{c}: {n}" for c, n in sorted(codes.items())))
    for line in bad:
        print(line)
    runner.metric("tracebacks", counts["traceback"], "cases", slack=0.0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(
        runner.main("cli_fuzz", __doc__, add_arguments, run, sim_only=True, quick={"cases": 120})
    )
