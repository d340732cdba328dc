"""`gpuenv monitor`: live view, `--once` snapshot, `--json` / `--csv` stream.

Exit codes: 0 success (also on q, Ctrl-C, or a closed pipe); 2 an error (bad
option, no GPU, standard output full); 9 no driver. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import sys

import click

from gpuenv.cli._common import gpu_option, handle_errors, open_from_ctx

_SCENARIO_NAMES = ("idle", "load", "bursts", "shared")  # gpuenv.monitor.SCENARIOS (checked there)


@click.command("monitor")
@gpu_option()
@click.option("--once", is_flag=True, help="Print one snapshot and exit (like 'nvitop --once').")
@click.option("--json", "as_json", is_flag=True, help="Stream one JSON line per GPU per tick.")
@click.option("--csv", "as_csv", is_flag=True, help="Stream CSV, one row per GPU per tick.")
@click.option(
    "-d",
    "--interval",
    type=float,
    default=1.0,
    show_default=True,
    metavar="S",
    help="Seconds between updates.",
)
@click.option("-c", "--count", type=int, default=None, metavar="N", help="Stop after N updates.")
@click.option("--duration", type=float, default=None, metavar="S", help="Stop after S seconds.")
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

    Keys: q quit, p pause, arrows or 0-9 pick a GPU. '--json'/'--csv' stream one
    line per GPU per tick, flushed (like 'nvidia-smi dmon'); '--once' prints one
    snapshot (like 'nvidia-smi' / 'nvitop --once').

    \b
    Demo on the simulated GPU:  gpuenv --sim monitor --scenario bursts
    """
    from gpuenv.errors import ConfigError

    if interval <= 0:
        raise ConfigError(
            f"--interval {interval:g} is not a positive number of seconds", hint="try -d 1"
        )
    if count is not None and count < 1:
        raise ConfigError(f"--count {count} must be at least 1")
    if duration is not None and duration <= 0:
        raise ConfigError(f"--duration {duration:g} must be positive")
    if once and count is not None:
        raise ConfigError("--once and --count disagree", hint="use one of them")
    if as_json and as_csv:
        raise ConfigError("--json and --csv disagree", hint="stream one format: pick one of them")
    fmt = "json" if as_json else "csv" if as_csv else None

    if scenario is not None and not _wants_sim(ctx):
        raise ConfigError(
            "--scenario drives the simulated GPU only",
            hint="add --sim: 'gpuenv --sim monitor --scenario load'",
        )

    from gpuenv.devices import select_gpus
    from gpuenv.monitor import MonitorModel, SimScenario, stream
    from gpuenv.monitor.tui import run_tui
    from gpuenv.monitor.view import Frame, ansi, plain, render

    backend = open_from_ctx(ctx, readonly=True)  # the monitor never writes
    driver = None
    try:
        gpus = select_gpus(backend, gpu)
        simulated = backend.capabilities.simulated
        source = _source(backend, simulated, scenario)
        model = MonitorModel(backend, gpus, processes=not no_processes)
        if scenario is not None:
            driver = SimScenario(backend.workload, gpus, scenario)
            driver.start()
            if once or fmt:
                model.clock.sleep(
                    min(interval, 2.0)
                )  # let the scenario start before the first line
        if fmt:
            if once:
                count = 1
            try:
                stream(
                    model,
                    sys.stdout,
                    fmt=fmt,
                    interval_s=interval,
                    count=count,
                    duration_s=duration,
                )
            except (KeyboardInterrupt, BrokenPipeError):
                _quiet_stdout()
            return
        frame = Frame(source=source, simulated=simulated, interval_s=interval)
        if once or not sys.stdout.isatty():
            if not once:
                raise ConfigError(
                    "the live view needs a terminal",
                    hint="use --once for a snapshot, or --json / --csv to stream to a pipe or file",
                )
            import shutil

            frame.keys = False
            width = shutil.get_terminal_size((120, 24)).columns
            lines = render(model.update(), frame, width, None)
            use_color = sys.stdout.isatty() if color is None else color
            sys.stdout.write(ansi(lines) if use_color else plain(lines))
            return
        stop_after = (
            duration if duration is not None else (None if count is None else count * interval)
        )
        run_tui(model, frame, interval_s=interval, stop_after_s=stop_after)
    finally:
        if driver is not None:
            driver.stop()
        backend.close()


def _wants_sim(ctx: click.Context) -> bool:
    import os

    kind = (ctx.find_root().obj or {}).get("backend_kind")
    return (kind or os.environ.get("GPUENV_BACKEND", "").strip().lower()) == "sim"


def _source(backend: object, simulated: bool, scenario: str | None) -> str:
    if simulated:
        text = "SIMULATED GPU"
        if scenario:
            text += f" - scenario {scenario}"
        return text
    try:
        return f"NVML, driver {backend.driver_version()}"  # type: ignore[attr-defined]
    except Exception:
        return "NVML"


def _quiet_stdout() -> None:
    """After a closed pipe (`| head`), stop Python complaining when it flushes stdout at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
