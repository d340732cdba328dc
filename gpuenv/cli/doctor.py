"""`gpuenv doctor`: what in this environment will make benchmark numbers lie.

Exit codes: 0 nothing worse than info; 1 warnings; 2 errors (no driver, a check
that could not run). Bad input (-i 7 on a one-GPU machine) also exits 2.
"""

from __future__ import annotations

import json
import sys

import click

from gpuenv.cli._common import gpu_option, handle_errors, open_from_ctx
from gpuenv.errors import ConfigError, GpuenvError


@click.command("doctor")
@gpu_option()
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.pass_context
@handle_errors
def doctor(ctx: click.Context, gpu: str, as_json: bool) -> None:
    """Check the driver, permissions, other processes, active clock-event reasons,
    power limit, persistence and MIG modes, application clocks, temperature,
    gpuenv's own locks, the CPU governor and boost, host load and environment
    variables. Each finding says what to do. Exit 0 fine, 1 warnings, 2 errors.
    """
    from gpuenv.devices import select_gpus
    from gpuenv.doctor import diagnose, exit_code, format_checks

    backend = None
    open_error: GpuenvError | None = None
    try:
        backend = open_from_ctx(ctx, readonly=True)
    except ConfigError:
        raise  # a bad GPUENV_BACKEND / GPUENV_READONLY is the user's input: one line, exit 2
    except GpuenvError as err:
        open_error = err
    try:
        gpus = select_gpus(backend, gpu) if backend is not None else []
        checks = diagnose(backend, gpus, open_error=open_error)
    finally:
        if backend is not None:
            backend.close()
    if as_json:
        out = {"exit_code": exit_code(checks), "checks": [c.to_dict() for c in checks]}
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(format_checks(checks))
    sys.exit(exit_code(checks))
