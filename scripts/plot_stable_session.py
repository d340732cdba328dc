#!/usr/bin/env python3
"""Make the docs figure of a `gpuenv.stable()` session: what `gpuenv plot` draws of it.

One burst-mode session, observing only (it asks for no lock, so it runs under
GPUENV_READONLY=1), with three measurements:
  1. a bf16 matmul benchmarked cold (gpuenv.bench: the GPU starts cool and uncapped),
  2. a heavy-load region of --heavy-s seconds (back-to-back matmuls in one
     `env.measure`): the power cap pulls the SM clock down and the chip warms,
  3. the same matmul again (burst mode first waits for the GPU to recover).
The session file keeps the telemetry trace, so the figure shows the clock, power and
temperature through all of it with each measurement shaded.

    GPUENV_READONLY=1 python3 scripts/plot_stable_session.py /tmp/session.jsonl \\
        --png docs/stable_session_h100.png             # a GPU: needs torch with CUDA
    python3 scripts/plot_stable_session.py /tmp/sim.jsonl --sim \\
        --png docs/stable_session_sim.png              # the simulated H100, virtual time

The session is appended to SESSION.jsonl (the plot draws the file's last run, as
`gpuenv plot SESSION.jsonl -o PNG` does). torch is imported only without --sim.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gpuenv  # noqa: E402
from gpuenv import timing  # noqa: E402

MATMUL_N = 8192  # bf16 matmul size: ~1.5 ms on an H100, heavy enough to meet the power cap
BENCH_S = 1.0  # each matmul benchmark's measuring budget: short, so the cold one stays cold


Work = tuple[Callable[[], Any], Callable[[float], None], dict[str, Any]]


def gpu_work(gpu: int) -> Work:
    """A matmul to benchmark and a load that runs matmuls for some seconds, on CUDA `gpu`
    (sampled as NVML GPU `gpu`: the same one unless CUDA_VISIBLE_DEVICES reorders them)."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --sim to run on the simulated GPU")
    dev = torch.device("cuda", gpu)
    torch.cuda.set_device(dev)
    a = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.bfloat16)

    def matmul() -> Any:
        return a @ b

    def load(seconds: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for _ in range(50):
                a @ b
            torch.cuda.synchronize(dev)

    return matmul, load, {"gpus": [gpu]}


def sim_work() -> Work:
    """The same on the simulated H100 in virtual time: a context open, idle, cool."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(10.0)
    matmul = timing.sim_kernel(sim, 0, seconds=1.5e-3)
    chunk = timing.sim_kernel(sim, 0, seconds=0.075)

    def load(seconds: float) -> None:
        t0 = sim.clock.now()
        while sim.clock.now() - t0 < seconds:
            chunk()

    return matmul, load, {"backend": sim, "gpus": [0]}


def run_session(path: str, *, sim: bool, gpu: int, heavy_s: float) -> Any:
    """The three measurements in one session appended to `path`; returns the session."""
    matmul, load, where = sim_work() if sim else gpu_work(gpu)
    with gpuenv.stable(mode="burst", output=path, **where) as env:
        env.bench(matmul, name="matmul (cold)", budget_s=BENCH_S)
        with env.measure(f"heavy load ({heavy_s:.0f} s)"):
            load(heavy_s)
        env.bench(matmul, name="matmul (after)", budget_s=BENCH_S)
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("session", metavar="SESSION.jsonl", help="results file to append to")
    p.add_argument("--png", default=None, help="also plot the session to this image")
    p.add_argument("--sim", action="store_true", help="the simulated H100 (virtual time)")
    p.add_argument("--gpu", type=int, default=0, help="CUDA/NVML index of the GPU (default 0)")
    p.add_argument(
        "--heavy-s", type=float, default=12.0, help="seconds of the heavy-load region (default 12)"
    )
    args = p.parse_args(argv)
    env = run_session(args.session, sim=args.sim, gpu=args.gpu, heavy_s=args.heavy_s)
    for m in env.results:
        print(m.summary())
    print(f"session: {args.session}")
    if args.png:
        from gpuenv.errors import ConfigError
        from gpuenv.plot import plot_run
        from gpuenv.results import load_run

        try:
            print(f"plot: {plot_run(load_run(args.session), args.png)}")
        except ConfigError as err:  # no matplotlib here: the session file is what matters
            print(
                f"no plot: {err}; plot it where matplotlib is installed: "
                f"gpuenv plot {args.session} -o {args.png}",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
