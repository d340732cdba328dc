"""`gpuenv compare A B`: what changed between two runs, and was the GPU in the same state.

Each side is a results file written by gpuenv (`gpuenv run -o`, `env.results.save`,
`gpuenv.bench(..., output=)`), or several: a comma-separated list, a glob or a directory
(per-rank files of one distributed run are pooled). Of a file that holds several runs
(written with --append) the last is read, and the report says so; --all-runs pools them.

A change is "faster"/"slower" when it is at least --min-change, p < --alpha and the
(1 - alpha) CI excludes no change; "no change" when the whole CI lies within
+-min-change; else "can't tell", with about how many reps per side would tell. A lock
is claimed only for the measurements taken under it.

Exit codes: 0 compared; 1 --fail-above was given and a measurement got significantly
slower by more than it, or --fail-on-cant-tell was given too and a row can't tell; 2 an
error (a file missing or unreadable, or --fail-above with no measurement present on
both sides: a gate that checked nothing does not pass).
"""

from __future__ import annotations

import json
import sys

import click

from gpuenv import validate
from gpuenv.cli._common import checked, handle_errors
from gpuenv.errors import ConfigError


@click.command("compare")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option(
    "--all-runs",
    is_flag=True,
    help="Pool every run of a file written with --append (default: each file's last run, "
    "said where a file holds several).",
)
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
    callback=checked("--min-change", validate.fraction),
    help="Smallest relative change called faster or slower (0.01 = 1%); a "
    "smaller one reads 'no change', whatever its p-value.",
)
@click.option(
    "--fail-above",
    type=click.FloatRange(0.0),
    default=None,
    metavar="FRACTION",
    callback=checked("--fail-above", validate.fraction),  # never NaN, never 5 for 5%
    help="Exit 1 if a measurement is significantly slower by more than this "
    "(0.05 = 5%) and by at least --min-change: a CI gate.",
)
@click.option(
    "--fail-on-cant-tell",
    is_flag=True,
    help="With --fail-above: exit 1 too where a row can't tell (its interval is wider than "
    "--min-change allows): a gate that passes only on evidence.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@handle_errors
def compare(
    a: str,
    b: str,
    all_runs: bool,
    alpha: float,
    min_change: float,
    fail_above: float | None,
    fail_on_cant_tell: bool,
    as_json: bool,
) -> None:
    """Compare the runs in A (before) with those in B (after). A and B are each a results
    file gpuenv wrote (gpuenv run -o, env.results.save, gpuenv.bench(output=)), or several:
    a comma-separated list, a glob ('runs/*.jsonl') or a directory (its *.jsonl), pooled
    per side (a distributed run's per-rank files). Of a file that holds several runs
    (written with --append) the last is read, and the report says so.

    \b
    gpuenv compare baseline.jsonl new.jsonl --fail-above 0.05
    gpuenv compare 'base.rank*.jsonl' 'new.rank*.jsonl'

    Per measurement: the change in median time with its CI and p-value, and beside
    it what changed in the GPU state (SM clock, time under the power cap,
    temperature, lock) and in the environment (GPU model, driver, power limit).
    "no change" where the whole CI lies within --min-change, "can't tell" (with the reps
    that would tell) where it is wider; a real change that coincides with a
    GPU state change says so. A side pooling locked and unlocked files says how
    many measurements each lock covered, and compares like with like.
    """
    from gpuenv.compare import compare_files, format_report
    from gpuenv.progress import Progress, sized

    if fail_on_cant_tell and fail_above is None:
        raise ConfigError(
            "--fail-on-cant-tell needs --fail-above: it tells the gate what else fails",
            hint="gpuenv compare A B --fail-above 0.05 --fail-on-cant-tell",
        )
    with Progress(f"gpuenv compare: reading {sized(a)} and {sized(b)}"):
        report = compare_files(a, b, all_runs=all_runs, alpha=alpha, min_change=min_change)
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
        unsure = report.cant_tell() if fail_on_cant_tell else []
        if unsure:
            names = ", ".join(
                f"{c.name} ({c.ratio_ci[0] - 1:+.1%} .. {c.ratio_ci[1] - 1:+.1%}"
                + (f", about {c.reps_needed:,} reps per side" if c.reps_needed else "")
                + ")"
                for c in unsure
            )
            click.echo(
                f"gpuenv: can't tell at the {min_change:.1%} minimum change: {names}", err=True
            )
        if worse or unsure:
            sys.exit(1)
