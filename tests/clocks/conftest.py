"""Fixtures for the tests of gpuenv/clocks/: two simulated H100s and a journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.timebase import VirtualClock


@pytest.fixture
def sim() -> SimBackend:
    return SimBackend(n_gpus=2, clock=VirtualClock())


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal")
