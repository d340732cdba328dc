"""The `>>>` examples in gpuenv's docstrings run, on the simulated GPU (GPUENV_BACKEND=sim):
an example that no longer runs is a broken promise to a reader (issue 30 item 8)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuenv"


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found() -> None:
    assert {"gpuenv.backend", "gpuenv.reasons", "gpuenv.timebase", "gpuenv.units"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    monkeypatch.setenv("GPUENV_SIM_STATE", "none")  # a fresh simulated GPU, in memory
    for var in ("GPUENV_SIM_PROFILE", "GPUENV_SIM_GPUS", "GPUENV_SIM_ROOT"):
        monkeypatch.delenv(var, raising=False)
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, report=True, verbose=False)
    assert result.attempted, f"{name} has '>>>' but doctest found no example in it"
    assert not result.failed, f"{result.failed} docstring example(s) of {name} failed"
