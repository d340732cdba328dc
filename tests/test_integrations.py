"""Integrations on the simulated GPU: pytest-benchmark plugin, torch adapter (the do_bench
drop-ins: tests/integrations/test_triton*.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.integrations import torch_benchmark
from gpuenv.telemetry import Sampler
from gpuenv.timebase import VirtualClock

pytest_plugins = ["pytester"]


@pytest.fixture
def sim() -> SimBackend:
    backend = SimBackend(clock=VirtualClock())
    backend.open_context(0)
    backend.idle(10.0)
    return backend


class TestTorchBenchmarkObserve:
    def test_metadata_gets_telemetry_and_findings(self, sim):
        fake = SimpleNamespace(metadata={"user": 1})
        kernel = timing.sim_kernel(sim, 0, seconds=0.5)

        def run():
            kernel()  # half a second of heavy load: the power cap engages
            return fake

        out = torch_benchmark._annotated(run, backend=sim)
        assert out is fake and out.metadata["user"] == 1
        rec = out.metadata["gpuenv"]
        assert rec["gpus"] == [0]
        assert rec["telemetry"][0]["sm_mhz_max"] == pytest.approx(1980)
        assert "power_cap" in {f["kind"] for f in rec["findings"]}
        assert rec["verdict"] == "annotated"
        json.dumps(rec)  # plain JSON values


class TestPytestPluginAnnotate:
    """`_annotate` on virtual time (the hook wiring is tested with pytester below)."""

    def state(self, sim, policy="annotate"):
        sampler = Sampler(sim, [0])
        sampler.start()
        from gpuenv.judge import read_facts

        return SimpleNamespace(sampler=sampler, backend=sim, gpus=[0], policy=policy,
                               facts=read_facts(sim, [0]))

    def fixture(self, data):
        return SimpleNamespace(extra_info={},
                               stats=SimpleNamespace(stats=SimpleNamespace(data=data)))

    def test_rounds_get_windows_and_findings(self, sim):
        from gpuenv.integrations.pytest_plugin import _annotate

        st = self.state(sim)
        kernel = timing.sim_kernel(sim, 0, seconds=0.05)
        t0 = st.sampler.mark()
        edges, data = [], []
        for _ in range(20):
            edges.append(sim.clock.now())
            data.append(kernel())
            edges.append(sim.clock.now())
        info = _annotate(st, self.fixture(data), t0, st.sampler.mark(), edges)
        assert info["rounds_sampled"] == 20
        assert info["telemetry"][0]["sm_mhz_min"] < 1980  # capped during the second
        assert "power_cap" in {f["kind"] for f in info["findings"]}
        assert info["verdict"] == "annotated"

    def test_reject_policy_rejects_rounds_shared_with_another_process(self, sim):
        from gpuenv.integrations.pytest_plugin import _annotate

        st = self.state(sim, policy="reject")
        sim.set_background_load(0, 0.5, pid=777)
        kernel = timing.sim_kernel(sim, 0, seconds=0.05, power_intensity=0.2)
        t0 = st.sampler.mark()
        edges, data = [], []
        for _ in range(5):
            edges.append(sim.clock.now())
            data.append(kernel())
            edges.append(sim.clock.now())
        info = _annotate(st, self.fixture(data), t0, st.sampler.mark(), edges)
        assert "other_process" in {f["kind"] for f in info["findings"]}
        assert info["verdict"] == "rejected"


INNER_TEST = """
import time

def test_sleep(benchmark):
    benchmark(time.sleep, 0.001)

def test_plain():
    assert True
"""


@pytest.fixture
def sim_env(monkeypatch):
    monkeypatch.setenv("GPUENV_BACKEND", "sim")


def plugin_args() -> list[str]:
    """`-p` the plugin unless the installed package registers it as a pytest11 entry point
    (loading it twice is an error)."""
    from importlib.metadata import entry_points

    registered = any(ep.value == "gpuenv.integrations.pytest_plugin"
                     for ep in entry_points(group="pytest11"))
    return [] if registered else ["-p", "gpuenv.integrations.pytest_plugin"]


def test_plugin_adds_extra_info_in_a_real_pytest_run(pytester, sim_env, tmp_path):
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(INNER_TEST)
    out_json = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--gpuenv", "--benchmark-max-time=0.05",
        "--benchmark-min-rounds=5", f"--benchmark-json={out_json}", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)
    data = json.loads(out_json.read_text())
    info = data["benchmarks"][0]["extra_info"]["gpuenv"]
    assert info["gpus"] == [0] and info["telemetry"][0]["sm_mhz_mean"] > 0
    assert info["verdict"] in ("ok", "annotated")
    assert info["rounds_sampled"] >= 5
    assert data["machine_info"]["gpuenv"]["gpus"][0]["name"]


def test_plugin_is_inert_without_the_flag_or_without_pytest_benchmark(pytester, sim_env):
    pytester.makepyfile("def test_plain():\n    assert True\n")
    with pytest.warns(UserWarning, match="pytest-benchmark is not installed"):
        result = pytester.runpytest_inprocess(*plugin_args(), "-p", "no:benchmark", "--gpuenv")
    result.assert_outcomes(passed=1)
    result = pytester.runpytest_inprocess(*plugin_args())
    result.assert_outcomes(passed=1)


def test_plugin_module_imports_nothing_heavy():
    code = (
        "import sys; import gpuenv.integrations.pytest_plugin; "
        "print(sorted(m for m in ('torch', 'pynvml', 'gpuenv.telemetry', 'gpuenv.backend') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
