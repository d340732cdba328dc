"""The do_bench drop-in (gpuenv.integrations.triton) on the simulated GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.errors import ConfigError
from gpuenv.integrations import triton as gtriton


class TestDoBench:
    def test_returns_what_triton_returns(self, warm_sim):
        k = timing.sim_kernel(warm_sim, 0, seconds=1e-3)
        mean = gtriton.do_bench(k, backend=warm_sim)
        assert isinstance(mean, float) and mean == pytest.approx(1.0, rel=1e-3)  # ms
        med, lo, hi = gtriton.do_bench(k, quantiles=[0.5, 0.2, 0.8], backend=warm_sim)
        assert lo <= med <= hi
        assert isinstance(gtriton.do_bench(k, quantiles=[0.5], backend=warm_sim), float)
        times = gtriton.do_bench(k, return_mode="all", backend=warm_sim)
        # rep=100 ms of 1 ms calls (fewer once the sim's power cap slows the estimate's calls)
        assert isinstance(times, list) and 50 <= len(times) <= 101
        assert gtriton.do_bench(k, return_mode="min", backend=warm_sim) <= gtriton.do_bench(
            k, return_mode="max", backend=warm_sim)

    def test_keeps_the_measurement_with_telemetry(self, warm_sim):
        timing.sim_kernel(warm_sim, 0, seconds=20.0)()  # a hot, power-capped GPU
        gtriton.do_bench(timing.sim_kernel(warm_sim, 0, seconds=1e-3), backend=warm_sim, name="mm",
                         condition="none")  # measured hot, as it is: the cap is in the reps
        m = gtriton.last_measurement()
        assert m.name == "mm" and m.windows and m.telemetry is not None
        assert "power_cap" in {f.kind for f in m.findings}
        assert gtriton.measurements()[-1] is m

    def test_grad_to_none_is_cleared_every_rep(self, warm_sim):
        x = SimpleNamespace(grad=1.0)
        k = timing.sim_kernel(warm_sim, 0, seconds=1e-3)
        seen = []

        def fn():
            seen.append(x.grad)
            x.grad = 5.0
            k()

        gtriton.do_bench(fn, grad_to_none=[x], backend=warm_sim, rep=10)
        assert set(seen[1:]) == {None}

    def test_bad_return_mode(self, warm_sim):
        with pytest.raises(ConfigError, match="return_mode"):
            gtriton.do_bench(timing.sim_kernel(warm_sim, 0), return_mode="p99", backend=warm_sim)
