"""Fixtures for the tests of gpuenv/doctor/: two simulated H100s and a quiet host."""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.helpers import make_sysfs
from gpuenv.doctor import Host


@pytest.fixture
def quiet_host(tmp_path: Path) -> Host:
    """A host with nothing wrong: root, performance governor, no turbo, idle, clean env."""
    return Host(
        euid=0,
        pid=1,
        env={},
        sysfs=make_sysfs(tmp_path / "sys", ["performance"] * 4),
        socket=str(tmp_path / "none.sock"),
        cpu_count=4,
        loadavg=(0.1, 0.1, 0.1),
    )
