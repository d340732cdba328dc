"""What every command shares: opening the backend, picking GPUs, printing errors."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from gpuenv.errors import ConfigError, FileError, GpuenvError

if TYPE_CHECKING:
    from gpuenv.backend import Backend
    from gpuenv.devices import OwnGpus

F = TypeVar("F", bound=Callable[..., Any])


def open_from_ctx(ctx: click.Context, *, readonly: bool | None = None):
    """Open the backend the global flags ask for (--sim, --dry-run, GPUENV_*)."""
    from gpuenv.backend import open_backend

    obj = ctx.find_root().obj or {}
    dry_run = bool(obj.get("dry_run"))
    return open_backend(obj.get("backend_kind"), readonly=readonly, dry_run=dry_run)


def is_dry_run(ctx: click.Context) -> bool:
    return bool((ctx.find_root().obj or {}).get("dry_run"))


GPU_HELP = (
    "GPUs: NVML indices, UUIDs or PCI bus ids, comma-separated; 'all'; "
    "'cuda:N' for a CUDA index (honours CUDA_VISIBLE_DEVICES); 'local' for LOCAL_RANK."
)
OWN = "auto"  # -i's default where a command takes this process's own GPUs
OWN_HELP = (
    " Default 'auto': this process's GPUs: torchrun's LOCAL_RANK's, else "
    "CUDA_VISIBLE_DEVICES', else Slurm's for the step, else all."
)


def gpu_option(default: str | None = "all", help: str = GPU_HELP) -> Callable[[F], F]:
    """`-i/--gpu 0,1|all|UUID|PCI bus id`, as nvidia-smi's -i but with lists: the one way
    every command that takes a GPU is told which. `default=OWN`: this process's own GPUs
    (`chosen_gpus`)."""
    return click.option(
        "-i",
        "--gpu",
        "gpu",
        default=default,
        show_default=default is not None,
        metavar="SEL",
        help=help + (OWN_HELP if default == OWN else ""),
    )


def chosen_gpus(backend: Backend, gpu: str) -> OwnGpus:
    """The GPUs `-i` names, and why (gpuenv.devices.OwnGpus): 'auto' is this process's own
    (gpuenv.devices.own_gpus), as every door takes them when none are named."""
    from gpuenv.devices import choose_gpus, own_env

    return choose_gpus(backend, None if gpu == OWN else gpu, env=own_env(os.environ), named="-i")


class AliasedOption(click.Option):
    """An option whose old spellings (`hidden_opts`) still work but are not shown in --help.

    One option with every spelling (not a second hidden option writing the same value):
    which of two options sets a value is up to the click version; one option has one value.
    """

    def __init__(self, *args: Any, hidden_opts: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hidden_opts = hidden_opts

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        saved = self.opts
        self.opts = [o for o in saved if o not in self.hidden_opts]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = saved


class NumbersAfterOptionalValues(click.Command):
    """A command whose options that may come alone (`-l` = every 5 s) still take a value
    that starts with a minus: click reads `-l -inf` as `-l` alone then `-i nf` (a GPU
    called "nf"), so a bad interval would be judged as a GPU name. A number right after
    such an option is its value, and is judged as one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        alone = {
            name
            for param in self.params
            if isinstance(param, click.Option) and param._flag_needs_value
            for name in param.opts
        }
        joined: list[str] = []
        rest = iter(args)
        for arg in rest:
            if arg == "--":
                joined += [arg, *rest]
                break
            value = next(rest, None) if arg in alone else None
            if value is None or not (value.startswith("-") and _is_number(value)):
                joined += [arg] if value is None else [arg, value]
                if value == "--":
                    joined += list(rest)
                    break
                continue
            # click hands back a value that starts with "-" even as `--loop=-inf` (it is
            # re-read as options): a leading space keeps it a value, and float() allows it
            joined += [arg, f" {value}"]
        return super().parse_args(ctx, joined)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def checked(
    name: str, check: Callable[..., Any] | None = None, **bounds: Any
) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that judges an option's value with gpuenv.validate (default: a
    finite number within `bounds`), in the flag's `name`: the rule the Python API uses, so
    the two cannot disagree. click's own FloatRange lets NaN through (every comparison
    with NaN is false) and inf past an open top."""
    from gpuenv import validate

    rule = check or validate.number

    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        return None if value is None else rule(value, name, **bounds)

    return callback


def lock_options(*, sm: str, mem: str, power_limit: str) -> Callable[[F], F]:
    """`--sm`, `--sm-max`, `--mem`, `--power-limit`: a lock request on the command line
    (`gpuenv lock`, `gpuenv run`), made into one `LockRequest` by `make_request` with
    `CLI_NAMES`. Each command says in its own words what they do (`sm`, `mem`, `power_limit`:
    the help)."""
    from gpuenv import validate

    options = [
        click.option("--sm", metavar="MHZ|MIN,MAX|max|base|sustained", help=sm),
        click.option(
            "--sm-max",
            type=int,
            metavar="MHZ",
            callback=checked("--sm-max", validate.integer, lo=1),
            help="Top of the SM range (with --sm MIN).",
        ),
        click.option("--mem", metavar="MHZ", help=mem),
        click.option(
            "--power-limit",
            type=float,
            metavar="W",
            callback=checked("--power-limit", lo=0, lo_open=True),
            help=power_limit,
        ),
    ]

    def decorate(fn: F) -> F:
        for option in reversed(options):  # as stacked decorators apply: the last first
            fn = option(fn)
        return fn

    return decorate


def interval_option(
    what: str, *, default: float | None = None, old: tuple[str, ...] = (), short: str = ""
) -> Callable[[F], F]:
    """`--interval SEC`: the one name of a sampling period in every command (nvitop's name;
    nvidia-smi's -l help says "second interval"). `what` ends "Seconds between ...";
    `old`: earlier spellings, still accepted, not shown; `short`: a letter (monitor's -d)."""
    from gpuenv import validate

    names = ([short] if short else []) + ["--interval", *old]
    return click.option(
        *names,
        "interval",
        cls=AliasedOption,
        hidden_opts=old,
        type=float,
        default=default,
        show_default=default is not None,
        metavar="SEC",
        help=f"Seconds between {what}.",
        callback=checked(short or "--interval", validate.display_interval),
    )


def handle_errors(fn: F) -> F:
    """Run a command under `guarded()` (also when a test invokes the command alone)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with guarded():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


_DONE: list[str] = []  # what a command did to the machine, once it is done (effect_done)


def effect_done(what: str) -> None:
    """Say that the command's effect happened (`what`: "the lock is taken ..."): should its
    report then fail to reach standard output (a full disk, a closed pipe), it still exits
    0, as what it was asked to do was done, and says so on stderr."""
    _DONE[:] = [what]


EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell shows for a writer whose reader left


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """The one place where a command's failure becomes one sentence and an exit code.

    GpuenvError prints as it is; an OSError becomes a FileError naming the path and
    what to do; text that is not UTF-8 becomes a ConfigError; Ctrl-C exits 130. Standard
    output is flushed inside, so a full disk or a closed pipe behind it is reported here
    rather than as a traceback at interpreter exit.
    """
    out = sys.stdout if isinstance(sys.stdout, _Stdout) else _Stdout(sys.stdout)
    saved, sys.stdout = sys.stdout, out
    if saved is not out:
        _DONE.clear()
    try:
        yield
        sys.stdout.flush()
    except GpuenvError as err:
        fail(err)
    except KeyboardInterrupt:
        _echo_err("gpuenv: interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except OSError as err:
        if out.error is None:
            fail(FileError.from_os_error(err, setting=_setting_for(err.filename)))
        _silence_stdout(out._stream)
        if _DONE:  # the effect happened: the exit code says so, stderr says what was lost
            _echo_err(
                f"gpuenv: {_DONE[0]}; its report could not be written to standard "
                f"output ({out.error.strerror or out.error})"
            )
            sys.exit(0)
        if isinstance(out.error, BrokenPipeError):
            sys.exit(EXIT_PIPE_CLOSED)  # the reader left (| head): nothing to say
        fail(
            GpuenvError(
                f"cannot write to standard output ({out.error.strerror or out.error})",
                hint="send it to a file on a disk with space, or to a pipe",
            )
        )
    except UnicodeDecodeError as err:
        fail(
            ConfigError(
                f"a file is not text (byte {err.object[err.start : err.start + 1]!r} at "
                f"offset {err.start})",
                hint="pass the text file the command asks for (results, config), not an image "
                "or archive",
            )
        )
    finally:
        sys.stdout = saved


class _Stdout:
    """sys.stdout, remembering the error a write or flush raised: whether it was stdout
    that failed is then known, not guessed from the errno."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _setting_for(path: Any) -> str | None:
    """The variable that moves `path`, when it is one of gpuenv's own places."""
    if not isinstance(path, str):
        return None
    from pathlib import Path

    from gpuenv.backend.sim_state import default_state_path
    from gpuenv.clocks.journal import default_state_dir

    journal = str(default_state_dir())
    sim = os.environ.get("GPUENV_SIM_STATE", "").strip() or str(default_state_path())
    if path == journal or path.startswith(journal + os.sep):
        return "GPUENV_STATE_DIR"
    if str(Path(path).parent) == str(Path(sim).parent) and Path(path).name.startswith(
        (Path(sim).name, f".{Path(sim).name}")
    ):
        return "GPUENV_SIM_STATE"
    return None


def fail(err: GpuenvError) -> NoReturn:
    """Print `err` as one line on stderr and exit with its code."""
    _echo_err(f"gpuenv: error: {err}")
    sys.exit(err.exit_code)


def _echo_err(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr itself gone: the code still tells
        click.echo(text, err=True)


def _silence_stdout(stream: Any) -> None:
    """Point fd 1 at /dev/null so the interpreter's own flush at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
