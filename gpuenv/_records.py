"""JSON round trips for gpuenv's frozen record dataclasses.

Records hold only JSON-friendly values: numbers, strings, None, tuples (JSON
lists), dicts with string keys, and nested records. `from_dict` turns lists
back into tuples and ignores keys it does not know, so a newer file still loads
in an older gpuenv.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R", bound="JsonRecord")


_SCALARS = frozenset({int, float, str, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...]] = {}  # a record class's field names, looked up once


def _names(record: Any) -> tuple[str, ...]:
    """A record's field names, looked up once per class."""
    names = _FIELDS.get(type(record))
    if names is None:
        names = _FIELDS[type(record)] = tuple(f.name for f in dataclasses.fields(record))
    return names


def to_dict(record: Any, omit: str | None = None) -> dict[str, Any]:
    """A plain dict of a record's fields (but `omit`), nested records and tuples included."""
    names = _names(record)
    values = getattr(record, "__dict__", None)
    if values is None:  # a record with __slots__
        return {n: _plain(getattr(record, n)) for n in names if n != omit}
    return {n: v if type(v := values[n]) in _SCALARS else _plain(v) for n in names if n != omit}


def fields(record: Any, omit: str | None = None) -> dict[str, Any]:
    """A record's fields (but `omit`) as a dict, values as they are: with `json_default`,
    a JSON encoder writes what `to_dict` gives without building it first."""
    names = _names(record)
    values = getattr(record, "__dict__", None)
    if values is None:
        return {n: getattr(record, n) for n in names if n != omit}
    return {n: values[n] for n in names if n != omit}


def json_default(value: Any) -> Any:
    """`json.JSONEncoder(default=json_default)`: a record as its `fields` (but the one its
    `json_omit()` names), nested records in turn, any other Mapping as a dict; tuples and
    dicts the encoder writes itself, in C."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        omit = getattr(value, "json_omit", None)
        return fields(value, omit() if omit is not None else None)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _plain(value: Any) -> Any:
    # scalars first, by exact type: `gpuenv run` writes 10,000 measurements at its end,
    # and the generic checks below on each of their ~100 values cost seconds
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple or kind is list:
        return [v if type(v) in _SCALARS else _plain(v) for v in value]
    if kind is dict:
        return {str(k): v if type(v) in _SCALARS else _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """`cls`'s resolved field types, worked out once per class: typing.get_type_hints
    evaluates every annotation on each call (6 s of a 1,000-measurement file's 9 s load)."""
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Build `cls` from `data`: lists become tuples, records are rebuilt, unknown keys ignored."""
    return _builder(cls)(data)  # type: ignore[arg-type]


Revive = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


@functools.cache
def _builder(cls: type) -> Revive:
    """The constructor of `cls` from a dict, its fields' revivers worked out once: a 30 MB
    results file holds a million values, and reading each one's type hint again took
    most of its load."""
    hints = field_hints(cls)
    fields = [(f.name, _reviver(hints.get(f.name, Any))) for f in dataclasses.fields(cls)]

    def build(data: Mapping[str, Any]) -> Any:
        return cls(
            **{
                name: (None if (v := data[name]) is None else revive(v))
                for name, revive in fields
                if name in data
            }
        )

    return build


@functools.cache
def _reviver(hint: Any) -> Revive:
    """What `_revive` does for `hint`, as a function of the value (never None: its
    callers pass None through)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        record = next((a for a in args if dataclasses.is_dataclass(a)), None)
        tup = next((a for a in args if typing.get_origin(a) is tuple), None)
        if record is None and tup is None:
            return _same
        as_record = _builder(record) if record is not None else None  # type: ignore[arg-type]
        as_tuple = _reviver(tup) if tup is not None else None

        def union(value: Any) -> Any:
            if as_record is not None and isinstance(value, Mapping):
                return as_record(value)
            if as_tuple is not None and isinstance(value, list):
                return as_tuple(value)
            return value

        return union
    if dataclasses.is_dataclass(hint):
        build = _builder(hint)  # type: ignore[arg-type]
        return lambda value: build(value) if isinstance(value, Mapping) else value
    if origin is tuple:
        inner = _reviver(args[0] if args else Any)
        if inner is _same:
            return lambda value: tuple(value) if isinstance(value, (list, tuple)) else value
        return lambda value: (
            tuple(None if v is None else inner(v) for v in value)
            if isinstance(value, (list, tuple))
            else value
        )
    if origin is dict:
        inner = _reviver(args[1] if len(args) == 2 else Any)
        if inner is _same:
            return lambda value: dict(value) if isinstance(value, Mapping) else value
        return lambda value: (
            {k: None if v is None else inner(v) for k, v in value.items()}
            if isinstance(value, Mapping)
            else value
        )
    return _same


class JsonRecord:
    """The base of a frozen record dataclass: `record.to_dict()` and `Cls.from_dict(data)`,
    as the functions above."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        return from_dict(cls, data)
