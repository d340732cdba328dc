"""The pytest-benchmark plugin (gpuenv.integrations.pytest_plugin): `_annotate` on virtual
time, and the hooks in real pytest runs (pytester) on the simulated GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.reasons import Reason
from gpuenv.telemetry import Sampler

pytest_plugins = ["pytester"]


class TestPytestPluginAnnotate:
    """`_annotate` on virtual time (the hook wiring is tested with pytester below)."""

    def state(self, warm_sim, policy="annotate"):
        sampler = Sampler(warm_sim, [0])
        sampler.start()
        from gpuenv.judge import read_facts

        return SimpleNamespace(
            sampler=sampler,
            backend=warm_sim,
            gpus=[0],
            policy=policy,
            facts=read_facts(warm_sim, [0]),
        )

    def fixture(self, data):
        return SimpleNamespace(
            extra_info={}, stats=SimpleNamespace(stats=SimpleNamespace(data=data))
        )

    def annotate(self, st, sim, rounds, per_round=None):
        """`rounds` rounds (`per_round()` each, or the next of `rounds` seconds of idle
        virtual time when `rounds` is a list) with their edges, as the plugin records them:
        each round's end and duration."""
        from gpuenv.integrations.pytest_plugin import _annotate

        t0 = st.sampler.mark()
        spans, data = [], []
        for r in rounds if isinstance(rounds, list) else range(rounds):
            start = sim.clock.now()
            if per_round is None:
                sim.clock.sleep(r)
            else:
                per_round()
            spans.append((start, sim.clock.now()))
            data.append(spans[-1][1] - start)
        return _annotate(st, self.fixture(data), t0, st.sampler.mark(), spans, data)

    def test_rounds_get_windows_and_findings(self, warm_sim):
        st = self.state(warm_sim)
        kernel = timing.sim_kernel(warm_sim, 0, seconds=0.05)
        info = self.annotate(st, warm_sim, 20, kernel)
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
        info = self.annotate(st, warm_sim, n, kernel)
        assert info["rounds_sampled"] == n and info["rounds_per_block"] == 3
        assert "power_cap" in {f["kind"] for f in info["findings"]}
        assert max(r for f in info["findings"] for r in f["reps"]) < MAX_JUDGED_ROUNDS

    def test_reject_policy_rejects_rounds_shared_with_another_process(self, warm_sim):
        st = self.state(warm_sim, policy="reject")
        warm_sim.set_background_load(0, 0.5, pid=777)
        kernel = timing.sim_kernel(warm_sim, 0, seconds=0.05, power_intensity=0.2)
        info = self.annotate(st, warm_sim, 5, kernel)
        assert "other_process" in {f["kind"] for f in info["findings"]}
        assert info["verdict"] == "rejected"

    def test_cpu_only_rounds_on_an_idle_gpu_are_no_gpu_work_not_warmup(self, sim):
        """A CPU-only benchmark whose first rounds are slow (caches, the interpreter) on a GPU
        that stayed idle: judged 'no GPU work', never 'GPU 0 was still warming up'."""
        st = self.state(sim)
        info = self.annotate(st, sim, [0.01] * 4 + [0.001] * 20)
        assert info["gpu_work"] is False
        assert info["findings"] == [] and info["verdict"] == "ok"

    def test_warmup_findings_speak_pytest_benchmarks_language(self, sim):
        """Rounds of GPU work that start cold: the finding counts rounds and points to
        pytest-benchmark's warm-up options, not to gpuenv.bench."""
        st = self.state(sim)
        info = self.annotate(st, sim, 12, timing.sim_kernel(sim, 0, seconds=0.002))
        assert info["gpu_work"] is True
        (f,) = [f for f in info["findings"] if f["kind"] == "warmup_ramp"]
        assert "gpuenv.bench" not in f["message"] and " rep" not in f["message"]
        assert "round" in f["message"]
        for option in (
            "--benchmark-warmup=on",
            "--benchmark-warmup-iterations",
            "warmup_iterations=",
            "warmup_rounds=",
        ):
            assert option in f["message"]

    def test_slow_first_rounds_on_a_steady_gpu_are_not_called_the_gpus_warmup(self, warm_sim):
        """A GPU with a context (at its boost clock, no GpuIdle) and slow first rounds from
        the code: the finding says whose warm-up it is, not 'GPU 0 was still warming up'."""
        st = self.state(warm_sim)
        info = self.annotate(st, warm_sim, [0.01] * 4 + [0.001] * 20)
        (f,) = info["findings"]
        assert f["kind"] == "warmup_ramp" and "still warming up" not in f["message"]
        assert f["message"].startswith("the first 4 rounds were up to")
        assert "not the GPU's clock" in f["message"]


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

    registered = any(
        ep.value == "gpuenv.integrations.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    return [] if registered else ["-p", "gpuenv.integrations.pytest_plugin"]


def _benchmark_json(pytester, tmp_path):
    """INNER_TEST under `pytest --gpuenv` in its own process: pytest-benchmark's JSON."""
    pytester.makepyfile(INNER_TEST)
    out_json = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess(
        *plugin_args(),
        "--gpuenv",
        "--benchmark-max-time=0.05",
        "--benchmark-min-rounds=5",
        f"--benchmark-json={out_json}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)
    return json.loads(out_json.read_text())


def test_plugin_adds_extra_info_in_a_real_pytest_run(pytester, sim_env, tmp_path):
    pytest.importorskip("pytest_benchmark")
    data = _benchmark_json(pytester, tmp_path)
    info = data["benchmarks"][0]["extra_info"]["gpuenv"]
    assert info["gpus"] == [0] and info["telemetry"][0]["sm_mhz_mean"] > 0
    assert info["verdict"] in ("ok", "annotated")
    # every timed round, recorded at pytest-benchmark's stats update (outside the round)
    assert info["rounds_sampled"] == data["benchmarks"][0]["stats"]["rounds"] >= 5
    assert data["machine_info"]["gpuenv"]["gpus"][0]["name"]


def test_plugin_is_inert_without_the_flag_or_without_pytest_benchmark(pytester, sim_env):
    """Without pytest-benchmark, --gpuenv says so in the summary: no warning that -W error
    would turn into an INTERNALERROR."""
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        *plugin_args(), "-p", "no:benchmark", "--gpuenv", "-W", "error", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["gpuenv: pytest-benchmark is not installed*"])
    result = pytester.runpytest_inprocess(*plugin_args())
    result.assert_outcomes(passed=1)
    assert not [x for x in result.stdout.lines if x.startswith("gpuenv")]


def test_a_gpuenv_option_without_gpuenv_is_a_usage_error(pytester, sim_env):
    """--gpuenv-policy=reject (or --gpuenv-gpu) alone samples and judges nothing: said as
    a usage error naming --gpuenv, never a run that passes as if a gate had run."""
    pytester.makepyfile("def test_plain():\n    assert True\n")
    for option in ("--gpuenv-policy=reject", "--gpuenv-gpu=1"):
        result = pytester.runpytest_subprocess(*plugin_args(), option, "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        result.stderr.fnmatch_lines([f"*{option} without --gpuenv does nothing*Add --gpuenv*"])
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--gpuenv-policy=reject", "--gpuenv", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)


# A suite as pytest-benchmark's docs write one: plain, parametrised, pedantic, a marker
DOCS_SUITE = """
import time
import pytest

def something(duration=0.000001):
    time.sleep(duration)
    return 123

def test_my_stuff(benchmark):
    result = benchmark(something)
    assert result == 123

@pytest.mark.parametrize("n", [10, 1000])
def test_sum(benchmark, n):
    assert benchmark(sum, range(n)) == n * (n - 1) // 2

@pytest.mark.benchmark(group="group-name", min_time=0.0001, max_time=0.01, min_rounds=5,
                       warmup=False)
def test_marked(benchmark):
    benchmark(something, 0.0001)

def test_pedantic(benchmark):
    result = benchmark.pedantic(something, args=(0.0001,), iterations=2, rounds=10)
    assert result == 123
"""


def _have_driver() -> bool:
    from gpuenv.backend import open_backend
    from gpuenv.errors import GpuenvError

    try:
        open_backend("nvml", readonly=True).close()
    except GpuenvError:
        return False
    return True


@pytest.mark.parametrize("how", ["-W error", "filterwarnings = error"])
def test_a_suite_with_warnings_as_errors_and_no_driver_passes(pytester, how):
    """The no-driver CI job: `pytest --gpuenv` with warnings as errors ran into INTERNALERROR
    (exit 3); now the benchmarks run, and the summary says why there are no verdicts."""
    pytest.importorskip("pytest_benchmark")
    if _have_driver():
        pytest.skip("this machine has an NVIDIA driver: the no-driver path is CI's")
    pytester.makepyfile(DOCS_SUITE)
    args = [*plugin_args(), "--gpuenv", "--benchmark-max-time=0.01", "-p", "no:cacheprovider"]
    if how == "-W error":
        args += ["-W", "error"]
    else:
        pytester.makeini("[pytest]\nfilterwarnings =\n    error\n")
    result = pytester.runpytest_subprocess(*args)
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, text
    result.assert_outcomes(passed=5)
    assert "INTERNALERROR" not in text
    result.stdout.fnmatch_lines(["gpuenv: no GPU telemetry (NVML*", "gpuenv: no benchmark judged"])


def test_a_telemetry_error_at_start_is_said_not_raised(pytester, monkeypatch):
    pytest.importorskip("pytest_benchmark")
    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    monkeypatch.setenv("GPUENV_SIM_GPUS", "none")  # the backend refuses to open
    pytester.makepyfile(INNER_TEST)
    result = pytester.runpytest_subprocess(
        *plugin_args(),
        "--gpuenv",
        "-W",
        "error",
        "--benchmark-max-time=0.01",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 0
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gpuenv: no GPU telemetry (GPUENV_SIM_GPUS='none'*"])


LOST_GPU_CONFTEST = """
import pytest

@pytest.fixture
def lose_the_gpu(request):
    # the plugin's own simulated GPU falls off the bus while the benchmark runs
    request.config._gpuenv_plugin_state.backend.inner.inject_fault(0, "gpu_lost")
"""

LOST_GPU_SUITE = """
def test_lost(benchmark, lose_the_gpu):
    benchmark(sum, range(100))

def test_after(benchmark):
    benchmark(sum, range(100))
"""


def test_a_gpu_lost_mid_session_is_said_not_raised(pytester, sim_env, tmp_path):
    """NVML failing under the sampler mid-run (-W error): the benchmarks pass, their records
    say what telemetry is missing, the summary names them."""
    pytest.importorskip("pytest_benchmark")
    pytester.makeconftest(LOST_GPU_CONFTEST)
    pytester.makepyfile(LOST_GPU_SUITE)
    out_json = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess(
        *plugin_args(),
        "--gpuenv",
        "-W",
        "error",
        "--benchmark-max-time=0.01",
        f"--benchmark-json={out_json}",
        "-p",
        "no:cacheprovider",
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, text
    result.assert_outcomes(passed=2)
    assert "INTERNALERROR" not in text
    infos = [b["extra_info"]["gpuenv"] for b in json.loads(out_json.read_text())["benchmarks"]]
    assert all(i.get("verdict") != "ok" or "error" in i for i in infos), infos
    result.stdout.fnmatch_lines(
        ["*gpuenv: GPU verdicts*", "test_lost  *telemetry_gap*rounds*", "gpuenv: 2 flagged"]
    )


GPU_CONFTEST = """
import pytest
from gpuenv import timing

@pytest.fixture
def sim_kernel(request):
    # the plugin's own simulated GPU (a sim's work belongs to the backend that made it).
    # 4 ms at boost is 23 ms at the idle clock: 8 rounds outlast the driver's 100 ms
    # refresh, which is when the new context's clock rises and GpuIdle clears. With 2 ms
    # (8 rounds of 11.8 ms) a context opened just after a refresh saw none, and every
    # round read idle: "no GPU work" (3 of 59 runs alone, once in CI; now 0 of 60)
    return timing.sim_kernel(request.config._gpuenv_plugin_state.backend.inner, 0,
                             seconds=0.004)
"""

GPU_SUITE = """
def test_cold_kernel(benchmark, sim_kernel):
    benchmark.pedantic(sim_kernel, rounds=8, iterations=1)
"""


def test_flagged_benchmarks_are_named_after_pytest_benchmarks_table(pytester, sim_env):
    """One line per flagged benchmark (name, verdict, finding), after pytest-benchmark's
    table, with -q too; the CPU-only ones counted as no GPU work."""
    pytest.importorskip("pytest_benchmark")
    pytester.makeconftest(GPU_CONFTEST)
    pytester.makepyfile(test_cpu=DOCS_SUITE, test_gpu=GPU_SUITE)
    result = pytester.runpytest_subprocess(
        *plugin_args(),
        "--gpuenv",
        "-q",
        "-W",
        "error",
        "--benchmark-max-time=0.01",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 0
    lines = result.stdout.lines
    table = min(i for i, x in enumerate(lines) if x.startswith("test_cold_kernel "))
    head = next(i for i, x in enumerate(lines) if "gpuenv: GPU verdicts" in x)
    assert table < head  # after pytest-benchmark's table
    flagged = [x for x in lines[head:] if x.startswith("test_cold_kernel  ")]
    assert len(flagged) == 1 and "  annotated  warmup_ramp: " in flagged[0]
    assert "--benchmark-warmup" in flagged[0]
    result.stdout.fnmatch_lines(["gpuenv: 5 with no GPU work (*), 1 flagged"])


def test_all_ok_is_one_line(pytester, sim_env):
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(INNER_TEST)
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--gpuenv", "--benchmark-max-time=0.01", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2)
    assert [x for x in result.stdout.lines if x.startswith("gpuenv")] == [
        "gpuenv: 1 with no GPU work (every sampled GPU idle throughout: nothing for gpuenv to "
        "judge)"
    ]


ROUND_HOOK_MOVED = """
import gpuenv.integrations.pytest_plugin as plugin
plugin.ROUND_HOOK = ("pytest_benchmark.stats", "Metadata", "moved_away")
"""


def test_the_private_pytest_benchmark_surface_the_plugin_relies_on():
    """ROUND_HOOK (called once per round, after its closing timer read, with its duration)
    and the fixture's timer (--gpuenv-sync) are not pytest-benchmark's documented API: this
    test names them when a new pytest-benchmark moves them."""
    pytest.importorskip("pytest_benchmark")
    import importlib
    import inspect

    from gpuenv.integrations.pytest_plugin import ROUND_HOOK, TIMER_ATTR

    module, cls, attr = ROUND_HOOK
    owner = getattr(importlib.import_module(module), cls, None)
    where = ".".join(ROUND_HOOK)
    assert callable(getattr(owner, attr, None)), f"pytest-benchmark has no {where}"
    assert list(inspect.signature(getattr(owner, attr)).parameters) == ["self", "duration"], (
        f"{where} changed its signature"
    )
    from pytest_benchmark.fixture import BenchmarkFixture

    source = inspect.getsource(BenchmarkFixture)
    assert f"self.{TIMER_ATTR} = timer.target" in source, (
        f"pytest_benchmark.fixture.BenchmarkFixture.{TIMER_ATTR} moved (--gpuenv-sync wraps it)"
    )
    assert source.count("stats.update(") >= 3, (
        f"BenchmarkFixture no longer calls {where} once per round (benchmark(), pedantic, "
        "--benchmark-precision)"
    )


def test_a_moved_round_hook_judges_the_benchmark_as_one_region(pytester, sim_env, tmp_path):
    pytest.importorskip("pytest_benchmark")
    pytester.makeconftest(ROUND_HOOK_MOVED)
    pytester.makepyfile(INNER_TEST)
    out_json = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess(
        *plugin_args(),
        "--gpuenv",
        "-W",
        "error",
        "--benchmark-max-time=0.01",
        f"--benchmark-json={out_json}",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "gpuenv: pytest-benchmark * has no pytest_benchmark.stats."
            "Metadata.moved_away: rounds judged as one region*"
        ]
    )
    info = json.loads(out_json.read_text())["benchmarks"][0]["extra_info"]["gpuenv"]
    assert info["rounds_sampled"] == 0 and info["verdict"] == "ok"


def test_plugin_module_imports_nothing_heavy():
    code = (
        "import sys; import gpuenv.integrations.pytest_plugin; "
        "print(sorted(m for m in ('torch', 'pynvml', 'gpuenv.telemetry', 'gpuenv.backend') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_entry_point_registers_the_plugin():
    """Installing gpuenv is enough for `pytest --gpuenv`: no `-p` needed."""
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("gpuenv") == "gpuenv.integrations.pytest_plugin"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, check=True
    )
    assert "--gpuenv-sync" in out.stdout


def _saved(path):
    (found,) = path.rglob("*.json")
    return found


def test_compare_is_quiet_between_two_runs_and_names_a_driver_change(pytester, sim_env, tmp_path):
    """machine_info holds only what stays put: two runs in a row compare without pytest-
    benchmark's 'machine_info is different' warning; a changed driver is named by GPU."""
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(INNER_TEST)
    storage = pytester.path / "storage"  # inside the cwd: pytest-benchmark 5.x needs it
    common = [
        *plugin_args(),
        "--gpuenv",
        "--benchmark-max-time=0.02",
        "--benchmark-min-rounds=3",
        f"--benchmark-storage=file://{storage}",
        "-p",
        "no:cacheprovider",
    ]
    pytester.runpytest_subprocess(*common, "--benchmark-save=first").assert_outcomes(passed=2)
    saved = json.loads(_saved(storage).read_text())
    info = saved["machine_info"]["gpuenv"]
    assert "time_utc" not in info and "sm_mhz" not in info["gpus"][0]
    assert info["gpus"][0]["lock"]["state"] == "none"
    result = pytester.runpytest_subprocess(*common, "--benchmark-compare=0001")
    result.assert_outcomes(passed=2)
    text = result.stdout.str() + result.stderr.str()
    assert "machine_info is different" not in text
    assert "the GPUs are not in the state" not in text

    saved["machine_info"]["gpuenv"]["driver_version"] = "1.0"
    saved["machine_info"]["gpuenv"]["gpus"][0]["lock"]["state"] = "locked"
    _saved(storage).write_text(json.dumps(saved))
    result = pytester.runpytest_subprocess(*common, "--benchmark-compare=0001")
    text = result.stdout.str() + result.stderr.str()
    assert "gpuenv: the GPUs are not in the state of the saved run" in text
    assert "driver 1.0 ->" in text and "GPU 0 clock lock: locked -> none" in text
    assert "{'state'" not in text  # in words, not Python dicts


def test_changes_name_what_makes_runs_incomparable():
    from gpuenv.integrations.pytest_plugin import changes, steady

    gpu = {
        "index": 0,
        "name": "H100",
        "uuid": "GPU-1",
        "power_limit_w": 700.0,
        "lock": {"state": "none", "sm_mhz": None, "mem_mhz": None},
        "sm_mhz": 1980,
    }
    meta = {"driver_version": "580", "time_utc": "now", "gpus": [gpu]}
    a = steady(meta)
    assert "time_utc" not in a and "sm_mhz" not in a["gpus"][0]
    assert changes(a, steady({**meta, "time_utc": "later"})) == []
    locked = {
        **gpu,
        "power_limit_w": 600.0,
        "lock": {"state": "locked", "sm_mhz": [1350, 1350], "mem_mhz": None},
    }
    found = changes(a, steady({**meta, "gpus": [locked]}))
    # in words, not Python dicts ("{'state': 'none', ...} -> {'state': 'locked', ...}")
    assert found == ["GPU 0 clock lock: none -> SM 1350 MHz", "GPU 0 power limit: 700 W -> 600 W"]
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
        *plugin_args(),
        "--gpuenv-sync",
        "--benchmark-max-time=0.02",
        "--benchmark-min-rounds=5",
        f"--benchmark-json={out_json}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)
    devices = (pytester.path / "syncs.txt").read_text().split()
    info = json.loads(out_json.read_text())["benchmarks"][0]["extra_info"]["gpuenv"]
    rounds = info["rounds_sampled"]
    assert rounds >= 5  # --gpuenv-sync implies --gpuenv
    # both devices, at the start and the end of every round (and of each calibration run)
    assert devices[:4] == ["0", "1", "0", "1"] and len(devices) >= 2 * 2 * rounds


def test_sync_without_torch_says_so_and_times_as_before(pytester, sim_env):
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(INNER_TEST)
    result = pytester.runpytest_subprocess(
        *plugin_args(),
        "--gpuenv-sync",
        "--benchmark-max-time=0.02",
        "-p",
        "no:cacheprovider",
        "-W",
        "error",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["gpuenv: --gpuenv-sync: not synchronizing (the tests have not imported torch)"]
    )


# Another process of the host keeps the simulated GPU busy until killed (it says when).
LOAD = """
import os, time
from gpuenv.backend.sim import SimBackend
sim = SimBackend(state_file=os.environ["GPUENV_SIM_STATE"])
sim.set_background_load(0, 1.0)
print("loaded", flush=True)
time.sleep(600)
"""


def _benchmarked(pytester, tmp_path):
    """INNER_TEST under `pytest --gpuenv` in its own process: (its first benchmark's
    extra_info["gpuenv"], gpuenv's machine_info)."""
    data = _benchmark_json(pytester, tmp_path)
    return data["benchmarks"][0]["extra_info"]["gpuenv"], data["machine_info"]["gpuenv"]


def test_pytest_gpuenv_sees_a_load_another_process_runs_on_the_simulated_gpu(
    pytester, sim_env, tmp_path
):
    """The simulated GPU is the host's (GPUENV_SIM_STATE, the tests' own here): a load that
    another process keeps up shows in the benchmarks' telemetry and findings."""
    pytest.importorskip("pytest_benchmark")
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert load.stdout is not None and load.stdout.readline() == "loaded\n", load.stderr
        info, _ = _benchmarked(pytester, tmp_path)
    finally:
        load.kill()
        load.wait()
    assert info["gpu_work"] is True  # a time.sleep benchmark, on a GPU another process works
    assert not info["telemetry"][0]["reasons"] & Reason.GPU_IDLE
    (other,) = [f for f in info["findings"] if f["kind"] == "other_process"]
    assert f"pid {load.pid}" in other["message"], other


def test_pytest_gpuenv_sees_a_lock_another_process_took_on_the_simulated_gpu(
    pytester, sim_env, tmp_path
):
    """Root's `gpuenv --sim lock` in another process: the benchmarks ran at the locked clock,
    and machine_info says it is locked (what pytest-benchmark's compare checks)."""
    pytest.importorskip("pytest_benchmark")
    if os.geteuid() != 0:
        pytest.skip("only root locks the simulated GPU without gpuenvd, as a real one")
    gpuenv = [sys.executable, "-m", "gpuenv", "--sim"]
    subprocess.run([*gpuenv, "lock", "--sm", "1350"], check=True, capture_output=True)
    try:
        info, machine = _benchmarked(pytester, tmp_path)
    finally:
        subprocess.run([*gpuenv, "restore"], check=True, capture_output=True)
    assert info["telemetry"][0]["sm_mhz_mean"] == 1350
    assert machine["gpus"][0]["lock"] == {
        "state": "locked",
        "sm_mhz": [1350, 1350],
        "mem_mhz": None,
    }
