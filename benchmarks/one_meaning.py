#!/usr/bin/env python3
"""One number, one meaning: an op swept over sizes, gpuenv.bench's default against CUPTI's
device time measured the same way; what CUPTI costs a process to start; and whether a
kernel's method changes between calls (read-only; needs torch and a GPU).

Parts (--part; each has its results file, one_meaning-<part>.json; flips with --procs N
above 1 keeps one_meaning-flipsN.json):

  sweep    an elementwise add and a sum reduction, 2^12 to 2^26 elements: CUPTI's median
           device time of a call after an L2 flush (`cupti_median_s(fn, flush_l2=True)`)
           and back to back with L2 warm, beside gpuenv.bench's default (flushed),
           `flush_l2=False` (warm), `mode="events"` (one call per CUDA event pair, the
           method the default used above 20 us until now) and triton's do_bench
  startup  in fresh processes (what each pytest process or torchrun rank pays): torch's
           CUDA start, the first and second profiler session (gpuenv's, and
           torch.profiler.profile's by phase, whose first start imports torch._inductor),
           where that cost lies, and the first two gpuenv.bench calls on a 64k-element sum
  flips    --calls calls of gpuenv.bench on a 64k-element sum (CUPTI 7.2-7.6 us; one call
           per event pair 17-20 us, either side of the old 20 us threshold) in one process,
           or --procs processes at once, one per GPU (as torchrun ranks): the methods seen

    GPUENV_READONLY=1 python -m benchmarks.one_meaning --part sweep
    GPUENV_READONLY=1 python -m benchmarks.one_meaning --part flips --procs 4 --calls 25
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner


def _sessions(prelude: str) -> str:
    """A process's first and second gpuenv profiler session (with its trace read), after
    `prelude`: the code a startup step runs."""
    return prelude + (
        "import time, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n"
        "from gpuenv.timing.cuda import profiler as cuda\n"
        "laps = []\n"
        "for _ in range(2):\n"
        "    t0 = time.perf_counter()\n"
        "    with cuda._profiling() as prof:\n"
        "        torch.cuda._sleep(1000); torch.cuda.synchronize()\n"
        "    cuda._trace_events(prof)\n"
        "    laps.append(time.perf_counter() - t0)\n"
        "print('LAPS', *laps)"
    )


STARTUP = {
    "torch's CUDA start": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "first and second profiler session": _sessions(""),
    "torch.profiler.profile's phases, first and second session: start, stop, trace": (
        "import time, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "from gpuenv.timing.cuda import profiler as cuda\n"
        "laps = []\n"
        "for _ in range(2):\n"
        "    prof = profile(activities=[ProfilerActivity.CUDA])\n"
        "    t0 = time.perf_counter(); prof.start(); t1 = time.perf_counter()\n"
        "    torch.cuda._sleep(1000); torch.cuda.synchronize(); t2 = time.perf_counter()\n"
        "    prof.stop(); t3 = time.perf_counter(); cuda._trace_events(prof)\n"
        "    laps += [t1 - t0, t3 - t2, time.perf_counter() - t3]\n"
        "print('LAPS', *laps)"
    ),
    "profiler started before CUDA's start, then CUDA start, stop": (
        "import time, torch\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "prof = profile(activities=[ProfilerActivity.CUDA])\n"
        "t0 = time.perf_counter(); prof.start(); t1 = time.perf_counter()\n"
        "torch.zeros(1, device='cuda'); torch.cuda.synchronize(); t2 = time.perf_counter()\n"
        "prof.stop(); t3 = time.perf_counter()\n"
        "print('LAPS', t1 - t0, t2 - t1, t3 - t2)"
    ),
    "first and second profiler session, CUDA_MODULE_LOADING=EAGER": _sessions(
        "import os; os.environ['CUDA_MODULE_LOADING'] = 'EAGER'\n"
    ),
    "CPU-only profiler session, then a CUDA one": (
        "import time, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "laps = []\n"
        "for acts in ([ProfilerActivity.CPU], [ProfilerActivity.CUDA]):\n"
        "    prof = profile(activities=acts)\n"
        "    t0 = time.perf_counter(); prof.start(); torch.cuda.synchronize(); prof.stop()\n"
        "    laps.append(time.perf_counter() - t0)\n"
        "print('LAPS', *laps)"
    ),
    "first and second gpuenv.bench (64k sum)": (
        "import time, torch, gpuenv\n"
        "x = torch.randn(1 << 16, device='cuda'); torch.cuda.synchronize()\n"
        "laps = []\n"
        "for _ in range(2):\n"
        "    t0 = time.perf_counter(); gpuenv.bench(lambda: x.sum())\n"
        "    laps.append(time.perf_counter() - t0)\n"
        "print('LAPS', *laps)"
    ),
}

FLIPS = (
    "import json, os, sys, time, torch, gpuenv\n"
    "x = torch.randn(1 << 16, device='cuda')\n"
    "for i in range(int(sys.argv[1])):\n"
    "    m = gpuenv.bench(lambda: x.sum())\n"
    "    print(json.dumps({'method': m.extra.get('method'), 'timer': m.timer,\n"
    "        'median_s': m.stats.median_s, 'findings': [f.kind for f in m.findings]}),\n"
    "        flush=True)\n"
)


def _pct(value: float, ref: float) -> str:
    return f"{(value / ref - 1) * 100:+.2f}%"


def _op(op: str, x: Any, y: Any) -> Callable[[], Any]:
    return (lambda: x + y) if op == "add" else (lambda: x.sum())


def sweep(args: argparse.Namespace) -> int:
    import torch

    import gpuenv
    from gpuenv.timing import cupti_median_s

    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    worst: dict[str, float] = {"flushed": 0.0, "warm": 0.0}
    methods = set()
    for op in args.ops.split(","):
        rows = []
        for p in range(args.lo, args.hi + 1, args.step):
            x, y = torch.randn(1 << p, device="cuda"), torch.randn(1 << p, device="cuda")
            fn = _op(op, x, y)
            flushed, warm = cupti_median_s(fn, flush_l2=True), cupti_median_s(fn)
            t0 = time.perf_counter()
            m = gpuenv.bench(fn)
            wall = time.perf_counter() - t0
            methods.add(m.extra.get("method"))
            mw = gpuenv.bench(fn, flush_l2=False)
            ev = gpuenv.bench(fn, mode="events")
            t0 = time.perf_counter()
            db = do_bench(fn) * 1e-3 if do_bench is not None else float("nan")
            db_wall = time.perf_counter() - t0
            worst["flushed"] = max(worst["flushed"], abs(m.stats.median_s / flushed - 1))
            worst["warm"] = max(worst["warm"], abs(mw.stats.median_s / warm - 1))
            rows.append(
                f"| 2^{p} | {flushed * 1e6:.2f} | {m.stats.median_s * 1e6:.2f} "
                f"({_pct(m.stats.median_s, flushed)}) | {warm * 1e6:.2f} | "
                f"{mw.stats.median_s * 1e6:.2f} ({_pct(mw.stats.median_s, warm)}) | "
                f"{ev.stats.median_s * 1e6:.2f} ({_pct(ev.stats.median_s, flushed)}) | "
                f"{db * 1e6:.2f} | {wall:.2f} / {db_wall:.2f} |"
            )
            print(json.dumps({"op": op, "log2n": p, "row": rows[-1]}), file=sys.stderr)
        print(f"{op}: device time per call in us, against CUPTI measured the same way")
        print()
        print(
            "| elements | CUPTI flushed | gpuenv default (flushed) | CUPTI warm "
            "| gpuenv flush_l2=False | mode='events' vs flushed | do_bench | wall s: "
            "default / do_bench |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        print("\n".join(rows))
        print()
    print(f"the default's method at every size: {'; '.join(sorted(map(str, methods)))}")
    runner.metric("default vs CUPTI flushed, worst", worst["flushed"] * 100, "%", slack=1.0)
    runner.metric("flush_l2=False vs CUPTI warm, worst", worst["warm"] * 100, "%", slack=1.0)
    return 0


def startup(args: argparse.Namespace) -> int:
    print("| step, in a fresh process | wall of the process s | laps s |")
    print("| --- | ---: | --- |")
    for name, code in STARTUP.items():
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=180
            )
            wall = time.perf_counter() - t0
            laps = [
                f"{float(v):.3f}"
                for line in done.stdout.splitlines()
                if line.startswith("LAPS")
                for v in line.split()[1:]
            ]
            if done.returncode:
                print(done.stderr[-1500:], file=sys.stderr)
            print(f"| {name} | {wall:.2f} | {', '.join(laps) or f'exit {done.returncode}'} |")
    return 0


def flips(args: argparse.Namespace) -> int:
    import torch

    gpus = min(args.procs, torch.cuda.device_count())
    procs = []
    for rank in range(gpus):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(rank)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", FLIPS, str(args.calls)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    print("| process (GPU) | calls | methods seen | median us: min - max | tiny_kernel findings |")
    print("| --- | ---: | --- | --- | ---: |")
    total, flipped = 0, 0
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=540)
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if proc.returncode or not rows:
            print(err[-1500:], file=sys.stderr)
        seen = sorted({f"{r['timer']}" for r in rows})
        med = [r["median_s"] * 1e6 for r in rows]
        tiny = sum("tiny_kernel" in r["findings"] for r in rows)
        total += len(rows)
        flipped += len(seen) > 1
        span = f"{min(med):.2f} - {max(med):.2f}" if med else "-"
        print(f"| {rank} | {len(rows)} | {', '.join(seen)} | {span} | {tiny} |")
    print()
    print(f"{total} calls in {gpus} process(es) at once; processes whose method changed: {flipped}")
    runner.metric("processes whose method changed", flipped, "", slack=0.5)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=("sweep", "startup", "flips"), default="sweep")
    parser.add_argument("--ops", default="add,sum")
    parser.add_argument("--lo", type=int, default=12, help="the smallest size, log2 elements")
    parser.add_argument("--hi", type=int, default=26, help="the largest size, log2 elements")
    parser.add_argument("--step", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes a step (startup)")
    parser.add_argument("--calls", type=int, default=30, help="bench calls a process (flips)")
    parser.add_argument("--procs", type=int, default=1, help="processes, one a GPU (flips)")


def run(args: argparse.Namespace) -> int:
    return {"sweep": sweep, "startup": startup, "flips": flips}[args.part](args)


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "one_meaning",
            __doc__,
            add_arguments,
            run,
            quick={"hi": 20, "rounds": 1, "calls": 5},
            variant=lambda args: (
                args.part + (f"{args.procs}" if args.part == "flips" and args.procs > 1 else "")
            ),
        )
    )
