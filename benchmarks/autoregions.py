#!/usr/bin/env python3
"""What automatic regions cost (gpuenv/run/autoregions.py), and whether they change the numbers.

CPU (default; fake `triton.testing` / `torch.utils.benchmark` modules, no GPU):
  - host time per wrapped call: a do_bench / Timer.timeit that returns at once,
    called N times unwrapped, wrapped outside `gpuenv run` (no pipe), and wrapped
    with a pipe as `gpuenv run` gives (two edge writes per call);
  - start-up of a Python child that imports nothing watched: `python -c pass`
    bare and with the import hook on its path, interleaved.

Device (--device; torch, triton and a GPU): benchmarks/workloads/do_bench_load.py
(do_bench on an 8192 bf16 matmul, 10 s of load, do_bench again) run bare and under
`gpuenv run`, alternately, with the printed do_bench numbers side by side and
what gpuenv said about each do_bench region. Read-only (GPUENV_READONLY=1).

    python -m benchmarks.autoregions                    # CPU figures: results autoregions.json
    GPUENV_READONLY=1 python -m benchmarks.autoregions --device --pairs 3
                                                        # the GPU: autoregions-device.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import py_compile
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.checkout import ROOT, checkout_env
from gpuenv.run import autoregions
from gpuenv.run import region as region_mod
from gpuenv.run.region import ENV_FD, ENV_PIPE, pipe_identity

RESULT = object()
PER_RUN = 32  # do_bench calls per perf_report run (16 sizes x 2 providers, as the tutorial)


# perf_report's Mark._run, cut to its loop: each point calls the user's function, which calls
# do_bench (defined in the fake triton.testing, so its frames are triton's)
MARK = """
class Mark:
    def __init__(self, fn):
        self.fn = fn
    def _run(self, bench, save_path, show_plots, print_data, n=1):
        for _ in range(n):
            for x in bench.x_vals:
                x_args = {x_name: x for x_name in bench.x_names}
                for y in bench.line_vals:
                    self.fn(**x_args, **{bench.line_arg: y}, **bench.args)
"""


def fake_modules() -> tuple[types.ModuleType, Any]:
    testing = types.ModuleType("triton.testing")
    testing.do_bench = lambda fn, warmup=25, rep=100: RESULT  # type: ignore[attr-defined]
    exec(MARK, testing.__dict__)
    timer_mod = types.ModuleType("torch.utils.benchmark.utils.timer")

    class Timer:
        def __init__(self, stmt: str, label: str | None = None):
            self._task_spec = types.SimpleNamespace(
                stmt=stmt, label=label, sub_label=None, description=None
            )

        def timeit(self, number: int = 1) -> object:
            return RESULT

    timer_mod.Timer = Timer  # type: ignore[attr-defined]
    return testing, Timer


def perf_report_calls(testing: types.ModuleType, orig: Any, orig_run: Any) -> tuple[Any, Any]:
    """A call of do_bench from a user's function that perf_report's Mark._run called: bare,
    and wrapped (naming it by its point walks to Mark._run's frame). Each lambda makes
    PER_RUN calls in one benchmark run, as a sweep does."""
    bench = types.SimpleNamespace(
        x_names=["size"],
        x_vals=[4096],
        line_arg="provider",
        line_vals=["triton"],
        line_names=["Triton"],
        args={},
        plot_name="vadd",
    )
    bare_mark = testing.Mark(lambda size, provider: orig(None))
    mark = testing.Mark(lambda size, provider: testing.do_bench(None))
    return (
        lambda: orig_run(bare_mark, bench, "", False, False, n=PER_RUN),
        lambda: mark._run(bench, "", False, False, n=PER_RUN),
    )


def per_call_us(
    fn: Callable[[], object],
    n: int,
    repeats: int = 7,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    best = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        best.append((clock() - t0) / n * 1e6)
    return statistics.median(best)


def call_overhead(n: int) -> list[tuple[str, float, float, float, float]]:
    """Per call: (name, unwrapped, wrapped, wrapped under gpuenv run, the same in this
    thread's CPU time: what the call costs whatever else the machine runs), in us."""
    testing, Timer = fake_modules()
    orig_bench, orig_timeit = testing.do_bench, Timer.timeit
    orig_run = testing.Mark._run
    timer_mod = types.ModuleType("torch.utils.benchmark.utils.timer")
    timer_mod.Timer = Timer  # type: ignore[attr-defined]
    autoregions.patch(testing)
    autoregions.patch(timer_mod)
    timer = Timer("a @ b", label="mm")
    rows = []
    cases = [
        ("do_bench", lambda: orig_bench(None), lambda: testing.do_bench(None)),
        ("Timer.timeit", lambda: orig_timeit(timer), lambda: timer.timeit()),
        ("do_bench in a perf_report point", *perf_report_calls(testing, orig_bench, orig_run)),
    ]
    for name, bare, wrapped in cases:
        per = PER_RUN if "perf_report" in name else 1
        n_calls = max(1, n // per)
        region_mod._CHANNEL.reset()
        os.environ.pop(ENV_FD, None)
        t_bare = per_call_us(bare, n_calls) / per
        t_off = per_call_us(wrapped, n_calls) / per  # wrapped, but no gpuenv run: no pipe
        r, w = os.pipe()  # read by another process, as gpuenv run's parent reads it
        reader = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL)
        os.close(r)
        os.environ[ENV_FD], os.environ[ENV_PIPE] = str(w), pipe_identity(w)
        region_mod._CHANNEL.reset()
        assert region_mod.active()
        t_on = per_call_us(wrapped, n_calls) / per
        cpu_on = per_call_us(wrapped, n_calls, clock=time.thread_time) / per
        os.environ.pop(ENV_FD)
        os.environ.pop(ENV_PIPE)
        region_mod._CHANNEL.reset()
        os.close(w)
        reader.wait(10)
        rows.append((name, t_bare, t_off, t_on, cpu_on))
    return rows


def startup(runs: int) -> dict[str, tuple[float, float]]:
    # as installed: pip compiles the hook's .pyc (PYTHONDONTWRITEBYTECODE would make every
    # child compile it again, ~2 ms here)
    py_compile.compile(os.path.join(autoregions.CHILD_SITE, "sitecustomize.py"))
    bare_env = dict(os.environ)
    bare_env.pop("PYTHONPATH", None)
    bare_env.pop("PYTHONDONTWRITEBYTECODE", None)
    hooked = dict(bare_env, GPUENV_REGION_FD="9")
    autoregions.child_env(hooked, autoregions.KINDS)
    argv = [sys.executable, "-c", "pass"]
    times: dict[str, list[float]] = {"bare": [], "hooked": []}
    for k in range(runs + 1):
        for name, env in (("bare", bare_env), ("hooked", hooked)):
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, check=True)
            if k:  # the first pair warms the file cache
                times[name].append(time.perf_counter() - t0)
    out = {k: (statistics.median(v) * 1e3, min(v) * 1e3) for k, v in times.items()}
    own = []  # the hook's own import time, as Python measures it (-X importtime, in us)
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"],
            env=hooked,
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        line = next(ln for ln in err.splitlines() if ln.rstrip().endswith(" sitecustomize"))
        own.append(float(line.split("|")[1]) / 1e3)
    out["own"] = (statistics.median(own), min(own))
    return out


def cpu(args: argparse.Namespace) -> None:
    print(
        f"# automatic regions on the CPU: {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()}-core {platform.machine()} machine, Python {platform.python_version()}"
    )
    print(
        f"\nHost time per call, median of 7 x {args.calls} calls of a function that returns "
        "at once:\n"
    )
    print(
        "| call | unwrapped | wrapped, not under gpuenv run | wrapped, under gpuenv run "
        "| the same, CPU time |"
    )
    print("|---|---|---|---|---|")
    for name, bare, off, on, cpu_on in call_overhead(args.calls):
        key = name.split(" ")[0].replace(".", "_") + ("_perf_report" * ("perf_report" in name))
        runner.metric(f"{key}_cpu_us", cpu_on, "us", slack=2.0)
        print(
            f"| {name} | {bare:.2f} us | {off:.2f} us (+{off - bare:.2f}) | "
            f"{on:.2f} us (+{on - bare:.2f}) | {cpu_on:.2f} us |"
        )
    t = startup(args.runs)
    print(f"\nStart-up of `python -c pass`, {args.runs} runs each, interleaved:\n")
    print("| child | median | fastest |")
    print("|---|---|---|")
    for key, label in (
        ("bare", "bare"),
        ("hooked", "with gpuenv's import hook (imports nothing watched)"),
    ):
        d_med, d_min = (t[key][0] - t["bare"][0], t[key][1] - t["bare"][1])
        extra = (f" ({d_med:+.1f})", f" ({d_min:+.1f})") if key != "bare" else ("", "")
        print(f"| {label} | {t[key][0]:.1f} ms{extra[0]} | {t[key][1]:.1f} ms{extra[1]} |")
    own_med, own_min = t["own"]
    print(f"| the hook's own import (-X importtime) | {own_med:.2f} ms | {own_min:.2f} ms |")


def device(args: argparse.Namespace) -> None:
    env = checkout_env(GPUENV_READONLY="1")
    script = ROOT / "benchmarks" / "workloads" / "do_bench_load.py"
    child = [sys.executable, str(script), "--load", str(args.load)]
    gpuenv = [sys.executable, "-c", "from gpuenv.cli import main; main()", "run", "-i", "0"]
    tmp = Path(tempfile.mkdtemp(prefix="gpuenv-autoregions-"))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# do_bench with and without gpuenv run: {when}")
    print(
        f"\n`{script.relative_to(ROOT)} --load {args.load:g}`, {args.pairs} pairs, alternately:\n"
    )
    print("| pair | run | do_bench before load | after load | gpuenv's rows |")
    print("|---|---|---|---|---|")
    for k in range(args.pairs):
        for wrapped in (False, True):
            out = tmp / f"run{k}.jsonl"
            argv = [*gpuenv, "-o", str(out), "--", *child] if wrapped else child
            proc = subprocess.run(
                argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
            )
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr[-2000:]}")
            told = json.loads(proc.stdout.strip().splitlines()[-1])
            rows = ""
            if wrapped:
                from gpuenv.results import load_run

                rows = "; ".join(_row(m) for m in load_run(out).measurements[1:])
                sys.stderr.write(proc.stderr)
            print(
                f"| {k + 1} | {'gpuenv run' if wrapped else 'bare'} | "
                f"{told['first_ms']:.3f} ms | {told['second_ms']:.3f} ms | {rows} |"
            )


def _row(m: Any) -> str:
    w = m.telemetry
    sm = f"{w.sm_mhz_mean:.0f} MHz" if w and w.sm_mhz_mean else "-"
    cap = next((f for f in m.findings if f.kind == "power_cap"), None)
    share = cap.details.get("fraction_under_cap") if cap else None
    under = f", power cap {100 * share:.0f}%" if share is not None else ""
    return f"{m.name}: {sm}{under}, {m.verdict}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", action="store_true", help="torch + triton on the GPU")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per timing (CPU)")
    parser.add_argument("--runs", type=int, default=21, help="start-up runs per child (CPU)")
    parser.add_argument("--pairs", type=int, default=3, help="bare/wrapped pairs (device)")
    parser.add_argument("--load", type=float, default=10.0, help="seconds of load (device)")


def run(args: argparse.Namespace) -> int:
    device(args) if args.device else cpu(args)
    return 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "autoregions",
            __doc__,
            add_arguments,
            run,
            quick={"calls": 2000, "runs": 5, "pairs": 1},
            variant=lambda args: "device" if args.device else "",
        )
    )
