"""`gpuenv monitor`: live view, `--once` snapshot, `--json` / `--csv` stream.

Exit codes: 0 success (also on q, Ctrl-C, or a closed pipe); 2 an error (bad
option, no GPU, standard output full); 9 no driver. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import click

from gpuenv import validate
from gpuenv.cli._common import checked, gpu_option, handle_errors, interval_option, open_from_ctx

_SCENARIO_NAMES = ("idle", "load", "bursts", "shared")  # gpuenv.monitor.SCENARIOS (checked there)


def _refuse_c(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """`-c` was the count here once; in nvitop it means "compute processes only". Rather
    than count where a nvitop user expects a filter (or the reverse), say which is which."""
    if value is not None and not ctx.resilient_parsing:
        raise click.UsageError(
            "-c is not a gpuenv monitor option: nvitop's -c shows compute processes only, "
            "which gpuenv's monitor does not filter; to stop after N updates use -n N (--count)",
            ctx,
        )


@click.command("monitor")
@gpu_option()
@click.option(
    "-1", "--once", is_flag=True, help="Print one snapshot and exit (like 'nvitop -1/--once')."
)
@click.option("--json", "as_json", is_flag=True, help="Stream one JSON line per GPU per tick.")
@click.option("--csv", "as_csv", is_flag=True, help="Stream CSV, one row per GPU per tick.")
@interval_option("updates (-d as in 'nvidia-smi dmon -d')", default=1.0, short="-d")
@click.option(
    "-n", "--count", type=int, default=None, metavar="N", help="Stop after N updates (top's -n).",
    callback=checked("--count", validate.integer, lo=1),
)
@click.option(
    "-c", "nvitop_c", hidden=True, default=None, expose_value=False, callback=_refuse_c,
    help="Refused: nvitop's -c means compute processes only; the count is -n/--count.",
)  # fmt: skip
@click.option("--duration", type=float, default=None, metavar="S", help="Stop after S seconds.",
              callback=checked("--duration", lo=0, lo_open=True))  # fmt: skip
@click.option(
    "--scenario",
    type=click.Choice(_SCENARIO_NAMES),
    default=None,
    help="With --sim: drive the simulated GPU so the view moves (idle, load, bursts, shared).",
)
@click.option(
    "--no-processes", is_flag=True, help="Do not list processes (saves the per-process lookups)."
)
@click.option(
    "--color/--no-color", default=None, help="Colours in --once output (default: when a terminal)."
)
@click.pass_context
@handle_errors
def monitor(
    ctx: click.Context,
    gpu: str,
    once: bool,
    as_json: bool,
    as_csv: bool,
    interval: float,
    count: int | None,
    duration: float | None,
    scenario: str | None,
    no_processes: bool,
    color: bool | None,
) -> None:
    """Live view of what makes numbers lie: clocks against max and the lock, power
    against the limit, temperature against slowdown, active clock-event reasons
    and how long, the lock owner, and the processes on each GPU.

    Keys: q quit, p pause, arrows or 0-9 pick a GPU, ? or h help. '--json'/'--csv' stream one
    line per GPU per tick, flushed (like 'nvidia-smi dmon'); '--once' prints one
    snapshot (like 'nvidia-smi' / 'nvitop --once').

    \b
    Demo on the simulated GPU:  gpuenv --sim monitor --scenario bursts
    """
    from gpuenv.errors import ConfigError
    from gpuenv.monitor.app import MonitorOptions, check_options, show

    fmt = check_options(
        interval=interval, count=count, duration=duration, once=once, as_json=as_json,
        as_csv=as_csv,
    )
    if scenario is not None and not _wants_sim(ctx):
        raise ConfigError(
            "--scenario drives the simulated GPU only",
            hint="add --sim: 'gpuenv --sim monitor --scenario load'",
        )

    from gpuenv.devices import select_gpus

    opts = MonitorOptions(
        interval_s=interval,
        count=count,
        duration_s=duration,
        once=once,
        fmt=fmt,
        scenario=scenario,
        processes=not no_processes,
        color=color,
    )
    backend = open_from_ctx(ctx, readonly=True)  # the monitor never writes
    try:
        show(backend, select_gpus(backend, gpu), opts)
    finally:
        backend.close()


def _wants_sim(ctx: click.Context) -> bool:
    import os

    kind = (ctx.find_root().obj or {}).get("backend_kind")
    return (kind or os.environ.get("GPUENV_BACKEND", "").strip().lower()) == "sim"
