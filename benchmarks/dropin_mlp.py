#!/usr/bin/env python3
"""Does the do_bench drop-in keep a heavy kernel off the power cap? The MLP block of the gpu
test `test_an_mlp_block_reads_the_same_cold_and_hot_and_its_reps_hold_one_level`
(gelu(X @ W1) @ W2, 8192x4096x16384 bf16, ~2.9 ms at 700 W), that test's scenario
repeated: a set-up call, 3 s idle, a cold call, 3 s of heavy 8192^3 bf16 matmuls, a hot
call. Per trial and call: the reps whose telemetry window shows the SW power cap's bit,
the findings, whether the test's checks hold (no drift, bimodal or power_cap finding, the
longest burst under 0.1 s, hot within 1% of cold).

Variants (--variants) of the drop-in's schedule, interleaved trial by trial so that the
GPU's state is shared: `now` (the schedule as it is), `target=X` (the rests keep the
modelled power under X of the limit, DROPIN_POWER_TARGET), `burst=S` (bursts of S
seconds, DROPIN_BURST_S), `unseen=X` (a kernel whose power no reading has shown yet counts
as drawing X times the limit, conditioning.burst.UNSEEN_POWER_FRAC; `unseen=0`: as
before it did, the highest reading), `first=S` (from a rested GPU, S s of work before the
first rest while no reading has shown the power, UNSEEN_FIRST_S), `heavyseen=X` (a
reading at X of the limit or more schedules the kernel as the heaviest; 0: every kernel,
HEAVY_SEEN_FRAC), `tau=S` (the power filter's time constant, DROPIN_POWER_TAU_S),
`coldwait=0` (a call begun on an idle GPU does not wait for samples taken after its
warmup, timing.harness.COLD_START_FRESH), `learn=0` (a burst that met the cap does not
shorten the next ones, nor the next call's, and a kernel a reading showed heavy is not held
to HEAVY_RUN_S of unbroken work: triton.bench.DROPIN_LEARN), `redo=0` (reps whose windows
show the cap are kept, not measured again: DROPIN_WINDOW_REDOS), `heavyrun=S` (a heavy
kernel's longest unbroken work, conditioning.burst.HEAVY_RUN_S), `floor=N` (the learned
limit's floor in reps, ONSET_FLOOR_REPS). `learn=0+redo=0` is the schedule before them.
Each call's line on stderr has the schedule: each burst's length and the rest after it
(ms), the reps measured again and why, and the learned limit.
Read-only; needs torch and a GPU, or --sim: the simulated H100 whose cap meets the block
40-50 ms into work from rest ("h100-fastcap"), the block at ~1.29x the limit.

    GPUENV_READONLY=1 python -m benchmarks.dropin_mlp --trials 10 --variants now,learn=0+redo=0
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from benchmarks._kernels import GpuEnv, kernels

IDLE_S = 3.0
LOAD_S = 3.0


# variant name -> (field of the drop-in's ConditionConfig, parse): what each variant sets
# for its calls
KNOBS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "target": ("burst_power_target", float),
    "burst": ("burst_s", float),
    "tau": ("burst_power_tau_s", float),
    "unseen": ("unseen_power_frac", float),
    "first": ("unseen_first_s", float),
    "heavyseen": ("heavy_seen_frac", float),
    "coldwait": ("cold_start_fresh", lambda v: bool(int(v))),
    "learn": ("burst_learn", lambda v: bool(int(v))),
    "redo": ("burst_window_redos", int),
    "heavyrun": ("heavy_run_s", float),
    "floor": ("onset_floor_reps", int),
}


def _variant(spec: str) -> Any:
    """The drop-in's conditioning with what `spec` ("now": nothing; "first=0+heavyseen=0":
    both at once) sets."""
    from gpuenv.integrations import triton as gt

    changes: dict[str, Any] = {}
    for part in spec.split("+"):
        key, _, value = part.partition("=")
        if key == "now":
            continue
        if key not in KNOBS:
            raise SystemExit(f"unknown variant {part!r}: now, or {', '.join(KNOBS)}=VALUE")
        field, parse = KNOBS[key]
        changes[field] = parse(value)
    return dataclasses.replace(gt.DROPIN_CONDITIONING, **changes)


def _call(mlp: Callable[[], Any], backend: Any = None, conditioning: Any = None) -> dict[str, Any]:
    from gpuenv.integrations import triton as gt
    from gpuenv.reasons import Reason

    ms = gt.do_bench(mlp, return_mode="median", backend=backend, conditioning=conditioning)
    m = gt.last_measurement()
    capped = sum(1 for w in m.windows if w.reasons & Reason.SW_POWER_CAP)
    kinds = sorted({f.kind for f in m.findings})
    x = m.extra
    return {
        "ms": ms,
        # the schedule, and the power the model saw (for why a call met the cap)
        "schedule": {
            k: x.get(k)
            for k in (
                "bursts",
                "burst_rests",
                "burst_rest_s",
                "burst_max_s",
                "warmup_reps",
                "burst_power_seen",
                "burst_waits",
                "burst_clock_redos",
                "burst_redone",
                "burst_limit_s",
            )
        },
        # each burst's length and the rest after it, ms
        "bursts_ms": [round(b * 1e3, 1) for b in x.get("burst_lengths_s") or []],
        "rests_ms": [round(r * 1e3, 1) for r in x.get("burst_rests_each_s") or []],
        "power_w_max": [round(w.power_w_max or 0) for w in m.windows[:6]],
        "capped_at": [i for i, w in enumerate(m.windows) if w.reasons & Reason.SW_POWER_CAP][:6],
        "reps": len(m.times_s),
        "capped_reps": capped,
        "kinds": kinds,
        "ok": not set(kinds) & {"drift", "bimodal", "power_cap"} and m.extra["burst_max_s"] < 0.1,
    }


class _SimEnv:
    """The simulated H100 whose cap meets a heavy kernel 40-50 ms into work from rest
    ("h100-fastcap"), on virtual time: idle, and heavy load."""

    def __init__(self) -> None:
        from gpuenv.backend.sim import SimBackend
        from gpuenv.timebase import VirtualClock

        self.backend = SimBackend("h100-fastcap", clock=VirtualClock())
        self.backend.open_context(0)

    def idle(self, seconds: float) -> None:
        self.backend.idle(seconds)

    def load(self, seconds: float) -> None:
        from gpuenv import timing

        timing.sim_kernel(self.backend, 0, seconds=seconds, power_intensity=1.0)()


def run(args: argparse.Namespace) -> int:
    from gpuenv import timing

    backend: Any = None
    if args.sim:
        gpu: Any = _SimEnv()
        backend = gpu.backend
        mlp = timing.sim_kernel(backend, 0, seconds=2.9e-3, power_intensity=0.8)
    else:
        import torch

        ks = kernels(torch)  # the MLP block and the 8192^3 matmul of the gpu test, set up
        mlp, gpu = ks["mlp"], GpuEnv(torch, ks["mm8192"])

    variants = args.variants.split(",")
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    from gpuenv.integrations import triton as gt

    gt.do_bench(mlp, backend=backend)  # set-up
    for trial in range(args.trials):
        for v in variants:
            cond = _variant(v)
            gpu.idle(IDLE_S)
            cold = _call(mlp, backend, cond)
            gpu.load(LOAD_S)
            hot = _call(mlp, backend, cond)
            passed = cold["ok"] and hot["ok"] and abs(hot["ms"] / cold["ms"] - 1) <= 0.01
            rows[v].append({"trial": trial, "cold": cold, "hot": hot, "passed": passed})
            print(f"trial {trial} {v}: {rows[v][-1]}", file=sys.stderr)
    print(
        "| variant | test passed | calls with a capped rep | capped reps / reps "
        "| calls with power_cap | hot / cold, median (range) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for v, trials in rows.items():
        calls = [t[k] for t in trials for k in ("cold", "hot")]
        ratios = [t["hot"]["ms"] / t["cold"]["ms"] for t in trials]
        passed = sum(t["passed"] for t in trials)
        print(
            f"| {v} | {passed} of {len(trials)} | {sum(c['capped_reps'] > 0 for c in calls)} "
            f"of {len(calls)} | {sum(c['capped_reps'] for c in calls)} / "
            f"{sum(c['reps'] for c in calls)} | "
            f"{sum('power_cap' in c['kinds'] for c in calls)} | "
            f"{statistics.median(ratios):.4f} ({min(ratios):.4f}-{max(ratios):.4f}) |"
        )
        runner.metric(f"{v}: trials failed", len(trials) - passed, "", slack=1.0)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--variants", default="now", help="now, target=X, burst=S (comma list)")


if __name__ == "__main__":
    sys.exit(runner.main("dropin_mlp", __doc__, add_arguments, run, quick={"trials": 2}))
