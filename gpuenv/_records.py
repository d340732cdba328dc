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
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R", bound="JsonRecord")


def to_dict(record: Any) -> dict[str, Any]:
    """A plain dict of a record's fields, nested records and tuples included."""
    return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _plain(value: Any) -> Any:
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
    hints = field_hints(cls)  # type: ignore[arg-type]
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
