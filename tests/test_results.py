"""Measurement and Run records, the JSONL store and environment metadata."""

from __future__ import annotations

import json
import sys

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.environment import environment_metadata
from gpuenv.errors import ConfigError, GpuLost
from gpuenv.results import (
    Measurement,
    Results,
    ResultStore,
    Run,
    Stats,
    load_run,
    load_runs,
)
from gpuenv.telemetry import Window
from gpuenv.timebase import VirtualClock
from gpuenv.verdict import Finding


def measurement(name: str = "gemm", times=(0.0015, 0.0014, 0.0016, 0.0030), **kw) -> Measurement:
    w = Window(
        gpu=0,
        t0=1.0,
        t1=1.1,
        n_samples=4,
        sm_mhz_mean=1452.0,
        sm_mhz_min=1380.0,
        sm_mhz_max=1980.0,
        reasons=4,
        reason_s={"power": 0.09},
    )
    f = Finding(
        "power_cap",
        "info",
        (0, 1),
        "the SW power cap held GPU 0 back",
        0,
        {"time_under_cap_s": 0.09},
    )
    kw.setdefault("windows", (w,) * len(times))
    kw.setdefault("findings", (f,))
    kw.setdefault("verdict", "annotated")
    kw.setdefault("summary_windows", (w,))
    return Measurement.build(name, times, **kw)


def test_stats_of_rep_times():
    s = Stats.of([0.004, 0.001, 0.003, 0.002])
    assert (s.n, s.median_s, s.min_s, s.max_s) == (4, 0.0025, 0.001, 0.004)
    assert s.mean_s == pytest.approx(0.0025)
    assert s.iqr_s == pytest.approx(0.0015)  # numpy's default quantiles
    assert Stats.of([0.5]).stdev_s is None and Stats.of([]).median_s is None


def test_stats_cover_only_the_reps_not_rejected():
    m = measurement(rejected_reps=[3])
    assert m.times_s == (0.0015, 0.0014, 0.0016, 0.0030)
    assert m.kept_times_s == (0.0015, 0.0014, 0.0016)
    assert m.stats.n == 3 and m.median_s == 0.0015


def test_measurement_round_trips_through_json():
    m = measurement(extra={"ci_s": [0.0014, 0.0016]}, started_at=1.79e9, gpus=(0,))
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m
    assert back.telemetry == m.summary_windows[0]


def test_a_file_written_before_stats_held_the_ci_loads_it_from_extra():
    # docs/stable_session_h100.jsonl: a real H100 session's file, kept as it was written
    # (bench's CI in extra["ci_s"] only; the two env.measure regions have none)
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "stable_session_h100.jsonl"
    assert '"ci_s"' not in json.loads(path.read_text().splitlines()[1])["stats"]
    ms = load_run(path).measurements
    benched = [m for m in ms if "ci_s" in m.extra]
    assert benched and all(m.stats.ci_s == tuple(m.extra["ci_s"]) for m in benched)
    assert all(m.stats.ci_s is None for m in ms if "ci_s" not in m.extra)


def test_measurement_summary_shows_time_verdict_telemetry_and_findings():
    text = str(measurement(rejected_reps=[3], policy="reject"))
    assert text.splitlines()[0] == (
        "gemm: median 1.500 ms, IQR 100.00 us over 3 reps (1 of 4 rejected) "
        "[annotated, policy reject]"
    )
    assert "SM 1452 MHz (1380-1980)" in text
    assert "[info] power_cap: the SW power cap held GPU 0 back" in text
    single = str(measurement("step", times=(2.5,), verdict="ok", findings=()))
    assert single.startswith("step: 2.500 s [ok]")


def test_store_appends_each_measurement_durably_and_load_run_reads_them(tmp_path):
    path = tmp_path / "out" / "run.jsonl"
    store = ResultStore(path, {"gpus": [{"name": "sim"}]}, mkdir=True)  # asked for
    store.append(measurement("a"))
    # readable before the store is closed: a crash now loses nothing already measured
    assert [m.name for m in load_run(path).measurements] == ["a"]
    store.append(measurement("b"))
    store.close()
    run = load_run(path)
    assert [m.name for m in run.measurements] == ["a", "b"]
    assert run.metadata["gpus"] == [{"name": "sim"}]
    assert run.measurements[0] == measurement("a")


def test_a_batch_of_measurements_is_written_with_one_fsync(tmp_path, monkeypatch):
    # `gpuenv run` ends with every call's measurement at once: 10,000 fsyncs of one line
    # each took 50 s of the summary; the batch is one write and one fsync
    import gpuenv.results as results_module

    synced: list[int] = []
    real_fsync = results_module.os.fsync
    monkeypatch.setattr(results_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "run.jsonl"
    with ResultStore(path, {}) as store:
        store.extend(measurement(f"call {k}") for k in range(50))
        store.extend([])  # nothing to write: no fsync either
    assert len(synced) == 2  # the run's header line, then the 50 measurements
    assert [m.name for m in load_run(path).measurements] == [f"call {k}" for k in range(50)]
    results = Results({})
    for k in range(20):
        results.add(measurement(f"m {k}"))
    synced.clear()
    results.save(tmp_path / "saved.jsonl")
    assert len(synced) == 2
    assert len(load_run(tmp_path / "saved.jsonl").measurements) == 20


def test_a_one_rep_measurement_writes_its_window_once_and_reads_back_whole(tmp_path):
    # each of a `gpuenv run`'s 10,000 do_bench calls is a one-rep measurement: its summary
    # window is its one window, and writing both made half of every line
    path = tmp_path / "run.jsonl"
    one = measurement("call", times=(0.002,))
    many = measurement("gemm")
    with ResultStore(path, {}) as store:
        store.extend([one, many])
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert "summary_windows" not in lines[0] and len(lines[0]["windows"]) == 1
    assert len(lines[1]["summary_windows"]) == 1  # many reps: the summary is its own
    back = load_run(path).measurements
    assert back == (one, many)
    assert back[0].telemetry == one.windows[0]


def test_the_store_writes_what_to_dict_gives(tmp_path):
    # the store encodes records from their fields (json_default), without a to_dict copy
    m = measurement(
        "gemm", extra={"labels": {"size": 4096}, "ci_s": (0.0014, None), 7: {"nested": [1, 2.5]}}
    )
    path = tmp_path / "run.jsonl"
    with ResultStore(path, {}) as store:
        store.append(m)
    line = json.loads(path.read_text().splitlines()[1])
    assert line == {"type": "measurement", "run_id": store.run_id, **m.to_dict()}


def test_a_line_cut_short_by_a_crash_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "run.jsonl"
    with ResultStore(path, {}) as store:
        store.append(measurement("a"))
    with open(path, "a") as fh:
        fh.write('{"type": "measurement", "name": "b", "tim')
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        run = load_run(path)
    assert [m.name for m in run.measurements] == ["a"]


def test_several_runs_in_one_file_only_when_asked_and_load_run_says_so(tmp_path):
    # one run per file: a second run into the same file is refused unless it appends
    # (a failed first attempt stayed in baseline.jsonl and was pooled with the good one)
    path = tmp_path / "run.jsonl"
    with ResultStore(path, {"label": "first"}) as store:
        store.append(measurement("first"))
    with pytest.raises(ConfigError, match="already holds results: output writes one run") as e:
        ResultStore(path, {"label": "second"})
    assert "append=True" in e.value.hint
    with pytest.raises(ConfigError, match="already holds results"):
        Results({}).save(path)
    assert len(load_runs(path)) == 1  # the refused writes left it as it was
    with ResultStore(path, {"label": "second"}, append=True) as store:
        store.append(measurement("second"))
    runs = load_runs(path)
    assert [r.metadata["label"] for r in runs] == ["first", "second"]
    with pytest.warns(UserWarning, match=r"run.jsonl holds 2 runs \(written with --append\)"):
        assert load_run(path).measurements[0].name == "second"
    Results({"label": "third"}).save(path, append=True)
    assert len(load_runs(path)) == 3


def test_stable_and_bench_refuse_a_results_file_before_they_measure(tmp_path):
    import gpuenv

    path = tmp_path / "run.jsonl"
    path.write_text('{"type": "run", "run_id": "x", "metadata": {}}\n')
    with pytest.raises(ConfigError, match="already holds results"):
        gpuenv.stable(output=path)
    with pytest.raises(ConfigError, match="already holds results"):
        gpuenv.bench(lambda: None, output=path)
    with pytest.raises(ConfigError, match="append must be"):
        gpuenv.stable(output=path, append="yes")


def test_unreadable_or_empty_files_give_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read results file"):
        load_run(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="holds no gpuenv run"):
        load_run(tmp_path / "empty.jsonl")
    with pytest.raises(ConfigError, match="cannot write results"):
        ResultStore(tmp_path / "empty.jsonl" / "x.jsonl", {})


def test_a_file_that_is_not_results_says_so_first_and_alone(tmp_path):
    """`gpuenv compare r.jsonl bench.py`: a script is no results file, said once, before
    (and instead of) a warning about each of its lines."""
    import warnings

    script = tmp_path / "bench.py"
    script.write_text("import gpuenv\n\ndef main():\n    print(1)\n\nmain()\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a line warning would raise here, before the error
        with pytest.raises(ConfigError) as err:
            load_run(script)
    assert "bench.py is not a gpuenv results file: none of its 4 lines" in str(err.value)
    assert "pass a .jsonl file written by gpuenv" in str(err.value)


def test_results_save_writes_a_run(tmp_path):
    results = Results({"host": "h"})
    results.add(measurement("a"))
    results.add(measurement("b"))
    assert len(results) == 2 and results[1].name == "b" and results.by_name("a")
    path = results.save(tmp_path / "r.jsonl")
    run = load_run(path)
    assert isinstance(run, Run)
    assert run.metadata["host"] == "h" and len(run.measurements) == 2


def test_environment_metadata_describes_gpu_host_and_versions():
    sim = SimBackend("h100", clock=VirtualClock())
    meta = environment_metadata(sim, [0])
    gpu = meta["gpus"][0]
    assert gpu["name"].startswith("NVIDIA H100")
    assert gpu["max_sm_mhz"] == 1980 and gpu["power_limit_w"] == 700
    assert gpu["persistence"] is True and gpu["sm_mhz"] == 345
    assert meta["driver_version"] and meta["gpuenv_version"] and meta["hostname"]
    assert meta["backend"] == "sim"
    assert meta["time_utc"].startswith("2026")  # the virtual clock's wall time
    json.dumps(meta)  # JSON-ready


def test_environment_metadata_never_imports_torch():
    had_torch = "torch" in sys.modules
    meta = environment_metadata(SimBackend("h100", clock=VirtualClock()), [0])
    if not had_torch:
        assert "torch" not in sys.modules
        assert "torch_version" not in meta


def test_environment_metadata_records_read_errors_instead_of_raising():
    sim = SimBackend("h100", clock=VirtualClock())
    sim.inject_fault(0, "gpu_lost")
    meta = environment_metadata(sim, [0])
    assert "device_info" in meta["gpus"][0]["errors"]
    assert "lost" in meta["gpus"][0]["errors"]["read_fast"].lower()
    with pytest.raises(GpuLost):
        sim.read_fast(0)


def test_results_with_a_store_append_as_they_go_and_survive_a_failing_disk(tmp_path):
    path = tmp_path / "live.jsonl"
    store = ResultStore(path, {})
    results = Results({}, store=store)
    results.add(measurement("a"))
    assert [m.name for m in load_run(path).measurements] == ["a"]
    store.close()  # the file goes away under us: warn once, keep the measurements
    with pytest.warns(UserWarning, match="could not append 'b'"):
        results.add(measurement("b"))
    results.add(measurement("c"))
    assert [m.name for m in results] == ["a", "b", "c"]
