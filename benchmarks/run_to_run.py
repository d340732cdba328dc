#!/usr/bin/env python3
"""Run to run: the spread of gpuenv.bench's median over calls, in one thermal state and across
states, in one process and across processes.

benchmarks.speed's repeats come minutes apart with heavy load between them, so the GPU's
temperature differs from one repeat to the next. On the H100 a heavy kernel at the same
NVML clock runs slower on a warmer chip (the 8192^3 matmul ~0.08% per C,
scripts/probe_temperature.py), and more reps in a call do not shrink what moves between
calls (scripts/probe_run_to_run.py: 100 reps spread as much as 10). So here the state is
set on purpose. Rounds of the eight kernels, each round after `--heat` s of 8192^3 matmuls
(heated: the chip some degrees warmer) or after `--rest` s idle (rested), each kernel
`--idle` s after the one before, measured by one of two doors:
  bench   gpuenv.bench(fn), no options: it waits for the clock and the power cap, not for
          the temperature;
  stable  env.bench(fn) in one `gpuenv.stable()` session opened after a rest: every call
          also waits until the GPU is within `burst_temp_margin_c` (5 C) of the session's
          starting temperature (ConditionConfig).
Per kernel and door: the spread (max - min) / median of the median over the rested rounds
(the same state), over all rounds (both states), the temperatures the calls ran at, and the
stable door's wait. Then `--procs` more processes, each after a rest measuring every kernel
once with gpuenv.bench, against the first rested call: run to run across processes.
Goal: <= 0.5%.
First, the remedy for what no wait removes: per kernel `gpuenv.bench_pair(fn, fn)`
(`--pairs` calls of each, alternating; the ratio of each pair's medians): the ratio of a
kernel against itself, its interval, and how far the same calls' medians moved.

Read-only (GPUENV_READONLY=1): it runs kernels and reads telemetry.

    python -m benchmarks.run_to_run          # the H100 (~6 minutes)
    python -m benchmarks.run_to_run --sim    # the simulated H100 (no thermal drift modelled)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from benchmarks._kernels import child_values
from benchmarks.runner import main as run_benchmark
from benchmarks.runner import metric
from benchmarks.speed import (
    DESCRIPTION,
    KERNELS,
    SPREAD_GOAL,
    Env,
    SimEnv,
    chosen_kernels,
    spread,
)

DOORS = ("bench", "stable")
STATES = ("heated", "rested")


def _call(env: Any, bench: Any, fn: Any) -> dict[str, Any]:
    t0 = env.now()
    m = bench(fn)
    w = m.summary_windows[0] if m.summary_windows else None
    temp = (
        (w.temp_c_start + w.temp_c_end) / 2
        if w is not None and w.temp_c_start is not None
        else None
    )
    return {
        "s": m.median_s,
        "wall_s": env.now() - t0,
        "temp_c": temp,
        "wait_s": m.extra.get("burst_first_wait_s") or 0.0,
        "findings": sorted({f.kind for f in m.findings}),
    }


def _on(env: Any) -> dict[str, Any]:
    """What every gpuenv call here is given: the simulated GPU's backend (virtual time), or
    nothing (the real GPU, opened by gpuenv)."""
    backend = getattr(env, "backend", None)
    return {"backend": backend} if backend is not None else {}


def _benches(env: Any, session: Any) -> dict[str, Any]:
    from gpuenv import timing

    return {"bench": lambda fn: timing.bench(fn, **_on(env)), "stable": session.bench}


def measure(env: Any, args: argparse.Namespace, kernels: list[str]) -> dict[str, Any]:
    """The rounds: (state, door) in an order that alternates, each measuring every kernel."""
    got: dict[str, Any] = {k: {d: {s: [] for s in STATES} for d in DOORS} for k in kernels}
    rounds = [(s, d) for s in STATES for d in DOORS]
    env.idle(args.rest)
    skipped = []
    import gpuenv

    with gpuenv.stable(**_on(env)) as session:
        benches = _benches(env, session)
        for name in kernels:  # first calls: library set-up, the memo of each door
            for b in benches.values():
                b(env.kernels[name])
        start = env.now()
        for r in range(args.repeats):
            for state, door in rounds if r % 2 == 0 else rounds[::-1]:
                if env.now() - start > args.deadline:
                    skipped.append(f"{state}/{door} (repeat {r + 1})")
                    continue
                env.load(args.heat) if state == "heated" else env.idle(args.rest)
                for name in kernels:
                    env.idle(args.idle)
                    got[name][door][state].append(_call(env, benches[door], env.kernels[name]))
            print(
                f"# repeat {r + 1} done at {env.now() - start:.0f} s", file=sys.stderr, flush=True
            )
    return {"runs": got, "skipped": skipped}


def pairs_part(env: Any, args: argparse.Namespace, kernels: list[str]) -> list[dict[str, Any]]:
    """Per kernel, bench_pair of the kernel against itself (A/A): the ratio should be 1."""
    from gpuenv.timing import bench_pair

    out = []
    for name in kernels:
        env.idle(args.idle)
        t0 = env.now()
        p = bench_pair(env.kernels[name], env.kernels[name], pairs=args.pairs, **_on(env))
        calls = [m.median_s for m in p.a + p.b]
        out.append(
            {
                "kernel": name,
                "ratio": p.ratio,
                "ci": list(p.ci),
                "coverage": p.confidence,
                "calls_spread": spread(calls),
                "wall_s": env.now() - t0,
                "findings": list(p.findings),
            }
        )
    return out


def pairs_report(rows: list[dict[str, Any]], pairs: int) -> None:
    print(
        f"`gpuenv.bench_pair(fn, fn)`, {pairs} pairs alternating: the ratio of a kernel "
        "against itself (1 is right) and its interval, beside how far the same calls' "
        "medians moved:"
    )
    print()
    print(
        "| kernel | ratio (interval, coverage) | interval's half-width | the calls' medians "
        "moved | wall |"
    )
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        lo, hi = r["ci"]
        print(
            f"| {DESCRIPTION[r['kernel']]} | {r['ratio']:.4f} ({lo:.4f}-{hi:.4f}, "
            f"{r['coverage']:.1%}) | {(hi - lo) / 2:.2%} | {r['calls_spread']:.2%} "
            f"| {r['wall_s']:.2f} s |"
        )
    print()
    ok = sum(
        r["ci"][0] <= 1.0 <= r["ci"][1] and (r["ci"][1] - r["ci"][0]) / 2 <= SPREAD_GOAL
        for r in rows
    )
    print(
        f"Pairs: the interval holds 1 and is within +-{SPREAD_GOAL:.1%} on {ok} of "
        f"{len(rows)} kernels."
    )


def children(args: argparse.Namespace, kernels: list[str]) -> list[dict[str, float]]:
    return child_values(
        "benchmarks.run_to_run",
        args.procs,
        ["--kernels", ",".join(kernels), "--idle", str(args.idle), "--rest", str(args.rest)],
        args.child_timeout,
    )


def child(env: Any, args: argparse.Namespace, kernels: list[str]) -> None:
    from gpuenv import timing

    for name in kernels:
        timing.bench(env.kernels[name])
    env.idle(args.rest)
    values = {}
    for name in kernels:
        env.idle(args.idle)
        values[name] = timing.bench(env.kernels[name]).median_s
    print("CHILD " + json.dumps(values))


def _temps(calls: list[dict[str, Any]]) -> str:
    t = [c["temp_c"] for c in calls if c["temp_c"] is not None]
    return f"{min(t):.0f}-{max(t):.0f} C" if t else "n/a"


def summarize(runs: dict[str, Any], procs: list[dict[str, float]]) -> list[dict[str, Any]]:
    rows = []
    for name, doors in runs.items():
        row: dict[str, Any] = {"kernel": name}
        for door, states in doors.items():
            rested, both = states["rested"], states["rested"] + states["heated"]
            if len(rested) < 2 or not states["heated"]:
                break
            row[door] = {
                "same_state": spread([c["s"] for c in rested]),
                "across_states": spread([c["s"] for c in both]),
                "temps_rested": _temps(rested),
                "temps_heated": _temps(states["heated"]),
                "wait_s": statistics.median(c["wait_s"] for c in both),
                "wait_max_s": max(c["wait_s"] for c in both),
                "wall_s": statistics.median(c["wall_s"] for c in both),
            }
        else:
            across = [doors["bench"]["rested"][0]["s"]] + [p[name] for p in procs if name in p]
            row["processes"] = spread(across) if len(across) >= 3 else None
            row["n_processes"] = len(across)
            rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return f"{x:.2%}" if x is not None else "n/a"


def report(rows: list[dict[str, Any]], head: str, skipped: list[str]) -> None:
    print(head)
    print()
    print(
        "| kernel | bench: same state / across states (C rested; heated) | stable: same "
        "state / across states (C rested; heated) | stable's wait median / max | across "
        "processes |"
    )
    print("| --- | --- | --- | ---: | ---: |")
    for r in rows:
        b, s = r["bench"], r["stable"]
        print(
            f"| {DESCRIPTION[r['kernel']]} | {_pct(b['same_state'])} / "
            f"{_pct(b['across_states'])} ({b['temps_rested']}; {b['temps_heated']}) "
            f"| {_pct(s['same_state'])} / {_pct(s['across_states'])} ({s['temps_rested']}; "
            f"{s['temps_heated']}) | {s['wait_s']:.2f} / {s['wait_max_s']:.2f} s "
            f"| {_pct(r['processes'])} ({r['n_processes']}) |"
        )
    print()
    if rows:
        n = len(rows)

        def ok(values: list[float | None]) -> int:
            return sum(x is not None and x <= SPREAD_GOAL for x in values)

        print(
            f"Goal run to run <= {SPREAD_GOAL:.1%}, on {n} kernels: bench in one state on "
            f"{ok([r['bench']['same_state'] for r in rows])}, across states on "
            f"{ok([r['bench']['across_states'] for r in rows])}; stable in one state on "
            f"{ok([r['stable']['same_state'] for r in rows])}, across states on "
            f"{ok([r['stable']['across_states'] for r in rows])}; across processes on "
            f"{ok([r['processes'] for r in rows])} (of "
            f"{sum(r['processes'] is not None for r in rows)} measured)."
        )
    if skipped:
        print(f"Skipped (deadline): {', '.join(skipped)}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=2, help="rounds per state and door")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    p.add_argument("--heat", type=float, default=12.0, help="seconds of load before a heated round")
    p.add_argument("--rest", type=float, default=15.0, help="seconds idle before a rested round")
    p.add_argument("--idle", type=float, default=1.0, help="seconds idle before each call")
    p.add_argument("--procs", type=int, default=2, help="more processes, each after a rest")
    p.add_argument("--child-timeout", type=float, default=90.0, help="seconds per process")
    p.add_argument(
        "--deadline",
        type=float,
        default=360.0,
        help="seconds of rounds after which the rest are skipped",
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=10,
        help="bench_pair's pairs per kernel (A/A); 0 skips that part",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    kernels = chosen_kernels(args.kernels)
    env: Any = SimEnv() if args.sim else Env()
    if args.child:
        child(env, args, kernels)
        return 0
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    paired = pairs_part(env, args, kernels) if args.pairs else []
    got = measure(env, args, kernels) if args.repeats else {"runs": {}, "skipped": []}
    procs = [] if args.sim else children(args, kernels)
    rows = summarize(got["runs"], procs)
    head = (
        f"{env.describe()}; {started}; {args.repeats} rounds per state and door in one "
        f"process and {len(procs)} more processes; heated after {args.heat} s of 8192^3 "
        f"matmuls, rested after {args.rest} s idle, {args.idle} s idle before each call; "
        f"total {time.monotonic() - t0:.0f} s (real)"
    )
    if args.repeats:
        report(rows, head, got["skipped"])
        print()
    else:
        print(head)
        print()
    if paired:
        pairs_report(paired, args.pairs)
    for r in paired:
        metric(f"{r['kernel']}/pair_halfwidth_pct", 50 * (r["ci"][1] - r["ci"][0]), "%", slack=0.2)
    for r in rows:
        metric(
            f"{r['kernel']}/stable_across_pct", 100 * r["stable"]["across_states"], "%", slack=0.3
        )
    return 0


if __name__ == "__main__":
    sys.exit(
        run_benchmark(
            "run_to_run",
            __doc__,
            add_arguments,
            run,
            quick={"repeats": 2, "procs": 0, "kernels": "mm4096,mlp", "heat": 2.0, "rest": 2.0},
        )
    )
