"""Does only a compile's first max-autotune selection after heavy load wait for a ready GPU?

Under gpuenv's switch (`patch_inductor(rank=True)`) each selection's ranking begins its
bursts on a ready GPU: after heavy load it waits for the power cap to clear (`waited 0.27 s
for a ready GPU` in its state). A model has many selections; the ones after the first find
the GPU ready, so a compile should pay the wait once. Each fresh process compiles one
function of three GEMMs (benchmarks/workloads/inductor_waits.py: three selections), rested
or with heavy load right before the first selection's ranking, the states interleaved;
per selection, in the order ranked: its benchmark function's wall and the ranking's wait,
medians over the processes. Reads the GPU only.

    GPUENV_READONLY=1 python -m benchmarks.inductor_waits [--processes 3] [--hot-s 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import ROOT
from benchmarks.inductor_rank import fresh_process

CHILD = ROOT / "benchmarks" / "workloads" / "inductor_waits.py"
STATES = ("rested", "hot")
HEADLINE = "hot_selection1_wait_ms"  # the wait a hot compile pays: the others' near 0


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print("max-autotune needs a GPU (CUDA torch): --sim has nothing to run", file=sys.stderr)
        return 2
    if args.processes < 1:
        raise SystemExit(f"--processes {args.processes}: at least 1")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="triton-") as shared:
        for i in range(args.processes):  # interleaved: both states meet the same machine
            for state in STATES:
                row = fresh_process(CHILD, [state, str(args.hot_s)], Path(shared))
                waits = " ".join(f"{s['waited_s']:.3f}" for s in row["selections"])
                print(
                    f"inductor_waits: {state} {i + 1}/{args.processes}: waited {waits} s",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(row)
    report(rows, args.hot_s)
    return 0


def report(rows: list[dict[str, Any]], hot_s: float) -> None:
    """A table per state: each selection, in the order ranked, its medians over the
    processes; and a line on the hot compile's waits."""
    first = rows[0]
    print(
        f"## Three max-autotune selections in one compile ({first['gpu']}, torch "
        f"{first['torch']}), under patch_inductor(rank=True)"
    )
    print()
    print(
        "| state | selection | choices | processes | benchmark function (median) "
        "| waited for a ready GPU (median, max) | winners |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    waited: dict[str, list[float]] = {}
    for state in STATES:
        mine = [r["selections"] for r in rows if r["state"] == state]
        for n in range(min(len(s) for s in mine)):
            sel = [s[n] for s in mine]
            waits = [s["waited_s"] for s in sel]
            winners = sorted({s["winner"] for s in sel})
            print(
                f"| {state} | {n + 1}: {' x '.join(sel[0]['key'])} | {sel[0]['choices']} "
                f"| {len(sel)} | {statistics.median(s['wall_s'] for s in sel):.2f} s "
                f"| {statistics.median(waits) * 1e3:.0f} ms, {max(waits) * 1e3:.0f} ms "
                f"| {', '.join(winners)} |"
            )
            waited[f"{state} {n + 1}"] = waits
            runner.metric(
                f"{state}_selection{n + 1}_wait_ms",
                statistics.median(waits) * 1e3,
                "ms",
                slack=20.0,
            )
    print()
    hot = [statistics.median(w) for k, w in waited.items() if k.startswith("hot")]
    if hot:
        later = ", ".join(f"{w * 1e3:.0f} ms" for w in hot[1:])
        print(
            f"Hot ({hot_s:g} s of heavy load right before the first selection's ranking): "
            f"the first ranking waited {hot[0] * 1e3:.0f} ms (median) for a ready GPU, the "
            f"later ones {later or 'none'}."
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per state (3)")
    parser.add_argument(
        "--hot-s",
        type=float,
        default=7.0,
        help="heavy load before the hot compile's first selection (7)",
    )


if __name__ == "__main__":
    sys.exit(runner.main("inductor_waits", __doc__, add_arguments, run, quick={"processes": 1}))
