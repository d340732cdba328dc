"""`gpuenv compare A B`: what changed between two runs, and was the GPU in the same state.

Each side is a results file written by gpuenv (`env.results.save`, `gpuenv.bench(...,
output=)`, `gpuenv run`), or several: a comma-separated list, a glob or a directory
(per-rank files of one distributed run are pooled).

A change smaller than --min-change is "no change", whatever its p-value; a change is
"faster"/"slower" when it is at least that, p < --alpha and the (1 - alpha) CI excludes
no change. A lock is claimed only for the measurements taken under it.

Exit codes: 0 compared; 1 --fail-above was given and a measurement got significantly
slower by more than it ("no change" rows and one region per side never fail it); 2 an
error (a file missing or unreadable, or --fail-above with no measurement present on
both sides: a gate that checked nothing does not pass).
"""

from __future__ import annotations

import json
import sys

import click

from gpuenv.cli._common import checked, handle_errors
from gpuenv.errors import ConfigError


@click.command("compare")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option(
    "--alpha",
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    callback=checked("--alpha", lo=0, hi=1, lo_open=True, hi_open=True),
    help="Significance level (Mann-Whitney U); the CI is at the 1 - alpha level.",
)
@click.option(
    "--min-change",
    type=click.FloatRange(0.0),
    default=0.01,
    show_default=True,
    callback=checked("--min-change", lo=0),
    help="Smallest relative change called faster or slower (0.01 = 1%); a "
    "smaller one reads 'no change', whatever its p-value.",
)
@click.option(
    "--fail-above",
    type=click.FloatRange(0.0),
    default=None,
    metavar="FRACTION",
    callback=checked("--fail-above", lo=0),  # a gate never passes on NaN
    help="Exit 1 if a measurement is significantly slower by more than this "
    "(0.05 = 5%) and by at least --min-change: a CI gate.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@handle_errors
def compare(
    a: str, b: str, alpha: float, min_change: float, fail_above: float | None, as_json: bool
) -> None:
    """Per measurement: the change in median time with its CI and p-value, and beside
    it what changed in the GPU state (SM clock, time under the power cap,
    temperature, lock) and in the environment (GPU model, driver, power limit).
    A change below --min-change is "no change"; a real change that coincides with a
    GPU state change says so. A side pooling locked and unlocked files says how
    many measurements each lock covered, and compares like with like.
    """
    from gpuenv.compare import compare_files, format_report
    from gpuenv.progress import Progress, sized

    with Progress(f"gpuenv compare: reading {sized(a)} and {sized(b)}"):
        report = compare_files(a, b, alpha=alpha, min_change=min_change)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(format_report(report))
    if fail_above is not None:
        if not report.comparisons:
            raise ConfigError(
                "--fail-above: no measurement name is in both A and B, so nothing was gated",
                hint="compare runs of the same benchmarks (names must match)",
            )
        worse = report.regressions(fail_above)
        if worse:
            names = ", ".join(f"{c.name} ({c.change:+.1%})" for c in worse)
            click.echo(f"gpuenv: slower by more than {fail_above:.1%}: {names}", err=True)
            sys.exit(1)
