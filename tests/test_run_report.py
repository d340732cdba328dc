"""What `gpuenv run` reports: measurements per region and the table, on synthetic windows.

tests/test_run_runner.py runs `gpuenv run` itself.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from gpuenv.results import Measurement
from gpuenv.run.perfgrid import grids, write_grids
from gpuenv.run.report import MAX_FLAGGED, RUN_NAME, build_measurements, call_names, summary_table
from gpuenv.run.tracker import Region
from gpuenv.telemetry import Window
from gpuenv.verdict import Finding


def _w(t0, t1, **kw) -> Window:
    return Window(gpu=0, t0=t0, t1=t1, n_samples=kw.pop("n", 1), **kw)


def _idle_start_window(t0: float, t1: float) -> Window:
    # a command's start on a real GPU: idle (GpuIdle) until its CUDA context exists
    return _w(
        t0,
        t1,
        sm_mhz_start=345,
        sm_mhz_mean=1500,
        sm_mhz_min=345,
        sm_mhz_max=1980,
        reasons=0x1,
        reasons_start=0x1,
        reasons_end=0x0,
    )


def test_the_idle_start_of_a_command_is_not_held_against_it_but_a_regions_is():
    from gpuenv.verdict import GpuFacts

    facts = {0: GpuFacts(max_sm_mhz=1980.0)}
    run = Region(RUN_NAME, 1, 0.0, 10.0)
    run.windows = {0: _idle_start_window(0.0, 10.0)}
    (whole,) = build_measurements(
        [], run, gpus=[0], facts=facts, policy="reject", stable_clocks=False, wall_at=float
    )
    warm = next(f for f in whole.findings if f.kind == "warmup_ramp")
    assert warm.severity == "info" and "expected: a command starts" in warm.message
    assert whole.verdict != "rejected"
    region = Region("first step", 1, 0.0, 1.0)
    region.windows = {0: _idle_start_window(0.0, 1.0)}
    whole, step = build_measurements(
        [region], run, gpus=[0], facts=facts, policy="reject", stable_clocks=False, wall_at=float
    )
    assert step.verdict == "rejected"  # a region that began cold measured the warmup
    assert whole.policy == "annotate"  # with regions, the policy is theirs


def test_summary_table_has_a_row_per_region_and_the_findings():
    from gpuenv.results import Measurement
    from gpuenv.verdict import Finding

    w = _w(
        0,
        2,
        sm_mhz_mean=1350,
        sm_mhz_min=1350,
        sm_mhz_max=1350,
        power_w_mean=690,
        energy_j=1380.0,
        temp_c_start=40,
        temp_c_max=61,
        reason_s={"power": 1.25},
    )
    f = Finding("power_cap", "info", (0,), "the SW power cap held GPU 0 back", 0)
    m = Measurement.build("train", [2.0], summary_windows=(w,), findings=(f,), gpus=(0,))
    text = summary_table([m], header="gpuenv run: x")
    row = next(line for line in text.splitlines() if line.strip().startswith("train"))
    for part in ("2.00 s", "1350", "690 W", "1.38 kJ", "40-61", "power cap 1.25 s", "ok"):
        assert part in row
    assert "[info] power_cap" in text
    assert Region("r", 1, 5.0).covered_to == 5.0


# -- calls of measuring functions: one measurement each, grouped by site for display --------


def _call(name: str, site: str, t0: float, t1: float, window: Window, **meta) -> Region:
    r = Region(name, 1, t0, t1)
    r.windows = {0: window}
    r.meta = {"site": site, "kind": "do_bench", **meta}
    return r


def _steady(t0: float, t1: float) -> Window:
    return _w(t0, t1, sm_mhz_start=1980, sm_mhz_mean=1980, sm_mhz_min=1980, sm_mhz_max=1980)


def test_calls_of_one_site_are_never_reps_of_one_measurement():
    # a sweep from one line: the first call compiles (5x longer); as reps of one measurement
    # that read as a warmup ramp, and a spread between calls that measure different things
    from gpuenv.verdict import GpuFacts

    facts = {0: GpuFacts(max_sm_mhz=1980.0)}
    run = Region(RUN_NAME, 1, 0.0, 20.0)
    run.windows = {0: _steady(0.0, 20.0)}
    site = "do_bench bench.py:33"
    times = [(0.0, 0.5)] + [(1.0 + k, 1.1 + k) for k in range(7)]
    calls = [
        _call(site, site, a, b, _steady(a, b), labels={"size": 2**k})
        for k, (a, b) in enumerate(times)
    ]
    step = [Region("step", 1, 10.0 + k, 10.5 + k) for k in range(3)]
    for r in step:
        r.windows = {0: _steady(r.t0, r.t1 or r.t0)}
    ms = build_measurements(
        [*calls, *step],
        run,
        gpus=[0],
        facts=facts,
        policy="annotate",
        stable_clocks=False,
        wall_at=float,
    )
    assert [m.name for m in ms] == [RUN_NAME, *(f"{site} #{k}" for k in range(1, 9)), "step"]
    assert all(len(m.times_s) == 1 and not m.findings for m in ms[1:9])
    assert [m.extra["call"] for m in ms[1:9]] == list(range(1, 9))
    assert ms[1].extra["site"] == site and ms[1].extra["labels"] == {"size": 1}
    assert len(ms[9].times_s) == 3  # a region the user marked: one measurement, a rep per entry


def test_call_names_number_repeats_and_tell_sites_apart():
    w = _steady(0.0, 1.0)
    calls = [
        _call("do_bench a.py:3", "do_bench a.py:3", 0, 1, w),
        _call("Timer mm", "Timer a.py:5", 1, 2, w),
        _call("do_bench a.py:3", "do_bench a.py:3", 2, 3, w),
        _call("Timer mm", "Timer a.py:9", 3, 4, w),
        _call("k BLOCK=64", "do_bench (autotune) a.py:12", 4, 5, w),
    ]
    assert call_names(calls) == [
        "do_bench a.py:3 #1",
        "Timer mm (Timer a.py:5)",
        "do_bench a.py:3 #2",
        "Timer mm (Timer a.py:9)",
        "k BLOCK=64",
    ]


def _measured(name: str, site: str, k: int, flagged: bool) -> Measurement:
    w = _w(0, 1, sm_mhz_mean=1980, power_w_mean=650)
    f = (Finding("power_cap", "warning", (0,), "the SW power cap held GPU 0 back", 0),)
    return Measurement.build(
        name,
        [0.1],
        summary_windows=(w,),
        findings=f if flagged else (),
        verdict="annotated" if flagged else "ok",
        gpus=(0,),
        extra={"site": site, "call": k, "returned_s": 1e-5 * k},
    )


def test_a_thousand_calls_are_a_row_and_their_flagged_ones_a_few_lines():
    site = "do_bench bench.py:7"
    ms = [_measured(f"gemm n={k}", site, k, flagged=k % 3 == 0) for k in range(1, 1001)]
    text = summary_table(ms, header="gpuenv run: x")
    lines = text.splitlines()
    assert len(lines) <= 3 + 1 + MAX_FLAGGED + 1, text
    row = next(line for line in lines if line.strip().startswith(site))
    assert "1000 calls" in row and "med 5.01 ms returned" in row
    assert "667 ok, 333 annotated" in row
    assert f"  {site}: 333 of 1000 calls flagged" in lines
    assert "    gemm n=3: annotated: [warning] power_cap: the SW power cap held GPU 0 back" in lines
    assert lines[-1] == ("    ... and 323 more (power_cap 323): gpuenv run -v names every call")
    every = summary_table(ms, header="gpuenv run: x", verbose=True)
    assert len(every.splitlines()) > 1000 and "\n    gemm n=1000 " in every


def test_the_rank0_table_groups_calls_per_rank():
    from gpuenv.run.ranks import combined_text

    record = {
        "command": "python b.py",
        "state": "clocks not locked",
        "outcome": "exited with 0",
        "duration_s": 1.0,
        "where": "GPU 0",
    }
    runs = [
        (r, record, [_measured(f"n={k}", "do_bench b.py:3", k, False) for k in (1, 2)])
        for r in (0, 1)
    ]
    text = combined_text(runs, [], 1.0)
    assert len([line for line in text.splitlines() if "do_bench b.py:3" in line]) == 2
    assert re.search(r"\n  0 +do_bench b.py:3 +2 calls ", text)
    assert re.search(r"\n  1 +do_bench b.py:3 +2 calls ", text)


# -- perf_report's grid ---------------------------------------------------------------------


def _point(size: int, line: str, flagged: bool, save_path: str = "") -> Measurement:
    m = _measured(f"vadd size={size} provider={line.lower()}", "do_bench b.py:30", 1, flagged)
    plot = {
        "serial": 1,
        "name": "vadd",
        "x_names": ["size"],
        "line_names": ["Triton", "Torch"],
        "save_path": save_path,
        "print": True,
        "x": [size],
        "line": line,
    }
    return dataclasses.replace(m, extra={**m.extra, "pids": [7], "plot": plot})


def test_the_grid_says_which_points_to_distrust(tmp_path):
    ms = [
        _point(s, line, flagged=(s, line) == (8192, "Torch"), save_path=str(tmp_path))
        for s in (4096, 8192)
        for line in ("Triton", "Torch")
    ]
    (grid,) = grids(ms)
    assert grid.table() == [
        ["size", "Triton", "Torch"],
        ["4096", "ok", "ok"],
        ["8192", "ok", "annotated: power_cap"],
    ]
    (tmp_path / "vadd.csv").write_text("the user's\n")
    lines = write_grids([grid])
    assert "gpuenv: vadd (perf_report): each point's verdict" in lines[0]
    assert re.search(r"\n +1 +8192 +ok +annotated: power_cap", lines[0])
    assert (tmp_path / "vadd.gpuenv.csv").read_text().splitlines()[2] == (
        "8192,ok,annotated: power_cap"
    )
    assert (tmp_path / "vadd.csv").read_text() == "the user's\n"


def test_the_grid_never_writes_over_a_users_csv(tmp_path):
    (tmp_path / "vadd.gpuenv.csv").write_text("the user's\n")
    mine = grids([_point(4096, "Triton", False, str(tmp_path))])
    theirs = grids(
        [
            dataclasses.replace(
                m,
                extra={**m.extra, "plot": {**m.extra["plot"], "serial": 2, "name": "vadd.gpuenv"}},
            )
            for m in [_point(4096, "Triton", False, str(tmp_path))]
        ]
    )
    lines = write_grids([*mine, *theirs])
    assert any("not writing" in line and "vadd.gpuenv.csv" in line for line in lines)
    assert (tmp_path / "vadd.gpuenv.csv").read_text() == "the user's\n"


def test_a_tool_that_warms_up_itself_is_not_blamed_for_starting_on_an_idle_gpu():
    """The first do_bench of a perf_report sweep starts on an idle GPU (it compiles, then
    do_bench warms up before its reps): on the H100 it read 'warmup_ramp: GPU 0 was still
    warming up' although the number it returned came after the warm-up: no finding, a note.
    A pytest-benchmark call, which does not warm up by default, keeps the warning."""
    from gpuenv.verdict import GpuFacts

    facts = {0: GpuFacts(max_sm_mhz=1980.0)}
    run = Region(RUN_NAME, 1, 0.0, 10.0)
    run.windows = {0: _idle_start_window(0.0, 10.0)}
    calls = []
    for kind, site in (
        ("do_bench", "do_bench bench.py:7"),
        ("timer", "Timer t.py:3"),
        ("pytest", "test_x.py::test_y"),
    ):
        r = Region(f"{kind} call", 1, 0.0, 1.0, meta={"kind": kind, "site": site})
        r.windows = {0: _idle_start_window(0.0, 1.0)}
        calls.append(r)
    _, bench, timer, test = build_measurements(
        calls, run, gpus=[0], facts=facts, policy="reject", stable_clocks=False, wall_at=float
    )
    for m, tool in ((bench, "do_bench warms up"), (timer, "the Timer warms up")):
        assert [f.kind for f in m.findings] == [] and m.verdict == "ok"
        assert tool in m.extra["cold_start"]
    assert next(f for f in test.findings if f.kind == "warmup_ramp").severity == "warning"
    assert test.verdict == "rejected"


def test_the_verdict_column_says_rejected_where_the_reject_policy_dropped_reps():
    # it read "annotated (1 reps)": the word the policy acted in was missing
    dropped = Measurement.build("step", [1.0, 1.0, 1.0], rejected_reps=(1,), verdict="annotated")
    gone = Measurement.build("drift", [1.0, 1.0], rejected_reps=(0, 1), verdict="rejected")
    text = summary_table([dropped, gone], header="gpuenv run: x")
    rows = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.strip()}
    assert rows["step"].rstrip().endswith("annotated, 1 of 3 reps rejected"), text
    assert rows["drift"].rstrip().endswith("rejected (2 of 2 reps)"), text


def test_the_header_quotes_the_command_as_it_was_typed():
    from gpuenv.run.report import run_text

    record = {
        "command": shlex.join(["python", "-c", "print(42)"]),
        "outcome": "exited with 0",
        "duration_s": 1.0,
        "where": "GPU 0",
        "state": "clocks not locked",
    }
    m = Measurement.build(RUN_NAME, [1.0])
    head = run_text(record, [m]).splitlines()[0]
    assert head.startswith("gpuenv run: python -c 'print(42)' exited with 0"), head
