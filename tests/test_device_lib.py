"""scripts/device-lib.sh, sourced by every script that runs on the lent GPU: GPUENV_READONLY=1
holds before anything in it can fail (a wheel install that fails under `set -e` must not
leave a later command, or the caller's EXIT trap, without the guard)."""

from __future__ import annotations

import subprocess
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "scripts" / "device-lib.sh"


def _source(tree: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    script = (
        "set -euo pipefail; trap 'echo \"guard=${GPUENV_READONLY:-unset}\"' EXIT; "
        f'cd "{tree}"; PATH="{bin_dir}:$PATH"; . "{LIB}"; echo sourced'
    )
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )


def test_the_guard_is_set_even_when_the_wheel_install_fails(tmp_path: Path):
    tree, bin_dir = tmp_path / "tree", tmp_path / "bin"
    (tree / ".whl").mkdir(parents=True)
    (tree / ".whl" / "x-1.0-py3-none-any.whl").write_bytes(b"")
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # pip fails, as an unpack or a bad wheel would
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    proc = _source(tree, bin_dir)
    assert proc.returncode == 3 and "sourced" not in proc.stdout  # set -e stopped it there
    assert "guard=1" in proc.stdout, proc.stdout + proc.stderr


def test_the_guard_is_set_without_wheels(tmp_path: Path):
    (tmp_path / "bin").mkdir()
    proc = _source(tmp_path, tmp_path / "bin")
    assert proc.returncode == 0 and "sourced" in proc.stdout and "guard=1" in proc.stdout
