"""`gpuenv job JOBID`: what a batch job's GPUs did from its prolog to its epilog, as gpuenvd
recorded it (time under each clock-event reason, SM clock quantiles, power, energy,
temperature, other processes, whether the lock held), running or finished.

The Slurm prolog and epilog (`gpuenv ops install prolog epilog`) record the job: `--begin
-i GPUS --user U --lock TEXT` and `--end`, which prints the one-line verdict. Both need an
admin of gpuenvd.

Exit codes: 0 printed; 2 no such job on this node's gpuenvd, a bad job id, or no gpuenvd
answers; 4 --begin/--end by a user who is not gpuenvd's admin; the rest:
gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gpuenv.cli._common import handle_errors, open_from_ctx


@click.command("job")
@click.argument("jobid")
@click.option("--begin", "begin", is_flag=True, help="(prolog, as root) Record the job from now.")
@click.option("--end", "end", is_flag=True, help="(epilog, as root) Close it; print the verdict.")
@click.option("-i", "--gpu", "gpu", metavar="SEL", help="With --begin: the job's GPUs (0,1).")
@click.option("--user", metavar="NAME", help="With --begin: who runs the job.")
@click.option("--asked", metavar="SPEC", help="With --begin: what the job asked (sm=1350).")
@click.option("--lock", "lock", metavar="TEXT", help="With --begin: was it locked, and why not.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@handle_errors
def job(
    ctx: click.Context,
    jobid: str,
    begin: bool,
    end: bool,
    gpu: str | None,
    user: str | None,
    asked: str | None,
    lock: str | None,
    as_json: bool,
) -> None:
    """What job JOBID's GPUs did: clocks, throttling, power, energy, the lock, other processes."""
    from gpuenv.daemon.client import Client
    from gpuenv.daemon.jobreport import judge_job, render

    with Client(client="gpuenv job") as client:
        if begin:
            gpus = None if gpu in (None, "all") else gpu.split(",")
            client.call("job_begin", job=jobid, user=user, gpus=gpus, asked=asked, lock=lock)
            return
        report = client.call("job_end" if end else "job_report", job=jobid)["report"]
    report = judge_job(_backend(ctx), report)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    elif end:
        click.echo(report["verdict"])
    else:
        click.echo(render(report))


def _backend(ctx: click.Context) -> Any:
    """This node's GPUs, read-only, for the facts a report is judged against; None where
    they cannot be opened (the report is still judged, with fewer facts)."""
    from gpuenv.errors import GpuenvError

    try:
        return open_from_ctx(ctx, readonly=True)
    except GpuenvError:
        return None
