"""`gpuenv monitor`: live view, `--once` snapshot, `--json` / `--csv` stream.

Exit codes: 0 success (also on q, Ctrl-C, or a closed pipe); 2 an error (bad
option, no GPU, standard output full); 9 no driver. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import click

from gpuenv import validate
from gpuenv.cli._common import checked, gpu_option, handle_errors, interval_option, open_from_ctx

_SCENARIO_NAMES = (
    "idle",
    "load",
    "bursts",
    "shared",
    "none",
)  # gpuenv.monitor.SCENARIOS (checked there)


_SORT_KEYS = (
    "pid",
    "user",
    "gpu_memory",
    "sm_utilization",
    "cpu_percent",
    "memory_percent",
    "time",
)  # gpuenv.monitor.processes.SORT_KEYS (checked there)


def _only_gpus(gpu: str, only: tuple[str, ...]) -> str:
    """nvitop's `--only 0 --only 1` (or `--only 0,1`) as the GPU selector; not both with -i.
    (nvitop's short `-o` is not taken: in gpuenv `-o` is --output, in every command.)"""
    if not only:
        return gpu
    if gpu != "all":
        from gpuenv.errors import ConfigError

        raise ConfigError(
            "-i and --only both choose GPUs", hint="use one: -i 0,1 or --only 0 --only 1"
        )
    return ",".join(only)


@click.command("monitor")
@gpu_option()
@click.option(
    "-1", "--once", is_flag=True, help="Print one snapshot and exit (like 'nvitop -1/--once')."
)
@click.option("--json", "as_json", is_flag=True, help="Stream one JSON line per GPU per tick.")
@click.option("--csv", "as_csv", is_flag=True, help="Stream CSV, one row per GPU per tick.")
@interval_option("updates (-d as in 'nvidia-smi dmon -d')", default=1.0, short="-d")
@click.option(
    "-n",
    "--count",
    type=int,
    default=None,
    metavar="N",
    help="Stop after N updates (top's -n).",
    callback=checked("--count", validate.integer, lo=1),
)
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="IDX",
    help="nvitop's spelling of -i: the GPUs to show (--only 0 --only 1, or --only 0,1).",
)
@click.option("-c", "--only-compute", is_flag=True, help="Only compute processes (nvitop -c).")
@click.option("-g", "--only-graphics", is_flag=True, help="Only graphics processes (nvitop -g).")
@click.option(
    "-u",
    "--user",
    "users",
    multiple=True,
    metavar="USER",
    help="Only the processes of USER (repeatable; nvitop -u).",
)
@click.option(
    "--pid",
    "pids",
    multiple=True,
    type=int,
    metavar="PID",
    help="Only process PID (repeatable; nvitop --pid).",
)
@click.option(
    "--sort",
    type=click.Choice(_SORT_KEYS),
    default="pid",
    show_default=True,
    help="Sort the processes by this column (keys , and . in the live view).",
)
@click.option("--reverse", is_flag=True, help="Reverse the sort (key / in the live view).")
@click.option(
    "-U",
    "--ascii",
    "--no-unicode",
    "ascii_only",
    is_flag=True,
    help="ASCII characters only (nvitop -U); automatic when the output is not UTF-8.",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    metavar="S",
    help="Stop after S seconds.",
    callback=checked("--duration", lo=0, lo_open=True),
)
@click.option(
    "--scenario",
    type=click.Choice(_SCENARIO_NAMES),
    default=None,
    help="With --sim: drive the simulated GPU so the view moves (idle, load, bursts, shared), "
    "or not (none). The live view runs bursts unless another process runs work there.",
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
    only: tuple[str, ...],
    only_compute: bool,
    only_graphics: bool,
    users: tuple[str, ...],
    pids: tuple[int, ...],
    sort: str,
    reverse: bool,
    ascii_only: bool,
) -> None:
    """Live view of what makes numbers lie: clocks against max and the lock, power
    against the limit, temperature against slowdown, active clock-event reasons
    and how long, the lock owner, and the processes on each GPU.

    Keys: q quit, p pause, arrows or 0-9 pick a GPU, , and . sort the processes,
    / reverse, f filter (all, compute, graphics), ? or h help. '--json'/'--csv' stream one
    line per GPU per tick, flushed (like 'nvidia-smi dmon'); '--once' prints one
    snapshot (like 'nvidia-smi' / 'nvitop --once').

    \b
    Demo on the simulated GPU:  gpuenv --sim monitor    (bursts while nothing else runs)
    """
    from gpuenv.errors import ConfigError
    from gpuenv.monitor.app import MonitorOptions, check_options, show

    fmt = check_options(
        interval=interval,
        count=count,
        duration=duration,
        once=once,
        as_json=as_json,
        as_csv=as_csv,
    )
    if scenario is not None and not _wants_sim(ctx):
        raise ConfigError(
            "--scenario drives the simulated GPU only",
            hint="add --sim: 'gpuenv --sim monitor --scenario load'",
        )

    if only_compute and only_graphics:
        raise ConfigError("-c and -g disagree", hint="one of them, or neither for every process")
    gpu = _only_gpus(gpu, only)

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
        ascii_only=ascii_only,
        sort=sort,
        reverse=reverse,
        kind="C" if only_compute else "G" if only_graphics else "all",
        users=users,
        pids=pids,
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
