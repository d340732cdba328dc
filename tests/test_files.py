"""gpuenv/_files.py: files replaced whole, with the mode asked for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuenv._files import create_temp, open_dir, replace_at


def test_a_replaced_file_has_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    # a job's report and a lock notice are for every account: a strict umask (root's in a
    # Slurm prolog, say) must not make them root's alone; no temp file is left behind
    old = os.umask(0o077)
    try:
        fd = open_dir(tmp_path, what="the test directory")
        try:
            replace_at(fd, "shared.json", b"{}", mode=0o644)
            replace_at(fd, "private.json", b"{}")
        finally:
            os.close(fd)
    finally:
        os.umask(old)
    assert (tmp_path / "shared.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["private.json", "shared.json"]


def test_a_temporary_file_it_cannot_make_is_named_by_its_directory(tmp_path: Path) -> None:
    """The random `.NAME.<hex>.tmp` says nothing of where: the error names the directory."""
    if os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(tmp_path)]).returncode != 0:
        pytest.skip("an immutable directory needs root and chattr")
    fd = open_dir(tmp_path, what="the test directory")
    try:
        with pytest.raises(PermissionError) as err:
            create_temp(fd, "state.json")
    finally:
        os.close(fd)
        subprocess.run(["chattr", "-i", str(tmp_path)], check=True)
    assert err.value.filename == str(tmp_path)
