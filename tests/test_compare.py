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
from gpuenv.environment import environment_metadata
from gpuenv.errors import ConfigError
from gpuenv.results import ResultStore, Run, load_run
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
    m = timing.bench(
        lambda: sim.run_work(0, cycles * rng.lognormvariate(0, 0.01)),
        name=name,
        backend=sim,
        reps=40,
        keep_trace=False,
        condition="none",
    )  # as measured naively: the GPU's state goes into it
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
    assert c.outcome == "no change" and c.note.startswith("no change (")


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
        str(tmp_path / "a-rank0.jsonl"),
        str(tmp_path / "a-rank1.jsonl"),
    ]
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


# --- "no change", lock claims, like with like (issue 14 item 8) ---------------------------


def region(t_s: float, *, sm: float = 1980.0, lock=None, held=None, name="step", temp=40.0):
    """A hand-made record in the shape gpuenv writes: one region with its window."""
    from gpuenv.results import Measurement
    from gpuenv.telemetry import Window

    w = Window(
        gpu=0,
        t0=0.0,
        t1=t_s,
        n_samples=10,
        sm_mhz_min=sm,
        sm_mhz_mean=sm,
        sm_mhz_max=sm,
        temp_c_start=temp,
        temp_c_end=temp,
        temp_c_max=temp,
        lock_range_mhz=lock,
        lock_held=held,
    )
    return Measurement.build(name, [t_s], windows=(w,), summary_windows=(w,))


def save(path, *ms):
    with ResultStore(path, {"backend": "sim"}) as store:
        for m in ms:
            store.append(m)
    return str(path)


def test_the_same_time_in_another_gpu_state_is_no_change_not_slower(tmp_path):
    # the user's case: one region per side, equal times, the clock moved
    a = save(tmp_path / "a.jsonl", region(1.0, sm=1980))
    b = save(tmp_path / "b.jsonl", region(1.0, sm=1350))
    report = compare_files(a, b)
    (c,) = report.comparisons
    assert "the GPU, not the code" not in c.note
    assert "slower" not in c.note and "faster" not in c.note
    assert c.note.startswith("no change")
    assert c.outcome == "no change" and not c.significant
    assert any("SM clock" in s for s in c.state_changes)  # the facts are still there
    assert "state: mean SM clock 1980 -> 1350" in format_report(report)


def test_a_change_below_min_change_is_no_change_one_region_or_many(tmp_path):
    a = save(tmp_path / "a.jsonl", region(1.0))
    b = save(tmp_path / "b.jsonl", region(1.004))  # +0.4%, under the 1% default
    (c,) = compare_files(a, b).comparisons
    assert "slower" not in c.note and c.outcome == "no change"
    # above it, one region per side is a change, but an untested one
    (c,) = compare_files(a, b, min_change=0.001).comparisons
    assert c.outcome == "slower" and not c.significant
    assert c.note.startswith("slower 0.4%") and "no significance test" in c.note
    # many reps: +0.4% with tiny noise is a significant p-value, and still no change
    rng = random.Random(1)
    ta = [1e-3 * (1 + rng.gauss(0, 1e-4)) for _ in range(30)]
    a = save(tmp_path / "ma.jsonl", *[region(t) for t in ta])
    b = save(tmp_path / "mb.jsonl", *[region(t * 1.004) for t in ta])
    (c,) = compare_files(a, b).comparisons
    assert c.p_value < 1e-6 and c.outcome == "no change" and not c.significant
    assert c.note.startswith("no change (+0.4%") and "1.0%" in c.note
    assert c.to_dict()["outcome"] == "no change"
    # the gate never fails on a change it calls "no change"
    out = CliRunner().invoke(cli, ["compare", a, b, "--fail-above", "0"], obj={})
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(
        cli, ["compare", a, b, "--fail-above", "0", "--min-change", "0.001"], obj={}
    )
    assert out.exit_code == 1 and "+0.4%" in out.output


def test_the_ci_has_the_level_of_alpha_and_a_starred_change_excludes_no_change(tmp_path):
    rng = random.Random(2)
    a = save(tmp_path / "a.jsonl", *[region(1e-3 * rng.lognormvariate(0, 0.05)) for _ in range(20)])
    b = save(
        tmp_path / "b.jsonl", *[region(1.04e-3 * rng.lognormvariate(0, 0.05)) for _ in range(20)]
    )
    wide = compare_files(a, b, alpha=0.01)
    narrow = compare_files(a, b, alpha=0.2)
    (cw,), (cn,) = wide.comparisons, narrow.comparisons
    assert cw.ratio_ci[0] < cn.ratio_ci[0] and cw.ratio_ci[1] > cn.ratio_ci[1]
    assert "| 99% CI |" in format_report(wide) and "| 80% CI |" in format_report(narrow)
    for c in (cw, cn):
        excludes = c.ratio_ci[0] > 1 or c.ratio_ci[1] < 1
        assert not c.significant or excludes


def test_pooled_locked_and_unlocked_files_do_not_claim_the_lock_held(tmp_path):
    locked = save(
        tmp_path / "locked.jsonl",
        *[region(1.0, sm=1350, lock=(1350, 1350), held=True) for _ in range(2)],
    )
    free = save(tmp_path / "free.jsonl", *[region(0.7, sm=1980) for _ in range(3)])
    b = save(
        tmp_path / "b.jsonl",
        *[region(1.0, sm=1350, lock=(1350, 1350), held=True) for _ in range(5)],
    )
    report = compare_files(f"{locked},{free}", b)
    (c,) = report.comparisons
    assert c.state_a.lock == "2 of 5 measurements under 1350 MHz"
    assert c.state_a.lock_mixed and not c.state_b.lock_mixed
    assert c.state_b.lock == "1350 MHz held"
    text = format_report(report)
    assert "lock: 2 of 5 measurements under 1350 MHz" in text
    assert "1350-1350 MHz held" not in text
    # pooled: a's median and clock mix two GPU states; no attribution from them, but the
    # measurements under the same lock on both sides are compared with each other
    assert c.change > 0.3  # the pooled median is the unlocked files'
    assert "the GPU, not the code" not in c.note
    assert "a pools measurements in different lock states" in c.note
    assert "like with like, under 1350 MHz (n=2 vs 5): no change (+0.0%" in c.note


def test_a_lock_that_held_for_some_measurements_only_says_in_how_many(tmp_path):
    a = save(
        tmp_path / "a.jsonl",
        *[region(1.0, sm=1350 if i else 1100, lock=(1350, 1350), held=bool(i)) for i in range(4)],
    )
    b = save(tmp_path / "b.jsonl", region(1.0, sm=1350, lock=(1350, 1350), held=False))
    (c,) = compare_files(a, b).comparisons
    assert "NOT held" in c.state_a.lock  # today: "1350-1350 MHz NOT held", as if in all
    assert c.state_a.lock == "1350 MHz NOT held in 1 of 4 measurements"
    assert c.state_b.lock == "1350 MHz NOT held"
    assert not c.state_a.lock_mixed  # one lock state asked for: like with like


def test_locked_and_unlocked_sides_attribute_a_real_change_to_the_gpu(tmp_path):
    a = save(tmp_path / "a.jsonl", region(1.0, sm=1350, lock=(1350, 1350), held=True))
    b = save(tmp_path / "b.jsonl", region(0.7, sm=1980))
    (c,) = compare_files(a, b).comparisons
    assert c.outcome == "faster" and "the GPU, not the code, may explain it" in c.note
    assert "clock lock 1350 MHz held -> none" in c.state_changes


def test_like_with_like_puts_a_change_down_to_the_gpu_within_one_lock_state(tmp_path):
    a = save(
        tmp_path / "a.jsonl",
        *[region(1.0, sm=1350, lock=(1350, 1350), held=True) for _ in range(2)],
        *[region(0.7, sm=1980) for _ in range(5)],
    )
    b = save(
        tmp_path / "b.jsonl",
        *[region(1.0, sm=1350, lock=(1350, 1350), held=True) for _ in range(3)],
        *[region(1.0, sm=1386) for _ in range(5)],
    )  # unlocked, on a hot GPU
    (c,) = compare_files(a, b).comparisons
    assert c.state_a.lock_mixed and c.state_b.lock_mixed
    assert "a and b pool measurements in different lock states" in c.note
    assert "under 1350 MHz (n=2 vs 3): no change" in c.note
    without = c.note.split("like with like, without a lock (n=5 vs 5): ")[1]
    assert without.startswith("slower 42.9%")
    assert "mean SM clock 1980 -> 1386 MHz" in without and "the GPU, not the code" in without


# --- one run per file; "can't tell" (issue 32 item 4) --------------------------------------


def test_a_file_with_several_runs_is_read_as_its_last_run_and_said(tmp_path):
    # a failed first attempt left in the file was pooled silently: "(n=2)" for one run
    path = tmp_path / "a.jsonl"
    save(path, region(2.0), region(2.0))
    with ResultStore(path, {"backend": "sim"}, append=True) as store:
        store.extend([region(1.0), region(1.0)])
    b = save(tmp_path / "b.jsonl", region(1.0), region(1.0))
    report = compare_files(str(path), b)
    (c,) = report.comparisons
    assert c.n_a == 2 and c.median_a_s == 1.0  # the last run, as load_run reads it
    assert report.notes == (
        f"{path} holds 2 runs (written with --append): reading the last; --all-runs pools them",
    )
    assert f"note: {path} holds 2 runs" in format_report(report)
    with pytest.warns(UserWarning, match="holds 2 runs .* reading the last"):
        assert [m.median_s for m in load_run(path).measurements] == [1.0, 1.0]
    pooled = compare_files(str(path), b, all_runs=True)
    assert pooled.comparisons[0].n_a == 4 and "all pooled" in pooled.notes[0]
    out = CliRunner().invoke(cli, ["compare", str(path), b, "--all-runs"], obj={})
    assert out.exit_code == 0 and "(n=4)" in out.output, out.output


def test_an_interval_wider_than_the_minimum_change_cant_tell(tmp_path):
    # the case: "no change (+0.0%, under the 1.0% minimum change)" for an
    # interval of -10.84% .. +50.49%: the median moved by nothing, the noise by a lot
    rng = random.Random(3)
    a = save(tmp_path / "a.jsonl", *[region(rng.lognormvariate(0, 0.3)) for _ in range(5)])
    b = save(tmp_path / "b.jsonl", *[region(rng.lognormvariate(0, 0.3)) for _ in range(5)])
    (c,) = compare_files(a, b).comparisons
    assert c.ratio_ci[1] - 1 > 0.01 or c.ratio_ci[0] - 1 < -0.01  # wider than +-1%
    assert c.outcome == "can't tell" and not c.significant
    assert c.note.startswith("can't tell (") and "wider than the 1.0% minimum change" in c.note
    assert c.reps_needed is not None and c.reps_needed > 5
    assert f"about {c.reps_needed:,} reps per side would tell (now 5)" in c.note
    assert c.to_dict()["reps_needed"] == c.reps_needed
    # the gate passes it by default, and fails it when told to
    args = ["compare", a, b, "--fail-above", "0.5"]
    assert CliRunner().invoke(cli, args, obj={}).exit_code == 0
    out = CliRunner().invoke(cli, [*args, "--fail-on-cant-tell"], obj={})
    assert out.exit_code == 1 and "can't tell at the 1.0% minimum change: step (" in out.output
    out = CliRunner().invoke(cli, ["compare", a, b, "--fail-on-cant-tell"], obj={})
    assert out.exit_code == 2 and "needs --fail-above" in out.output


def test_compare_help_says_what_a_and_b_may_be():
    out = CliRunner().invoke(cli, ["compare", "--help"], obj={})
    assert "A and B are each a results file" in " ".join(out.output.split())
    assert "a glob" in out.output and "directory" in out.output


def test_a_finding_that_moved_no_number_is_no_state_change_a_slowdown_coincides_with():
    # a CI gate's baseline carried an info clock_drift (the number showed no effect); its
    # "gone" in the slow run was offered as the GPU state change behind a real +9.9%
    from types import SimpleNamespace

    from gpuenv.compare.state import gpu_state, state_changes
    from gpuenv.verdict.records import Finding

    def m(*findings: Finding) -> SimpleNamespace:
        return SimpleNamespace(
            windows=(), summary_windows=(), findings=findings, extra={}, verdict="ok"
        )

    info = Finding("clock_drift", "info", (0,), "the SM clock moved; the number held")
    warning = Finding("power_cap", "warning", (0,), "the cap held the SM clock back")
    assert state_changes(gpu_state([m(info)]), gpu_state([m()])) == []
    assert state_changes(gpu_state([m(warning)]), gpu_state([m()])) == ["findings gone: power_cap"]
