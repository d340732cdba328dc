#!/usr/bin/env python3
"""The reproducibility benchmark: the same kernel, cold and hot, with each timing tool.

For an 8192^3 and a 2048^3 bf16 matmul, a 1 GiB device copy and a 1k-element add,
each tool measures each kernel (a) after 10 s idle ("cold") and (b) right after
20 s of heavy load ("hot": back-to-back 8192 matmuls). Per tool and kernel it
reports the cold and hot medians, the cold-vs-hot gap |a - b| / mean(a, b), the
run-to-run spread over repeats ((max - min) / median, per state, the larger),
and the wall time one measurement took.

Tools: triton.testing.do_bench (default arguments: the mean of ~100 ms of reps),
torch.utils.benchmark.Timer.blocked_autorange (min_run_time=0.2, median),
gpuenv.bench in burst mode (each burst <= 25 ms, started from the uncapped
state) and in sustained mode (preconditioned with the kernel itself until
equilibrium, then measured). For gpuenv it also reports the time at the
reference (max) clock: median(rep time x effective clock probed before the rep
/ max clock), meaningful for compute-bound kernels only.

Read-only: it runs kernels and reads telemetry; no GPU setting is touched. One
call must finish in < 9 minutes: the schedule shares idle and load phases,
checks a deadline (--deadline) before every step and marks what it skipped.

    python -m benchmarks.repro            # the H100 run (about 8 minutes)
    python -m benchmarks.repro --quick    # one repeat, shorter preconditioning
    python -m benchmarks.repro --sim      # the same schedule on the simulated H100

Prints a markdown table; the results (benchmarks/runner.py) keep each row's wall time
and gap as metrics for the regression check.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks._kernels import GpuEnv, SimGpuEnv
from benchmarks.runner import main as run_benchmark
from benchmarks.runner import metric
from gpuenv import timing
from gpuenv.conditioning import ConditionConfig

KERNELS = (
    "mm8192",
    "mm4096h",
    "mm2048",
    "mm512h",
    "conv",
    "sdpa",
    "mlp",
    "softmax",
    "copy1g",
    "relu1m",
    "add_tiny",
)
DESCRIPTION = {
    "mm8192": "8192^3 bf16 matmul",
    "mm4096h": "4096^3 fp16 matmul",
    "mm2048": "2048^3 bf16 matmul",
    "mm512h": "512^3 fp16 matmul (~6 us)",
    "conv": "3x3 conv 64x128x56x56 fp16 (cuDNN)",
    "sdpa": "attention 8x16x2048x128 bf16",
    "mlp": "MLP block: layernorm, 4096x16384 GEMM, GELU, GEMM (multi-kernel)",
    "softmax": "softmax of 8192x8192 fp32 (reduction)",
    "copy1g": "1 GiB device copy",
    "relu1m": "1M fp32 relu (~7 us)",
    "add_tiny": "1k-element add",
}
# simulated stand-ins: (seconds at the top clock, power intensity)
SIM_KERNELS = {
    "mm8192": (1.4e-3, 1.0),
    "mm4096h": (0.18e-3, 1.0),
    "mm2048": (27e-6, 0.9),
    "mm512h": (6e-6, 0.5),
    "conv": (0.1e-3, 0.8),
    "sdpa": (0.45e-3, 0.9),
    "mlp": (1.0e-3, 0.9),
    "softmax": (0.2e-3, 0.4),
    "copy1g": (0.65e-3, 0.5),
    "relu1m": (7e-6, 0.2),
    "add_tiny": (4e-6, 0.1),
}
# the headline page's figure (benchmarks/report.py): how far gpuenv's default moved cold vs hot
HEADLINE = "gpuenv default/mm8192/gap_pct"
COLD_IDLE_S = 10.0
HOT_LOAD_S = 20.0
BETWEEN_TOOLS_S = 3.0  # idle between tools inside one cold phase (clocks recover in ~0.5 s)
REHEAT_S = 2.0  # heavy load again before each further kernel of a hot phase: each is "right
# after load" (the power cap clears within ~0.5 s of the load stopping)


class Env(GpuEnv):
    """The GPU side: kernels, idling, heavy load, a clock for wall times."""

    load_calls = 16

    name = "gpu"

    def __init__(self) -> None:
        import torch

        from gpuenv.backend import open_backend

        self.torch = torch
        self.backend = open_backend(readonly=True)
        torch.cuda.init()
        a8 = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b8 = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        a2 = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        b2 = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        src = torch.empty(512 << 20, device="cuda", dtype=torch.bfloat16)  # 1 GiB
        dst = torch.empty_like(src)
        x = torch.randn(1024, device="cuda")
        y = torch.randn(1024, device="cuda")
        F = torch.nn.functional
        h4a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
        h4b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
        h5a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
        h5b = torch.randn(512, 512, device="cuda", dtype=torch.float16)
        img = torch.randn(64, 128, 56, 56, device="cuda", dtype=torch.float16)
        wconv = torch.randn(128, 128, 3, 3, device="cuda", dtype=torch.float16)
        q = torch.randn(8, 16, 2048, 128, device="cuda", dtype=torch.bfloat16)
        tok = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
        w1 = torch.randn(4096, 16384, device="cuda", dtype=torch.bfloat16)
        w2 = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
        sm = torch.randn(8192, 8192, device="cuda")
        r1 = torch.randn(1 << 20, device="cuda")

        def mlp() -> Any:
            h = F.layer_norm(tok, (4096,))
            return F.gelu(h @ w1) @ w2

        self.kernels: dict[str, Callable[[], Any]] = {
            "mm8192": lambda: torch.matmul(a8, b8),
            "mm4096h": lambda: torch.matmul(h4a, h4b),
            "mm2048": lambda: torch.matmul(a2, b2),
            "mm512h": lambda: torch.matmul(h5a, h5b),
            "conv": lambda: F.conv2d(img, wconv, padding=1),
            "sdpa": lambda: F.scaled_dot_product_attention(q, q, q),
            "mlp": mlp,
            "softmax": lambda: torch.softmax(sm, dim=-1),
            "copy1g": lambda: dst.copy_(src),
            "relu1m": lambda: torch.relu(r1),
            "add_tiny": lambda: x + y,
        }
        for fn in self.kernels.values():  # library set-up happens here, not in a tool
            fn()
        torch.cuda.synchronize()
        super().__init__(torch, self.kernels["mm8192"])

    def describe(self) -> dict[str, Any]:
        be, torch = self.backend, self.torch
        info = {
            "gpu": torch.cuda.get_device_name(),
            "driver": be.driver_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
        return info


class SimEnv(SimGpuEnv):
    """The same on the simulated H100, on virtual time (kernels are synthetic)."""

    def __init__(self) -> None:
        super().__init__()
        be = self.backend
        self.kernels = {
            name: timing.sim_kernel(be, 0, seconds=sec, power_intensity=power)
            for name, (sec, power) in SIM_KERNELS.items()
        }
        self._heavy = timing.sim_kernel(be, 0, seconds=0.1, power_intensity=1.0)

    def load(self, seconds: float) -> None:  # `seconds` of virtual time, in 0.1 s calls
        end = self.now() + seconds
        while self.now() < end:
            self._heavy()

    def describe(self) -> dict[str, Any]:
        return {
            "gpu": "simulated " + self.backend.device_info(0).name,
            "driver": self.backend.driver_version(),
        }


# --- the tools: each returns (seconds, details) -------------------------------------------


def tool_do_bench(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    from triton.testing import do_bench

    return do_bench(fn) / 1e3, {}


def tool_timer(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    import torch.utils.benchmark as tb

    m = tb.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2)
    return m.median, {}


def tool_naive(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    """The simulator's stand-in for do_bench: ~25 ms warmup, mean of ~100 ms of reps."""
    for _ in range(max(1, int(0.025 / max(_one(env, fn), 1e-9)))):
        fn()
    n = max(1, int(0.1 / max(_one(env, fn), 1e-9)))
    t0 = env.now()
    for _ in range(n):
        fn()
    return (env.now() - t0) / n, {}


def _one(env: Any, fn: Callable[[], Any]) -> float:
    t0 = env.now()
    fn()
    return env.now() - t0


def _gpuenv(
    env: Any, fn: Callable[[], Any], condition: str | None, args: argparse.Namespace, **kw: Any
) -> tuple[float, dict]:
    m = timing.bench(
        fn, backend=env.backend, condition=condition, budget_s=args.budget, keep_trace=False, **kw
    )
    x = m.extra
    details = {
        "n": m.stats.n,
        "rel_ci": x.get("rel_ci"),
        "stop": x.get("stop_reason"),
        "at_ref_clock_s": x.get("time_at_ref_clock_s"),
        "clock_mhz": x.get("rep_clock_mhz_median"),
        "findings": sorted({f.kind for f in m.findings}),
        "precondition_s": x.get("precondition_s"),
        "steady": x.get("precondition_steady"),
        "precondition_temp_c": x.get("precondition_temp_c"),
        "burst_rests": x.get("burst_rests"),
    }
    assert m.stats.median_s is not None, "a bench keeps at least one rep"
    return m.stats.median_s, details


def tool_burst(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    return _gpuenv(env, fn, "burst", args)


def tool_default(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    """gpuenv.bench(fn) with no condition or mode: what a user who passes nothing gets."""
    return _gpuenv(env, fn, None, args)


def tool_events(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    """gpuenv.bench(fn, mode="events"): one call per event pair even for a tiny kernel."""
    return _gpuenv(env, fn, None, args, mode="events")


def tool_dropin(env: Any, fn: Callable[[], Any], args: argparse.Namespace) -> tuple[float, dict]:
    """gpuenv's do_bench drop-in with its defaults (the mean, as triton's)."""
    from gpuenv.integrations.triton import do_bench

    ms = do_bench(fn, backend=env.backend)
    assert isinstance(ms, float)  # one figure: no quantiles asked for
    return ms / 1e3, {}


def tool_sustained(
    env: Any, fn: Callable[[], Any], args: argparse.Namespace, max_s: float = 90.0
) -> tuple[float, dict]:
    return _gpuenv(
        env,
        fn,
        "sustained",
        args,
        precondition_max_s=max_s,
        conditioning=ConditionConfig(sustained_window_s=args.window),
    )


# --- the schedule ---------------------------------------------------------------------------


class Runner:
    def __init__(self, env: Any, args: argparse.Namespace):
        self.env = env
        self.args = args
        self.start = time.monotonic()
        self.results: dict[str, dict[str, dict[str, list[float]]]] = {}
        self.walls: dict[str, dict[str, list[float]]] = {}
        self.details: dict[str, dict[str, list[dict]]] = {}
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.start)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f} s] {text}", file=sys.stderr, flush=True)

    def measure(
        self, tool: str, run: Callable[..., tuple[float, dict]], kernel: str, state: str, **kw: Any
    ) -> None:
        t0 = self.env.now()
        try:
            value, details = run(self.env, self.env.kernels[kernel], self.args, **kw)
        except Exception as err:  # one tool failing must not lose the others' numbers
            self.log(f"{tool} {kernel} {state}: FAILED {type(err).__name__}: {err}")
            self.skipped.append(f"{tool}/{kernel}/{state}: {type(err).__name__}: {err}")
            return
        wall = self.env.now() - t0
        self.results.setdefault(tool, {}).setdefault(kernel, {}).setdefault(state, []).append(value)
        self.walls.setdefault(tool, {}).setdefault(kernel, []).append(wall)
        self.details.setdefault(tool, {}).setdefault(kernel, []).append({"state": state, **details})
        self.log(f"{tool:17s} {kernel:8s} {state:4s} {value * 1e3:10.4f} ms  ({wall:.1f} s)")


def schedule(runner: Runner, short_tools: dict[str, Callable], kernels: list[str]) -> None:
    env, args = runner.env, runner.args
    per_phase = len(kernels) * 3.0
    for r in range(args.repeats if "short" in args.parts else 0):
        # cold: one idle, then each tool in turn with a short rest between tools
        need = COLD_IDLE_S + len(short_tools) * (BETWEEN_TOOLS_S + per_phase)
        if runner.left() < need + args.reserve:
            runner.skipped.append(f"repeat {r + 1} cold phase (deadline)")
        else:
            runner.log(f"repeat {r + 1}: cold (idle {COLD_IDLE_S:.0f} s)")
            env.idle(COLD_IDLE_S)
            for i, (tool, run) in enumerate(short_tools.items()):
                if i:
                    env.idle(BETWEEN_TOOLS_S)
                for k in kernels:
                    runner.measure(tool, run, k, "cold")
        # hot: each tool right after its own 20 s of heavy load, each further kernel after
        # REHEAT_S more of it
        for tool, run in short_tools.items():
            if runner.left() < HOT_LOAD_S + per_phase + len(kernels) * REHEAT_S + args.reserve:
                runner.skipped.append(f"repeat {r + 1} hot {tool} (deadline)")
                continue
            runner.log(f"repeat {r + 1}: hot (load {HOT_LOAD_S:.0f} s) for {tool}")
            env.load(HOT_LOAD_S)
            for i, k in enumerate(kernels):
                if i:
                    env.load(REHEAT_S)
                runner.measure(tool, run, k, "hot")
    # sustained: per kernel, from cold and from hot, in order of falling power: the two
    # matmuls share the 700 W equilibrium; the deadline cuts from the end of the list
    order = [k for k in KERNELS if k in kernels]
    if "sustained" not in args.parts:
        order = []
    for k in order:
        for state in ("cold", "hot"):
            prep = COLD_IDLE_S if state == "cold" else HOT_LOAD_S
            max_s = min(args.precondition, runner.left() - prep - args.reserve - 5)
            if max_s < args.window + 2:
                runner.skipped.append(f"gpuenv sustained {k} {state} (deadline)")
                continue
            runner.log(f"sustained {k}: {state}")
            if state == "cold":
                env.idle(COLD_IDLE_S)
            else:
                env.load(HOT_LOAD_S)
            runner.measure("gpuenv sustained", tool_sustained, k, state, max_s=max_s)


# --- the report -----------------------------------------------------------------------------


def _fmt(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def summarize(runner: Runner) -> list[dict[str, Any]]:
    rows = []
    for tool, per_kernel in runner.results.items():
        for kernel in KERNELS:
            states = per_kernel.get(kernel)
            if not states:
                continue
            cold, hot = states.get("cold", []), states.get("hot", [])
            a = statistics.fmean(cold) if cold else None
            b = statistics.fmean(hot) if hot else None
            gap = abs(a - b) / ((a + b) / 2) if a and b else None
            spreads = [(max(v) - min(v)) / statistics.median(v) for v in (cold, hot) if len(v) > 1]
            details = runner.details[tool][kernel]
            row: dict[str, Any] = {
                "tool": tool,
                "kernel": kernel,
                "cold_s": a,
                "hot_s": b,
                "gap": gap,
                "spread": max(spreads) if spreads else None,
                "repeats": min(len(cold), len(hot)),
                "wall_s": statistics.fmean(runner.walls[tool][kernel]),
                "details": details,
            }
            norm_c = [
                d["at_ref_clock_s"]
                for d in details
                if d["state"] == "cold" and d.get("at_ref_clock_s")
            ]
            norm_h = [
                d["at_ref_clock_s"]
                for d in details
                if d["state"] == "hot" and d.get("at_ref_clock_s")
            ]
            if norm_c and norm_h:
                na, nb = statistics.fmean(norm_c), statistics.fmean(norm_h)
                row["norm_gap"] = abs(na - nb) / ((na + nb) / 2)
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| tool | kernel | cold | hot | gap | spread | at max clock: gap | wall / measurement |"
        " notes |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        notes = []
        for d in r["details"]:
            if d.get("steady") is False:
                notes.append(f"{d['state']}: not at equilibrium after {d['precondition_s']:.0f} s")
            elif d.get("precondition_s") is not None:
                notes.append(f"{d['state']}: preconditioned {d['precondition_s']:.0f} s")
        spread = f"{r['spread']:.2%}" if r["spread"] is not None else f"n/a ({r['repeats']} run)"
        norm = f"{r['norm_gap']:.2%}" if r.get("norm_gap") is not None else "-"
        gap = f"{r['gap']:.2%}" if r["gap"] is not None else "-"
        out.append(
            f"| {r['tool']} | {DESCRIPTION[r['kernel']]} | {_fmt(r['cold_s'])} | "
            f"{_fmt(r['hot_s'])} | {gap} | {spread} | {norm} | {r['wall_s']:.1f} s | "
            f"{'; '.join(notes)} |"
        )
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=2, help="repeats of the short tools")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    p.add_argument(
        "--parts",
        default="short,sustained",
        help="short (do_bench, Timer, gpuenv burst) and/or sustained: one device "
        "call may not fit both once sustained mode waits for a temperature plateau",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=480.0,
        help="seconds; no new step starts after it (default 480: < 9 min total)",
    )
    p.add_argument("--reserve", type=float, default=5.0, help="seconds kept for the report")
    p.add_argument(
        "--precondition",
        type=float,
        default=90.0,
        help="longest preconditioning of one sustained measurement (s)",
    )
    p.add_argument("--window", type=float, default=6.0, help="sustained equilibrium window (s)")
    p.add_argument("--budget", type=float, default=2.0, help="gpuenv measuring budget (s)")
    p.add_argument(
        "--tools",
        default="dropin",
        help="extra gpuenv tools beside do_bench, Timer and gpuenv's default: "
        "dropin, burst (the default is burst unless gpuenv's lock holds), events "
        "(the default with one call per rep, tiny kernels too)",
    )


def run(args: argparse.Namespace) -> int:
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    args.parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    args.tools = {x.strip() for x in args.tools.split(",") if x.strip()}
    if not args.parts or args.parts - {"short", "sustained"}:
        raise SystemExit("--parts takes short, sustained or both")
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        raise SystemExit(f"unknown kernels {bad}; choose from {', '.join(KERNELS)}")
    if args.sim:
        args.deadline = 1e9  # virtual time: the deadline is about real GPU minutes
    env: Any = SimEnv() if args.sim else Env()
    runner = Runner(env, args)
    short: dict[str, Callable] = {}
    if args.sim:
        short["naive (do_bench-like)"] = tool_naive
    else:
        try:
            import triton.testing  # noqa: F401

            short["triton do_bench"] = tool_do_bench
        except ImportError:
            runner.skipped.append("triton do_bench (triton is not installed)")
        short["torch Timer"] = tool_timer
    if "burst" in args.tools:
        short["gpuenv burst"] = tool_burst
    short["gpuenv default"] = tool_default
    if "events" in args.tools:
        short["gpuenv default, mode=events"] = tool_events
    if "dropin" in args.tools:
        short["gpuenv do_bench drop-in"] = tool_dropin
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    schedule(runner, short, kernels)
    rows = summarize(runner)
    info = env.describe()
    head = (
        f"{info.get('gpu')}, driver {info.get('driver')}"
        + (f", torch {info['torch']}" if info.get("torch") else "")
        + (f", triton {info['triton']}" if info.get("triton") else "")
        + f"; {started}; repeats {args.repeats}; total {time.monotonic() - runner.start:.0f} s"
    )
    print(head)
    print()
    print(table(rows))
    if runner.skipped:
        print()
        print("Skipped: " + "; ".join(runner.skipped))
    for r in rows:
        key = f"{r['tool']}/{r['kernel']}"
        metric(f"{key}/wall_s", r["wall_s"], "s", slack=0.02)
        if r["gap"] is not None:
            metric(f"{key}/gap_pct", 100 * r["gap"], "%", slack=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(
        run_benchmark(
            "repro", __doc__, add_arguments, run, quick={"repeats": 1, "precondition": 45.0}
        )
    )
