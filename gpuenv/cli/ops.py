"""`gpuenv ops`: the operations files gpuenv ships (gpuenvd's systemd unit, the Slurm
prolog and epilog, the Prometheus rules, the Grafana dashboard), listed, printed or
installed. The work is gpuenv.ops's; this parses and prints.

Exit codes: 0 listed, printed, installed (or already there, the same); 2 an unknown
name, a file already there that differs (without --force), a directory missing or
read-only, a full disk; 4 no permission to write there (run as root). The rest:
gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

import click

from gpuenv import validate
from gpuenv.cli._common import checked, handle_errors
from gpuenv.ops import FILES, NAMES


@click.group("ops", invoke_without_command=True)
@click.pass_context
def ops(ctx: click.Context) -> None:
    """The operations files: gpuenvd's systemd unit, the Slurm prolog and epilog, the
    Prometheus rules and the Grafana dashboard, as this gpuenv ships them. Alone, it
    lists them.

    \b
      gpuenv ops list                       what there is, and where each goes
      gpuenv ops show unit                  print one
      sudo gpuenv ops install unit          install it where it goes
      sudo gpuenv ops install prolog epilog
      gpuenv ops install dashboard --dest /var/lib/grafana/dashboards
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_files)


@ops.command("list", short_help="Each file, where it goes, what it is for.")
@handle_errors
def list_files() -> None:
    """Each file: its name here, its name installed, where it goes, what it is."""
    from gpuenv.table import render

    rows = [[f.name, f.file, f.folder or "(--dest DIR)", f.what] for f in FILES.values()]
    for line in render(rows, header=["NAME", "FILE", "GOES TO", "WHAT"]):
        click.echo(line)


@ops.command("show", short_help="Print a file, as this gpuenv ships it.")
@click.argument("name", type=click.Choice(NAMES), metavar="NAME")
@handle_errors
def show(name: str) -> None:
    """Print NAME's file, as gpuenv ships it (gpuenv ops list names them)."""
    from gpuenv.ops import read

    click.echo(read(name).decode(), nl=False)


@ops.command("install", short_help="Install files where they go, or into --dest DIR.")
@click.argument("names", nargs=-1, required=True, type=click.Choice(NAMES), metavar="NAME...")
@click.option(
    "--dest",
    metavar="DIR",
    default=None,
    callback=checked("--dest", validate.path_like),
    help="The directory to write into (it must exist). Default: where each file goes "
    "(gpuenv ops list).",
)
@click.option("--force", is_flag=True, help="Replace a file already there that differs.")
@handle_errors
def install(names: tuple[str, ...], dest: str | None, force: bool) -> None:
    """Install each NAME's file, mode set (0755 for the Slurm scripts), never half a file.

    A file already there that differs is kept unless --force; one that is the same is
    left as it is. Each file's lines say what was done, and what to do next.
    """
    from gpuenv.ops import install as install_file

    for name in dict.fromkeys(names):
        done = install_file(name, dest, force=force)
        click.echo(f"{done.action} {done.path}\n  next: {done.then}")
        if done.note:
            click.echo(f"  note: {done.note}")
