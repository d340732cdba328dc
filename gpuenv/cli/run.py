"""`gpuenv run [options] -- <cmd> [args]`: lock, sample, run, restore, report.

Exit codes: the command's own exit code; 1 when it succeeded but a region was
rejected under --policy reject; when a signal killed the command, gpuenv dies
of the same signal (SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGKILL) or exits 128+N
(others); 127 / 126 the command was not found / not executable; 2 a gpuenv
error (bad option, no GPU) before the command started; 4 no permission; 5 a
lock held by another owner. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from gpuenv.cli._common import (
    gpu_option,
    handle_errors,
    interval_option,
    is_dry_run,
    lock_options,
    open_from_ctx,
)

if TYPE_CHECKING:
    from gpuenv.run.plan import RunPlan
    from gpuenv.run.runner import RunResult


@dataclass(frozen=True)
class RunOptions:
    """`gpuenv run`'s options by the names click passes them (the decorators below give
    each its flag and help): the one list that run() and the runner read."""

    sm: str | None
    sm_max: int | None
    mem: str | None
    power_limit: float | None
    force: bool
    gpu: str
    policy: str
    regions_from: str | None
    no_auto_regions: bool
    output: str | None
    append: bool
    interval: float | None
    quiet: bool
    verbose: bool
    summary: str
    autotune: bool


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@lock_options(
    sm="Lock the SM clock for the run (as 'gpuenv lock --sm'); restored afterwards.",
    mem="Lock the memory clock for the run.",
    power_limit="Set the power limit for the run.",
)
@click.option("--force", is_flag=True, help="Take over a lock another owner holds.")
@gpu_option(default="auto")
@click.option(
    "--policy",
    metavar="[annotate|reject]",  # checked by plan_run: retry is refused with its reason
    default="annotate",
    show_default=True,
    help="reject: exit 1 when a region's telemetry makes it untrustworthy (for CI). "
    "(To retry, use policy='retry' inside the program: gpuenv cannot re-run a call it "
    "did not make.)",
)
@click.option(
    "--regions",
    "regions_from",
    type=click.Choice(["nvtx"]),
    default=None,
    help="nvtx: each NVTX range the command pushes and pops (torch.cuda.nvtx, nvtx, C/C++) is "
    "a region too; needs a C compiler on first use, no profiler.",
)
@click.option(
    "--no-auto-regions",
    is_flag=True,
    help="Do not make each do_bench, torch Timer and pytest-benchmark call of a Python "
    "command a region (GPUENV_AUTO_REGIONS=do_bench,timer,pytest picks kinds).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the run to this JSONL file, one run per file: a file that holds results is "
    "refused without --append (run.jsonl -> run.rankN.jsonl under torchrun/Slurm).",
)
@click.option(
    "--append",
    is_flag=True,
    help="Add the run to the -o file when it already holds runs (readers then take the last, "
    "and say the file holds several; gpuenv compare --all-runs pools them).",
)
@interval_option("telemetry samples (default 0.1; 0.025 while a wait polls)", old=("--period",))
@click.option("-q", "--quiet", is_flag=True, help="No summary table on stderr.")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="A row for every call of each do_bench / Timer / pytest-benchmark site (without: a "
    "row per site, its flagged calls named), and every perf_report grid in full.",
)
@click.option(
    "--summary",
    type=click.Choice(["each", "rank0"]),
    default="each",
    show_default=True,
    help="Under torchrun/Slurm: each rank prints its table, or rank 0 prints one table of all "
    "ranks (GPUENV_RANKS_DIR: a directory the ranks share; default the temp directory).",
)
@click.option(
    "--autotune",
    is_flag=True,
    help="The command's autotuners choose with gpuenv: @triton.autotune ranks its configs "
    "and torch.compile max-autotune the choices of each selection with gpuenv.rank; each "
    "decision is a row of the table (GPUENV_AUTOTUNE=rank does the same).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
@handle_errors
def run(ctx: click.Context, command: tuple[str, ...], **options: Any) -> None:
    """Run COMMAND under gpuenv: lock clocks if asked (restored whatever happens),
    sample telemetry for the whole run, and print a summary per region.

    COMMAND keeps its stdin, stdout and stderr; SIGINT and SIGTERM reach it;
    gpuenv exits with its exit code. Each do_bench, torch Timer and pytest-benchmark
    call of a Python command is a region of its own, with no change to its code;
    mark others with 'with gpuenv.region("train"): ...' (the whole run is one more).

    \b
    gpuenv run --sm 1350 -o run.jsonl -- python bench.py
    gpuenv run --policy reject -- pytest --benchmark-only
    torchrun --nproc-per-node 8 --no-python gpuenv run --summary rank0 -- python train.py

    -i defaults to the rank's own GPU under torchrun (LOCAL_RANK) or Slurm
    (SLURM_LOCALID), else the GPUs CUDA_VISIBLE_DEVICES shows, else all.
    """
    from gpuenv.run.plan import exit_like, plan_run

    opts = RunOptions(**options)
    plan = plan_run(
        command,
        sm=opts.sm,
        sm_max=opts.sm_max,
        mem=opts.mem,
        power_limit=opts.power_limit,
        period=opts.interval,
        policy=opts.policy,
        no_auto_regions=opts.no_auto_regions,
        gpu=opts.gpu,
        output=opts.output,
        env=os.environ,
        append=opts.append,
        autotune=opts.autotune,
    )
    result = _run_plan(ctx, plan, opts)
    if result is None:
        return
    exit_like(result, opts.policy)


def _run_plan(ctx: click.Context, plan: RunPlan, opts: RunOptions) -> RunResult | None:
    """The run `plan` asks for on the GPUs it selects (None: a dry run, its lines printed)."""
    from gpuenv.devices import choose_gpus, own_env
    from gpuenv.run.plan import dry_run_lines
    from gpuenv.run.runner import Runner

    backend = open_from_ctx(ctx)
    try:
        gpus, why = choose_gpus(backend, plan.selector, env=own_env(os.environ), named="-i")
        if is_dry_run(ctx):
            for line in dry_run_lines(backend, gpus, plan, why):
                click.echo(line)
            return None
        return Runner(
            plan.argv,
            backend=backend,
            gpus=gpus,
            gpus_why=why,
            lock=plan.lock,
            force=opts.force,
            policy=opts.policy,
            output=plan.output,
            append=opts.append,
            period=opts.interval,
            quiet=opts.quiet,
            verbose=opts.verbose,
            auto_regions=plan.auto_regions,
            summary=opts.summary,
            nvtx=opts.regions_from == "nvtx",
            autotune=plan.autotune,
        ).run()
    finally:
        backend.close()
