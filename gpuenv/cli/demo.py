"""`gpuenv demo`: a short tour of why GPU numbers move, and what gpuenv does about it.

On a machine with an NVIDIA GPU it reads that GPU through a read-only backend
(no setting is changed, clocks are never locked); with torch and CUDA it also
measures an 8192x8192 bf16 matmul cold and hot, naively and with gpuenv.
Without a GPU, or with --sim / GPUENV_BACKEND=sim, it tells the whole story,
locked clocks included, on a simulated GPU in virtual time.

Exit codes: 0 done (also when it falls back: no torch means telemetry only, no
GPU means the simulated one); 2 an error (bad -i, an unknown profile, a GPU
error during the tour); 130 interrupted (Ctrl-C). The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import os
import sys

import click

from gpuenv import validate
from gpuenv.cli._common import checked, gpu_option, handle_errors, open_from_ctx
from gpuenv.errors import NvmlUnavailable


@click.command("demo")
@gpu_option()
@click.option(
    "--fast",
    is_flag=True,
    help="Do not pause between lines (it pauses only on a terminal: piped, it never does).",
)
@click.option(
    "--profile",
    default=None,
    metavar="NAME",
    callback=checked("--profile", validate.text),
    help="Simulated GPU for the sim tour: h100 (default), rtx4090, legacy.",
)
@click.option(
    "--load-seconds",
    type=click.FloatRange(1, 300),
    default=None,
    callback=checked("--load-seconds", lo=1, hi=300),
    metavar="S",
    help="Seconds of back-to-back kernels before the hot measurements "
    "[default: 15 on a real GPU (it runs them), 30 simulated].",
)
@click.pass_context
@handle_errors
def demo(
    ctx: click.Context, gpu: str, fast: bool, profile: str | None, load_seconds: float | None
) -> None:
    """Why the same kernel, timed twice, gives two numbers; and what gpuenv does about it.

    Reads the real GPU when there is one (read-only; with torch it also runs a
    matmul cold and hot, in under a minute), else tours the simulated GPU.
    """
    from gpuenv.demo import REAL_LOAD_S, SIM_LOAD_S, real_tour, sim_tour

    pace = _pace(fast)
    obj = ctx.find_root().obj or {}
    use_sim = obj.get("backend_kind") == "sim" or (
        os.environ.get("GPUENV_BACKEND", "").strip().lower() == "sim"
    )
    if not use_sim:
        try:
            backend = open_from_ctx(ctx, readonly=True)
        except NvmlUnavailable as err:
            click.echo(f"No NVIDIA GPU here ({err.message}): touring a simulated GPU instead.\n")
        else:
            try:
                if backend.device_count() > 0:
                    from gpuenv.devices import select_gpus

                    real_tour(
                        backend,
                        select_gpus(backend, gpu),
                        click.echo,
                        pace=pace,
                        load_s=load_seconds or REAL_LOAD_S,
                    )
                    return
                click.echo("NVML sees no GPU: touring a simulated GPU instead.\n")
            finally:
                backend.close()
    name = profile or os.environ.get("GPUENV_SIM_PROFILE", "").strip() or "h100"
    _check_sim_selector(gpu)
    sim_tour(click.echo, pace=pace, profile=name, seconds=load_seconds or SIM_LOAD_S)


def _check_sim_selector(gpu: str) -> None:
    """The sim tour runs on one simulated GPU: a selector that names another is refused
    as on a real machine (`demo -i 9` ignored it)."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.devices import select_gpus
    from gpuenv.timebase import VirtualClock

    sim = SimBackend(clock=VirtualClock())  # in memory: no state file is touched
    try:
        select_gpus(sim, gpu)
    finally:
        sim.close()


def _pace(fast: bool) -> float:
    """Seconds between lines: for a person reading along at a terminal; output to a file or
    a pipe (a script, CI) gets no pause."""
    return 0.0 if fast or not sys.stdout.isatty() else 0.3
