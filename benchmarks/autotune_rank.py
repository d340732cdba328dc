"""Autotuners that choose right: triton's `@triton.autotune` over the fp16 4096^3
matmul, plain and with gpuenv's choice (`patch_autotuner(rank=True)`), rested and right
after heavy load: how many distinct winners, the regret of the choice, the tuning wall.

Two cases (benchmarks/workloads/autotune_matmul.py): `matmul8`, 8 configs (BM256/BN128/BK64
among them, and BM128/BN128/BK64 with 3 and 4 stages, which plain triton chose on a rested
H200 in 6 of 6 processes), and `close`, 4 configs of which at least 2 are within 1% of each
other. First a process compiles every config (triton's disk cache), then one times each
config carefully (gpuenv.bench, 2 s each: the true ranking). Then, for plain triton and for
gpuenv, `--processes` fresh processes rested and as many hot, each autotuning a fresh
kernel of each case `--trials` times: rested after `--rest-s` of idle, hot after
`--hot-s` of bf16 8192 matmuls (the first) or `--topup-s` (the later ones). Per case,
tuner and state: the distinct winners and the most common one's share, the distinct
decisions (the winner alone, or the tie declared) and the most common one's share (goal
>= 95% for gpuenv: one winner or one declared tie), regret = the winner's careful time against
the best's (goal <= 0.5%), and the tuning wall (the first launch, autotuning included;
goal: gpuenv's at most 1.5x plain triton's, rested), and where gpuenv's went: outside the
ranking, between its calls, and each bench phase of its calls (`ranking_parts`).
Read-only: no clock is set, every child runs with GPUENV_READONLY=1. About 7 minutes on an
H200 at the defaults (N = 2 x processes x trials = 20 autotunes per case and tuner); one
case in 20 fresh processes a tuner (`--cases close --processes 10 --trials 1`) about 8.

    GPUENV_READONLY=1 python -m benchmarks.autotune_rank
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import runner
from benchmarks.checkout import ROOT, checkout_env
from gpuenv.timing.rank import SCREEN_CALLS

if TYPE_CHECKING:
    from gpuenv.timing.rank import Ranking

CHILD = ROOT / "benchmarks" / "workloads" / "autotune_matmul.py"
TUNERS = ("plain", "gpuenv")
STATES = ("rested", "hot")


CASES = ("matmul8", "close")


def child(*args: str, cases: str = ",".join(CASES), timeout: float = 300) -> list[dict[str, Any]]:
    """Run the workload in a fresh process (on `cases`); its JSON lines."""
    env = checkout_env(GPUENV_READONLY="1", AUTOTUNE_CASES=cases)
    argv = [sys.executable, str(CHILD), *args]
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


# Where gpuenv's tuning wall went: the first launch's wall outside the ranking (triton's
# loading of each config's kernel, its first run), the ranking's time between its calls
# (rank's rests and its own work), and each bench phase summed over the calls
# (`gpuenv.phases.Wall`), with the waits for a ready GPU (in "condition") and the rests
# between bursts (in "measure") named apart. rank_cost.py splits the same on the
# simulated H200; this is the GPU's.
OUTSIDE = "outside the ranking (triton: each config's kernel loaded, the first run)"
BETWEEN = "between calls (rank's rests, its own work)"
SCREEN = f"the screen (each candidate's calls between CUDA events, {SCREEN_CALLS} a candidate)"
WAIT = "  of which: waiting for a ready GPU"
COLD = "    of which: calls begun on an idle GPU (samples after their warmup)"
RESTS = "  of which: rests between bursts"
FIRST_OPEN = "  of which: the first call's open (the backend, the GPU's facts, the sampler's start)"


def ranking_parts(r: Ranking) -> dict[str, float]:
    """A gpuenv.Ranking's wall, in seconds: each bench phase summed over its calls, the
    waits and rests inside them, and the time between its calls (`BETWEEN`)."""
    from gpuenv.phases import WALL_PHASES

    parts = dict.fromkeys(WALL_PHASES, 0.0)
    wait = cold = rests = 0.0
    for cand in r.candidates:
        for m in cand.measurements:
            if m.wall is not None:
                for phase, sec in m.wall.phases:
                    parts[phase] += sec
            waited = float(m.extra.get("burst_first_wait_s") or 0.0)
            wait += waited
            cold += waited if m.extra.get("burst_cold_start") else 0.0
            rests += float(m.extra.get("burst_rest_s") or 0.0)
    # round 1 begins with the first candidate in the order given that the screen left: its
    # first call opened first
    timed = [c.measurements[0] for c in r.candidates if c.measurements]
    first = timed[0].wall if timed else None
    return {
        BETWEEN: max(0.0, r.wall_s - r.screen_wall_s - sum(parts.values())),
        SCREEN: r.screen_wall_s,
        **parts,
        FIRST_OPEN: first.seconds("open") if first is not None else 0.0,
        WAIT: wait,
        COLD: cold,
        RESTS: rests,
    }


def wall_split(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """gpuenv's rows (`ranking_parts` kept as "parts", the ranking's wall as
    "rank_wall_s"): each part's median over the autotunes, in seconds."""
    got = [r for r in rows if r.get("parts") and r.get("rank_wall_s") is not None]
    if not got:
        return {}
    keys = [OUTSIDE, *got[0]["parts"]]
    split: dict[str, list[float]] = {k: [] for k in keys}
    for r in got:
        split[OUTSIDE].append(max(0.0, r["wall_s"] - r["rank_wall_s"]))
        for k in keys[1:]:
            split[k].append(float(r["parts"].get(k, 0.0)))
    return {k: statistics.median(v) for k, v in split.items()}


def choices(rows: Sequence[dict[str, Any]], careful: dict[str, float]) -> dict[str, Any]:
    """Autotunes' choices (each row's "winner", and "tied" where it declared a tie): their
    count ("n"), the distinct winners ("distinct", "winners") and the most common one
    ("modal", "modal_share"), the ties declared ("ties"), the distinct decisions, each the
    winner alone or the tie declared ("decisions"), and the most common one's share
    ("decision_share"; the goal: one in 95%: a tie's winner, its first, does not say whether
    the ties agreed), and regret: the winner's careful time / the best careful time - 1
    ("regret_median", "regret_max"; a winner the careful run did not time is left out and
    counted, "unseen")."""
    winners = Counter(r["winner"] for r in rows)
    modal, count = winners.most_common(1)[0] if winners else ("-", 0)
    tied = [tuple(r.get("tied") or ()) for r in rows]
    made = Counter(t if len(t) > 1 else (r["winner"],) for t, r in zip(tied, rows, strict=True))
    best = min(careful.values())
    regrets = [careful[r["winner"]] / best - 1 for r in rows if r["winner"] in careful]
    return {
        "n": len(rows),
        "distinct": len(winners),
        "winners": dict(winners),
        "modal": modal,
        "modal_share": count / len(rows) if rows else 0.0,
        "ties": sum(1 for t in tied if len(t) > 1),
        "decisions": len(made),
        "decision_share": made.most_common(1)[0][1] / len(rows) if rows else 0.0,
        "regret_median": statistics.median(regrets) if regrets else float("nan"),
        "regret_max": max(regrets) if regrets else float("nan"),
        "unseen": sum(1 for r in rows if r["winner"] not in careful),
    }


def choice_cells(s: dict[str, Any]) -> str:
    """A tuner's `choices` as the table cells both autotune benchmarks show: count, distinct
    winners, the most common (share), ties declared, distinct decisions (the most common's
    share), regret median and max."""
    return (
        f"{s['n']} | {s['distinct']} | {s['modal']} ({s['modal_share']:.0%}) | {s['ties']} | "
        f"{s['decisions']} ({s['decision_share']:.0%}) | {s['regret_median']:.2%} | "
        f"{s['regret_max']:.2%}"
    )


def choice_metrics(prefix: str, g: dict[str, Any]) -> None:
    """gpuenv's `choices` as the regression metrics both autotune benchmarks keep: regret
    max (goal <= 0.5%) and the most common decision's share (goal >= 95%)."""
    runner.metric(f"{prefix}: gpuenv regret max", 100 * g["regret_max"], "%", slack=0.3)
    runner.metric(
        f"{prefix}: gpuenv most common decision",
        100 * g["decision_share"],
        "%",
        better="higher",
        slack=5,
    )


def summarize(rows: Sequence[dict[str, Any]], careful: dict[str, float]) -> dict[str, Any]:
    """One case, tuner and state: its `choices`, the tuning wall, and gpuenv's rounds and
    where its wall went."""
    walls = [r["wall_s"] for r in rows]
    # gpuenv's: its rounds, and the wall a call of gpuenv.bench took (benchmarks/rank_cost.py
    # splits it on the simulated H200: the GPU's work, the rests between calls, the host)
    rounds = [r["rounds"] for r in rows if r.get("rounds")]
    per_call = [r["wall_s"] / r["calls"] for r in rows if r.get("calls")]
    return {
        **choices(rows, careful),
        "wall_median_s": statistics.median(walls) if walls else float("nan"),
        "rounds_median": statistics.median(rounds) if rounds else None,
        "call_wall_median_s": statistics.median(per_call) if per_call else None,
        "split": wall_split(rows),
    }


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print(
            "autotuning needs a GPU (torch and triton): --sim has nothing to run", file=sys.stderr
        )
        return 2
    cases = args.cases
    unknown = sorted(set(cases.split(",")) - set(CASES))
    if unknown:
        print(f"unknown cases {unknown}: use some of {', '.join(CASES)}", file=sys.stderr)
        return 2
    child("warm", cases=cases)
    careful = child("careful", cases=cases)[0]["careful"]
    rows: list[dict[str, Any]] = []
    for _ in range(args.processes):  # interleaved: the tuners meet the same machine
        for state in STATES:
            for tuner in TUNERS:
                rows += child(
                    "tune",
                    tuner,
                    state,
                    str(args.trials),
                    str(args.rest_s),
                    str(args.hot_s),
                    str(args.topup_s),
                    cases=cases,
                )
    chosen = {k: v for k, v in _case_configs().items() if k in cases.split(",")}
    report(rows, careful, chosen)
    return 0


def _case_configs() -> dict[str, list[str]]:
    """Each case's config names, as the workload names them (parsed from its source: the
    parent imports neither torch nor triton)."""
    import ast

    tree = ast.parse(CHILD.read_text())
    cases: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if target in ("MATMUL8", "CLOSE"):
                specs = ast.literal_eval(node.value)
                cases["matmul8" if target == "MATMUL8" else "close"] = [
                    f"BM{m}/BN{n}/BK{k}/G{g} s{s} w{w}" for m, n, k, g, s, w in specs
                ]
    return cases


def report(
    rows: Sequence[dict[str, Any]], careful: dict[str, float], cases: dict[str, list[str]]
) -> None:
    for case, names in cases.items():
        times = {n: careful[n] for n in names if n in careful}
        best = min(times, key=times.__getitem__)
        print(f"## {case}: {len(names)} configs, careful times (gpuenv.bench, 2 s each)")
        print()
        print("| config | careful time | against the best |")
        print("| --- | ---: | ---: |")
        for n in sorted(times, key=times.__getitem__):
            print(f"| {n} | {times[n] * 1e6:.1f} us | {times[n] / times[best] - 1:+.2%} |")
        print()
        close = sorted(times.values())
        within = sum(1 for t in close if t / close[0] - 1 <= 0.01)
        print(f"{within} configs within 1% of the best ({best}).")
        print()
        print(
            "| tuner | state | autotunes | distinct winners | most common (share) | ties "
            "declared | distinct decisions (most common) | regret median | regret max | "
            "tuning wall median | rounds median | wall a call (median) |"
        )
        print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        summary: dict[tuple[str, str], dict[str, Any]] = {}
        for tuner in TUNERS:
            for state in STATES:
                mine = [
                    r for r in rows if (r["case"], r["tuner"], r["state"]) == (case, tuner, state)
                ]
                if not mine:
                    continue
                s = summary[tuner, state] = summarize(mine, times)
                print(
                    f"| {tuner} | {state} | {choice_cells(s)} | {s['wall_median_s']:.2f} s | "
                    f"{or_dash(s['rounds_median'], '{:g}')} | "
                    f"{or_dash(s['call_wall_median_s'], '{:.1f} ms', 1e3)} |"
                )
        print()
        _split_table(summary)
        _metrics(case, summary)


def _split_table(summary: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Where gpuenv's tuning wall went, rested and hot: each part's median an autotune."""
    states = [st for st in STATES if summary.get(("gpuenv", st), {}).get("split")]
    if not states:
        return
    print("Where gpuenv's tuning wall went (each part's median over the autotunes):")
    print()
    print("| part | " + " | ".join(states) + " |")
    print("| --- |" + " ---: |" * len(states))
    for part in summary["gpuenv", states[0]]["split"]:
        cells = [f"{summary['gpuenv', st]['split'].get(part, 0.0) * 1e3:.0f} ms" for st in states]
        print(f"| {part} | " + " | ".join(cells) + " |")
    print()


def or_dash(value: float | None, fmt: str, scale: float = 1.0) -> str:
    """A table cell: `value` (times `scale`) in `fmt`, or "-" where there is none."""
    return "-" if value is None else fmt.format(value * scale)


def _metrics(case: str, summary: dict[tuple[str, str], dict[str, Any]]) -> None:
    for state in STATES:
        g = summary.get(("gpuenv", state))
        if g is None:
            continue
        choice_metrics(f"{case} {state}", g)
        runner.metric(
            f"{case} {state}: gpuenv most common choice",
            100 * g["modal_share"],
            "%",
            better="higher",
            slack=5,
        )
    g, p = summary.get(("gpuenv", "rested")), summary.get(("plain", "rested"))
    if g is not None and p is not None and p["wall_median_s"] > 0:
        ratio = g["wall_median_s"] / p["wall_median_s"]
        print(f"Rested, gpuenv's tuning wall is {ratio:.2f}x plain triton's (goal <= 1.5x).")
        print()
        runner.metric(f"{case} rested: tuning wall gpuenv / plain", ratio, "x", slack=0.1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--processes", type=int, default=2, help="fresh processes per tuner and state (2)"
    )
    parser.add_argument(
        "--trials", type=int, default=5, help="autotunes of each case per process (5)"
    )
    parser.add_argument("--cases", default=",".join(CASES), help="cases to run (all)")
    parser.add_argument("--rest-s", type=float, default=3.0, help="idle before a rested one")
    parser.add_argument("--hot-s", type=float, default=7.0, help="heavy load before the first hot")
    parser.add_argument(
        "--topup-s", type=float, default=2.0, help="heavy load before each later hot one"
    )


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "autotune_rank", __doc__, add_arguments, run, quick={"processes": 1, "trials": 2}
        )
    )
