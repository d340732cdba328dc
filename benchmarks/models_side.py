#!/usr/bin/env python3
"""Kernels gpuenv was not tuned on, cold and hot, through do_bench, gpuenv.bench, the drop-in and
stable(), on each GPU model.

Issue 42, item 4: figures from each GPU model side by side. Seven kernels that no other
benchmark measures (none is in benchmarks._kernels' `kernels`, session_wait's or
warnings_moved's): compute-bound ones (a 64 x 512^3 fp16 bmm, an fp32 4096^3 matmul on
TF32, a bf16 linear with bias 16384x4096 -> 11008) and memory-bound ones (an RMSNorm
written in torch ops, a cumsum over 16M, a top-16 of 32k rows of 4096, a sum embedding-bag
of 1M lookups). Each is measured by four tools, one call each with default arguments:
  do_bench  triton.testing.do_bench,
  bench     gpuenv.bench(fn),
  dropin    gpuenv.integrations.triton.do_bench(fn), the drop-in,
  stable    `with gpuenv.stable() as env: env.bench(fn)` (a session per call),
each `--repeats` times cold (after `--idle` s of idle) and hot (right after `--load` s of
heavy 8192^3 bf16 matmuls), the tools' order alternating between repeats. Per kernel and
tool: the medians over the repeats of the number it returns (do_bench's and the drop-in's
mean, gpuenv.bench's and the session's median) cold and hot, their gap |cold - hot| /
mean, and the wall time of a call cold and hot; per tool: the worst and median gap, and
its wall against do_bench's.

The results file is named by the GPU model (`models_side-h200.json`,
`models_side-h100-sim.json`): each model's run is a section of its own on one page.

Read-only (GPUENV_READONLY=1): it runs kernels and reads telemetry; nothing is written to
the GPU. A deadline (`--deadline`) is checked before each kernel, and what it skipped is
said. About 4 minutes on an H200.

    GPUENV_READONLY=1 python -m benchmarks.models_side     # results/models_side-<gpu>.json
    python -m benchmarks.models_side --sim                 # the simulated H100 (do_bench:
                                                           # a model of it)
    python -m benchmarks.models_side --sim --sim-profile h200     # another simulated model
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from benchmarks._kernels import GpuEnv, SimGpuEnv, sim_do_bench
from gpuenv.units import fmt_s

HEADLINE = "bench/worst_gap_pct"
TOOLS = ("do_bench", "bench", "dropin", "stable")
DESCRIPTION = {  # in the order measured: what the deadline would skip comes last
    "linear_bias": "bf16 linear with bias, 16384x4096 -> 11008",
    "bmm64_f16": "bmm 64 x 512^3 fp16",
    "rmsnorm_8k": "RMSNorm in torch ops, 8192x8192 bf16 (fp32 inside)",
    "mm4096_tf32": "4096^3 fp32 matmul on TF32",
    "embbag_1m": "embedding_bag sum, 1M lookups of 128 fp32 in 1M rows, bags of 64",
    "cumsum_16m": "cumsum over 16M fp32",
    "topk_32k": "top-16 of 32768 rows x 4096 fp16",
}
KERNELS = tuple(DESCRIPTION)
# The simulated GPU's stand-ins: (SM seconds at the top SM clock, memory seconds at the top
# memory clock: the part whose time does not follow the SM clock, power intensity)
SIM_KERNELS = {
    "bmm64_f16": (35e-6, 0.0, 0.8),
    "rmsnorm_8k": (50e-6, 0.35e-3, 0.4),
    "mm4096_tf32": (0.35e-3, 0.0, 1.0),
    "cumsum_16m": (5e-6, 35e-6, 0.3),
    "topk_32k": (1.0e-3, 0.3e-3, 0.5),
    "embbag_1m": (20e-6, 0.25e-3, 0.3),
    "linear_bias": (2.2e-3, 0.0, 1.0),
}

Tool = Callable[[Callable[[], Any]], tuple[float, Any]]  # fn -> (seconds, Measurement | None)


def new_kernels(torch: Any) -> dict[str, Callable[[], Any]]:
    """The seven kernels on the current CUDA device, set up (each called once). Turns on
    TF32 for fp32 matmuls (the only fp32 matmul of this benchmark is the TF32 one)."""
    F = torch.nn.functional
    torch.backends.cuda.matmul.allow_tf32 = True

    def randn(*shape: int, dtype: Any = torch.bfloat16) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    bq, bk = randn(64, 512, 512, dtype=torch.float16), randn(64, 512, 512, dtype=torch.float16)
    x, w = randn(8192, 8192), randn(8192)
    a32, b32 = randn(4096, 4096, dtype=torch.float32), randn(4096, 4096, dtype=torch.float32)
    c16m = randn(1 << 24, dtype=torch.float32)
    scores = randn(32768, 4096, dtype=torch.float16)
    table = randn(1 << 20, 128, dtype=torch.float32)
    idx = torch.randint(0, 1 << 20, (1 << 20,), device="cuda")
    offsets = torch.arange(0, 1 << 20, 64, device="cuda")
    xl, wl, bl = randn(16384, 4096), randn(11008, 4096), randn(11008)

    def rmsnorm() -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    out: dict[str, Callable[[], Any]] = {
        "bmm64_f16": lambda: torch.bmm(bq, bk),
        "rmsnorm_8k": rmsnorm,
        "mm4096_tf32": lambda: a32 @ b32,
        "cumsum_16m": lambda: torch.cumsum(c16m, 0),
        "topk_32k": lambda: torch.topk(scores, 16, dim=-1),
        "embbag_1m": lambda: F.embedding_bag(idx, table, offsets, mode="sum"),
        "linear_bias": lambda: F.linear(xl, wl, bl),
    }
    for fn in out.values():
        fn()
    torch.cuda.synchronize()
    return out


def _measured(m: Any) -> tuple[float, Any]:
    return float(m.median_s), m


def _stable(fn: Callable[[], Any], backend: Any = None) -> tuple[float, Any]:
    import gpuenv

    with gpuenv.stable(backend=backend) as env:
        return _measured(env.bench(fn))


def _dropin(fn: Callable[[], Any], backend: Any = None) -> tuple[float, Any]:
    from gpuenv.integrations import triton as gt

    ms = gt.do_bench(fn, backend=backend)
    if not isinstance(ms, float):  # return_mode "mean", no quantiles: one number
        raise TypeError(f"the drop-in returned {ms!r}, not one number")
    return ms / 1e3, gt.last_measurement()


class Env(GpuEnv):
    """The GPU: the kernels, idle, heavy load, wall time, the four tools."""

    def __init__(self) -> None:
        import torch

        self.kernels = new_kernels(torch)
        a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        super().__init__(torch, lambda: a @ b)

    def tools(self) -> dict[str, Tool]:
        import triton.testing as tt

        import gpuenv

        return {
            "do_bench": lambda fn: (tt.do_bench(fn) / 1e3, None),
            "bench": lambda fn: _measured(gpuenv.bench(fn)),
            "dropin": _dropin,
            "stable": _stable,
        }

    def gpu(self) -> str:
        return str(self.torch.cuda.get_device_name())

    def describe(self) -> str:
        import triton

        torch = self.torch
        return f"{self.gpu()}, torch {torch.__version__}, triton {triton.__version__}"


class SimEnv(SimGpuEnv):
    """A simulated GPU (`profile`: a key of gpuenv's sim profiles) on virtual time; do_bench
    is a model of its schedule (benchmarks._kernels.sim_do_bench), since triton cannot run."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        super().__init__(profile)
        be = self.backend
        limits = be.clock_limits(0)
        sm_hz, mem_hz = limits.max_sm_mhz * 1e6, limits.max_mem_mhz * 1e6

        def work(sm_s: float, mem_s: float, power: float) -> Callable[[], float]:
            return lambda: be.run_work(
                0, sm_s * sm_hz, mem_cycles=mem_s * mem_hz, power_intensity=power
            )

        self.kernels = {name: work(*spec) for name, spec in SIM_KERNELS.items()}

    def tools(self) -> dict[str, Tool]:
        import gpuenv

        be = self.backend
        return {
            "do_bench": lambda fn: (sim_do_bench(be, fn) / 1e3, None),
            "bench": lambda fn: _measured(gpuenv.bench(fn, backend=be)),
            "dropin": lambda fn: _dropin(fn, be),
            "stable": lambda fn: _stable(fn, be),
        }

    def gpu(self) -> str:
        return str(self.backend.device_info(0).name)

    def describe(self) -> str:
        return f"simulated {self.gpu()} (profile {self.profile})"


def model_key(gpu: str) -> str:
    """A GPU's model as a results file names it: "NVIDIA H200" -> "h200", "NVIDIA H100
    80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA L40S" -> "l40s"."""
    words = gpu.replace("-", " ").replace("_", " ").split()
    words = [w for w in words if w.upper() not in ("NVIDIA", "GEFORCE", "TESLA", "RTX")]
    model = next((w for w in words if re.fullmatch(r"[A-Za-z]*\d+[A-Za-z]*", w)), None)
    if model is None:
        model = "-".join(words) or "gpu"
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "gpu"


def call(env: Any, tool: Tool, fn: Callable[[], Any]) -> dict[str, Any]:
    """One call of a tool: its number (s), its wall, and gpuenv's verdict and findings."""
    t0 = env.now()
    value, m = tool(fn)
    out: dict[str, Any] = {"s": value, "wall_s": env.now() - t0}
    if m is not None:
        out["verdict"] = m.verdict
        out["findings"] = sorted({f.kind for f in m.findings})
    return out


def measure(env: Any, args: argparse.Namespace, kernels: list[str]) -> dict[str, Any]:
    """Per kernel (until the deadline), repeat, state and tool (the order alternating
    between repeats): one call after idle (cold) or load (hot)."""
    tools = env.tools()
    for name in kernels:  # a first call each: NVML start-up, library set-up, compiling
        for tool in tools.values():
            tool(env.kernels[name])
    start = env.now()
    runs: dict[str, Any] = {}
    skipped = []
    for name in kernels:
        if env.now() - start > args.deadline:
            skipped.append(name)
            continue
        res: dict[str, Any] = {t: {"cold": [], "hot": []} for t in tools}
        for r in range(args.repeats):
            order = list(tools) if r % 2 == 0 else list(reversed(tools))
            for state in ("cold", "hot"):
                for t in order:
                    (env.idle(args.idle) if state == "cold" else env.load(args.load))
                    res[t][state].append(call(env, tools[t], env.kernels[name]))
        runs[name] = res
        print(f"# {name}: done at {env.now() - start:.0f} s", file=sys.stderr, flush=True)
    return {"runs": runs, "skipped": skipped}


def _med(calls: list[dict[str, Any]], key: str) -> float:
    return statistics.median(c[key] for c in calls)


def summarize(runs: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per kernel and tool: medians cold and hot, the gap, walls and their ratio to
    do_bench's, and gpuenv's verdicts and findings."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, res in runs.items():
        per: dict[str, dict[str, Any]] = {}
        for tool, d in res.items():
            cold, hot = _med(d["cold"], "s"), _med(d["hot"], "s")
            calls = d["cold"] + d["hot"]
            per[tool] = {
                "cold_s": cold,
                "hot_s": hot,
                "gap": abs(cold - hot) / ((cold + hot) / 2),
                "wall_cold_s": _med(d["cold"], "wall_s"),
                "wall_hot_s": _med(d["hot"], "wall_s"),
                "verdicts": sorted({c["verdict"] for c in calls if "verdict" in c}),
                "findings": sorted({k for c in calls for k in c.get("findings", [])}),
            }
        base = per["do_bench"]
        for s in per.values():
            s["ratio_cold"] = s["wall_cold_s"] / base["wall_cold_s"]
            s["ratio_hot"] = s["wall_hot_s"] / base["wall_hot_s"]
        out[name] = per
    return out


def per_tool(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per tool over the kernels: the worst gap (and its kernel), the median gap, and the
    median and worst wall ratio to do_bench, cold and hot."""
    out: dict[str, dict[str, Any]] = {}
    for tool in TOOLS:
        rows = {k: per[tool] for k, per in summary.items() if tool in per}
        if not rows:
            continue
        worst = max(rows, key=lambda k: rows[k]["gap"])
        out[tool] = {
            "worst_gap": rows[worst]["gap"],
            "worst_kernel": worst,
            "median_gap": statistics.median(r["gap"] for r in rows.values()),
            **{
                f"{how}_ratio_{state}": f(r[f"ratio_{state}"] for r in rows.values())
                for how, f in (("median", statistics.median), ("worst", max))
                for state in ("cold", "hot")
            },
        }
    return out


def report(summary: dict[str, Any], tools: dict[str, Any], head: str, skipped: list[str]) -> None:
    print(head)
    print()
    print(
        "| kernel | tool | cold | hot | gap | wall cold | wall hot | wall x do_bench cold / hot "
        "| verdicts; findings |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, per in summary.items():
        for tool in TOOLS:
            s = per[tool]
            judged = (
                f"{', '.join(s['verdicts'])}; {', '.join(s['findings']) or '-'}"
                if s["verdicts"]
                else "-"
            )
            print(
                f"| {DESCRIPTION[name]} | {tool} | {fmt_s(s['cold_s'])} | {fmt_s(s['hot_s'])} "
                f"| {s['gap']:.2%} | {s['wall_cold_s']:.3f} s | {s['wall_hot_s']:.3f} s "
                f"| {s['ratio_cold']:.2f}x / {s['ratio_hot']:.2f}x | {judged} |"
            )
    print()
    print(f"Per tool over {len(summary)} kernels (wall x do_bench: median / worst over kernels):")
    print()
    print("| tool | worst gap (kernel) | median gap | wall x do_bench cold | wall x do_bench hot |")
    print("| --- | --- | ---: | ---: | ---: |")
    for tool, t in tools.items():
        print(
            f"| {tool} | {t['worst_gap']:.2%} ({t['worst_kernel']}) | {t['median_gap']:.2%} "
            f"| {t['median_ratio_cold']:.2f}x / {t['worst_ratio_cold']:.2f}x "
            f"| {t['median_ratio_hot']:.2f}x / {t['worst_ratio_hot']:.2f}x |"
        )
    if skipped:
        print()
        print(f"Skipped (deadline): {', '.join(skipped)}")


def keep_metrics(tools: dict[str, dict[str, Any]]) -> None:
    for tool, t in tools.items():
        # do_bench's own gap is the GPU's doing, not gpuenv's: kept to read, with room
        slack = 3.0 if tool == "do_bench" else 0.5
        runner.metric(f"{tool}/worst_gap_pct", 100 * t["worst_gap"], "%", slack=slack)
        runner.metric(f"{tool}/median_gap_pct", 100 * t["median_gap"], "%", slack=slack)
        if tool != "do_bench":
            runner.metric(f"{tool}/wall_ratio_cold", t["median_ratio_cold"], "x", slack=0.2)
            runner.metric(f"{tool}/wall_ratio_hot", t["median_ratio_hot"], "x", slack=0.3)


def chosen_kernels(text: str) -> list[str]:
    """`--kernels`: a comma-separated subset of KERNELS (an unknown name ends the run)."""
    kernels = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KERNELS]
    if bad or not kernels:
        raise SystemExit(f"unknown kernels {bad or text!r}; choose from {', '.join(KERNELS)}")
    return kernels


def sim_profile(args: argparse.Namespace) -> str | None:
    """The simulated GPU model --sim runs on: --sim-profile, else GPUENV_SIM_PROFILE, else
    the H100 (None without --sim). Set in GPUENV_SIM_PROFILE too, so that the results' GPU
    (runner.gpu_name, read through gpuenv's own simulated backend) is the one measured."""
    from gpuenv.backend.sim_profiles import get_profile
    from gpuenv.errors import GpuenvError

    if args.sim_profile is not None and not args.sim:
        raise SystemExit("--sim-profile is for the simulated GPU: add --sim")
    if not args.sim:
        return None
    key = args.sim_profile or os.environ.get("GPUENV_SIM_PROFILE", "").strip() or "h100"
    try:
        profile = get_profile(key).key
    except GpuenvError as e:
        raise SystemExit(f"--sim-profile: {e}") from None
    os.environ["GPUENV_SIM_PROFILE"] = profile
    return profile


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=2, help="cold/hot pairs per tool and kernel")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    p.add_argument("--idle", type=float, default=1.0, help="seconds idle before a cold call")
    p.add_argument("--load", type=float, default=1.5, help="seconds of load before a hot call")
    p.add_argument(
        "--sim-profile",
        default=None,
        help="with --sim: the simulated GPU model, a key of gpuenv's sim profiles (h100, "
        "h200, a100, l40s, b200; default GPUENV_SIM_PROFILE's, else h100)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=190.0,
        help="seconds of measuring after which the remaining kernels are skipped",
    )


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: at least 1")
    kernels = chosen_kernels(args.kernels)
    profile = sim_profile(args)
    env: Any = Env() if profile is None else SimEnv(profile)
    args.model = model_key(env.gpu())  # the results file's part: runner's variant
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    got = measure(env, args, kernels)
    summary = summarize(got["runs"])
    tools = per_tool(summary)
    head = (
        f"{env.describe()}; {started}; {args.repeats} repeats, tools alternating; cold after "
        f"{args.idle} s idle, hot after {args.load} s of 8192^3 bf16 matmuls; gap = |cold - "
        f"hot| / mean of the medians; wall {'virtual ' if args.sim else ''}seconds of one call; "
        f"total {time.monotonic() - t0:.0f} s (real)"
    )
    report(summary, tools, head, got["skipped"])
    keep_metrics(tools)
    return 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "models_side",
            __doc__,
            add_arguments,
            run,
            quick={"repeats": 1, "kernels": "bmm64_f16,linear_bias"},
            variant=lambda args: getattr(args, "model", ""),
        )
    )
