"""The pytest-benchmark plugin (gpuenv.integrations.pytest_plugin): `_annotate` on virtual
time, and the hooks in real pytest runs (pytester) on the simulated GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.telemetry import Sampler

pytest_plugins = ["pytester"]


class TestPytestPluginAnnotate:
    """`_annotate` on virtual time (the hook wiring is tested with pytester below)."""

    def state(self, warm_sim, policy="annotate"):
        sampler = Sampler(warm_sim, [0])
        sampler.start()
        from gpuenv.judge import read_facts

        return SimpleNamespace(sampler=sampler, backend=warm_sim, gpus=[0], policy=policy,
                               facts=read_facts(warm_sim, [0]))

    def fixture(self, data):
        return SimpleNamespace(extra_info={},
                               stats=SimpleNamespace(stats=SimpleNamespace(data=data)))

    def annotate(self, st, sim, kernel, rounds):
        """`rounds` calls of `kernel` with their edges, as the plugin times them, annotated."""
        from gpuenv.integrations.pytest_plugin import _annotate

        t0 = st.sampler.mark()
        edges, data = [], []
        for _ in range(rounds):
            edges.append(sim.clock.now())
            data.append(kernel())
            edges.append(sim.clock.now())
        return _annotate(st, self.fixture(data), t0, st.sampler.mark(), edges)

    def test_rounds_get_windows_and_findings(self, warm_sim):
        st = self.state(warm_sim)
        kernel = timing.sim_kernel(warm_sim, 0, seconds=0.05)
        info = self.annotate(st, warm_sim, kernel, 20)
        assert info["rounds_sampled"] == 20
        assert info["telemetry"][0]["sm_mhz_min"] < 1980  # capped during the second
        assert "power_cap" in {f["kind"] for f in info["findings"]}
        assert info["verdict"] == "annotated"

    def test_many_rounds_are_judged_in_blocks(self, warm_sim):
        """A benchmark of 10^5 tiny rounds must not cost a telemetry window per round: past
        MAX_JUDGED_ROUNDS, consecutive rounds are judged together (and the cap still shows)."""
        from gpuenv.integrations.pytest_plugin import MAX_JUDGED_ROUNDS

        st = self.state(warm_sim)
        n = 2 * MAX_JUDGED_ROUNDS + 1
        kernel = timing.sim_kernel(warm_sim, 0, seconds=0.002)
        info = self.annotate(st, warm_sim, kernel, n)
        assert info["rounds_sampled"] == n and info["rounds_per_block"] == 3
        assert "power_cap" in {f["kind"] for f in info["findings"]}
        assert max(r for f in info["findings"] for r in f["reps"]) < MAX_JUDGED_ROUNDS

    def test_reject_policy_rejects_rounds_shared_with_another_process(self, warm_sim):
        st = self.state(warm_sim, policy="reject")
        warm_sim.set_background_load(0, 0.5, pid=777)
        kernel = timing.sim_kernel(warm_sim, 0, seconds=0.05, power_intensity=0.2)
        info = self.annotate(st, warm_sim, kernel, 5)
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


def test_the_entry_point_registers_the_plugin():
    """`pip install gpuenv` is enough for `pytest --gpuenv`: no `-p` needed."""
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("gpuenv") == "gpuenv.integrations.pytest_plugin"
    out = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True,
                         text=True, check=True)
    assert "--gpuenv-sync" in out.stdout


def _saved(path):
    (found,) = path.rglob("*.json")
    return found


def test_compare_is_quiet_between_two_runs_and_names_a_driver_change(
        pytester, sim_env, tmp_path):
    """machine_info holds only what stays put: two runs in a row compare without pytest-
    benchmark's 'machine_info is different' warning; a changed driver is named by GPU."""
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(INNER_TEST)
    storage = pytester.path / "storage"  # inside the cwd: pytest-benchmark 5.x needs it
    common = [*plugin_args(), "--gpuenv", "--benchmark-max-time=0.02",
              "--benchmark-min-rounds=3", f"--benchmark-storage=file://{storage}",
              "-p", "no:cacheprovider"]
    pytester.runpytest_subprocess(*common, "--benchmark-save=first").assert_outcomes(passed=2)
    saved = json.loads(_saved(storage).read_text())
    info = saved["machine_info"]["gpuenv"]
    assert "time_utc" not in info and "sm_mhz" not in info["gpus"][0]
    assert info["gpus"][0]["lock"]["state"] == "none"
    result = pytester.runpytest_subprocess(*common, "--benchmark-compare=0001")
    result.assert_outcomes(passed=2)
    text = result.stdout.str() + result.stderr.str()
    assert "machine_info is different" not in text
    assert "gpuenv:" not in text

    saved["machine_info"]["gpuenv"]["driver_version"] = "1.0"
    saved["machine_info"]["gpuenv"]["gpus"][0]["lock"]["state"] = "locked"
    _saved(storage).write_text(json.dumps(saved))
    result = pytester.runpytest_subprocess(*common, "--benchmark-compare=0001")
    text = result.stdout.str() + result.stderr.str()
    assert "gpuenv: the GPUs are not in the state of the saved run" in text
    assert "driver 1.0 ->" in text and "GPU 0 lock:" in text


def test_changes_name_what_makes_runs_incomparable():
    from gpuenv.integrations.pytest_plugin import changes, steady

    gpu = {"index": 0, "name": "H100", "uuid": "GPU-1", "power_limit_w": 700.0,
           "lock": {"state": "none", "sm_mhz": None, "mem_mhz": None}, "sm_mhz": 1980}
    meta = {"driver_version": "580", "time_utc": "now", "gpus": [gpu]}
    a = steady(meta)
    assert "time_utc" not in a and "sm_mhz" not in a["gpus"][0]
    assert changes(a, steady({**meta, "time_utc": "later"})) == []
    locked = {**gpu, "power_limit_w": 600.0,
              "lock": {"state": "locked", "sm_mhz": [1350, 1350], "mem_mhz": None}}
    found = changes(a, steady({**meta, "gpus": [locked]}))
    assert [f.split(":")[0] for f in found] == ["GPU 0 lock", "GPU 0 power_limit_w"]
    assert changes(a, {**a, "gpus": [{**gpu, "index": 1}]}) == ["GPU 1 was not in the saved run"]


FAKE_TORCH = """
import sys, types

calls = []
cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                             synchronize=lambda device: calls.append(device))
sys.modules["torch"] = types.SimpleNamespace(cuda=cuda, __version__="fake")

def pytest_sessionfinish(session):
    import pathlib
    pathlib.Path("syncs.txt").write_text(" ".join(map(str, calls)))
"""



def test_sync_waits_for_every_device_at_each_round_edge(pytester, sim_env, tmp_path):
    """--gpuenv-sync calls torch.cuda.synchronize(d) for every device before each timer read
    (a fake torch, imported by the tests' conftest, counts the calls)."""
    pytest.importorskip("pytest_benchmark")
    pytester.makeconftest(FAKE_TORCH)
    pytester.makepyfile(INNER_TEST)
    out_json = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--gpuenv-sync", "--benchmark-max-time=0.02",
        "--benchmark-min-rounds=5", f"--benchmark-json={out_json}", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)
    devices = (pytester.path / "syncs.txt").read_text().split()
    info = json.loads(out_json.read_text())["benchmarks"][0]["extra_info"]["gpuenv"]
    rounds = info["rounds_sampled"]
    assert rounds >= 5  # --gpuenv-sync implies --gpuenv
    # both devices, at the start and the end of every round (and of each calibration run)
    assert devices[:4] == ["0", "1", "0", "1"] and len(devices) >= 2 * 2 * rounds


def test_sync_without_torch_warns_and_times_as_before(pytester, sim_env):
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(INNER_TEST)
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--gpuenv-sync", "--benchmark-max-time=0.02", "-p", "no:cacheprovider",
        "-W", "always",
    )
    result.assert_outcomes(passed=2)
    assert "--gpuenv-sync: not synchronizing (the tests have not imported torch)" in (
        result.stdout.str())
