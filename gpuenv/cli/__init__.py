"""The `gpuenv` command: a thin click layer.

Each command lives in its own module under gpuenv/cli/ and is imported only
when it runs, so `gpuenv --help` and `gpuenv status` stay fast and never
import torch.

Exit codes (every command): gpuenv.errors.EXIT_CODES, docs/reference/exit-codes.md (nvidia-smi's
numbers where one fits: 2 bad argument, 3 not supported, 4 no permission, 9 no driver).
Every failure goes through `_common.guarded()`: one sentence on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import click

# command name -> (module under gpuenv.cli, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "status": ("status", "status", "Clocks, lock, power, temperature and active reasons per GPU."),
    "doctor": ("doctor", "doctor", "What in this environment will make benchmark numbers lie."),
    "demo": ("demo", "demo", "A short tour: why GPU numbers move, and what gpuenv does about it."),
    "lock": ("lock", "lock", "Lock GPU clocks; 'gpuenv restore' puts back what was there."),
    "restore": ("lock", "restore", "Put back exactly what was there before 'gpuenv lock'."),
    "unlock": ("lock", "restore", "Alias of 'restore'."),
    "monitor": ("monitor", "monitor", "Live view of clocks, power, temperature and reasons."),
    "run": ("run", "run", "Run a command under gpuenv: lock, sample, restore, report."),
    "calibrate": ("calibrate", "calibrate", "Find the clock a sustained load holds (to lock)."),
    "check": ("check", "check", "Run the same kernels on every GPU; name a slower one, and why."),
    "compare": ("compare", "compare", "Compare two runs, and whether the GPU was in one state."),
    "plot": ("plot", "plot", "Plot clocks, power and temperature of a run, with its regions."),
    "job": ("job", "job", "What a batch job's GPUs did, prolog to epilog (gpuenvd's record)."),
    "daemon": ("daemon", "daemon", "Privileged service: unprivileged users get clock-lock leases."),
    "ops": ("ops", "ops", "Print or install the systemd unit, Slurm scripts, alert rules."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _available(cmd_name):
            return None
        module = importlib.import_module(f"gpuenv.cli.{entry[0]}")
        command: click.Command = getattr(module, entry[1])
        if cmd_name == "unlock":
            command = click.Command(
                "unlock", params=list(command.params), callback=command.callback, help=entry[2]
            )
        _accept_global_flags(command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        from gpuenv.cli._common import guarded

        with guarded():
            return super().invoke(ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table, so --help imports no command module.
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _root_setter(key: str, setting: object) -> Callable[[click.Context, Any, bool], None]:
    """A flag's callback that sets what the group's own flag would have set."""

    def callback(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        obj = ctx.find_root().obj
        if value and obj is not None:
            obj[key] = setting

    return callback


def _accept_global_flags(command: click.Command) -> None:
    """`gpuenv status --sim` as `gpuenv --sim status`: the group's flags after the command too.

    Hidden, so each command's --help stays about the command. A command with its own
    --dry-run (lock, restore) keeps it; both mean the same.
    """
    have = {opt for p in command.params for opt in getattr(p, "opts", ())}
    for flag, callback in (
        ("--sim", _sim),
        ("--dry-run", _root_setter("dry_run", True)),
        ("--quiet", _quiet),
    ):
        if flag not in have:
            command.params.append(
                click.Option(
                    [flag], is_flag=True, expose_value=False, hidden=True, callback=callback
                )
            )


def _sim(ctx: click.Context, _param: click.Parameter | None, value: bool) -> None:
    """--sim is GPUENV_BACKEND=sim, for this command and every process it starts (what
    `gpuenv run` wraps, gpuenvd, a sampler process): one switch, one meaning."""
    obj = ctx.find_root().obj
    if value and obj is not None:
        import os

        os.environ["GPUENV_BACKEND"] = "sim"
        obj["backend_kind"] = "sim"


def _quiet(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """--quiet: no progress line (gpuenv.progress), here and in what this command starts."""
    if value:
        import os

        os.environ["GPUENV_QUIET"] = "1"


def _available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"gpuenv.cli.{COMMANDS[name][0]}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--sim",
    is_flag=True,
    help="Use the simulated GPU: the same as GPUENV_BACKEND=sim, for the command gpuenv "
    "runs too (gpuenv --sim run -- python bench.py).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Change nothing on any GPU: writes are refused and reported (like GPUENV_READONLY=1).",
)
@click.option(
    "--quiet",
    is_flag=True,
    expose_value=False,
    callback=_quiet,
    help="No progress line on stderr (like GPUENV_QUIET=1).",
)
@click.version_option(package_name="gpuenv")
@click.pass_context
def cli(ctx: click.Context, sim: bool, dry_run: bool) -> None:
    """gpuenv: GPU benchmark numbers you can trust.

    Locks clocks and puts back exactly what was there; samples NVML telemetry
    during every timed region and says when a warmup ramp, a power cap or
    thermal throttling touched a number.
    """
    ctx.ensure_object(dict)
    ctx.obj["backend_kind"] = None
    _sim(ctx, None, sim)
    ctx.obj["dry_run"] = dry_run


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """A Python warning on the command line: one line, as the errors are."""
    import contextlib
    import sys

    from gpuenv.progress import make_room

    make_room()  # a progress line on the terminal: the warning goes on a line of its own
    with contextlib.suppress(OSError, ValueError):
        print(f"gpuenv: warning: {message}", file=sys.stderr)


def main() -> None:
    """The console script: the group runs under `guarded()` too, so what click prints
    before any command runs (--help, --version, a usage error) into a full disk or a
    closed pipe is one sentence and an exit code, not a traceback."""
    import sys
    import warnings

    from gpuenv.cli._common import guarded

    warnings.showwarning = _show_warning
    code: Any = 0
    with guarded():
        try:
            cli(obj={})
        except SystemExit as done:  # click's own exit: flush inside guarded first
            code = done.code
    sys.exit(code)
