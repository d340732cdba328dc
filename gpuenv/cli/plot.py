"""`gpuenv plot RUN.jsonl -o run.png`: clocks, power and temperature over time.

Each measured region is shaded and named; rejected reps are marked. Needs the
optional extra (`plot`), or pip install matplotlib.

Exit codes: 0 written; 2 an error (file unreadable or not a results file, no
telemetry, no such GPU in the run, an image format or directory that will not do,
no matplotlib). The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import click

from gpuenv import validate
from gpuenv.cli._common import gpu_option, handle_errors


@click.command("plot")
@click.argument("run_file", metavar="RUN.jsonl", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    default=None,
    metavar="FILE",
    help="Image to write (.png, .svg, .pdf). Default: RUN.png beside the input.",
)
@gpu_option(
    default=None,
    help="The GPU to draw, as the run recorded it: an NVML index, a UUID or a PCI bus id "
    "(default: each measurement's first GPU).",
)
@click.option("--title", default=None, help="Figure title.")
@handle_errors
def plot(run_file: str, output: str | None, gpu: str | None, title: str | None) -> None:
    """Plot SM clock, power and temperature of the last run in RUN.jsonl."""
    from gpuenv.plot import plot_run, recorded_gpu
    from gpuenv.progress import Progress, sized
    from gpuenv.results import load_run

    if output is not None:  # '' is a bad name, not "the default" (it wrote somewhere else)
        validate.output_path(output, "-o")
    with Progress(f"gpuenv plot: reading {sized(run_file)}") as progress:
        run = load_run(run_file)
        out = (
            output
            if output is not None
            else (run_file[: -len(".jsonl")] if run_file.endswith(".jsonl") else run_file) + ".png"
        )
        chosen = None if gpu is None else recorded_gpu(run, gpu)
        n = len(run.measurements)
        progress.update(f"gpuenv plot: drawing {n:,} measurement{'' if n == 1 else 's'} to {out}")
        written = plot_run(run, out, title=title, gpu=chosen)
    click.echo(written)
