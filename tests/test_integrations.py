"""The do_bench drop-in (gpuenv.integrations.triton) on the simulated GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.integrations import triton as gtriton
from gpuenv.timebase import VirtualClock


@pytest.fixture
def sim() -> SimBackend:
    backend = SimBackend(clock=VirtualClock())
    backend.open_context(0)
    backend.idle(10.0)
    return backend


class TestDoBench:
    def test_returns_what_triton_returns(self, sim):
        k = timing.sim_kernel(sim, 0, seconds=1e-3)
        mean = gtriton.do_bench(k, backend=sim)
        assert isinstance(mean, float) and mean == pytest.approx(1.0, rel=1e-3)  # ms
        med, lo, hi = gtriton.do_bench(k, quantiles=[0.5, 0.2, 0.8], backend=sim)
        assert lo <= med <= hi
        assert isinstance(gtriton.do_bench(k, quantiles=[0.5], backend=sim), float)
        times = gtriton.do_bench(k, return_mode="all", backend=sim)
        # rep=100 ms of 1 ms calls (fewer once the sim's power cap slows the estimate's calls)
        assert isinstance(times, list) and 50 <= len(times) <= 101
        assert gtriton.do_bench(k, return_mode="min", backend=sim) <= gtriton.do_bench(
            k, return_mode="max", backend=sim)

    def test_keeps_the_measurement_with_telemetry(self, sim):
        timing.sim_kernel(sim, 0, seconds=20.0)()  # a hot, power-capped GPU
        gtriton.do_bench(timing.sim_kernel(sim, 0, seconds=1e-3), backend=sim, name="mm",
                         condition="none")  # measured hot, as it is: the cap is in the reps
        m = gtriton.last_measurement()
        assert m.name == "mm" and m.windows and m.telemetry is not None
        assert "power_cap" in {f.kind for f in m.findings}
        assert gtriton.measurements()[-1] is m

    def test_grad_to_none_is_cleared_every_rep(self, sim):
        x = SimpleNamespace(grad=1.0)
        k = timing.sim_kernel(sim, 0, seconds=1e-3)
        seen = []

        def fn():
            seen.append(x.grad)
            x.grad = 5.0
            k()

        gtriton.do_bench(fn, grad_to_none=[x], backend=sim, rep=10)
        assert set(seen[1:]) == {None}

    def test_bad_return_mode(self, sim):
        with pytest.raises(ConfigError, match="return_mode"):
            gtriton.do_bench(timing.sim_kernel(sim, 0), return_mode="p99", backend=sim)
