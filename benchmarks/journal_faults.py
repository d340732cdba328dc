#!/usr/bin/env python3
"""Journal faults injected / original states lost (goal: 0 of >= 1,000).

Each trial (tests/journal_fault_harness.py) locks two simulated GPUs that start in a
non-default state, injects one fault, and does what a user would next (release,
'gpuenv restore', and 'gpuenv restore --defaults' where gpuenv names a lost record):
  cut                  every write of the lock's records stops at byte N (N = 0 ... the
                       last byte of the last copy: RLIMIT_FSIZE, a disk that fills)
  garble               one field of one GPU's record changed (the main copy, the backup,
                       or both alike), a key removed, the file cut, a byte flipped
  delete               one GPU's main copy, backup, or both deleted
  one_damaged_release  a library lock of 2 GPUs released with one GPU's records damaged
  one_damaged_restore  'restore -i 0' with GPU 1's records damaged, then the rest
  readonly             the state directory turns read-only before the release
Outcomes: exact (every GPU back in its original state), defaults (gpuenv said which
record was lost and --defaults reset that GPU; the others exact), lost (a GPU left
changed, or put back wrong without a word).

    python -m benchmarks.journal_faults --garble 600 --each 100
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from journal_fault_harness import KINDS, record_size, run_trial  # noqa: E402

from benchmarks import runner  # noqa: E402


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--garble", type=int, default=600, help="garbling trials")
    parser.add_argument("--each", type=int, default=100, help="trials of each other fault")
    parser.add_argument("--seed", type=int, default=13)


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    table: dict[str, collections.Counter[str]] = {k: collections.Counter() for k in KINDS}
    t0 = time.monotonic()
    total = record_size()
    with tempfile.TemporaryDirectory(prefix="gpuenv-journal-faults-") as tmp:
        work = Path(tmp) / "journal"
        for budget in range(total + 1):
            table["cut"][run_trial("cut", work, rng, budget)] += 1
        for kind in KINDS[1:]:
            for _ in range(args.garble if kind == "garble" else args.each):
                table[kind][run_trial(kind, work, rng)] += 1
    wall = time.monotonic() - t0
    print("| fault | trials | restored exactly | --defaults offered and done | lost |")
    print("| --- | ---: | ---: | ---: | ---: |")
    all_: collections.Counter[str] = collections.Counter()
    for kind, c in table.items():
        all_.update(c)
        print(f"| {kind} | {sum(c.values())} | {c['exact']} | {c['defaults']} | {c['lost']} |")
    print(f"| all | {sum(all_.values())} | {all_['exact']} | {all_['defaults']} | {all_['lost']} |")
    print(f"\nthe lock of 2 GPUs writes {total} bytes (2 copies per GPU); wall {wall:.0f} s")
    runner.metric("lost", all_["lost"], "states", slack=0.0)
    return 1 if all_["lost"] else 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "journal_faults",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"garble": 100, "each": 20},
        )
    )
