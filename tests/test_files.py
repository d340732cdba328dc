"""gpuenv/_files.py: files replaced whole, with the mode asked for."""

from __future__ import annotations

import os
from pathlib import Path

from gpuenv._files import open_dir, replace_at


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
