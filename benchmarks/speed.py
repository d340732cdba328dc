#!/usr/bin/env python3
"""Time to a trustworthy number: gpuenv.bench's default against triton's do_bench, cold and hot.

Eight kernels of 20 us - 5 ms (issue 22, item 1), each measured by both tools with
default arguments, `--repeats` times in one process (tools alternate first/second):
  cold  after `--idle` s idle (the power cap cleared),
  hot   right after `--load` s of 8192^3 bf16 matmuls (capped and hot at the call's start).
Per kernel: the medians cold and hot and their gap |cold - hot| / mean, the wall time of a
call cold and hot and gpuenv's ratio to do_bench's, where gpuenv's time went (warmup, the
wait before measuring, measuring, the rest: sampler start, judging), and run to run
(item 3): the spread (max - min) / median of the returned number over the repeats of one
process (cold and hot, the larger), and over `--procs` more processes that each measure
the kernels once cold (with the first process's first cold value).
Then the tiny-kernel path (calls under 20 us, timed by CUPTI device time): the wall time
of three calls in a row of the same function (the first pays the CUPTI trial).

Goals: wall <= 2x do_bench cold and <= 3x hot; cold vs hot <= 1% on every kernel and
<= 0.5% on >= 6 of 8; run-to-run spread <= 0.5% in one process and across processes.

Read-only (GPUENV_READONLY=1): it runs kernels and reads telemetry. A deadline
(`--deadline`) is checked before each kernel, and what was skipped is said.

    python -m benchmarks.speed              # the H100 (~4 minutes)
    python -m benchmarks.speed --sim        # the simulated H100; do_bench is a model of it
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks._kernels import GpuEnv, SimGpuEnv, child_values, kernels
from benchmarks.runner import main as run_benchmark
from benchmarks.runner import metric
from gpuenv import timing
from gpuenv.units import fmt_s

KERNELS = ("mm2048", "mm4096", "mm8192", "sdpa", "softmax", "layernorm", "conv", "mlp")
TINY = ("mm512", "relu1m")
DESCRIPTION = {
    "mm2048": "2048^3 bf16 matmul (~27 us)",
    "mm4096": "4096^3 bf16 matmul (~0.2 ms)",
    "mm8192": "8192^3 bf16 matmul (~1.4 ms)",
    "sdpa": "attention 8x16x2048x128 bf16",
    "softmax": "softmax of 8192x8192 fp32",
    "layernorm": "layer norm of 16384x8192 fp16",
    "conv": "3x3 conv 64x128x56x56 fp16",
    "mlp": "gelu(X@W1)@W2 8192x4096x16384 bf16 (~2.9 ms)",
    "mm512": "512^3 fp16 matmul (~3 us)",
    "relu1m": "1M fp32 relu (~2 us)",
}
SIM_KERNELS = {  # (seconds at the top clock, power intensity)
    "mm2048": (27e-6, 0.8),
    "mm4096": (0.19e-3, 1.0),
    "mm8192": (1.4e-3, 1.0),
    "sdpa": (0.42e-3, 1.0),
    "softmax": (0.3e-3, 0.5),
    "layernorm": (0.3e-3, 0.5),
    "conv": (0.2e-3, 0.9),
    "mlp": (2.9e-3, 1.0),
    "mm512": (6e-6, 0.3),
    "relu1m": (7e-6, 0.2),
}
PARTS = ("warmup_s", "burst_first_wait_s", "measure_s")


def _variants() -> dict[str, dict[str, Any]]:
    """gpuenv.bench settings tried beside the default (`--variants`), by name."""
    import dataclasses

    from gpuenv.timing.config import BENCH_CONDITIONING

    clock = dataclasses.replace(BENCH_CONDITIONING, burst_ready="clock")
    return {
        "clock": {"conditioning": clock},
        "ci25": {"rel_ci": 0.0025},
        "clock+ci25": {"conditioning": clock, "rel_ci": 0.0025},
    }


GAP_GOAL, GAP_STRICT, SPREAD_GOAL = 0.01, 0.005, 0.005
WALL_GOAL = {"cold": 2.0, "hot": 3.0}


class Env(GpuEnv):
    """The GPU: the kernels, idle, heavy load, wall time, the two tools."""

    def __init__(self) -> None:
        import torch

        self.kernels = kernels(torch)
        super().__init__(torch, self.kernels["mm8192"])

    def tools(self) -> dict[str, Callable[[Callable[[], Any]], tuple[float, Any]]]:
        import triton.testing as tt

        return {
            "do_bench": lambda fn: (tt.do_bench(fn) / 1e3, None),
            "gpuenv": lambda fn: _gpuenv(timing.bench(fn)),
        }

    def variant(self, settings: dict[str, Any]) -> Callable[[Callable[[], Any]], tuple[float, Any]]:
        return lambda fn: _gpuenv(timing.bench(fn, **settings))

    def describe(self) -> str:
        import triton

        torch = self.torch
        return (
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"triton {triton.__version__}"
        )


class SimEnv(SimGpuEnv):
    """The simulated H100 on virtual time; do_bench is a model of its schedule (a first
    call, 5 timed calls, 25 ms of warm-up calls, 100 ms of reps), since triton cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = {
            name: timing.sim_kernel(self.backend, 0, seconds=s, power_intensity=p)
            for name, (s, p) in SIM_KERNELS.items()
        }

    def tools(self) -> dict[str, Callable[[Callable[[], Any]], tuple[float, Any]]]:
        return {
            "do_bench": self._do_bench_model,
            "gpuenv": lambda fn: _gpuenv(timing.bench(fn, backend=self.backend)),
        }

    def variant(self, settings: dict[str, Any]) -> Callable[[Callable[[], Any]], tuple[float, Any]]:
        return lambda fn: _gpuenv(timing.bench(fn, backend=self.backend, **settings))

    def _do_bench_model(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        dev = timing.SimDevice(self.backend, 0, rep_probe_cycles=0)
        fn()
        est = statistics.mean(dev.rep(fn).time_s for _ in range(5))
        for _ in range(max(1, int(0.025 / est))):
            fn()
        return statistics.mean(dev.rep(fn).time_s for _ in range(max(1, int(0.1 / est)))), None

    def describe(self) -> str:
        return "simulated " + self.backend.device_info(0).name


def _gpuenv(m: Any) -> tuple[float, dict[str, Any]]:
    x = m.extra
    info = {k: x.get(k) for k in PARTS}
    info.update(
        reps=len(m.times_s),
        stop=x.get("stop_reason"),
        verdict=m.verdict,
        rests_s=x.get("burst_rest_s"),
        tiny=x.get("method"),
        rel_ci=x.get("rel_ci"),
        warmup_reps=x.get("warmup_reps"),
        clock_mhz=x.get("rep_clock_mhz_median"),
        first_s=m.times_s[0],
        last_s=m.times_s[-1],
        from_start=x.get("burst_from_start"),
        findings=sorted({f.kind for f in m.findings}),
        redos=x.get("burst_clock_redos"),
        temp_c=m.summary_windows[0].temp_c_start if m.summary_windows else None,
    )
    return float(m.median_s), info


def call(
    env: Any, tool: Callable[[Callable[[], Any]], tuple[float, Any]], fn: Callable[[], Any]
) -> dict[str, Any]:
    t0 = env.now()
    value, info = tool(fn)
    out: dict[str, Any] = {"s": value, "wall_s": env.now() - t0}
    if info is not None:
        out.update(info)
    return out


def spread(values: list[float]) -> float | None:
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def measure(env: Any, args: argparse.Namespace, kernels: list[str]) -> dict[str, Any]:
    """The side-by-side runs: per repeat, kernel and state, both tools (order alternating)."""
    tools = env.tools()
    table = _variants()
    for v in args.variants:
        tools[f"gpuenv:{v}"] = env.variant(table[v])
    for name in kernels:  # a first call each: NVML start-up, profiler and library set-up
        for tool in tools.values():
            tool(env.kernels[name])
    start = env.now()
    res: dict[str, Any] = {k: {t: {"cold": [], "hot": []} for t in tools} for k in kernels}
    skipped = []
    for r in range(args.repeats):
        for name in kernels:
            if env.now() - start > args.deadline:
                skipped.append(f"{name} (repeat {r + 1})")
                continue
            order = list(tools) if r % 2 == 0 else list(reversed(tools))
            for state in ("cold", "hot"):
                for t in order:
                    (env.idle(args.idle) if state == "cold" else env.load(args.load))
                    res[name][t][state].append(call(env, tools[t], env.kernels[name]))
        print(f"# repeat {r + 1} done at {env.now() - start:.0f} s", file=sys.stderr, flush=True)
    return {"runs": res, "skipped": skipped}


def tiny_path(env: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Three calls in a row of each tiny kernel (after idle): wall and value of each."""
    out: dict[str, Any] = {}
    tool = env.tools()["gpuenv"]
    for name in TINY:
        env.idle(args.idle)
        out[name] = [call(env, tool, env.kernels[name]) for _ in range(3)]
    return out


def profile(env: Any, args: argparse.Namespace, path: str) -> None:
    """cProfile's top `--profile` functions (cumulative) of one cold and one hot gpuenv call
    of the 4096^3 matmul, to `path`: where the host's share of the wall time goes."""
    import cProfile
    import io
    import pstats

    tool, fn = env.tools()["gpuenv"], env.kernels["mm4096"]
    with open(path, "w") as f:
        for state in ("cold", "hot"):
            (env.idle(args.idle) if state == "cold" else env.load(args.load))
            prof = cProfile.Profile()
            t0 = env.now()
            prof.enable()
            tool(fn)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.profile)
            f.write(f"## {state}: wall {env.now() - t0:.3f} s\n{buf.getvalue()}\n")


def recovery(env: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """After `--load` s of heavy matmuls, every ~10 ms for 1 s: the effective SM clock of a
    0.2 ms spin (events) beside NVML's newest sample. When does the clock come back, and
    when does NVML's power-cap reason clear? (The hot call's wait follows the second.)"""
    from gpuenv.backend import open_backend
    from gpuenv.reasons import HELD_DOWN
    from gpuenv.telemetry import Sampler

    torch = env.torch
    backend = open_backend(readonly=True)
    sampler = Sampler(backend, [0])
    sampler.start()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def probe(cycles: int = 400_000) -> float:
        torch.cuda._sleep(60_000)
        e0.record()
        torch.cuda._sleep(cycles)
        e1.record()
        e1.synchronize()
        return cycles / (e0.elapsed_time(e1) / 1e3) / 1e6

    out = []
    try:
        env.idle(args.idle)
        probe(10_000_000)
        ref = max(probe() for _ in range(5))  # the cool GPU's clock, as the spin sees it
        for _ in range(args.recovery):
            env.load(args.load)
            t0, points = time.monotonic(), []
            while time.monotonic() - t0 < 1.0:
                mhz = probe()
                s = sampler.latest(0)
                points.append(
                    (
                        time.monotonic() - t0,
                        mhz,
                        s.sm_mhz if s else None,
                        bool(s.reasons & HELD_DOWN) if s else None,
                    )
                )
                time.sleep(0.01)
            clock_back = next((p[0] for p in points if p[1] >= 0.98 * ref), None)
            flag_clear = next(
                (
                    p[0]
                    for i, p in enumerate(points)
                    if all(q[3] is False for q in points[i : i + 3])
                ),
                None,
            )
            out.append(
                {
                    "ref_mhz": ref,
                    "clock_back_s": clock_back,
                    "flag_clear_s": flag_clear,
                    "points": points,
                }
            )
    finally:
        sampler.stop()
        backend.close()
    return out


def children(args: argparse.Namespace, kernels: list[str]) -> list[dict[str, float]]:
    """`--procs` more processes, one after the other, each measuring the kernels once cold."""
    return child_values(
        "benchmarks.speed",
        args.procs,
        ["--kernels", ",".join(kernels), "--idle", str(args.idle)],
        args.child_timeout,
    )


def child(env: Any, args: argparse.Namespace, kernels: list[str]) -> None:
    tool = env.tools()["gpuenv"]
    for name in kernels:
        tool(env.kernels[name])
    values = {}
    for name in kernels:
        env.idle(args.idle)
        values[name] = call(env, tool, env.kernels[name])["s"]
    print("CHILD " + json.dumps(values))


def _med(calls: list[dict[str, Any]], key: str) -> float:
    return statistics.median(c[key] for c in calls)


def summarize(runs: dict[str, Any], procs: list[dict[str, float]]) -> list[dict[str, Any]]:
    rows = []
    for name, res in runs.items():
        g, t = res["gpuenv"], res["do_bench"]
        if not g["cold"] or not g["hot"] or not t["cold"] or not t["hot"]:
            continue
        row: dict[str, Any] = {"kernel": name}
        for tool, d in (("gpuenv", g), ("do_bench", t)):
            cold, hot = _med(d["cold"], "s"), _med(d["hot"], "s")
            row[tool] = {
                "cold_s": cold,
                "hot_s": hot,
                "gap": abs(cold - hot) / ((cold + hot) / 2),
                "wall_cold_s": _med(d["cold"], "wall_s"),
                "wall_hot_s": _med(d["hot"], "wall_s"),
                "spread_in_process": max(
                    spread([c["s"] for c in d["cold"]]) or 0.0,
                    spread([c["s"] for c in d["hot"]]) or 0.0,
                ),
            }
        across = [g["cold"][0]["s"]] + [p[name] for p in procs if name in p]
        row["gpuenv"]["spread_across_processes"] = spread(across) if len(across) >= 3 else None
        row["gpuenv"]["processes"] = len(across)
        for state in ("cold", "hot"):
            row[f"ratio_{state}"] = (
                row["gpuenv"][f"wall_{state}_s"] / row["do_bench"][f"wall_{state}_s"]
            )
            row[f"parts_{state}"] = {p: _med(g[state], p) for p in PARTS}
            row[f"parts_{state}"]["other_s"] = row["gpuenv"][f"wall_{state}_s"] - sum(
                row[f"parts_{state}"].values()
            )
            row[f"reps_{state}"] = _med(g[state], "reps")
        rows.append(row)
    return rows


def variant_table(runs: dict[str, Any]) -> list[str]:
    """The variants beside the default and do_bench: value cold / hot (gap), wall ratios to
    do_bench, the wait before a hot call, run to run in process, findings and clock redos."""
    lines = [
        "| kernel | variant | cold / hot (gap) | wall cold / hot: x do_bench | hot wait "
        "| run to run in process | findings (hot) | clock redos |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for name, res in runs.items():
        t = res["do_bench"]
        if not t["cold"] or not t["hot"]:
            continue
        for tool, d in res.items():
            if not tool.startswith("gpuenv") or not d["cold"] or not d["hot"]:
                continue
            cold, hot = _med(d["cold"], "s"), _med(d["hot"], "s")
            rc = _med(d["cold"], "wall_s") / _med(t["cold"], "wall_s")
            rh = _med(d["hot"], "wall_s") / _med(t["hot"], "wall_s")
            rtr = max(spread([c["s"] for c in d[st]]) or 0.0 for st in ("cold", "hot"))
            found = sorted({k for c in d["hot"] for k in c.get("findings") or []})
            redos = sum(c.get("redos") or 0 for st in ("cold", "hot") for c in d[st])
            lines.append(
                f"| {DESCRIPTION[name]} | {tool.partition(':')[2] or 'default'} "
                f"| {fmt_s(cold)} / {fmt_s(hot)} "
                f"({abs(cold - hot) / ((cold + hot) / 2):.2%}) "
                f"| {rc:.2f}x / {rh:.2f}x | {_med(d['hot'], 'burst_first_wait_s'):.3f} s "
                f"| {rtr:.2%} | {', '.join(found) or '-'} | {redos} |"
            )
    return lines


def report(rows: list[dict[str, Any]], tiny: dict[str, Any], head: str, skipped: list[str]) -> None:
    print(head)
    print()
    print(
        "| kernel | do_bench cold / hot (gap) | gpuenv cold / hot (gap) | wall do_bench cold / "
        "hot | wall gpuenv cold / hot | ratio cold / hot | run to run: gpuenv in process / "
        "across processes; do_bench in process |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        g, t = r["gpuenv"], r["do_bench"]
        across = g["spread_across_processes"]
        print(
            f"| {DESCRIPTION[r['kernel']]} | {fmt_s(t['cold_s'])} / {fmt_s(t['hot_s'])} "
            f"({t['gap']:.2%}) | {fmt_s(g['cold_s'])} / {fmt_s(g['hot_s'])} ({g['gap']:.2%}) "
            f"| {t['wall_cold_s']:.3f} / {t['wall_hot_s']:.3f} s "
            f"| {g['wall_cold_s']:.3f} / {g['wall_hot_s']:.3f} s "
            f"| {r['ratio_cold']:.2f}x / {r['ratio_hot']:.2f}x "
            f"| {g['spread_in_process']:.2%} / "
            f"{f'{across:.2%}' if across is not None else 'n/a'}; "
            f"{t['spread_in_process']:.2%} |"
        )
    print()
    print(
        "Where gpuenv's wall time went (medians, s): warmup, the wait before measuring, "
        "measuring (reps and rests), the rest (sampler start, facts, judging)."
    )
    print()
    print(
        "| kernel | cold: warmup / wait / measure / rest (reps) | "
        "hot: warmup / wait / measure / rest (reps) |"
    )
    print("| --- | --- | --- |")
    for r in rows:
        cells = []
        for state in ("cold", "hot"):
            p = r[f"parts_{state}"]
            cells.append(
                f"{p['warmup_s']:.3f} / {p['burst_first_wait_s']:.3f} / "
                f"{p['measure_s']:.3f} / {p['other_s']:.3f} ({r[f'reps_{state}']:.0f})"
            )
        print(f"| {DESCRIPTION[r['kernel']]} | {cells[0]} | {cells[1]} |")
    if tiny:
        print()
        print("The tiny path: three calls in a row of the same function (wall s; value).")
        print()
        print("| kernel | how | call 1 | call 2 | call 3 |")
        print("| --- | --- | ---: | ---: | ---: |")
        for name, calls in tiny.items():
            print(
                f"| {DESCRIPTION[name]} | {calls[0].get('tiny')} | "
                + " | ".join(f"{c['wall_s']:.3f} s; {fmt_s(c['s'])}" for c in calls)
                + " |"
            )
    print()
    n = len(rows)
    if n:
        gap_ok = sum(r["gpuenv"]["gap"] <= GAP_GOAL for r in rows)
        strict = sum(r["gpuenv"]["gap"] <= GAP_STRICT for r in rows)
        wall_c = sum(r["ratio_cold"] <= WALL_GOAL["cold"] for r in rows)
        wall_h = sum(r["ratio_hot"] <= WALL_GOAL["hot"] for r in rows)
        rtr = sum(r["gpuenv"]["spread_in_process"] <= SPREAD_GOAL for r in rows)
        acr = [r["gpuenv"]["spread_across_processes"] for r in rows]
        acr_ok = sum(a is not None and a <= SPREAD_GOAL for a in acr)
        print(
            f"Goals, gpuenv on {n} kernels: wall <= 2x do_bench cold on {wall_c}, <= 3x hot "
            f"on {wall_h}; cold vs hot <= 1% on {gap_ok}, <= 0.5% on {strict} (goal >= 6); "
            f"run to run <= 0.5% in one process on {rtr}, across processes on {acr_ok} "
            f"(of {sum(a is not None for a in acr)} measured)."
        )
    if skipped:
        print(f"Skipped (deadline): {', '.join(skipped)}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=3, help="cold/hot pairs per tool and kernel")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    p.add_argument("--idle", type=float, default=1.0, help="seconds idle before a cold call")
    p.add_argument("--load", type=float, default=1.5, help="seconds of load before a hot call")
    p.add_argument("--procs", type=int, default=2, help="more processes for run to run")
    p.add_argument("--child-timeout", type=float, default=60.0, help="seconds per process")
    p.add_argument(
        "--deadline",
        type=float,
        default=200.0,
        help="seconds of the side-by-side part after which kernels are skipped",
    )
    p.add_argument("--no-tiny", action="store_true", help="skip the tiny-kernel part")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        help="write cProfile's top N of a cold and a hot call to $OUT/speed_profile.txt",
    )
    p.add_argument(
        "--recovery",
        type=int,
        default=0,
        help="times to follow the clock's and NVML's recovery after load",
    )
    p.add_argument(
        "--variants",
        default="",
        help="gpuenv.bench settings tried beside the "
        "default, comma-separated: " + ", ".join(_variants()),
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def chosen_kernels(text: str) -> list[str]:
    """`--kernels`: a comma-separated subset of KERNELS (an unknown name ends the run)."""
    kernels = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        raise SystemExit(f"unknown kernels {bad}; choose from {', '.join(KERNELS)}")
    return kernels


def run(args: argparse.Namespace) -> int:
    kernels = chosen_kernels(args.kernels)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in _variants()]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {', '.join(_variants())}")
    env: Any = SimEnv() if args.sim else Env()
    if args.child:
        child(env, args, kernels)
        return 0
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    got = measure(env, args, kernels)
    tiny = {} if args.no_tiny else tiny_path(env, args)
    procs = [] if args.sim else children(args, kernels)
    if args.profile:
        profile(env, args, os.path.join(os.environ.get("OUT", "."), "speed_profile.txt"))
    rec = recovery(env, args) if args.recovery and not args.sim else []
    rows = summarize(got["runs"], procs)
    head = (
        f"{env.describe()}; {started}; {args.repeats} repeats in one process and "
        f"{len(procs)} more processes; cold after {args.idle} s idle, hot after "
        f"{args.load} s of 8192^3 matmuls; wall {'virtual ' if args.sim else ''}seconds; "
        f"total {time.monotonic() - t0:.0f} s (real)"
    )
    report(rows, tiny, head, got["skipped"])
    if args.variants:
        print()
        print(
            "gpuenv.bench's settings side by side (medians over the repeats; x do_bench: "
            "wall time against do_bench's in the same state):"
        )
        print()
        print("\n".join(variant_table(got["runs"])))
    if rec:
        print()
        print(
            "After the load stops (a 0.2 ms spin's clock every ~10 ms beside NVML): the clock "
            "within 2% of the cool GPU's at "
            + ", ".join(
                f"{r['clock_back_s']:.2f} s" if r["clock_back_s"] is not None else "never"
                for r in rec
            )
            + "; NVML's held-down reasons clear (3 samples) at "
            + ", ".join(
                f"{r['flag_clear_s']:.2f} s" if r["flag_clear_s"] is not None else "never"
                for r in rec
            )
            + "."
        )
    for r in rows:
        k = r["kernel"]
        metric(f"{k}/ratio_cold", r["ratio_cold"], "x", slack=0.2)
        metric(f"{k}/ratio_hot", r["ratio_hot"], "x", slack=0.3)
        metric(f"{k}/gap_pct", 100 * r["gpuenv"]["gap"], "%", slack=0.3)
    path = os.environ.get("SPEED_RAW")
    if path:
        with open(path, "w") as f:
            json.dump(
                {"runs": got["runs"], "procs": procs, "tiny": tiny, "rows": rows, "recovery": rec},
                f,
            )
    return 0


if __name__ == "__main__":
    sys.exit(
        run_benchmark(
            "speed",
            __doc__,
            add_arguments,
            run,
            quick={"repeats": 1, "procs": 0, "kernels": "mm4096,mlp"},
        )
    )
