"""gpuenv compare on runs measured on the simulated GPU."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.compare import compare_files, compare_runs, expand_paths, format_report
from gpuenv.errors import ConfigError
from gpuenv.results import ResultStore, Run, environment_metadata, load_run
from gpuenv.timebase import VirtualClock


def measure(path, *, seconds=1.4e-3, hot=False, seed=0, name="gemm", meta=None):
    """Bench a noisy sim kernel and write it as a run file."""
    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(10)
    if hot:
        timing.sim_kernel(sim, 0, seconds=20.0)()
    rng = random.Random(seed)
    cycles = seconds * 1980e6
    m = timing.bench(lambda: sim.run_work(0, cycles * rng.lognormvariate(0, 0.01)), name=name,
                     backend=sim, reps=40, keep_trace=False,
                     condition="none")  # as measured naively: the GPU's state goes into it
    metadata = environment_metadata(sim, [0], clock=sim.clock)
    metadata.update(meta or {})
    with ResultStore(path, metadata) as store:
        store.append(m)
    return path


def test_same_code_same_state_is_no_change(tmp_path):
    a = measure(tmp_path / "a.jsonl", seed=1)
    b = measure(tmp_path / "b.jsonl", seed=2)
    (c,) = compare_files(str(a), str(b)).comparisons
    assert not c.significant
    assert abs(c.change) < 0.01
    assert not c.state_changes
    assert c.note.startswith("no significant change")


def test_faster_code_in_the_same_state_is_a_clean_speedup(tmp_path):
    a = measure(tmp_path / "a.jsonl", seconds=1.4e-3)
    b = measure(tmp_path / "b.jsonl", seconds=1.26e-3, seed=3)
    (c,) = compare_files(str(a), str(b)).comparisons
    assert c.significant and c.change == pytest.approx(-0.10, abs=0.01)
    assert c.ratio_ci[0] < c.ratio < c.ratio_ci[1]
    assert c.p_value < 1e-6
    assert "faster 10" in c.note and "state change" not in c.note


def test_a_speedup_from_a_cooler_gpu_says_so(tmp_path):
    a = measure(tmp_path / "a.jsonl", hot=True)  # measured right after sustained load
    b = measure(tmp_path / "b.jsonl", hot=False, seed=4)  # same code on a cool GPU
    report = compare_files(str(a), str(b))
    (c,) = report.comparisons
    assert c.significant and c.change < -0.1
    assert any("SM clock" in s for s in c.state_changes)
    assert any("power cap" in s for s in c.state_changes)
    assert "coincides with a GPU state change" in c.note
    assert "the GPU, not the code" in c.note
    assert c.normalized_ratio == pytest.approx(1.0, abs=0.02)  # same work at the same clock
    text = format_report(report)
    assert "| gemm |" in text and "coincides" in text


def test_per_rank_files_are_pooled_and_env_changes_reported(tmp_path):
    a0 = measure(tmp_path / "a-rank0.jsonl", seed=5)
    measure(tmp_path / "a-rank1.jsonl", seed=6)
    b = measure(tmp_path / "b.jsonl", seed=7, meta={"driver_version": "999.1"})
    assert expand_paths(str(tmp_path / "a-rank*.jsonl")) == [
        str(tmp_path / "a-rank0.jsonl"), str(tmp_path / "a-rank1.jsonl")]
    report = compare_files(str(tmp_path / "a-rank*.jsonl"), str(b))
    (c,) = report.comparisons
    assert c.n_a == 80 and c.n_b == 40
    assert any(s.startswith("driver_version") for s in report.env_changes)
    assert f"{a0}" in report.files_a[0]


def test_names_on_one_side_only(tmp_path):
    a = load_run(measure(tmp_path / "a.jsonl", name="x"))
    b = load_run(measure(tmp_path / "b.jsonl", name="y"))
    report = compare_runs([a], [b])
    assert report.comparisons == () and report.only_a == ("x",) and report.only_b == ("y",)
    assert "No measurement" in format_report(report)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no results file matches"):
        expand_paths(str(tmp_path / "nope.jsonl"))


def test_single_region_per_side_has_no_test(tmp_path):
    from gpuenv.results import Measurement

    ma = Measurement.build("step", [1.0])
    mb = Measurement.build("step", [0.8])
    (c,) = compare_runs([Run({}, (ma,))], [Run({}, (mb,))]).comparisons
    assert c.p_value == 1.0 and not c.significant
    assert "no significance test" in c.note


class TestCli:
    def test_table_json_and_gate(self, tmp_path):
        a = measure(tmp_path / "a.jsonl")
        b = measure(tmp_path / "b.jsonl", seconds=1.6e-3, seed=8)  # 14% slower
        runner = CliRunner()
        out = runner.invoke(cli, ["compare", str(a), str(b)], obj={})
        assert out.exit_code == 0, out.output
        assert "| gemm |" in out.output and "slower" in out.output
        out = runner.invoke(cli, ["compare", str(a), str(b), "--json"], obj={})
        data = json.loads(out.output)
        assert data["comparisons"][0]["change"] == pytest.approx(0.143, abs=0.01)
        out = runner.invoke(cli, ["compare", str(a), str(b), "--fail-above", "0.05"], obj={})
        assert out.exit_code == 1 and "slower by more than 5.0%" in out.output
        out = runner.invoke(cli, ["compare", str(a), str(b), "--fail-above", "0.2"], obj={})
        assert out.exit_code == 0

    def test_missing_file_exits_2(self, tmp_path):
        out = CliRunner().invoke(cli, ["compare", str(tmp_path / "x.jsonl"), "y.jsonl"], obj={})
        assert out.exit_code == 2
        assert "no results file matches" in out.output
