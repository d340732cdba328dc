"""`gpuenv monitor`'s three ways to show the model: a stream, a snapshot, the live view.

    fmt = check_options(interval=1.0, count=None, duration=None, once=False, ...)
    show(backend, gpus, MonitorOptions(interval_s=1.0, fmt=fmt, ...))

Options are checked before a GPU is opened; the scenario driving a simulated GPU
is stopped whatever happens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from gpuenv.errors import ConfigError

if TYPE_CHECKING:
    from gpuenv.backend import Backend


@dataclass(frozen=True)
class MonitorOptions:
    interval_s: float = 1.0
    count: int | None = None
    duration_s: float | None = None
    once: bool = False
    fmt: str | None = None  # "json", "csv", or None: a view
    scenario: str | None = None
    processes: bool = True
    color: bool | None = None  # None: when standard output is a terminal
    ascii_only: bool = False  # --ascii / -U (also when the output is not UTF-8)
    sort: str = "pid"  # processes.SORT_KEYS
    reverse: bool = False
    kind: str = "all"  # "all", "C" (--only-compute) or "G" (--only-graphics)
    users: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


def check_options(
    *,
    interval: float,
    count: int | None,
    duration: float | None,
    once: bool,
    as_json: bool,
    as_csv: bool,
) -> str | None:
    """Refuse options that disagree; returns the stream format ("json", "csv" or None)."""
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
    return "json" if as_json else "csv" if as_csv else None


def show(
    backend: Backend, gpus: list[int], opts: MonitorOptions, out: IO[str] | None = None
) -> None:
    """Stream, print one snapshot, or run the live view, as `opts` says."""
    from gpuenv.monitor.model import MonitorModel
    from gpuenv.monitor.scenarios import SimScenario, choose

    out = sys.stdout if out is None else out
    driver = None
    try:
        simulated = backend.capabilities.simulated
        scenario, source = None, _source(backend)
        if simulated:
            live = not (opts.once or opts.fmt)
            scenario, source = choose(opts.scenario, backend, gpus, live=live)
        model = MonitorModel(backend, gpus, processes=opts.processes)
        if scenario is not None:
            driver = SimScenario(backend.workload, gpus, scenario)
            driver.start()
            if opts.once or opts.fmt:
                model.clock.sleep(min(opts.interval_s, 2.0))  # let the scenario start first
        if opts.fmt:
            _stream(model, opts.fmt, opts, out)
        else:
            _view(model, opts, source, simulated, out)
    finally:
        if driver is not None:
            driver.stop()


def _stream(model: Any, fmt: str, opts: MonitorOptions, out: IO[str]) -> None:
    from gpuenv.monitor.streams import stream

    try:
        stream(
            model,
            out,
            fmt=fmt,
            interval_s=opts.interval_s,
            count=1 if opts.once else opts.count,
            duration_s=opts.duration_s,
        )
    except (KeyboardInterrupt, BrokenPipeError):
        _quiet(out)


def _view(model: Any, opts: MonitorOptions, source: str, simulated: bool, out: IO[str]) -> None:
    from gpuenv.monitor.blocks import Frame
    from gpuenv.monitor.draw import Glyphs, ansi, plain
    from gpuenv.monitor.tui import run_tui
    from gpuenv.monitor.view import render

    frame = Frame(
        source=source,
        simulated=simulated,
        interval_s=opts.interval_s,
        sort=opts.sort,
        reverse=opts.reverse,
        kind=opts.kind,
        users=opts.users,
        pids=opts.pids,
    )
    if opts.once or not out.isatty():
        if not opts.once:
            raise ConfigError(
                "the live view needs a terminal",
                hint="use --once for a snapshot, or --json / --csv to stream to a pipe or file",
            )
        import shutil

        frame.keys = False
        # what `out` can write: ASCII unless it is UTF-8 (PYTHONIOENCODING=ascii, LANG=C)
        frame.glyphs = Glyphs.for_output(getattr(out, "encoding", None), ascii_only=opts.ascii_only)
        width = shutil.get_terminal_size((120, 24)).columns
        views = model.update()
        frame.host = model.host
        lines = render(views, frame, width, None)
        use_color = out.isatty() if opts.color is None else opts.color
        out.write(ansi(lines) if use_color else plain(lines))
        return
    stop_after: float | None
    if opts.duration_s is not None:
        stop_after = opts.duration_s
    else:
        stop_after = None if opts.count is None else opts.count * opts.interval_s
    run_tui(
        model,
        frame,
        interval_s=opts.interval_s,
        stop_after_s=stop_after,
        ascii_only=opts.ascii_only,
    )


def _source(backend: Backend) -> str:
    try:
        return f"NVML, driver {backend.driver_version()}"
    except Exception:
        return "NVML"


def _quiet(out: IO[str]) -> None:
    """After a closed pipe (`| head`), stop Python complaining when it flushes `out` at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except OSError:
        pass
