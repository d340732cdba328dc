"""What `gpuenv status` prints, once or in a loop (`-l SEC`, `-lms MS`), as nvidia-smi does.

`StatusOptions` holds what the command line asked; `check()` refuses options that
disagree before anything is read; `show()` prints the table, JSON, a `--query-gpu`
CSV or the supported clocks, and with an interval repeats on a fixed schedule (no
drift) until Ctrl-C or until the reader of a pipe leaves (`| head`): both end the
loop cleanly, with exit code 0, as nvidia-smi's `-l` does. A CSV header is printed
once; a looping table is printed whole each time, JSON as one document per line.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from gpuenv.backend import Backend
from gpuenv.errors import ConfigError

EXIT_OK = 0
EXIT_GPU_ERROR = 2  # a selected GPU did not answer (its row or cells say why)


@dataclass(frozen=True)
class StatusOptions:
    query_gpu: str | None = None  # --query-gpu=FIELDS
    fmt: str | None = None  # --format=csv[,noheader][,nounits]
    as_json: bool = False
    supported_clocks: bool = False
    query_supported_clocks: str | None = None  # --query-supported-clocks=FIELDS
    interval_s: float | None = None  # -l SEC / -lms MS: repeat until Ctrl-C
    readonly: bool | None = None  # what the user's environment allows (shown in the title)
    count: int | None = None  # stop after this many (tests; nvidia-smi has no such option)


def interval(loop_s: float | None, loop_ms: int | None) -> float | None:
    """The loop period from `-l SEC` or `-lms MS` (one of them), in seconds."""
    if loop_s is not None and loop_ms is not None:
        raise ConfigError("-l and -lms disagree", hint="give the period once: -l 1 or -lms 500")
    if loop_ms is not None:
        if loop_ms <= 0:
            raise ConfigError(
                f"-lms {loop_ms} is not a positive number of milliseconds", hint="e.g. -lms 500"
            )
        return loop_ms / 1000.0
    if loop_s is not None and loop_s <= 0:
        raise ConfigError(f"-l {loop_s:g} is not a positive number of seconds", hint="e.g. -l 1")
    return loop_s


def check(opts: StatusOptions) -> None:
    """Refuse options that disagree, before any GPU is read."""
    modes = [
        name
        for name, on in (
            ("--query-gpu", opts.query_gpu is not None),
            ("--supported-clocks", opts.supported_clocks),
            ("--query-supported-clocks", opts.query_supported_clocks is not None),
        )
        if on
    ]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} disagree", hint="ask for one of them")
    if opts.as_json and opts.fmt is not None:
        raise ConfigError("--json and --format disagree", hint="pick one output format")
    if opts.as_json and (opts.query_gpu is not None or opts.query_supported_clocks is not None):
        raise ConfigError(
            "--json does not go with a --query-* switch",
            hint="use --format=csv with --query-gpu, or --json alone for every value",
        )
    if opts.fmt is not None and not modes:
        raise ConfigError(
            "--format needs a query",
            hint="e.g. 'gpuenv status --query-gpu=index,clocks.sm --format=csv', or "
            "'gpuenv status --supported-clocks --format=csv'",
        )
    _fields(opts)  # a field or format nvidia-smi would refuse is refused before any GPU is read


def _fields(opts: StatusOptions) -> tuple[list[Any], Any]:
    """The CSV fields and format a query asks for (none for the table or JSON)."""
    csv_clocks = opts.query_supported_clocks is not None or (opts.supported_clocks and opts.fmt)
    if opts.query_gpu is None and not csv_clocks:
        return [], None  # the table or JSON: the query modules are not imported
    from gpuenv.status import clocks, query

    fmt = query.parse_format(opts.fmt or "csv")
    if opts.query_gpu is not None:
        return query.parse_fields(opts.query_gpu), fmt
    text = opts.query_supported_clocks
    if text is None:  # --supported-clocks --format=csv: nvidia-smi's default columns
        text = "gpu_uuid,memory,graphics"
    return query.parse_fields(text, clocks.SUPPORTED_FIELDS, "--query-supported-clocks"), fmt


@dataclass(frozen=True)
class _Tick:
    text: str  # for standard output
    errors: list[str]  # one line each for standard error
    failed: bool  # a selected GPU did not answer


def _renderer(
    backend: Backend, gpus: Sequence[int], opts: StatusOptions
) -> Callable[[bool], _Tick]:
    """A function (first tick?) -> what to print this tick."""
    fields, fmt = _fields(opts)
    if fields:
        from gpuenv.status import clocks, query

        def render_csv(first: bool) -> _Tick:
            if opts.query_gpu is not None:
                lines, errors = query.query_rows(backend, gpus, fields, fmt)
            else:
                reads, errors = clocks.supported_reads(backend, gpus)
                lines, more = query.csv_rows(reads, fields, fmt)
                errors += more
            head = [query.header_line(fields, fmt)] if first and fmt.header else []
            return _Tick("\n".join([*head, *lines]), errors, bool(errors))

        return render_csv
    if opts.supported_clocks:
        from gpuenv.status import clocks

        def render_clocks(first: bool) -> _Tick:
            doc = clocks.supported_clocks(backend, gpus)
            failed = any(g["error"] for g in doc["gpus"])
            text = _json(doc, opts) if opts.as_json else clocks.format_supported(doc)
            return _Tick(text, [], failed)

        return render_clocks

    def render_status(first: bool) -> _Tick:
        from gpuenv.status import format_table, snapshot

        snap = snapshot(backend, gpus, readonly=opts.readonly)
        failed = any(g.get("error") for g in snap["gpus"])
        if opts.as_json:
            return _Tick(_json(snap, opts), [], failed)
        blank = "\n" if opts.interval_s is not None else ""  # tables of a loop apart
        return _Tick(format_table(snap) + blank, [], failed)

    return render_status


def _json(doc: object, opts: StatusOptions) -> str:
    if opts.interval_s is None:
        return json.dumps(doc, indent=2)
    return json.dumps(doc, separators=(",", ":"))  # JSON lines while looping


def show(
    backend: Backend,
    gpus: Sequence[int],
    opts: StatusOptions,
    out: IO[str],
    err: IO[str],
) -> int:
    """Print what `opts` asks, once or every `opts.interval_s`; return the exit code."""
    check(opts)
    render = _renderer(backend, gpus, opts)
    clock = backend.clock
    start = clock.now()
    ticks = 0
    failed = False
    try:
        while True:
            tick = render(ticks == 0)
            failed = failed or tick.failed
            if tick.text:
                out.write(tick.text + "\n")
            out.flush()
            for line in tick.errors:
                err.write(f"gpuenv: error: {line}\n")
            ticks += 1
            if opts.interval_s is None or (opts.count is not None and ticks >= opts.count):
                break
            clock.sleep(max(0.0, start + ticks * opts.interval_s - clock.now()))
    except KeyboardInterrupt:  # Ctrl-C ends a loop: that is how nvidia-smi -l is stopped
        if opts.interval_s is None:
            raise  # a single report cut short is an interruption (exit 130), as elsewhere
        return EXIT_OK
    except BrokenPipeError:  # the reader left (| head): nothing more to say to anyone
        if opts.interval_s is None:
            raise
        _quiet(out)
        return EXIT_OK
    if opts.interval_s is not None:
        return EXIT_OK
    return EXIT_GPU_ERROR if failed else EXIT_OK


def _quiet(out: IO[str]) -> None:
    """Point `out`'s descriptor at /dev/null so the interpreter's flush at exit is silent."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)


__all__ = ["StatusOptions", "check", "interval", "show"]
