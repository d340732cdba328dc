"""JSON round trips for gpuenv's frozen record dataclasses.

Records hold only JSON-friendly values: numbers, strings, None, tuples (JSON
lists), dicts with string keys, and nested records. `from_dict` turns lists
back into tuples and ignores keys it does not know, so a newer file still loads
in an older gpuenv.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R", bound="JsonRecord")


_SCALARS = frozenset({int, float, str, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...]] = {}  # a record class's field names, looked up once


def to_dict(record: Any, omit: str | None = None) -> dict[str, Any]:
    """A plain dict of a record's fields (but `omit`), nested records and tuples included."""
    cls = type(record)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(record))
    values = getattr(record, "__dict__", None)
    if values is None:  # a record with __slots__
        return {n: _plain(getattr(record, n)) for n in names if n != omit}
    return {n: v if type(v := values[n]) in _SCALARS else _plain(v)
            for n in names if n != omit}  # fmt: skip


def fields(record: Any, omit: str | None = None) -> dict[str, Any]:
    """A record's fields (but `omit`) as a dict, values as they are: with `json_default`,
    a JSON encoder writes what `to_dict` gives without building it first."""
    cls = type(record)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(record))
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


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Build `cls` from `data`: lists become tuples, records are rebuilt, unknown keys ignored."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _revive(hints.get(f.name, Any), data[f.name])
    return cls(**kwargs)


def _revive(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            if dataclasses.is_dataclass(arg) and isinstance(value, Mapping):
                return from_dict(arg, value)  # type: ignore[arg-type]
            if typing.get_origin(arg) is tuple and isinstance(value, list):
                return _revive(arg, value)
        return value
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return from_dict(hint, value)  # type: ignore[arg-type]
    if origin is tuple and isinstance(value, (list, tuple)):
        inner = args[0] if args else Any
        return tuple(_revive(inner, v) for v in value)
    if origin is dict and isinstance(value, Mapping):
        inner = args[1] if len(args) == 2 else Any
        return {k: _revive(inner, v) for k, v in value.items()}
    return value


class JsonRecord:
    """The base of a frozen record dataclass: `record.to_dict()` and `Cls.from_dict(data)`,
    as the functions above."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        return from_dict(cls, data)
