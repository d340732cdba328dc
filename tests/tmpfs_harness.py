"""A tmpfs of a test's own (root only): a disk that fills, a read-only place. Not a test
module: the mount and unmount that the fault tests share."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mount_tmpfs(mnt: Path, options: str) -> None:
    """Mount a tmpfs with `options` ("size=64k,ro") at the new directory `mnt`, or skip
    the test saying why (not root, or mounting is refused here)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")


def unmount(mnt: Path) -> None:
    """Unmount it, lazily where a file is still open on it."""
    if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs at the new directory `mnt` for the block, unmounted after (skips as
    mount_tmpfs does)."""
    mount_tmpfs(mnt, options)
    try:
        yield mnt
    finally:
        unmount(mnt)
