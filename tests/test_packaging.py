"""gpuenv as the docs install it without a checkout: the wheel `python -m build` makes,
installed into a fresh virtual environment, run from outside the checkout. The
operations files travel in it (`gpuenv ops`), so a wheel alone sets up gpuenvd and Slurm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv import ops

ROOT = Path(__file__).resolve().parent.parent
# what a build reads: the wheel holds the package and its data, the metadata reads the rest
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "gpuenv")
# what pip says when no package index answers (not "No matching distribution found" alone:
# a misspelled dependency says that too, and must fail)
OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Could not fetch URL",
)

pytestmark = pytest.mark.slow


def _run(cmd: list[str], *, cwd: Path, why: str) -> subprocess.CompletedProcess[str]:
    """`cmd`, which must succeed; skipped, saying so, where it needs a package index that
    cannot be reached (build fetches setuptools, pip the dependencies)."""
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    said = [text[text.index(s) :].split("\n")[0] for s in OFFLINE if s in text]
    if out.returncode != 0 and said:
        pytest.skip(f"{why} needs a package index, and none answers ({said[0][:120]})")
    assert out.returncode == 0, f"{' '.join(cmd)}:\n{text}"
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with only the built wheel and its dependencies."""
    pytest.importorskip("build", reason="python -m build is not installed (pip install build)")
    tmp = tmp_path_factory.mktemp("wheel")
    # a copy, so the build's build/ and egg-info never land in the checkout or leak into it
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    dist = tmp / "dist"
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
        cwd=tmp,
        why="building the wheel",
    )
    (wheel,) = dist.glob("gpuenv-*-py3-none-any.whl")
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env / "bin" / "python"),
            "install",
            "-q",
            str(wheel),
        ],
        cwd=tmp,
        why="installing the wheel's dependencies",
    )
    return env


def _gpuenv(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin" / "gpuenv"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_wheel_runs_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gpuenv; print(gpuenv.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout's
    out = _gpuenv(venv, "--sim", "status", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H100" in out.stdout and "sim backend" in out.stdout


def test_the_installed_wheel_holds_every_operations_file(venv: Path, tmp_path: Path) -> None:
    for name in ops.NAMES:
        out = _gpuenv(venv, "ops", "show", name, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout == ops.read(name).decode(), name
    out = _gpuenv(venv, "ops", "install", "unit", "prolog", "--dest", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    prolog = tmp_path / "gpuenv-prolog.sh"
    assert prolog.read_bytes() == ops.read("prolog") and os.access(prolog, os.X_OK)


def test_the_wheel_carries_the_license_it_declares(venv: Path) -> None:
    """pyproject declares Apache-2.0: the wheel carries the full text, and its metadata
    names both the licence and the file."""
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"], text[:200]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    (info,) = venv.glob("lib/python*/site-packages/gpuenv-*.dist-info")
    assert (info / "licenses" / "LICENSE").read_text() == text
    metadata = (info / "METADATA").read_text().split("\n\n")[0].splitlines()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
