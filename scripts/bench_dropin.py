#!/usr/bin/env python3
"""Wall time per call: gpuenv's do_bench drop-ins against triton's, on kernels from ~5 us
to ~5 ms of several kinds (GEMMs, elementwise, reductions, a convolution, attention).

Per kernel, each tool is called once to warm up (library set-up, the flush buffer,
gpuenv's NVML start-up: not counted), then, after IDLE_S of idle, CALLS times back to
back, as an autotuner calls it. "cold" is the first of those calls (after the idle),
"b2b" the median of the others. Per tool it also reports the kernel time it returned
(median over the calls) and, for gpuenv, the reps it took and how long its burst
check waited. The ratio columns are gpuenv's wall time over triton's.

Tools:
  triton          triton.testing.do_bench, defaults (warmup 25 ms, rep 100 ms, 256 MiB flush)
  gpuenv          gpuenv.integrations.triton.do_bench, defaults (condition "auto": burst
                  unless gpuenv's lock holds; flush 2x the L2)
  gpuenv-none     the same with condition="none" (measured as triton does, no check)
and on three kernels do_bench_cudagraph, triton's against gpuenv's (defaults, rep 20 ms).

Read-only: it runs kernels and reads telemetry; nothing is written to the GPU. It checks
a deadline (--deadline, default 210 s) before each kernel and says what it skipped.

    GPUENV_READONLY=1 python3 scripts/bench_dropin.py          # on the H100: ~2-3 minutes
    python3 scripts/bench_dropin.py --sim                      # the simulated H100 (no triton:
                                                               # a model of its schedule)

Prints a markdown table; writes JSON to $OUT/bench_dropin.json when OUT is set.
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

from gpuenv import timing
from gpuenv.integrations import triton as gt

CALLS = 5  # timed calls per tool and kernel, back to back
IDLE_S = 1.0  # idle before each tool's calls (the power cap clears in ~0.5 s on an H100)
GRAPH_KERNELS = ("mm512_f16", "relu_1m", "mm4096_bf16")

Kernel = tuple[str, str, Callable[[], Any]]  # name, what it is, fn


class Env:
    """The GPU: torch kernels, idling, wall time."""

    name = "gpu"

    def __init__(self) -> None:
        import torch
        import torch.nn.functional as F

        self.torch = torch
        dev = "cuda"

        def randn(*shape: int, dtype: Any = torch.bfloat16) -> Any:
            return torch.randn(*shape, device=dev, dtype=dtype)

        a512, b512 = randn(512, 512, dtype=torch.float16), randn(512, 512, dtype=torch.float16)
        x1m = randn(1 << 20, dtype=torch.float32)
        a2, b2 = randn(2048, 2048), randn(2048, 2048)
        a4, b4 = randn(4096, 4096), randn(4096, 4096)
        a8, b8 = randn(8192, 8192), randn(8192, 8192)
        aw, bw = randn(8192, 24576), randn(24576, 8192)
        x16, y16 = randn(1 << 24, dtype=torch.float32), randn(1 << 24, dtype=torch.float32)
        sm = randn(4096, 4096, dtype=torch.float32)
        ln = randn(8192, 8192, dtype=torch.float16)
        img = randn(32, 64, 56, 56, dtype=torch.float16).to(memory_format=torch.channels_last)
        wconv = randn(64, 64, 3, 3, dtype=torch.float16).to(memory_format=torch.channels_last)
        q, k, v = (randn(8, 16, 2048, 128) for _ in range(3))
        self.kernels: list[Kernel] = [
            ("mm512_f16", "512^3 fp16 matmul (~6 us)", lambda: a512 @ b512),
            ("relu_1m", "1M fp32 relu (~7 us)", lambda: F.relu(x1m)),
            ("mm2048_bf16", "2048^3 bf16 matmul (~30 us)", lambda: a2 @ b2),
            ("softmax_4k", "softmax of 4096x4096 fp32 (reduction)", lambda: sm.softmax(-1)),
            ("add_16m", "16M fp32 add (memory-bound)", lambda: x16 + y16),
            ("layernorm_8k", "layer norm of 8192x8192 fp16 (reduction)",
             lambda: F.layer_norm(ln, (8192,))),
            ("conv_56", "3x3 conv, 32x64x56x56 fp16 (cuDNN)", lambda: F.conv2d(img, wconv)),
            ("mm4096_bf16", "4096^3 bf16 matmul (~0.2 ms)", lambda: a4 @ b4),
            ("sdpa_2k", "attention 8x16x2048x128 bf16", lambda: F.scaled_dot_product_attention(
                q, k, v)),
            ("mm8192_bf16", "8192^3 bf16 matmul (~1.4 ms)", lambda: a8 @ b8),
            ("mm_8k_24k", "8192x24576x8192 bf16 matmul (~4-5 ms)", lambda: aw @ bw),
        ]
        for _, _, fn in self.kernels:  # library set-up and lazy loading happen here
            fn()
        torch.cuda.synchronize()

    now = staticmethod(time.monotonic)

    def idle(self, seconds: float) -> None:
        self.torch.cuda.synchronize()  # nothing still running on the GPU while idle
        time.sleep(seconds)

    def tools(self) -> dict[str, Callable[..., Any]]:
        import triton.testing as tt

        return {"triton": tt.do_bench, "gpuenv": gt.do_bench,
                "gpuenv-none": lambda fn: gt.do_bench(fn, condition="none")}

    def graph_tools(self) -> dict[str, Callable[..., Any]]:
        import triton.testing as tt

        def theirs(fn: Callable[[], Any]) -> Any:
            with self.torch.cuda.stream(self.torch.cuda.Stream()):  # older triton needs one
                return tt.do_bench_cudagraph(fn)

        return {"triton": theirs, "gpuenv": gt.do_bench_cudagraph}

    def describe(self) -> dict[str, Any]:
        import triton

        torch = self.torch
        return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "cuda": torch.version.cuda, "triton": triton.__version__}


class SimEnv:
    """The simulated H100 on virtual time; "triton" is a model of its schedule (a first
    call, 5 timed calls with a 256 MiB flush, warmup ms of calls, rep ms of flushed calls),
    since triton cannot run here."""

    name = "sim"

    def __init__(self) -> None:
        from gpuenv.backend.sim import SimBackend
        from gpuenv.timebase import VirtualClock

        self.backend = be = SimBackend(clock=VirtualClock())
        be.open_context(0)

        def k(seconds: float, power: float) -> Callable[[], Any]:
            return timing.sim_kernel(be, 0, seconds=seconds, power_intensity=power)

        self.kernels = [
            ("mm512_f16", "~6 us, light", k(6e-6, 0.3)),
            ("relu_1m", "~7 us, memory-bound", k(7e-6, 0.2)),
            ("mm2048_bf16", "~30 us", k(30e-6, 0.8)),
            ("add_16m", "~70 us, memory-bound", k(70e-6, 0.4)),
            ("mm4096_bf16", "~0.2 ms", k(0.2e-3, 0.9)),
            ("mm8192_bf16", "~1.4 ms, heavy", k(1.4e-3, 1.0)),
            ("mm_8k_24k", "~5 ms, heavy", k(5e-3, 1.0)),
        ]

    def now(self) -> float:
        return self.backend.clock.now()

    def idle(self, seconds: float) -> None:
        self.backend.idle(seconds)

    def tools(self) -> dict[str, Callable[..., Any]]:
        be = self.backend
        return {"triton": self._triton_model,
                "gpuenv": lambda fn: gt.do_bench(fn, backend=be),
                "gpuenv-none": lambda fn: gt.do_bench(fn, backend=be, condition="none")}

    def graph_tools(self) -> dict[str, Callable[..., Any]]:
        return {"gpuenv": lambda fn: gt.do_bench_cudagraph(fn, backend=self.backend)}

    def _triton_model(self, fn: Callable[[], Any]) -> float:
        dev = timing.SimDevice(self.backend, 0, rep_probe_cycles=0,
                               flush_bytes=gt.TRITON_FLUSH_BYTES)
        fn()
        est = statistics.mean(dev.rep(fn).time_s + self._flush_s(dev) for _ in range(5))
        for _ in range(max(1, int(0.025 / est))):
            fn()
        times = [dev.rep(fn).time_s for _ in range(max(1, int(0.100 / est)))]
        return statistics.mean(times) * 1e3

    def _flush_s(self, dev: Any) -> float:
        from gpuenv.timing.devices import SIM_FLUSH_BYTES_PER_MEM_CYCLE

        return float(dev.flush_bytes / SIM_FLUSH_BYTES_PER_MEM_CYCLE / 2619e6)

    def describe(self) -> dict[str, Any]:
        return {"gpu": "simulated " + self.backend.device_info(0).name}


def measure(env: Any, fn: Callable[[], Any], tools: dict[str, Callable[..., Any]],
            calls: int) -> dict[str, Any]:  # fmt: skip
    """Per tool: a warm call, IDLE_S idle, then `calls` timed calls back to back."""
    out: dict[str, Any] = {}
    for name, tool in tools.items():
        tool(fn)
        env.idle(IDLE_S)
        walls, values, waits, reps, parts = [], [], [], [], []
        for _ in range(calls):
            t0 = env.now()
            value = tool(fn)
            walls.append(env.now() - t0)
            values.append(float(value))
            if name.startswith("gpuenv"):
                m = gt.last_measurement()
                x = m.extra
                waits.append(x.get("burst_first_wait_s") or 0.0)
                reps.append(len(m.times_s))
                # where the wall time went: warmup, the check, reps + judging (measure_s)
                parts.append({k: x.get(k) for k in ("warmup_reps", "warmup_s", "measure_s",
                                                    "burst_first_wait_s", "dropin")})
        out[name] = {"wall_s": walls, "ms": values, "wait_s": waits, "reps": reps,
                     "parts": parts, "cold_s": walls[0],
                     "b2b_s": statistics.median(walls[1:] or walls)}
    return out


def run(env: Any, args: argparse.Namespace) -> dict[str, Any]:
    start = env.now()
    rows: dict[str, Any] = {"kernels": {}, "graphs": {}, "skipped": []}
    graph_tools = env.graph_tools()
    for name, what, fn in env.kernels:
        if env.now() - start > args.deadline:
            rows["skipped"].append(name)
            continue
        rows["kernels"][name] = {"what": what, **measure(env, fn, env.tools(), args.calls)}
        if name in GRAPH_KERNELS:
            rows["graphs"][name] = {"what": what, **measure(env, fn, graph_tools, args.calls)}
        print(f"# {name}: done at {env.now() - start:.0f} s", file=sys.stderr, flush=True)
    return rows


def table(rows: dict[str, Any], title: str) -> str:
    def ratio(res: dict[str, Any], tool: str, key: str) -> str:
        if "triton" not in res or tool not in res:
            return "n/a"
        return f"{res[tool][key] / res['triton'][key]:.2f}"

    def cell(res: dict[str, Any], tool: str) -> str:
        if tool not in res:
            return "n/a"
        r = res[tool]
        extra = ""
        if r["reps"]:
            extra = f"; {statistics.median(r['reps']):.0f} reps, waited {max(r['wait_s']):.2f} s"
        return (f"{statistics.median(r['ms']) * 1e3:.1f} us; wall {r['cold_s']:.3f} / "
                f"{r['b2b_s']:.3f} s{extra}")

    lines = [f"### {title}", "",
             "| kernel | triton: time; wall cold / b2b | gpuenv (default) | gpuenv ratio "
             "cold / b2b | gpuenv condition=none | none ratio b2b |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, res in rows["kernels"].items():
        lines.append(f"| {name} ({res['what']}) | {cell(res, 'triton')} | {cell(res, 'gpuenv')} "
                     f"| {ratio(res, 'gpuenv', 'cold_s')} / {ratio(res, 'gpuenv', 'b2b_s')} "
                     f"| {cell(res, 'gpuenv-none')} | {ratio(res, 'gpuenv-none', 'b2b_s')} |")
    if rows["graphs"]:
        lines += ["", "do_bench_cudagraph:", "",
                  "| kernel | triton | gpuenv | ratio cold / b2b |", "| --- | --- | --- | --- |"]
        for name, res in rows["graphs"].items():
            lines.append(f"| {name} | {cell(res, 'triton')} | {cell(res, 'gpuenv')} | "
                         f"{ratio(res, 'gpuenv', 'cold_s')} / {ratio(res, 'gpuenv', 'b2b_s')} |")
    if rows["skipped"]:
        lines += ["", f"Skipped (deadline): {', '.join(rows['skipped'])}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sim", action="store_true", help="the simulated H100 (virtual time)")
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls per tool/kernel")
    parser.add_argument("--deadline", type=float, default=210.0,
                        help="seconds after which remaining kernels are skipped")
    args = parser.parse_args()
    env: Any = SimEnv() if args.sim else Env()
    info = env.describe()
    t0 = time.time()
    rows = run(env, args)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
    print(table(rows, f"do_bench drop-in: wall time per call, {info['gpu']}, {when}"))
    print(f"\n{json.dumps(info)}; {args.calls} calls per tool and kernel after {IDLE_S} s idle; "
          f"wall seconds {'(simulated)' if args.sim else ''}; total {time.time() - t0:.0f} s")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_dropin.json"), "w") as f:
            json.dump({"info": info, "when": when, **rows}, f, indent=1)


if __name__ == "__main__":
    main()
