"""gpuenv.errors is the whole tree: every GpuenvError subclass is defined there (its
docstring draws them all), and a class moved there is still importable from the module
that raises it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import gpuenv
from gpuenv import errors

PACKAGE = Path(gpuenv.__file__).parent


def _base_names(node: ast.ClassDef) -> set[str]:
    """The names a class's bases end in (`errors.ConfigError` -> ConfigError)."""
    out = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            out.add(base.id)
        elif isinstance(base, ast.Attribute):
            out.add(base.attr)
    return out


def test_every_gpuenv_error_is_defined_in_errors_py():
    tree = {
        name
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.GpuenvError)
    }
    assert {"GpuenvError", "ConfigError", "BackendError", "MeasurementRejected"} <= tree
    classes = [
        (path.relative_to(PACKAGE).as_posix(), node)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "errors.py" or path.parent != PACKAGE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    outside = sorted(f"{where}: {node.name}" for where, node in classes if _base_names(node) & tree)
    assert not outside, f"define these in gpuenv/errors.py (and re-export them): {outside}"


def test_the_tree_in_the_docstring_names_every_error():
    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.GpuenvError):
            assert f" {name} " in errors.__doc__, f"{name} is not in errors.py's tree"


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("gpuenv._files", "UnsafePath"),
        ("gpuenv.reader", "BadRecord"),
        ("gpuenv.clocks.journal", "JournalDamaged"),
        ("gpuenv.clocks.restoring", "JournalNotUpdated"),
        ("gpuenv.run.runner", "CommandNotFound"),
        ("gpuenv.verdict", "MeasurementRejected"),
        ("gpuenv.verdict.records", "MeasurementRejected"),
        ("gpuenv.daemon.client", "DaemonUnavailable"),
        ("gpuenv.daemon.client", "DaemonNotTrusted"),
        ("gpuenv.daemon.protocol", "ProtocolError"),
    ],
)
def test_an_error_moved_to_errors_py_keeps_its_old_import_path(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)
