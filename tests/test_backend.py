"""The backend seam: code above gpuenv/backend/ asks the protocol, never the backend's name.

Everything above the seam gets a `Backend` and asks it for its `clock`,
`capabilities`, `workload` and `spec()`. These tests read the source of every
module above the seam (AST, not grep: comments and strings do not count) and
fail on a test of the backend's name, a `getattr` reaching for something the
protocol offers or a simulator's private part, or an import of pynvml or of the
NVML backend module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuenv
from gpuenv.backend import Backend, ReadOnlyBackend, open_backend
from gpuenv.errors import ConfigError

PACKAGE = Path(gpuenv.__file__).parent
BACKEND_NAMES = {"sim", "nvml"}
# Members of the protocol (or of one backend) that callers once fished for with getattr.
REACHED_FOR = {
    "clock",
    "run_work",
    "workload",
    "capabilities",
    "spec",
    "mig_parent_index",
    "inner",
    "root",
    "_state",
    "state_file",
    "profile",
    "seed",
}


def _above_the_seam() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "backend" not in p.relative_to(PACKAGE).parts)


def _is_name_read(node: ast.AST) -> bool:
    """`x.name` or `getattr(x, "name", ...)`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "name"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value == "name"
    )


def _backend_literals(node: ast.AST) -> set[str]:
    """The backend names a comparison's operand spells: "sim", or ("sim", "nvml")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & BACKEND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_backend_literals(e) for e in node.elts))
    return set()


def seam_violations(source: str, where: str) -> list[str]:
    """What in `source` reaches around the Backend protocol (one line each)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_is_name_read, operands)) and any(map(_backend_literals, operands)):
                found.append(f"{line}: tests a backend's name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if (
                node.func.id == "getattr"
                and len(args) >= 2
                and isinstance(args[1], ast.Constant)
                and args[1].value in REACHED_FOR
            ):
                found.append(f"{line}: getattr(..., {args[1].value!r}) reaches around the protocol")
            if (
                node.func.id in ("__import__", "import_module")
                and args
                and isinstance(args[0], ast.Constant)
                and str(args[0].value).split(".")[0] == "pynvml"
            ):
                found.append(f"{line}: imports pynvml")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            )
            if any(m.split(".")[0] == "pynvml" for m in modules):
                found.append(f"{line}: imports pynvml")
            elif any(m.startswith("gpuenv.backend.nvml") for m in modules):
                found.append(f"{line}: imports the NVML backend (open_backend is the door)")
    return found


def test_nothing_above_the_seam_tests_a_backend_name_or_reaches_around_it() -> None:
    found = []
    for path in _above_the_seam():
        found += seam_violations(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "the backend seam leaks:\n" + "\n".join(found)


def test_only_the_nvml_modules_import_pynvml() -> None:
    inside = sorted((PACKAGE / "backend").glob("*.py"))
    importers = {
        p.name
        for p in inside
        if any("imports pynvml" in v for v in seam_violations(p.read_text(), p.name))
    }
    assert importers and all(name.startswith("nvml") for name in importers), importers


@pytest.mark.parametrize(
    "source",
    [
        'if backend.name == "sim": pass',
        'simulated = "nvml" != self.backend.name',
        'if getattr(backend, "name", "") in ("sim", "nvml"): pass',
        'clock = getattr(backend, "clock", None)',
        'run = getattr(self.backend, "run_work", None)',
        'path = getattr(getattr(backend, "_state", None), "path", None)',
        "import pynvml",
        "from pynvml import nvmlInit",
        "nv = __import__('pynvml')",
        "from gpuenv.backend.nvml import NvmlBackend",
    ],
)
def test_the_seam_check_sees_each_kind_of_leak(source: str) -> None:
    assert seam_violations(source, "x.py")


@pytest.mark.parametrize(
    "source",
    [
        "if backend.capabilities.simulated: pass",
        'if self.name == "shared": pass',  # a scenario's name, not a backend's
        'record = {"backend": backend.name}',  # the name as an identity in a record
        "if entry.backend != backend.name: pass",
        'if kind == "sim": pass',  # the user's choice, before any backend exists
        "workload = backend.workload",
        'reason = getattr(backend, "reason", "read-only")',
    ],
)
def test_the_seam_check_lets_the_protocol_through(source: str) -> None:
    assert seam_violations(source, "x.py") == []


def test_open_backend_opens_the_simulator_by_spec_and_by_kind(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPUENV_SIM_STATE", str(tmp_path / "sim.json"))
    first = open_backend("sim")
    try:
        assert isinstance(first, Backend) and first.capabilities.simulated
        spec = first.spec()
        assert spec is not None and spec["kind"] == "sim"
        again = open_backend(spec=spec, readonly=True)
        assert isinstance(again, ReadOnlyBackend)
        assert again.spec() == {**spec, "readonly": "read-only"}
        assert again.device_info(0).uuid == first.device_info(0).uuid
        again.close()
    finally:
        first.close()


def test_open_backend_rejects_an_unknown_kind_with_what_to_use() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'tpu'") as err:
        open_backend("tpu")
    assert "sim" in (err.value.hint or "")
