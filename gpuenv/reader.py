"""The one reader for every file gpuenv reads: results JSONL, journal records, the
calibration store, the daemon's config, the simulated GPU's state.

Before anything is parsed a file is judged: it must be a regular file (a FIFO would
wait forever, /dev/zero or /dev/urandom would fill memory), no larger than a limit for
its kind, and text; after parsing, no deeper than MAX_DEPTH, and its records match
their dataclass (`check_record`: the field types, finite numbers). A file that fails
gets one sentence naming the file, the line and the field of the first bad value:

    results run.jsonl, line 7, field times_s[2]: nan is not a finite number
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import math
import os
import stat
import types
import typing
from collections.abc import Callable
from typing import Any

from gpuenv._records import field_hints
from gpuenv.errors import BadRecord as BadRecord  # defined in gpuenv.errors
from gpuenv.errors import ConfigError, FileError

MiB = 1 << 20
RESULTS_MAX_BYTES = 1024 * MiB  # results JSONL: a day of traces; 30 MB for 12,000 measurements
SMALL_MAX_BYTES = 16 * MiB  # a journal record, the calibration store, a config, sim state
MAX_DEPTH = 32  # gpuenv writes records 5 deep; 200,000 nested '[' stop here with a sentence

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def kind_of(mode: int) -> str | None:
    """What a file that is not a regular file is ("a FIFO (named pipe)"), or None."""
    return next((kind for test, kind in _KINDS if test(mode)), None)


def read_bytes(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = SMALL_MAX_BYTES,
    setting: str | None = None,
    missing_ok: bool = False,
    pipe_ok: bool = False,
) -> bytes | None:
    """The bytes of regular file `path`, at most `max_bytes`; None when it does not exist
    and `missing_ok`. `what` names the file for a person ("results", "the journal
    record"); `setting` the variable or option that moves it. `pipe_ok`: a shell's pipe
    is read too, once, to its end (`<(cat run.jsonl)`: /dev/fd/63), at most `max_bytes`;
    a named FIFO is still refused (with no writer it would wait forever)."""
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise FileError(path, errno.ENOENT, where=what, setting=setting) from None
    except OSError as err:
        raise FileError.from_os_error(err, path=path, where=what, setting=setting) from err
    try:
        st = os.fstat(fd)
        kind = kind_of(st.st_mode)
        if pipe_ok and stat.S_ISFIFO(st.st_mode) and _anonymous_pipe(fd):
            return _read_pipe(fd, path, what, max_bytes)
        if kind is not None:
            raise ConfigError(
                f"{what}: {os.fspath(path)} is {kind}, not a file",
                hint="pass a regular file" + (f" ({setting} says which)" if setting else ""),
            )
        if st.st_size > max_bytes:
            raise _too_big(what, path, st.st_size, max_bytes)
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # it grew while read
                raise _too_big(what, path, size, max_bytes)
        return b"".join(chunks)
    except OSError as err:
        raise FileError.from_os_error(err, path=path, where=what, setting=setting) from err
    finally:
        os.close(fd)


PIPE_WAIT_S = 30.0  # the longest a pipe may stay silent before its reader gives up


def _anonymous_pipe(fd: int) -> bool:
    """Whether `fd` is a pipe a process holds the other end of (a shell's process
    substitution), not a named FIFO on a filesystem that may have no writer at all."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:
        return False


def _read_pipe(fd: int, path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """A pipe read to its end, at most `max_bytes`, waiting at most PIPE_WAIT_S for each
    next chunk (a writer that stalls is named, never waited for forever)."""
    import select

    chunks, size = [], 0
    while True:
        if not select.select([fd], [], [], PIPE_WAIT_S)[0]:
            raise ConfigError(
                f"{what}: nothing came from the pipe {os.fspath(path)} in {PIPE_WAIT_S:.0f} s",
                hint="pass a file, or a pipe whose writer finishes",
            )
        try:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
        except BlockingIOError:  # readable, then taken: wait again
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise _too_big(what, path, size, max_bytes)
    return b"".join(chunks)


def _too_big(what: str, path: str | os.PathLike[str], size: int, limit: int) -> ConfigError:
    return ConfigError(
        f"{what}: {os.fspath(path)} is {size / MiB:.1f} MiB, over the {limit / MiB:.0f} MiB "
        f"gpuenv reads for it",
        hint="pass the file gpuenv wrote (split a results file with several runs by run_id)",
    )


def read_text(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = SMALL_MAX_BYTES,
    setting: str | None = None,
    missing_ok: bool = False,
    noun: str = "text",
    pipe_ok: bool = False,
) -> str | None:
    """`read_bytes`, decoded as UTF-8; a file that is not text is named with the offset
    (`noun`: what it is not, e.g. "a results file")."""
    data = read_bytes(
        path,
        what=what,
        max_bytes=max_bytes,
        setting=setting,
        missing_ok=missing_ok,
        pipe_ok=pipe_ok,
    )
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what}: {os.fspath(path)} is not {noun} "
            f"({'' if noun == 'text' else 'not text: '}byte {err.start} is not UTF-8)",
            hint="pass the text file itself, not an image or archive",
        ) from None


def parse_json(
    text: str | bytes, *, what: str, path: str | os.PathLike[str], line: int | None = None
) -> Any:
    """One JSON document (a file, or a line of JSONL), no deeper than MAX_DEPTH."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise BadRecord(what, path, f"nested deeper than {MAX_DEPTH} levels", line=line) from None
    except ValueError as err:  # JSONDecodeError, and bytes that are not UTF-8
        raise BadRecord(what, path, f"not JSON ({err})", line=line) from None
    field = _too_deep(doc)
    if field is not None:
        raise BadRecord(
            what, path, f"nested deeper than {MAX_DEPTH} levels", line=line, field=field
        )
    return doc


def _too_deep(doc: Any) -> str | None:
    """The path of a value deeper than MAX_DEPTH, or None (iterative: no recursion; only
    containers are visited, so a long list of numbers costs one isinstance each)."""
    stack: list[tuple[Any, int, str]] = [(doc, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            return where or "(top)"
        if isinstance(value, dict):
            stack += [
                (v, depth + 1, f"{where}.{k}" if where else str(k))
                for k, v in value.items()
                if isinstance(v, (dict, list))
            ]
        elif isinstance(value, list):
            stack += [
                (v, depth + 1, f"{where}[{i}]")
                for i, v in enumerate(value)
                if isinstance(v, (dict, list))
            ]
    return None


# -- record schema ------------------------------------------------------------------------


def check_record(
    cls: type,
    data: Any,
    *,
    what: str,
    path: str | os.PathLike[str],
    line: int | None = None,
    prefix: str = "",
    hint: str | None = None,
) -> None:
    """`data` can become a `cls` (a record dataclass): every field it has is of the field's
    type, numbers finite, nested records checked too; a missing field without a default is
    named. Unknown keys are ignored (a newer gpuenv's file still loads)."""
    problem = _check(cls, data, prefix)
    if problem is not None:
        field, why = problem
        raise BadRecord(what, path, why, line=line, field=field or None, hint=hint)


Problem = tuple[str, str] | None  # (where under the value: "", ".field", "[3]"; why)
Checker = Callable[[Any], Problem]


def _check(cls: type, data: Any, prefix: str) -> tuple[str, str] | None:
    problem = _record(cls)(data)
    if problem is None:
        return None
    where, why = problem
    return (f"{prefix}{where}" if prefix else where.lstrip(".")), why


def _ok(value: Any) -> Problem:
    return None


@functools.cache
def _checker(hint: Any) -> Checker:
    """The check of a value against `hint`, built once per type: a 30 MB results file
    holds a million values, and working the hint out again for each took most of its load."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return _ok
    if origin in (typing.Union, types.UnionType):
        return _union([_checker(a) for a in args if a is not type(None)], type(None) in args)
    if dataclasses.is_dataclass(hint):
        return _not_null(_record(hint))  # type: ignore[arg-type]
    if hint in _SCALARS:
        return _not_null(_SCALARS[hint])
    if origin is typing.Literal:
        # a vocabulary (a finding's kind, a verdict): checked as the type of its words, not
        # for membership, so a file keeps loading whatever words it was written with
        kinds: set[Any] = {type(a) for a in args}
        return _checker(kinds.pop()) if len(kinds) == 1 else _not_null(_ok)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _not_null(_items(_checker(args[0])))
        return _not_null(_fixed([_checker(a) for a in args]))
    if origin is dict:
        return _not_null(_values(_checker(args[1]) if len(args) == 2 else _ok))
    return _not_null(_ok)  # a type this checker does not know: its constructor judges it


def _not_null(check: Checker) -> Checker:
    def run(value: Any) -> Problem:
        return ("", "null where a value is needed") if value is None else check(value)

    return run


def _union(options: list[Checker], nullable: bool) -> Checker:
    def run(value: Any) -> Problem:
        if value is None and nullable:
            return None
        first = None
        for check in options:
            problem = check(value)
            if problem is None:
                return None
            first = first or problem
        return first

    return run


@functools.cache
def _record(cls: type) -> Checker:
    hints = field_hints(cls)
    missing = dataclasses.MISSING
    fields = [
        (
            f.name,
            f.default is missing and f.default_factory is missing,
            _checker(hints.get(f.name, Any)),
        )
        for f in dataclasses.fields(cls)
    ]

    def run(data: Any) -> Problem:
        if not isinstance(data, dict):
            return "", f"{_show(data)} is not a JSON object"
        for name, required, check in fields:
            if name not in data:
                if required:
                    return f".{name}", "missing"
                continue
            problem = check(data[name])
            if problem is not None:
                return f".{name}{problem[0]}", problem[1]
        return None

    return run


def _bool(value: Any) -> Problem:
    return None if isinstance(value, bool) else ("", f"{_show(value)} is not true/false")


def _int(value: Any) -> Problem:
    if isinstance(value, int) and not isinstance(value, bool):
        return None
    return "", f"{_show(value)} is not a whole number"


def _float(value: Any) -> Problem:
    if type(value) is float and math.isfinite(value):
        return None  # the common case, first
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if _finite(value) else ("", f"{_show(value)} is not a finite number")
    return "", f"{_show(value)} is not a number"


def _str(value: Any) -> Problem:
    return None if isinstance(value, str) else ("", f"{_show(value)} is not a string")


_SCALARS: dict[Any, Checker] = {bool: _bool, int: _int, float: _float, str: _str}


def _items(check: Checker) -> Checker:
    def run(value: Any) -> Problem:
        if not isinstance(value, list):
            return "", f"{_show(value)} is not a list"
        for i, v in enumerate(value):
            problem = check(v)
            if problem is not None:
                return f"[{i}]{problem[0]}", problem[1]
        return None

    return run


def _fixed(checks: list[Checker]) -> Checker:
    def run(value: Any) -> Problem:
        if not isinstance(value, list):
            return "", f"{_show(value)} is not a list"
        if len(value) != len(checks):
            return "", f"{_show(value)} does not have {len(checks)} items"
        for i, (check, v) in enumerate(zip(checks, value, strict=True)):
            problem = check(v)
            if problem is not None:
                return f"[{i}]{problem[0]}", problem[1]
        return None

    return run


def _values(check: Checker) -> Checker:
    def run(value: Any) -> Problem:
        if not isinstance(value, dict):
            return "", f"{_show(value)} is not a JSON object"
        for k, v in value.items():
            problem = check(v)
            if problem is not None:
                return f".{k}{problem[0]}", problem[1]
        return None

    return run


def check_series(data: Any, keys: tuple[str, ...], name: str) -> tuple[str, str] | None:
    """A telemetry trace ({"t0": s, "t_s": [...], "sm_mhz": [...], ...}): t0 and every
    listed series finite numbers (None allowed in a series: a gap), of equal length."""
    if not isinstance(data, dict):
        return name, f"{_show(data)} is not a JSON object"
    t0 = data.get("t0")
    if not isinstance(t0, (int, float)) or isinstance(t0, bool) or not _finite(t0):
        return f"{name}.t0", f"{_show(t0)} is not a finite number"
    length = None
    for key in keys:
        series = data.get(key)
        if series is None:
            continue
        if not isinstance(series, list):
            return f"{name}.{key}", f"{_show(series)} is not a list"
        if length is not None and len(series) != length:
            return f"{name}.{key}", f"has {len(series)} values, not {length} as t_s"
        length = len(series) if length is None else length
        for i, x in enumerate(series):
            if x is None and key != "t_s":
                continue
            ok = isinstance(x, (int, float)) and not isinstance(x, bool) and _finite(x)
            if not ok:
                return f"{name}.{key}[{i}]", f"{_show(x)} is not a finite number"
    return None


def _finite(x: float) -> bool:
    """A JSON number a float can hold: 10**400 (an int JSON allows) is not one."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _show(value: Any) -> str:
    if isinstance(value, (str, float, int, bool)) or value is None:
        text = json.dumps(value)
    else:
        text = "a list" if isinstance(value, list) else "an object"
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = [
    "MAX_DEPTH",
    "RESULTS_MAX_BYTES",
    "SMALL_MAX_BYTES",
    "BadRecord",
    "check_record",
    "check_series",
    "parse_json",
    "read_bytes",
    "read_text",
]
