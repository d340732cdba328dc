"""The public API's docstrings (gpuenv.__all__) say what each argument is, what comes back
and what is raised, in the Google style the API reference parses (mkdocs.yml's
mkdocstrings: `docstring_style: google`): an `Args:` (or, for a record, `Attributes:`)
entry for every parameter as the source writes it, and `Returns:` where one comes back."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Protocol

import pytest

import gpuenv

SECTION = re.compile(r"^(\w[\w ]*):\s*$")


def sections(doc: str | None) -> dict[str, list[str]]:
    """A Google-style docstring's sections: each one's entry names (`name:` lines one
    level in; `*args` and `**kwargs` keep their stars)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in inspect.cleandoc(doc or "").splitlines():
        head = SECTION.match(line)
        if head:
            current = out.setdefault(head.group(1), [])
        elif current is not None and line and not line.startswith(" "):
            current = None  # back to plain text
        elif current is not None:
            entry = re.match(r"^    (\*{0,2}\w+)( \([^)]*\))?:", line)
            if entry:
                current.append(entry.group(1))
    return out


def _source_parameters(fn: Any) -> list[str]:
    """The parameters as the source writes them (what the API reference shows), not a
    `__signature__` given at import."""
    code = fn.__code__
    names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    k = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        names.append("*" + code.co_varnames[k])
        k += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        names.append("**" + code.co_varnames[k])
    return [n for n in names if n not in ("self", "cls")]


def _public() -> list[tuple[str, Any]]:
    return [(name, getattr(gpuenv, name)) for name in gpuenv.__all__]


@pytest.mark.parametrize(("name", "obj"), _public(), ids=[n for n, _ in _public()])
def test_each_public_name_documents_its_arguments(name: str, obj: Any) -> None:
    found = sections(obj.__doc__)
    if inspect.isclass(obj):
        if Protocol in getattr(obj, "__mro__", ()) or getattr(obj, "_is_protocol", False):
            assert obj.__doc__, f"{name} has no docstring"
            return  # a protocol is implemented, never constructed
        init = obj.__init__
        params = (
            [f.name for f in dataclasses.fields(obj) if f.init]
            if dataclasses.is_dataclass(obj)
            else _source_parameters(init)
        )
        documented = found.get("Args", []) + found.get("Attributes", [])
    else:
        params = _source_parameters(obj)
        documented = found.get("Args", [])
        returns = inspect.signature(obj).return_annotation
        if returns not in (None, "None"):
            assert "Returns" in found, f"{name}'s docstring has no Returns: section"
    missing = [p for p in params if p not in documented]
    assert not missing, f"{name}'s docstring does not document {missing}"
    extra = [d for d in documented if d not in params and not d.startswith("*")]
    if not dataclasses.is_dataclass(obj):
        assert not extra, f"{name}'s docstring documents {extra}, which it does not take"


def test_stable_takes_and_documents_sessions_parameters() -> None:
    """`stable(*args, **kwargs)` hands them to `Session`, whose docstring says each."""
    from gpuenv.session import Session

    documented = sections(Session.__doc__)["Args"]
    assert list(inspect.signature(gpuenv.stable).parameters) == documented
    assert sections(gpuenv.stable.__doc__)["Args"] == ["*args", "**kwargs"]


def test_the_section_reader_reads_what_the_reference_parses() -> None:
    doc = """One line.

    Args:
        a: the first.
        *rest: more,
            on two lines.
        b (int): typed.

    Returns:
        Something.

    Text again, not a section's.
        c: not an entry.
    """
    assert sections(doc) == {"Args": ["a", "*rest", "b"], "Returns": []}
    assert _source_parameters(lambda x, *ys, z=1, **kw: None) == ["x", "z", "*ys", "**kw"]
