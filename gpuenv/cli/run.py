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
import signal
import sys

import click

from gpuenv.cli._common import gpu_option, handle_errors, is_dry_run, open_from_ctx

_RERAISE = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGKILL)


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--sm",
    metavar="MHZ|MIN,MAX|max|base|sustained",
    help="Lock the SM clock for the run (as 'gpuenv lock --sm'); restored afterwards.",
)
@click.option("--sm-max", type=int, metavar="MHZ", help="Top of the SM range (with --sm MIN).")
@click.option("--mem", metavar="MHZ", help="Lock the memory clock for the run.")
@click.option("--power-limit", type=float, metavar="W", help="Set the power limit for the run.")
@click.option("--force", is_flag=True, help="Take over a lock another owner holds.")
@gpu_option(default="auto")
@click.option(
    "--policy",
    type=click.Choice(["annotate", "reject", "retry"]),
    default="annotate",
    show_default=True,
    help="reject: exit 1 when a region's telemetry makes it untrustworthy (for CI). "
    "retry is refused: gpuenv cannot re-run a call it did not make.",
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
    help="Append the run to this JSONL file (run.jsonl -> run.rankN.jsonl under torchrun/Slurm).",
)
@click.option(
    "--period", type=float, default=None, metavar="S", help="Sampling period (default 0.025 s)."
)
@click.option("-q", "--quiet", is_flag=True, help="No summary table on stderr.")
@click.option(
    "--summary",
    type=click.Choice(["each", "rank0"]),
    default="each",
    show_default=True,
    help="Under torchrun/Slurm: each rank prints its table, or rank 0 prints one table of all "
    "ranks (GPUENV_RANKS_DIR: a directory the ranks share; default the temp directory).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
@handle_errors
def run(
    ctx: click.Context,
    sm: str | None,
    sm_max: int | None,
    mem: str | None,
    power_limit: float | None,
    force: bool,
    gpu: str,
    policy: str,
    output: str | None,
    period: float | None,
    quiet: bool,
    summary: str,
    regions_from: str | None,
    no_auto_regions: bool,
    command: tuple[str, ...],
) -> None:
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
    from gpuenv.devices import select_gpus
    from gpuenv.errors import ConfigError
    from gpuenv.run.autoregions import ENV_SELECT, select_kinds
    from gpuenv.run.runner import (
        Runner,
        check_run_policy,
        default_gpu_selector,
        rank_of,
        rank_output_path,
        resolve_command,
        selector_env,
    )

    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("no command to run", hint="gpuenv run [options] -- python bench.py")
    if period is not None and period <= 0:
        raise ConfigError(f"--period {period:g} must be positive", hint="e.g. --period 0.05")
    check_run_policy(policy)
    resolve_command(argv)  # a typo fails here, before anything is locked
    auto = select_kinds(os.environ.get(ENV_SELECT), enabled=not no_auto_regions)
    lock_args = None
    if sm is not None or mem is not None or power_limit is not None or sm_max is not None:
        from gpuenv.clocks import make_request

        make_request(sm, sm_max=sm_max, mem=mem, power_limit_w=power_limit)  # validate now
        lock_args = {"sm": sm, "sm_max": sm_max, "mem": mem, "power_limit_w": power_limit}

    env = os.environ
    selector = default_gpu_selector(env) if gpu == "auto" else gpu
    out_path = rank_output_path(output, rank_of(env)) if output else None
    if out_path is not None:
        _check_output_dir(out_path)
    dry = is_dry_run(ctx)
    backend = open_from_ctx(ctx)
    try:
        gpus = select_gpus(backend, selector, env=selector_env(env))
        if dry:
            _dry_run(backend, gpus, lock_args, argv, out_path)
            return
        runner = Runner(
            argv,
            backend=backend,
            gpus=gpus,
            lock_args=lock_args,
            force=force,
            policy=policy,
            output=out_path,
            period=period,
            quiet=quiet,
            auto_regions=auto,
            summary=summary,
            nvtx=regions_from == "nvtx",
        )
        result = runner.run()
    finally:
        backend.close()
    code = result.exit_status(policy)
    if result.returncode < 0 and -result.returncode in _RERAISE:
        sys.stdout.flush()
        sys.stderr.flush()
        sig = -result.returncode
        if sig != signal.SIGKILL:  # SIGKILL's action cannot be set (nor caught)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # die of it, as the command did: shells see a signal death
    sys.exit(code)


def _check_output_dir(path: os.PathLike[str] | str) -> None:
    """-o names a file in a directory that exists: a typo must not grow a tree from '/'."""
    from pathlib import Path

    from gpuenv.errors import ConfigError

    parent = Path(path).parent
    if not parent.is_dir():
        raise ConfigError(
            f"-o {path}: the directory {parent} does not exist",
            hint=f"create it first (mkdir -p {parent}) or pick another path",
        )


def _dry_run(
    backend: object, gpus: list[int], lock_args: dict | None, argv: list[str], out
) -> None:
    import shlex

    from gpuenv.devices import describe

    where = ", ".join(describe(backend, g) for g in gpus)  # type: ignore[arg-type]
    click.echo(f"would run: {shlex.join(argv)}")
    click.echo(f"sampling: {where}")
    if lock_args:
        from gpuenv.clocks import make_request, plan_lock

        request = make_request(**lock_args)
        for line in plan_lock(backend, request, gpus).lines():  # type: ignore[arg-type]
            click.echo(f"would lock: {line}")
    if out is not None:
        click.echo(f"results: {out}")
    click.echo("dry run: nothing was run or changed")
