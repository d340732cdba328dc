"""Fixtures for the tests of gpuenv/integrations/: a simulated H100 with a CUDA context."""

from __future__ import annotations

import pytest

from gpuenv.backend.sim import SimBackend


@pytest.fixture
def gpu(sim: SimBackend) -> SimBackend:
    """The simulated H100 on virtual time, with this process's context, rested 10 s."""
    sim.open_context(0)
    sim.idle(10.0)
    return sim
