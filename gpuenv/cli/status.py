"""`gpuenv status`: clocks, lock, power, temperature and active reasons per GPU.

Exit codes: 0 every selected GPU answered; 2 an error (bad -i, or a GPU that
failed to answer: its row says why); 9 no driver. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import json
import sys

import click

from gpuenv.backend import env_readonly
from gpuenv.cli._common import gpu_option, handle_errors, is_dry_run, open_from_ctx


@click.command("status")
@gpu_option()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema in gpuenv/status.py).")
@click.pass_context
@handle_errors
def status(ctx: click.Context, gpu: str, as_json: bool) -> None:
    """Clocks now/max, lock state, power draw/limit, temperature/slowdown threshold,
    active clock-event reasons, persistence mode and process count, per GPU.

    Like 'nvidia-smi -q -d CLOCK,POWER,TEMPERATURE,PERFORMANCE', in one line per GPU.
    """
    from gpuenv.devices import select_gpus
    from gpuenv.status import format_table, snapshot

    readonly = is_dry_run(ctx) or env_readonly()  # what the user's environment allows
    backend = open_from_ctx(ctx, readonly=True)  # status itself never writes
    try:
        snap = snapshot(backend, select_gpus(backend, gpu), readonly=readonly)
    finally:
        backend.close()
    click.echo(json.dumps(snap, indent=2) if as_json else format_table(snap))
    if any(g.get("error") for g in snap["gpus"]):
        sys.exit(2)
