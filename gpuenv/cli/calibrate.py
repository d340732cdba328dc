"""`gpuenv calibrate`: find the clock a sustained heavy load holds (the one to lock).

Runs a heavy reference load (bf16 matmuls through torch; the simulated GPU's heavy
work with --sim) until clock and temperature reach equilibrium, with progress on
stderr, and reports the sustained clock under the power cap and the highest
supported clock that held: 'gpuenv lock --sm sustained' then locks that one.
Read-only on the GPU: it only runs work and reads telemetry. With --sim it runs on
a fresh copy of the simulated GPU on virtual time (seconds, the same answer every run;
gpuenv.clocks.calibration says how).

Exit codes: 0 calibrated (and saved); 1 a GPU did not reach equilibrium within
--duration (nothing saved for it); 2 an error (no torch, bad input); 9 no driver;
130 interrupted (Ctrl-C; nothing saved). The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import json
import sys

import click

from gpuenv.cli._common import checked, gpu_option, handle_errors, open_from_ctx


@click.command("calibrate")
@gpu_option()
@click.option(
    "--duration",
    type=click.FloatRange(1.0),
    default=180.0,
    show_default=True,
    callback=checked("--duration", lo=1, hi=86400),
    metavar="S",
    help="Longest load per GPU, in seconds (virtual ones with --sim).",
)
@click.option("--no-save", is_flag=True, help="Report only; do not store the calibration.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
@handle_errors
def calibrate(ctx: click.Context, gpu: str, duration: float, no_save: bool, as_json: bool) -> None:
    """Load each selected GPU until it reaches equilibrium and report the sustained
    clock and the highest supported clock that held (saved for 'gpuenv lock --sm
    sustained'). With --sim: a fresh simulated GPU at idle, on virtual time."""
    from gpuenv.clocks.calibration import calibrate as run
    from gpuenv.devices import select_gpus

    backend = open_from_ctx(ctx, readonly=True)
    try:
        results = run(
            backend,
            select_gpus(backend, gpu),
            duration_s=duration,
            save=not no_save,
            progress=sys.stderr,
        )
    finally:
        backend.close()
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        for r in results:
            click.echo(r.summary())
    unsettled = [r for r in results if not r.steady]
    if unsettled:
        gpus = ", ".join(str(r.gpu) for r in unsettled)
        click.echo(
            f"gpuenv: GPU {gpus} did not reach equilibrium within {duration:.0f} s; nothing "
            "saved for it: run longer with --duration",
            err=True,
        )
        sys.exit(1)
