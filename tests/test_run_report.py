"""What `gpuenv run` reports: measurements per region and the table, on synthetic windows.

tests/test_run_runner.py runs `gpuenv run` itself.
"""

from __future__ import annotations

from gpuenv.run.report import RUN_NAME, build_measurements, summary_table
from gpuenv.run.tracker import Region
from gpuenv.telemetry import Window


def _w(t0, t1, **kw) -> Window:
    return Window(gpu=0, t0=t0, t1=t1, n_samples=kw.pop("n", 1), **kw)


def _idle_start_window(t0: float, t1: float) -> Window:
    # a command's start on a real GPU: idle (GpuIdle) until its CUDA context exists
    return _w(t0, t1, sm_mhz_start=345, sm_mhz_mean=1500, sm_mhz_min=345, sm_mhz_max=1980,
              reasons=0x1, reasons_start=0x1, reasons_end=0x0)  # fmt: skip


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
