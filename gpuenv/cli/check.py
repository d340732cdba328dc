"""`gpuenv check`: run the same kernels on this process's GPUs and name a slower one.

A heavy bf16 matmul, a memory-bound copy and a tiny kernel, then the matmul sustained,
on each GPU alone and then on all at once (gpuenv.check says how); the GPUs ranked by
time and by the clock each holds under sustained load, and any GPU more than 2% slower
than the median of the others, or holding a lower sustained clock, named with the
telemetry that explains it. Read-only on the GPU unless asked to lock (--sm, --mem,
--power-limit: as 'gpuenv lock', for the check only, then put back); within --budget
seconds. Without -i, the GPUs this process may use, as 'gpuenv lock' takes them
(gpuenv.devices.own_gpus); -i all checks every GPU of the node.

Exit codes: 0 no GPU slower than the others; 1 a GPU named; 2 an error (no torch, bad
input); 9 no driver; 130 interrupted. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from gpuenv.cli._common import (
    OWN,
    checked,
    chosen_gpus,
    gpu_option,
    handle_errors,
    lock_options,
    open_from_ctx,
)

if TYPE_CHECKING:
    from gpuenv.check import NodeCheck


@click.command("check")
@gpu_option(OWN)
@click.option(
    "--budget",
    type=float,
    default=60.0,
    show_default=True,
    callback=checked("--budget", lo=5, hi=3600),
    metavar="S",
    help="Seconds for the whole check (the sustained load per GPU is cut to fit).",
)
@click.option("--alone-only", is_flag=True, help="Each GPU alone; not all at once as well.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@lock_options(
    sm="Lock the SM clock for the check (as 'gpuenv lock --sm'); put back afterwards.",
    mem="Lock the memory clock for the check.",
    power_limit="Set the power limit for the check, in watts.",
)
@click.pass_context
@handle_errors
def check(
    ctx: click.Context,
    gpu: str,
    budget: float,
    alone_only: bool,
    as_json: bool,
    sm: str | None,
    sm_max: int | None,
    mem: str | None,
    power_limit: float | None,
) -> None:
    """Run the same kernels on each GPU (alone, then all at once), rank the GPUs and name any
    that is slower than the others or holds a lower clock, with why. Read-only unless asked
    to lock (--sm ...: for the check only, then put back)."""
    from gpuenv.backend import ReadOnlyBackend
    from gpuenv.check import check_node, report_text
    from gpuenv.clocks.request import cli_request

    request = cli_request(sm, sm_max, mem, power_limit)
    backend = open_from_ctx(ctx, readonly=True if request is None else None)
    try:
        gpus, why = chosen_gpus(backend, gpu)
        click.echo(f"gpuenv check: {why}", err=True)
        held = None
        if request is not None:  # as `gpuenv run --sm`: through gpuenvd where one serves
            from gpuenv.locking import acquire

            held = acquire(request=request, gpus=gpus, backend=backend, command="gpuenv check")
            click.echo(f"gpuenv check: locked {request.describe()} for the check", err=True)
        try:
            report = check_node(
                ReadOnlyBackend(backend, reason="gpuenv check only reads"),
                gpus,
                budget_s=budget,
                together=not alone_only,
                progress=sys.stderr,
            )
        finally:
            if held is not None:
                held.release()
                click.echo("gpuenv check: the lock is released; the GPUs are as before", err=True)
    finally:
        backend.close()
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report_text(report))
    _keep(report)
    if report.named:
        sys.exit(1)


def _keep(report: NodeCheck) -> None:
    """Root's check is kept for gpuenvd's gauges (gpuenv.check.store); another account's is
    only shown. A place that cannot be written costs the gauges, not the check."""
    import os

    from gpuenv.check.store import save_checks
    from gpuenv.errors import GpuenvError

    if os.geteuid() != 0:
        click.echo("(not kept for gpuenvd's gauges: only root's check is)", err=True)
        return
    try:
        where = save_checks(report)
    except (OSError, GpuenvError) as err:
        click.echo(f"gpuenv: warning: the check was not kept for gpuenvd's gauges: {err}", err=True)
        return
    click.echo(f"kept for gpuenvd's gauges: {where}", err=True)
