"""One validation layer: every argument of the Python API and every CLI option is judged
here, at the door, before anything runs or changes.

Each check takes the value and the *name the caller knows it by*: the Python API passes
the parameter's name (`budget_s`), the CLI its flag (`--interval`), so the two use the
same rule and cannot disagree, and a Python error never names a flag. A bad value is a
`ConfigError` (also a ValueError) that names the parameter, says what it must be and
shows what it got:

    number(x, "budget_s", lo=0, lo_open=True)  # ConfigError: budget_s must be a finite
                                               # number > 0, not nan

A check returns the value normalised (an integral float asked for as an int becomes an
int), so a caller can write `reps = integer(reps, "reps", lo=1)`.
"""

from __future__ import annotations

import errno
import inspect
import math
import numbers
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuenv.errors import ConfigError, FileError

_SHOW = 60  # characters of a bad value shown in a message


def shown(value: Any) -> str:
    """A bad value as a message shows it: its repr, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _bounds(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {_num(lo)}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {_num(hi)}")
    return " and ".join(parts)


def number(
    value: Any,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    unit: str = "",
    hint: str | None = None,
) -> float:
    """A finite real number (not a bool, not a string) within the bounds; returned as float.

    Text that spells a number is refused too: a Python caller passing '1.5' has a bug
    that the CLI's own parsing (which converts before calling) never has."""
    what = f"a finite number{f' of {unit}' if unit else ''}"
    rng = _bounds(lo, hi, lo_open, hi_open)
    if rng:
        what += f" {rng}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be {what}, not {shown(value)}", hint=hint)
    try:
        x = float(value)
    except (OverflowError, ValueError):
        raise ConfigError(f"{name} must be {what}, not {shown(value)}", hint=hint) from None
    bad = not math.isfinite(x)
    bad = bad or (lo is not None and (x < lo or (lo_open and x == lo)))
    bad = bad or (hi is not None and (x > hi or (hi_open and x == hi)))
    if bad:
        raise ConfigError(f"{name} must be {what}, not {shown(value)}", hint=hint)
    return x


def fraction(value: Any, name: str) -> float:
    """A relative change as a fraction in [0, 1] (0.05 = 5%): a number above 1 is refused,
    as a percentage written where a fraction is read ('5' meant 5%, and would read 500%)."""
    x = number(value, name, lo=0, hint="a fraction: 0.05 = 5%")
    if x > 1:
        raise ConfigError(
            f"{name} {_num(x)} reads as {x:.0%}: it takes a fraction, not a percentage",
            hint=f"0.05 = 5%: for {_num(x)}%, give {name} {_num(x / 100)}",
        )
    return x


def integer(
    value: Any,
    name: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    hint: str | None = None,
) -> int:
    """A whole number (an int, or a float with no fraction) within [lo, hi]; returned as int."""
    what = "a whole number"
    rng = _bounds(lo, hi, False, False)
    if rng:
        what += f" {rng}"
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if ok:
        try:  # 10**400 is an int, but no count gpuenv could ever reach: refused as inf is
            x = float(value)
        except OverflowError:
            x = math.inf
        ok = math.isfinite(x) and x.is_integer()
    if not ok:
        raise ConfigError(f"{name} must be {what}, not {shown(value)}", hint=hint)
    n = int(value)
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise ConfigError(f"{name} must be {what}, not {shown(value)}", hint=hint)
    return n


def boolean(value: Any, name: str) -> bool:
    """True or False (not 'yes', not 1): a string is truthy, so 'no' would mean yes."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, not {shown(value)}")
    return value


def choice(value: Any, name: str, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise ConfigError(
            f"{name} must be one of {', '.join(map(repr, options))}, not {shown(value)}"
        )
    return value


def text(value: Any, name: str, *, empty: bool = False) -> str:
    """A string (a name, a label); an empty one only when `empty`."""
    if not isinstance(value, str) or (not empty and not value.strip()):
        what = "a string" if empty else "a non-empty string"
        raise ConfigError(f"{name} must be {what}, not {shown(value)}")
    return value


def instance(value: Any, name: str, cls: type | tuple[type, ...], what: str) -> Any:
    """`value` is a `cls` (e.g. config must be a BenchConfig); `what` names it for a person."""
    if not isinstance(value, cls):
        raise ConfigError(f"{name} must be {what}, not {shown(value)}")
    return value


def gpu_selector(value: Any, name: str) -> Any:
    """A GPU selector's shape (devices.select_gpus judges what it names): None, a string
    ('all', '0,1', a UUID, a bus id, 'cuda:0'), an index, or a list or tuple of those."""

    def one(x: Any) -> bool:
        return isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool))

    if value is None or one(value):
        return value
    if isinstance(value, (list, tuple)) and all(one(x) for x in value):
        return value
    raise ConfigError(
        f"{name} must be 'all', a GPU index, a UUID or a list of them, not {shown(value)}",
        hint="e.g. gpus=0, gpus=[0, 1], gpus='0,1' or gpus='GPU-5d3c...'",
    )


def path_like(value: Any, name: str) -> str | None:
    """A file system path (a string or os.PathLike, not empty), or None: returned as str."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
    raise ConfigError(f"{name} must be a path (a non-empty string), not {shown(value)}")


def grads(value: Any, name: str) -> list[Any]:
    """Tensors whose .grad gpuenv clears (triton's grad_to_none): None or a list of them."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)) and all(hasattr(x, "grad") for x in value):
        return list(value)
    raise ConfigError(
        f"{name} must be a list of tensors (each with a .grad), not {shown(value)}",
        hint="e.g. grad_to_none=[x, w]",
    )


def no_arg_callable(fn: Any, name: str) -> Callable[[], Any]:
    """A function gpuenv can call with no arguments (wrap others: lambda: f(x, y))."""
    if not callable(fn):
        raise ConfigError(
            f"{name} must be a function to call, not {shown(fn)}",
            hint="pass the function itself (fn, not fn()); wrap one that takes arguments: "
            "lambda: f(x, y)",
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without a signature: trust it
        return fn
    try:
        sig.bind()
    except TypeError:
        needed = [
            p.name
            for p in sig.parameters.values()
            if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise ConfigError(
            f"{name} {getattr(fn, '__name__', shown(fn))} needs arguments "
            f"({', '.join(needed)}); gpuenv calls it with none",
            hint="wrap it: lambda: f(x, y)",
        ) from None
    return fn


def candidates(value: Any, name: str) -> dict[str, Callable[[], Any]]:
    """A non-empty mapping of names (non-empty strings) to functions gpuenv can call with
    no arguments: what gpuenv.rank ranks. Returned as a dict in the order given."""
    from collections.abc import Mapping

    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name} must be a dict of names to functions, not {shown(value)}",
            hint='e.g. {"bm128": lambda: k128(a, b), "bm256": lambda: k256(a, b)}',
        )
    if not value:
        raise ConfigError(f"{name} is empty: there is nothing to rank", hint="pass at least one")
    out: dict[str, Callable[[], Any]] = {}
    for key, fn in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"{name} must be named by non-empty strings, not {shown(key)}",
                hint="name each candidate: str(config) will do",
            )
        out[key] = no_arg_callable(fn, f"{name}[{key!r}]")
    return out


def ordered(lo_name: str, lo: float | None, hi_name: str, hi: float | None) -> None:
    """`lo` <= `hi` when both are given (min_reps <= max_reps)."""
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(f"{lo_name} ({lo:g}) must not be above {hi_name} ({hi:g})")


def quantiles(value: Any, name: str = "quantiles") -> list[float] | float | None:
    """None, one quantile, or a list of them, each a finite number in [0, 1]."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return number(value, name, lo=0, hi=1)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(
            f"{name} must be a list of numbers in [0, 1] (or one), not {shown(value)}"
        )
    return [number(q, f"{name}[{i}]", lo=0, hi=1) for i, q in enumerate(value)]


def output_path(
    path: Any, name: str, *, mkdir: bool = False, where: str | None = None
) -> Path | None:
    """A file to write: a non-empty path whose directory exists (gpuenv creates no
    directory it was not asked for; `mkdir=True` asks). None passes as None. `where`
    starts a file error's sentence (default: `name`)."""
    where = where or name
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{name} must be a file path, not {shown(path)}")
    text_path = os.fspath(path)
    if not isinstance(text_path, str) or not text_path.strip():
        raise ConfigError(
            f"{name} must be a file path, not {shown(path)}",
            hint="give a file name, e.g. run.jsonl",
        )
    p = Path(text_path)
    folder = p.parent
    if os.path.isdir(text_path):
        raise FileError(p, errno.EISDIR, where=where)
    if mkdir:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise FileError.from_os_error(err, path=folder, where=where) from err
    elif not folder.is_dir():
        missing = FileError(
            folder, errno.ENOENT if not folder.exists() else errno.ENOTDIR, where=where
        )
        if not folder.exists():
            missing.hint = f"create it first (mkdir -p {folder}) or pick another path"
        raise missing
    return p


def results_path(
    path: Any, name: str, *, append: bool, mkdir: bool = False, where: str | None = None
) -> Path | None:
    """A results file to write, one run per file: `output_path`'s checks, and a file that
    already holds something is refused unless `append` (the CLI's --append): two runs in
    one file were pooled by readers that could not tell them apart."""
    boolean(append, "--append" if name.startswith("-") else "append")
    p = output_path(path, name, mkdir=mkdir, where=where)
    if p is None or append:
        return p
    try:
        size = p.stat().st_size
    except OSError:  # not there yet (or unreadable: the write says so)
        return p
    if size and p.is_file():
        flag = "--append" if name.startswith("-") else "append=True"
        raise ConfigError(
            f"{p} already holds results: {name} writes one run per file",
            hint=f"write another file or remove this one; {flag} adds this run beside the "
            "ones there (a reader then takes the last and says the file holds several)",
        )
    return p


# A telemetry sample at least this often: a region is judged on its samples, and a burst
# waits for them (stable(period=1e9) waited its whole 30 s timeout, then blamed the GPU).
MAX_SAMPLE_PERIOD_S = 10.0
# A display loop (status -l, monitor -d) at least once a day: inf or 1e309 overflowed a
# timer, NaN busy-looped.
MAX_DISPLAY_INTERVAL_S = 86400.0
# a view faster than this only burns a core: NVML's readings change every ~100 ms, and
# nvidia-smi's fastest loop (-lms) is given in whole milliseconds
MIN_DISPLAY_INTERVAL_S = 0.01


def sample_period(value: Any, name: str) -> float:
    """Seconds between telemetry samples: stable(period=), run --interval."""
    return number(value, name, lo=0, hi=MAX_SAMPLE_PERIOD_S, lo_open=True, unit="seconds")


def display_interval(value: Any, name: str) -> float:
    """Seconds between updates of a view: status -l, monitor -d, daemon --interval."""
    return number(value, name, lo=MIN_DISPLAY_INTERVAL_S, hi=MAX_DISPLAY_INTERVAL_S, unit="seconds")


def env_number(
    var: str,
    default: float,
    *,
    lo: float | None = None,
    hi: float | None = None,
    environ: Any = None,
) -> float:
    """A number from environment variable `var` (unset or empty: `default`); text that is
    not a finite number in range is refused naming the variable, never silently replaced."""
    env = os.environ if environ is None else environ
    raw = env.get(var, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    try:
        return number(value, var, lo=lo, hi=hi)
    except ConfigError as err:
        rng = _bounds(lo, hi, False, False)
        raise ConfigError(
            f"{var} must be a finite number{' ' + rng if rng else ''}, not {shown(raw)}",
            hint=f"unset it for the default ({default:g})",
        ) from err


__all__ = [
    "boolean",
    "candidates",
    "choice",
    "display_interval",
    "env_number",
    "instance",
    "integer",
    "no_arg_callable",
    "number",
    "ordered",
    "output_path",
    "quantiles",
    "sample_period",
    "shown",
    "text",
]
