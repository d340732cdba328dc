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
And, in a table of their own (issue 31, item 3), the seven ways both copies of GPU 1's
record are lost while its lock is held (journal_fault_harness.BOTH_COPIES: deleted, cut,
edited alike, replaced by a directory; then 'gpuenv restore', the owner's release, or the
owner SIGKILLed and its watchdog), each --both times, run in a fresh process per tree
(`--tree DIR`: the code before the kept original, side by side).
Outcomes: exact (every GPU back in its original state), defaults (gpuenv said which
record was lost and --defaults reset that GPU; the others exact), lost (a GPU left
changed, or put back wrong without a word).

    python -m benchmarks.journal_faults --garble 600 --each 100
    python -m benchmarks.journal_faults --sim --tree /tmp/old   # both-copies: old vs new
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from journal_fault_harness import BOTH_COPIES, KINDS, record_size, run_trial  # noqa: E402

from benchmarks import runner  # noqa: E402
from benchmarks.checkout import add_tree_argument  # noqa: E402
from benchmarks.checkout import trees as checkout_trees  # noqa: E402

# one tree's both-copies trials, in a process of its own (argv: tree, tests, work, repeats)
BOTH = (
    "import json, sys\n"
    "sys.path[:0] = sys.argv[1:3]\n"
    "from pathlib import Path\n"
    "from journal_fault_harness import BOTH_COPIES, trial_both_copies\n"
    "out = {s: [trial_both_copies(Path(sys.argv[3]) / f'{s}-{i}', s)\n"
    "           for i in range(int(sys.argv[4]))] for s in BOTH_COPIES}\n"
    "print(json.dumps(out))\n"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--garble", type=int, default=600, help="garbling trials")
    parser.add_argument("--each", type=int, default=100, help="trials of each other fault")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--both", type=int, default=3, help="trials of each both-copies way")
    add_tree_argument(parser)


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
    print(
        f"\nthe lock of 2 GPUs writes {total} bytes (3 copies per GPU: the record, its backup, "
        f"the kept original); wall {wall:.0f} s"
    )
    runner.metric("lost", all_["lost"], "states", slack=0.0)
    not_exact = both_copies(args)
    return 1 if all_["lost"] or not_exact else 0


def both_copies(args: argparse.Namespace) -> int:
    """The both-copies table, each tree in a fresh process; returns this tree's trials that
    did not put the original back exactly."""
    runs: list[tuple[str, dict[str, list[str]]]] = []
    for name, tree in checkout_trees(args):
        with tempfile.TemporaryDirectory(prefix="gpuenv-both-copies-") as tmp:
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    BOTH,
                    str(tree or ROOT),
                    str(ROOT / "tests"),
                    tmp,
                    str(args.both),
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=True,
                timeout=1800,
            )
        runs.append((name, json.loads(out.stdout.splitlines()[-1])))
    print(
        "\nboth copies of GPU 1's record lost while it is locked (journal_fault_harness."
        "BOTH_COPIES); 'late': the watchdog left it, 'gpuenv restore' put it back\n"
    )
    print("| way | code | trials | restored exactly | late | --defaults offered and done | lost |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for scenario in BOTH_COPIES:
        for name, outcomes in runs:
            c = collections.Counter(outcomes[scenario])
            print(
                f"| {scenario} | {name} | {len(outcomes[scenario])} | {c['exact']} | "
                f"{c['late']} | {c['defaults']} | {c['lost']} |"
            )
    ways = {
        name: sum(any(o != "exact" for o in outs[s]) for s in BOTH_COPIES) for name, outs in runs
    }
    print(
        f"\nways of the {len(BOTH_COPIES)} that lose an original (any trial not exact): "
        + ", ".join(f"{name} {n} of {len(BOTH_COPIES)}" for name, n in ways.items())
    )
    mine = runs[0][1]
    not_exact = sum(o != "exact" for s in BOTH_COPIES for o in mine[s])
    runner.metric("both_copies_not_exact", not_exact, "trials", slack=0.0)
    return not_exact


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "journal_faults",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"garble": 100, "each": 20, "both": 1},
        )
    )
