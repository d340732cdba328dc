"""`gpuenv status`: clocks, lock, power, temperature and active reasons per GPU.

nvidia-smi's habits work: `--query-gpu=FIELDS --format=csv[,noheader][,nounits]`
(`--help-query-gpu` lists the fields), `-l SEC` / `-lms MS` to repeat until Ctrl-C,
`--supported-clocks` (or `--query-supported-clocks=mem,gr`), `-i` to pick GPUs.

Exit codes, nvidia-smi's where gpuenv means the same: 0 every selected GPU answered
(and always after a loop ends with Ctrl-C or a closed pipe); 2 an error (bad option or
field, or a GPU that failed to answer: its row says why); 6 no GPU matches -i/--id;
9 no driver; 12 no NVML library. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from gpuenv import validate
from gpuenv._files import naming
from gpuenv.backend import env_readonly
from gpuenv.cli._common import (
    GPU_HELP,
    AliasedOption,
    NumbersAfterOptionalValues,
    checked,
    handle_errors,
    is_dry_run,
    open_from_ctx,
)


def _print_help(table: str) -> None:
    from gpuenv.status import clocks, query

    if table == "gpu":
        click.echo(query.help_text())
    else:
        click.echo(query.help_text(clocks.SUPPORTED_FIELDS, "--query-supported-clocks"))


def _help_callback(table: str) -> Callable[[click.Context, click.Parameter, bool], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            _print_help(table)
            ctx.exit(0)

    return callback


@click.command("status", cls=NumbersAfterOptionalValues)
@click.option(
    "-i",
    "--gpu",
    "--id",
    "gpu",
    cls=AliasedOption,
    hidden_opts=("--id",),
    default="all",
    show_default=True,
    metavar="SEL",
    help=GPU_HELP + " (--id=SEL: nvidia-smi's spelling)",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema in gpuenv/status/).")
@click.option(
    "--query-gpu",
    "query_gpu",
    metavar="FIELDS",
    help="Print these fields, as nvidia-smi --query-gpu does (e.g. index,clocks.sm,power.draw,"
    "gpuenv.lock); --help-query-gpu lists them.",
)
@click.option(
    "--format",
    "fmt",
    metavar="csv[,noheader][,nounits]",
    help="Output format of a query (default csv): as nvidia-smi's --format.",
)
@click.option(
    "--supported-clocks",
    is_flag=True,
    help="Each memory clock and the graphics clocks it supports (nvidia-smi -q -d "
    "SUPPORTED_CLOCKS); a table, --json or --format=csv.",
)
@click.option(
    "--query-supported-clocks",
    "query_supported_clocks",
    metavar="FIELDS",
    help="One row per supported clock pair, as nvidia-smi's (e.g. mem,gr).",
)
@click.option(
    "-l",
    "--loop",
    "--interval",
    "loop_s",
    type=float,
    metavar="SEC",
    is_flag=False,
    flag_value=5.0,
    callback=checked("-l", validate.display_interval),
    help="Repeat every SEC seconds (5 when -l comes alone) until Ctrl-C (nvidia-smi -l).",
)
@click.option(
    "-f",
    "--filename",
    "filename",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the output to this file instead of standard output (nvidia-smi -f).",
)
@click.option(
    "-lms",
    "--loop-ms",
    "loop_ms",
    type=int,
    metavar="MS",
    callback=checked("-lms", validate.integer, lo=1, hi=int(validate.MAX_DISPLAY_INTERVAL_S * 1e3)),
    help="Repeat every MS milliseconds until Ctrl-C (nvidia-smi -lms).",
)
@click.option(
    "--help-query-gpu",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_help_callback("gpu"),
    help="List the fields of --query-gpu and exit.",
)
@click.option(
    "--help-query-supported-clocks",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_help_callback("clocks"),
    help="List the fields of --query-supported-clocks.",
)
@click.pass_context
@handle_errors
def status(
    ctx: click.Context,
    gpu: str,
    as_json: bool,
    query_gpu: str | None,
    fmt: str | None,
    supported_clocks: bool,
    query_supported_clocks: str | None,
    loop_s: float | None,
    loop_ms: int | None,
    filename: str | None,
) -> None:
    """Clocks now/max, lock state, power draw/limit, temperature/slowdown threshold,
    active clock-event reasons, persistence mode and process count, per GPU.

    Like 'nvidia-smi -q -d CLOCK,POWER,TEMPERATURE,PERFORMANCE', in one line per GPU.

    \b
    gpuenv status --query-gpu=index,clocks.sm,power.draw --format=csv,noheader
    gpuenv status --query-gpu=timestamp,clocks.sm,clocks_event_reasons.active -lms 200
    gpuenv status --supported-clocks -i 0
    gpuenv status --query-gpu=timestamp,power.draw --format=csv -l -f power.csv
    """
    from gpuenv.devices import select_gpus
    from gpuenv.status.show import StatusOptions, check, interval, show

    opts = StatusOptions(
        query_gpu=query_gpu,
        fmt=fmt,
        as_json=as_json,
        supported_clocks=supported_clocks,
        query_supported_clocks=query_supported_clocks,
        interval_s=interval(loop_s, loop_ms),
        readonly=is_dry_run(ctx) or env_readonly(),  # what the user's environment allows
    )
    check(opts)
    backend = open_from_ctx(ctx, readonly=True)  # status itself never writes
    try:
        gpus = select_gpus(backend, gpu)
        if filename is None:
            code = show(backend, gpus, opts, sys.stdout, sys.stderr)
        else:
            try:
                with open(filename, "w", encoding="utf-8") as out:  # nvidia-smi -f replaces it
                    code = show(backend, gpus, opts, out, sys.stderr)
            except OSError as err:
                raise naming(err, filename) from err
    finally:
        backend.close()
    if code:
        sys.exit(code)
