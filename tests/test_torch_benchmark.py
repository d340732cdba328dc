"""The torch.utils.benchmark adapter (gpuenv.integrations.torch_benchmark)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.integrations import torch_benchmark


class TestTorchBenchmarkObserve:
    def test_metadata_gets_telemetry_and_findings(self, warm_sim):
        fake = SimpleNamespace(metadata={"user": 1})
        kernel = timing.sim_kernel(warm_sim, 0, seconds=0.5)

        def run():
            kernel()  # half a second of heavy load: the power cap engages
            return fake

        out = torch_benchmark._annotated(run, backend=warm_sim)
        assert out is fake and out.metadata["user"] == 1
        rec = out.metadata["gpuenv"]
        assert rec["gpus"] == [0]
        assert rec["telemetry"][0]["sm_mhz_max"] == pytest.approx(1980)
        assert "power_cap" in {f["kind"] for f in rec["findings"]}
        assert rec["verdict"] == "annotated"
        json.dumps(rec)  # plain JSON values


def _record(warm_sim, seconds: float) -> dict:
    kernel = timing.sim_kernel(warm_sim, 0, seconds=seconds)
    _, rec = torch_benchmark.observe(kernel, backend=warm_sim)
    return rec


@pytest.mark.parametrize("phase", [0.0, 0.007, 0.013])
@pytest.mark.parametrize("ms", [10, 30, 100, 300, 1000])
def test_a_calls_energy_and_power_are_the_simulators_own(warm_sim, ms, phase):
    """A Timer call of `ms` of 10 ms kernels back to back: its energy and mean power are
    the simulator's own counter's within 2%, from the driver's power samples (not marked
    from 25 ms on), and the mean lies within its max. Judged at the call's end, before the
    sample after it was out, 10 and 30 ms calls read the readings in force (-88.7%) and
    0.3-1 s calls up to +1.3%, marked. The call waits for that sample at most
    POWER_WAIT_S after its end."""
    from gpuenv.telemetry import Window
    from gpuenv.telemetry.sampler import POWER_WAIT_S

    warm_sim.idle(phase)
    hz = warm_sim.clock_limits(0).max_sm_mhz * 1e6
    log: dict[float, float] = {}

    def call() -> None:
        log[warm_sim.clock.now()] = warm_sim.truth(0).energy_mj
        for _ in range(ms // 10):
            warm_sim.run_work(0, 0.01 * hz)
        log[warm_sim.clock.now()] = warm_sim.truth(0).energy_mj

    _, rec = torch_benchmark.observe(call, backend=warm_sim)
    w = Window.from_dict(rec["telemetry"][0])
    truth_j = (log[w.t1] - log[w.t0]) / 1e3
    assert w.energy_j == pytest.approx(truth_j, rel=0.02)
    assert w.power_w_mean == pytest.approx(truth_j / w.duration_s, rel=0.02)
    assert 0 < w.power_w_mean <= w.power_w_max
    assert w.energy_interpolated == (ms < 25)
    assert warm_sim.clock.now() - w.t1 <= POWER_WAIT_S


def test_replicates_records_merge_into_one_with_the_worst_verdict(warm_sim):
    """What `Measurement.merge` and `Compare` keep of several replicates (no torch needed)."""
    cool = _record(warm_sim, 0.01)
    capped = _record(warm_sim, 0.5)  # the power cap engages: annotated
    assert (cool["verdict"], capped["verdict"]) == ("ok", "annotated")
    merged = torch_benchmark.merge_records([cool, capped])
    assert merged["verdict"] == "annotated" and merged["replicates"] == 2
    (window,) = merged["telemetry"]
    spans = [(r["telemetry"][0]["t0"], r["telemetry"][0]["t1"]) for r in (cool, capped)]
    assert (window["t0"], window["t1"]) == (spans[0][0], spans[1][1])
    assert window["sm_mhz_max"] == capped["telemetry"][0]["sm_mhz_max"]
    assert {f["replicate"] for f in merged["findings"]} == {1}
    assert torch_benchmark.note(merged).startswith("annotated (power_cap): GPU 0")
    json.dumps(merged)
    failed = torch_benchmark.merge_records([{"error": "NVML not found"}] * 2)
    assert torch_benchmark.note(failed) == "no telemetry: NVML not found"


def test_importing_the_adapter_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, gpuenv.integrations.torch_benchmark as t; "
        "from gpuenv.integrations.torch_benchmark import *; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- with torch (the CPU build is enough: the GPU is the simulated one) ----------------


@pytest.fixture
def tb(monkeypatch):
    pytest.importorskip(
        "torch",
        reason="torch is not installed (pip install torch; CI installs the CPU wheel "
        "when the machine has one)",
    )
    import torch.utils.benchmark as tb

    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    return tb


def test_timer_is_torchs_timer_with_torchs_signatures(tb):
    import inspect

    from gpuenv.integrations.torch_benchmark import Measurement, Timer

    t = Timer("x + 1", globals={"x": 1})
    assert isinstance(t, tb.Timer) and issubclass(Measurement, tb.Measurement)
    for name in ("timeit", "blocked_autorange", "adaptive_autorange"):
        ours = inspect.signature(getattr(Timer, name)).parameters
        theirs = inspect.signature(getattr(tb.Timer, name)).parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == [
            (p.name, p.kind, p.default) for p in theirs.values()
        ], name


def test_autorange_keeps_callback_and_min_run_time_and_adds_telemetry(tb):
    from gpuenv.integrations.torch_benchmark import Measurement, Timer

    seen = []
    t = Timer("sum(range(100))", label="sum", description="py")
    m = t.blocked_autorange(callback=lambda n, s: seen.append((n, s)), min_run_time=0.05)
    assert isinstance(m, Measurement) and seen and sum(s for _, s in seen) >= 0.05
    assert m.metadata["gpuenv"]["verdict"] in ("ok", "annotated")
    assert m.metadata["gpuenv"]["telemetry"][0]["gpu"] == 0
    seen.clear()
    m = t.adaptive_autorange(
        threshold=0.5, min_run_time=0.02, max_run_time=0.5, callback=lambda n, s: seen.append(n)
    )
    assert seen and m.metadata["gpuenv"]["gpus"] == [0]
    assert t.timeit(10).number_per_run == 10


def test_merge_and_compare_keep_the_verdict_and_telemetry(tb):
    from gpuenv.integrations.torch_benchmark import Compare, Measurement, Timer

    a = Timer("sum(range(100))", label="sum", sub_label="100", description="py")
    b = Timer("sum(range(1000))", label="sum", sub_label="1000", description="py")
    runs = [a.blocked_autorange(min_run_time=0.02) for _ in range(2)]
    runs.append(b.blocked_autorange(min_run_time=0.02))
    assert [m.metadata for m in tb.Measurement.merge(runs)] == [None, None]  # torch's drops it
    merged = Measurement.merge(runs)
    assert len(merged) == 2 and merged[0].metadata["gpuenv"]["replicates"] == 2
    assert len(merged[0].times) == len(runs[0].times) + len(runs[1].times)
    text = str(Compare(runs))
    assert "Times are in" in text  # torch's table, then the notes
    assert "gpuenv (verdict: telemetry) of each sum cell:" in text
    for row in ("100 / py: ", "1000 / py: "):
        line = next(x for x in text.splitlines() if x.strip().startswith(row))
        assert line.split(": ", 1)[1].split()[0] in ("ok", "annotated", "ok:", "annotated:")
        assert "GPU 0" in line


def test_functions_wrap_a_plain_torch_timer(tb):
    from gpuenv.integrations.torch_benchmark import Measurement

    t = tb.Timer("sum(range(100))")
    seen = []
    m = torch_benchmark.blocked_autorange(
        t, callback=lambda n, s: seen.append(n), min_run_time=0.02
    )
    assert isinstance(m, Measurement) and seen and "gpuenv" in m.metadata
    m = torch_benchmark.adaptive_autorange(t, 0.5, min_run_time=0.02, max_run_time=0.3)
    assert m.metadata["gpuenv"]["gpus"] == [0]


def test_each_call_is_its_own_measurement_named_by_its_task(tb):
    """One Timer, three calls: three records, each judged over its own call and named by the
    Timer's label / sub_label / description."""
    from gpuenv.integrations.torch_benchmark import Timer

    t = Timer("sum(range(100))", label="sum", sub_label="100", description="py")
    ms = [
        t.timeit(100),
        t.blocked_autorange(min_run_time=0.02),
        t.adaptive_autorange(threshold=0.5, min_run_time=0.02, max_run_time=0.3),
    ]
    recs = [m.metadata["gpuenv"] for m in ms]
    assert [r["name"] for r in recs] == ["sum / 100 / py"] * 3
    spans = [(r["telemetry"][0]["t0"], r["telemetry"][0]["t1"]) for r in recs]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # a window per call
    assert all(isinstance(r["note"], str) and r["note"].startswith(r["verdict"]) for r in recs)
    assert torch_benchmark.task_name(tb.Timer("x = 1\ny = 2")._task_spec) == "x = 1"


UNPICKLE_WITHOUT_GPUENV = """
import pickle, sys
sys.modules["gpuenv"] = None  # gpuenv not importable in this process
try:
    import gpuenv  # noqa: F401
    raise SystemExit("gpuenv is importable")
except ImportError:
    pass
import torch.utils.benchmark as tb
with open(sys.argv[1], "rb") as f:
    ms = pickle.load(f)
assert all(type(m) is tb.Measurement for m in ms), [type(m) for m in ms]
print(tb.Compare(ms))
for m in ms:
    print("NOTE", m.description, "=", m.metadata["gpuenv"]["note"])
"""


def test_the_verdict_survives_pickling_and_torchs_compare_without_gpuenv(tb, warm_sim, tmp_path):
    """A flagged call's verdict is in its description (torch's Compare shows it) and its note a
    plain string in its metadata: both load and print in a process without gpuenv."""
    import pickle
    import subprocess
    import sys

    def timer(seconds: float, sub_label: str) -> object:
        kernel = timing.sim_kernel(warm_sim, 0, seconds=seconds)
        return tb.Timer(
            "k()", globals={"k": kernel}, label="mm", sub_label=sub_label, description="bf16"
        )

    cool = torch_benchmark.timeit(timer(0.01, "cool"), 1, backend=warm_sim)
    capped = torch_benchmark.timeit(timer(0.5, "capped"), 1, backend=warm_sim)
    assert cool.description == "bf16" and cool.metadata["gpuenv"]["verdict"] == "ok"
    assert capped.description == "bf16 [gpuenv: annotated, power_cap]"
    assert capped.metadata["gpuenv"]["name"] == "mm / capped / bf16"
    path = tmp_path / "ms.pkl"
    path.write_bytes(pickle.dumps([cool, capped]))
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", UNPICKLE_WITHOUT_GPUENV, str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    header = next(x for x in out.stdout.splitlines() if "|" in x)
    assert "bf16 [gpuenv: annotated, power_cap]" in header  # torch's table, its column
    assert "NOTE bf16 [gpuenv: annotated, power_cap] = annotated (power_cap): GPU 0" in out.stdout
    assert "NOTE bf16 = ok: GPU 0" in out.stdout
