"""`gpuenv job JOBID`: what a batch job's GPUs did from its prolog to its epilog, as gpuenvd
recorded it (time under each clock-event reason, SM clock quantiles, power, energy,
temperature, other processes, whether the lock held), running or finished.

The Slurm prolog and epilog (`gpuenv ops install prolog epilog`) record the job: `--begin
-i GPUS --user U --lock TEXT` and `--end`, which prints the one-line verdict; after its
restore, the epilog's `--publish --restored yes|no|none` puts the node's report into the
shared jobs directory and its verdict into the job's AdminComment (where slurmdbd runs; the
prolog's --begin puts its line there while the job runs: daemon/jobnodes.py).
--begin/--end need an admin of gpuenvd.

With a shared jobs directory (--jobs-dir or GPUENV_JOBS_DIR), `gpuenv job JOBID` shows
every node of the job from there, on any node or the login node, and names each node that
did not report, with why.

Exit codes: 0 printed; 1 a node of the job did not report (read from the jobs directory);
2 no such job on this node's gpuenvd (or in the jobs directory), a bad job id, or no gpuenvd
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
@click.option(
    "--publish", is_flag=True, help="(epilog, as root, after its restore) Share this node's report."
)
@click.option(
    "--restored",
    type=click.Choice(["yes", "no", "none"]),
    default="none",
    help="With --publish: were the job's GPUs put back (none: nothing was locked).",
)
@click.option(
    "--jobs-dir",
    metavar="DIR",
    help="The directory every node shares for job reports (default: $GPUENV_JOBS_DIR).",
)
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
    publish: bool,
    restored: str,
    jobs_dir: str | None,
    as_json: bool,
) -> None:
    """What job JOBID's GPUs did: clocks, throttling, power, energy, the lock, other processes."""
    from gpuenv.daemon import jobnodes
    from gpuenv.daemon.client import Client
    from gpuenv.daemon.jobreport import judge_job, render, render_nodes
    from gpuenv.daemon.jobreport import publish as publish_report

    shared = jobnodes.jobs_dir(jobs_dir)
    if shared is not None and not (begin or end or publish):
        gathered = jobnodes.gather(shared, jobid)
        click.echo(json.dumps(gathered, indent=2) if as_json else render_nodes(gathered))
        ctx.exit(1 if gathered["missing"] else 0)
    with Client(client="gpuenv job") as client:
        if begin:
            gpus = None if gpu in (None, "all") else gpu.split(",")
            done = client.call("job_begin", job=jobid, user=user, gpus=gpus, asked=asked, lock=lock)
            jobnodes.begun(shared, jobid, done["gpus"], lock or "not asked")
            return
        report = client.call("job_end" if end else "job_report", job=jobid)["report"]
    report = judge_job(_backend(ctx), report)
    if publish:
        line, kept = publish_report(report, jobnodes.node_name(), restored, shared)
        click.echo(line)
        if kept is None:  # an ended job's comment needs slurmdbd: the prolog's line stays
            click.echo(f"gpuenv job: AdminComment of job {jobid} not updated: {NO_DBD}", err=True)
    elif as_json:
        click.echo(json.dumps(report, indent=2))
    elif end:
        click.echo(report["verdict"])
    else:
        click.echo(render(report))


NO_DBD = "slurmctld takes none once a job ended; sacctmgr (slurmdbd) did not take it either"


def _backend(ctx: click.Context) -> Any:
    """This node's GPUs, read-only, for the facts a report is judged against; None where
    they cannot be opened (the report is still judged, with fewer facts)."""
    from gpuenv.errors import GpuenvError

    try:
        return open_from_ctx(ctx, readonly=True)
    except GpuenvError:
        return None
