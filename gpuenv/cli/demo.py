"""`gpuenv demo`: a short, read-only tour of why GPU numbers move.

On a machine with an NVIDIA GPU it reads that GPU (nothing is changed); without
one, or with --sim / GPUENV_BACKEND=sim, it tells the story on a simulated GPU
in virtual time. Exit codes: 0 done; 2 an error (bad -i, unknown profile).
"""

from __future__ import annotations

import os

import click

from gpuenv.cli._common import gpu_option, handle_errors, open_from_ctx
from gpuenv.errors import NvmlUnavailable


@click.command("demo")
@gpu_option()
@click.option("--fast", is_flag=True, help="Do not pause between lines.")
@click.option(
    "--profile",
    default=None,
    metavar="NAME",
    help="Simulated GPU for the sim tour: h100 (default), rtx4090, legacy.",
)
@click.pass_context
@handle_errors
def demo(ctx: click.Context, gpu: str, fast: bool, profile: str | None) -> None:
    """Why the same kernel, timed twice, gives two numbers; and what gpuenv does about it.

    Reads the real GPU when there is one (read-only), else tours the simulated GPU.
    """
    from gpuenv.demo import real_tour, sim_tour

    pace = 0.0 if fast else 0.3
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

                    real_tour(backend, select_gpus(backend, gpu), click.echo, pace=pace)
                    return
                click.echo("NVML sees no GPU: touring a simulated GPU instead.\n")
            finally:
                backend.close()
    name = profile or os.environ.get("GPUENV_SIM_PROFILE", "").strip() or "h100"
    sim_tour(click.echo, pace=pace, profile=name)
