#!/usr/bin/env python3
"""Tiny kernels (under 20 us) timed several ways, cold and hot, side by side (read-only).

Each kernel, each round: "cold" after --idle seconds of rest; "hot" right after --heat
seconds of back-to-back 8192^3 bf16 matmuls. Three parts (--part; each has its results
file, tiny-<part>.json):

  ways   why a ~6 us kernel reads slower hot with the SM clock unchanged: gpuenv's timers
         raw, no burst wait (median of --reps reps a call): events (L2 flush, a spin
         covering the launch, 1 call a rep), noflush, nospin (launch latency may land
         between the events), batch10 (10 calls between one event pair), graph20
         (gpuenv's CudaGraph, 20 calls a rep); with NVML's SM / memory clock and GPU /
         memory temperature read right after (read-only)
  bench  gpuenv.bench itself with its default condition (burst: it waits until the GPU
         is uncapped): bench (events, 1 call a rep), bench_x10 (a rep is 10 calls back
         to back, per call), bench_graph (mode="graph")
  cupti  the default against CUPTI's device time (issue 18 item 5): cupti (the
         reference, gpuenv.timing.cupti_median_s: 200 calls queued back to back behind a
         spin, L2 warm), default (gpuenv.bench(fn), no options), burst
         (condition="burst"), graph (mode="graph", after this process captured a graph
         first, so a method that depends on capture history shows it)

    GPUENV_READONLY=1 python -m benchmarks.tiny --part cupti --rounds 1  # tiny-cupti.json
    GPUENV_READONLY=1 python -m benchmarks.tiny --part ways --rounds 3   # tiny-ways.json

Needs torch and a GPU; --data PATH keeps every measurement as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner

PARTS = {  # part: its ways of timing, the kernels it measures by default, idle s, heat s
    "ways": (("events", "noflush", "nospin", "batch10", "graph20"), "mm512_fp16,relu_1M", 6.0, 3.0),
    "bench": (("bench", "bench_x10", "bench_graph"), "mm512_fp16,relu_1M,add_1k", 6.0, 3.0),
    "cupti": (("cupti", "default", "burst", "graph"), "", 5.0, 6.0),
}


class Kit:
    """The GPU's side: the tiny kernels, the heavy matmul that heats it, NVML read-only."""

    def __init__(self) -> None:
        import torch

        from gpuenv.backend import open_backend

        self.torch = torch
        torch.cuda.init()
        self.backend = open_backend(readonly=True)

        def randn(*shape: int, dtype: Any = torch.float32) -> Any:
            return torch.randn(*shape, device="cuda", dtype=dtype)

        a, b = randn(512, 512, dtype=torch.float16), randn(512, 512, dtype=torch.float16)
        x, y, s = randn(1 << 20), randn(1024), randn(4096, 1024)
        ln_in = randn(256, 1024, dtype=torch.float16)
        ln = torch.nn.LayerNorm(1024, device="cuda", dtype=torch.float16)
        self.h8a, self.h8b = (randn(8192, 8192, dtype=torch.bfloat16) for _ in range(2))
        self.kernels: dict[str, Callable[[], Any]] = {
            "mm512_fp16": lambda: a @ b,
            "relu_1M": lambda: torch.relu(x),
            "add_1k": lambda: y + y,
            "layernorm_256x1k": lambda: ln(ln_in),
            "sum_4Mf": lambda: s.sum(),
        }

    def heat(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                self.h8a @ self.h8b
            self.torch.cuda.synchronize()

    def rest(self, seconds: float) -> None:
        self.torch.cuda.synchronize()
        time.sleep(seconds)

    def state(self) -> dict[str, Any]:
        f = self.backend.read_fast(0)
        return {
            "sm_mhz": f.sm_mhz,
            "mem_mhz": f.mem_mhz,
            "temp_c": f.temp_c,
            "mem_temp_c": getattr(f, "mem_temp_c", None),
            "power_w": f.power_w,
            "reasons": f.reasons,
        }


def way_timers(kit: Kit, reps: int) -> Callable[[str, Callable[[], Any]], float]:
    """The `ways` and `bench` parts' measurement: the median time of one call, in s."""
    import gpuenv
    from gpuenv.timing import CudaEvents, CudaGraph

    torch = kit.torch
    timers = {
        "events": CudaEvents(),
        "noflush": CudaEvents(flush_l2=False),
        "nospin": CudaEvents(saturate=False),
    }
    graph = CudaGraph(calls=20)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    prepared: set[int] = set()

    def batch10(fn: Callable[[], Any]) -> list[float]:
        ev, out = timers["events"], []
        for _ in range(reps):
            ev._lead_in()
            torch.cuda._sleep(ev.rep_probe_cycles)
            e0.record()
            for _ in range(10):
                fn()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1) / 1e3 / 10)
        return out

    def measure(way: str, fn: Callable[[], Any]) -> float:
        """`way`'s median for fn; "prepare" only sets the timers up for fn."""
        if way.startswith("bench"):
            if way == "bench_x10":

                def ten() -> None:
                    for _ in range(10):
                        fn()

                return float(gpuenv.bench(ten, budget_s=0.5, keep_trace=False).median_s) / 10
            mode = "graph" if way == "bench_graph" else "events"
            return float(gpuenv.bench(fn, mode=mode, budget_s=0.5, keep_trace=False).median_s)
        if id(fn) not in prepared:  # measure_all calls this before the kernel's first round
            for timer in timers.values():
                timer.prepare(fn)
            graph.prepare(fn)
            prepared.add(id(fn))
        if way == "prepare":
            return math.nan
        if way == "batch10":
            times = batch10(fn)
        elif way == "graph20":
            times = [r.time_s for r in graph.reps(fn, max(10, reps // 10))]
        else:
            times = [timers[way].rep(fn).time_s for _ in range(reps)]
        return statistics.median(times)

    return measure


def cupti_timers(kit: Kit) -> Callable[[str, Callable[[], Any]], tuple[float, dict[str, Any]]]:
    """The `cupti` part's measurement: (the median time of one call in s, what gpuenv said)."""
    import gpuenv
    from gpuenv.timing import CudaGraph, cupti_median_s

    y = kit.torch.randn(1024, device="cuda")
    CudaGraph(calls=10).prepare(lambda: y * 2)  # the process's first capture, before any

    def measure(way: str, fn: Callable[[], Any]) -> tuple[float, dict[str, Any]]:
        if way == "cupti":
            return cupti_median_s(fn), {}
        kw = {"default": {}, "burst": {"condition": "burst"}, "graph": {"mode": "graph"}}[way]
        m = gpuenv.bench(fn, name=way, **kw)
        return float(m.stats.median_s), {
            "verdict": str(m.verdict),
            "findings": [f.kind for f in m.findings],
            "timer": m.timer,
            "tiny": m.extra.get("method"),
            "reps": len(m.times_s),
        }

    return measure


def measure_all(kit: Kit, args: argparse.Namespace, ways: tuple[str, ...]) -> list[dict]:
    """Every kernel, way, state and round: one row each."""
    names = (args.kernels or PARTS[args.part][1] or ",".join(kit.kernels)).split(",")
    unknown = sorted(set(names) - set(kit.kernels))
    if unknown:
        raise SystemExit(
            f"--kernels: no kernel {', '.join(unknown)} (have: {', '.join(kit.kernels)})"
        )
    rows: list[dict[str, Any]] = []
    if args.part == "cupti":
        measure = cupti_timers(kit)
        for rnd in range(args.rounds):
            for state in ("cold", "hot"):
                for name in names:
                    for k, way in enumerate(ways):  # the first way after the whole rest or heat
                        if state == "cold":
                            kit.rest(args.idle if k == 0 else 0.5)
                        else:
                            kit.heat(args.heat if k == 0 else 1.5)
                        t = time.perf_counter()
                        value, extra = measure(way, kit.kernels[name])
                        rows.append(
                            {
                                "round": rnd,
                                "state": state,
                                "kernel": name,
                                "way": way,
                                "per_call_s": value,
                                "wall_s": time.perf_counter() - t,
                                **extra,
                            }
                        )
            print(f"round {rnd} done", file=sys.stderr, flush=True)
        return rows
    way_measure = way_timers(kit, args.reps)
    for name in names:
        fn = kit.kernels[name]
        way_measure("prepare", fn)  # the timers' set-up (and a graph capture) before any rest
        for _ in range(5):
            fn()
        for rnd in range(args.rounds):
            kit.rest(args.idle)
            for way in ways:
                rows.append(
                    {
                        "kernel": name,
                        "round": rnd,
                        "state": "cold",
                        "way": way,
                        "per_call_s": way_measure(way, fn),
                        **kit.state(),
                    }
                )
            for way in ways:
                kit.heat(args.heat)
                rows.append(
                    {
                        "kernel": name,
                        "round": rnd,
                        "state": "hot",
                        "way": way,
                        "per_call_s": way_measure(way, fn),
                        **kit.state(),
                    }
                )
            print(f"{name} round {rnd} done", file=sys.stderr, flush=True)
    return rows


def _median(rows: list[dict], key: str = "per_call_s", **where: str) -> float:
    return statistics.median(r[key] for r in rows if all(r[k] == v for k, v in where.items()))


def ways_table(rows: list[dict]) -> list[str]:
    """The `ways` and `bench` parts' table: cold and hot medians per kernel and way."""
    lines = [
        "| kernel | variant | cold median us | hot median us | gap | hot runs (us) "
        "| hot SM / mem MHz | hot temp C |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for name in dict.fromkeys(r["kernel"] for r in rows):
        for way in dict.fromkeys(r["way"] for r in rows):
            hot = [
                r for r in rows if r["kernel"] == name and r["way"] == way and r["state"] == "hot"
            ]
            if not hot:
                continue
            c, h = (_median(rows, kernel=name, way=way, state=s) for s in ("cold", "hot"))
            lines.append(
                f"| {name} | {way} | {c * 1e6:.3f} | {h * 1e6:.3f} | {(h - c) / c:+.1%} "
                "| "
                + ", ".join(f"{r['per_call_s'] * 1e6:.2f}" for r in hot)
                + f" | {hot[-1]['sm_mhz']} / {hot[-1]['mem_mhz']} | {hot[-1]['temp_c']} "
                f"/ {hot[-1]['mem_temp_c']} |"
            )
    return lines


def cupti_table(rows: list[dict]) -> list[str]:
    """The `cupti` part's table: each way against CUPTI's device time, medians."""
    lines = [
        "| kernel | CUPTI us | default us (vs CUPTI) | burst us (vs default) | graph us "
        "| default cold vs hot | default wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in dict.fromkeys(r["kernel"] for r in rows):
        c, d, bu, g = (
            1e6 * _median(rows, kernel=name, way=w) for w in ("cupti", "default", "burst", "graph")
        )
        gap = (
            _median(rows, kernel=name, way="default", state="hot")
            / _median(rows, kernel=name, way="default", state="cold")
            - 1
        )
        wall = _median(rows, "wall_s", kernel=name, way="default")
        lines.append(
            f"| {name} | {c:.2f} | {d:.2f} ({d / c - 1:+.1%}) | {bu:.2f} "
            f"({bu / d - 1:+.1%}) | {g:.2f} | {gap:+.2%} | {wall:.2f} |"
        )
    return lines


def cupti_metrics(rows: list[dict]) -> None:
    """The figures a later `cupti` run must not regress on."""
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    off = [
        abs(_median(rows, kernel=k, way="default") / _median(rows, kernel=k, way="cupti") - 1)
        for k in kernels
    ]
    gaps = [
        abs(
            _median(rows, kernel=k, way="default", state="hot")
            / _median(rows, kernel=k, way="default", state="cold")
            - 1
        )
        for k in kernels
    ]
    runner.metric("worst_default_vs_cupti_pct", 100 * max(off), "%", slack=1.0)
    runner.metric("worst_default_cold_vs_hot_pct", 100 * max(gaps), "%", slack=0.5)
    runner.metric(
        "worst_default_wall_s",
        max(_median(rows, "wall_s", kernel=k, way="default") for k in kernels),
        "s",
        slack=0.5,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--part",
        choices=sorted(PARTS),
        default="cupti",
        help="which ways of timing (default cupti)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds (ways, bench: 3; cupti: 2)"
    )
    parser.add_argument("--idle", type=float, default=None, help="seconds of rest before cold")
    parser.add_argument("--heat", type=float, default=None, help="seconds of load before hot")
    parser.add_argument("--reps", type=int, default=200, help="reps a call (ways)")
    parser.add_argument("--kernels", default="", help="comma-separated names (default: the part's)")
    parser.add_argument("--data", default=None, help="where to keep every measurement (JSON)")


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print(
            "tiny kernels need a GPU (torch, CUDA events, CUPTI): --sim has nothing to run",
            file=sys.stderr,
        )
        return 2
    ways, _, idle, heat = PARTS[args.part]
    args.idle = idle if args.idle is None else args.idle
    args.heat = heat if args.heat is None else args.heat
    args.rounds = args.rounds or (2 if args.part == "cupti" else 3)
    kit = Kit()
    rows = measure_all(kit, args, ways)
    print(
        f"{args.part}, rounds: {args.rounds}; cold after {args.idle:g} s idle, hot right after "
        f"{args.heat:g} s of 8192^3 bf16 matmuls; medians per call:\n"
    )
    print("\n".join(cupti_table(rows) if args.part == "cupti" else ways_table(rows)))
    if args.part == "cupti":
        cupti_metrics(rows)
    if args.data:
        with open(args.data, "w") as f:
            json.dump(
                {
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "gpu": kit.torch.cuda.get_device_name(),
                    "torch": kit.torch.__version__,
                    "part": args.part,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "tiny", __doc__, add_arguments, run, quick={"rounds": 1}, variant=lambda args: args.part
        )
    )
