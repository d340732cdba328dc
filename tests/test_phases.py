"""What bench did before and around its reps, as records (gpuenv.phases): written into a
Measurement's extra under the keys files have always held, read back as the same record,
and read from a file written before the records existed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpuenv
from gpuenv.backend.sim import SimBackend
from gpuenv.phases import (
    WALL_PHASES,
    BurstSchedule,
    Conditioned,
    Conditioning,
    FirstBurst,
    StateProbe,
    TemperatureFacts,
    Wall,
    Warmup,
)
from gpuenv.results import Measurement, load_run
from gpuenv.timebase import VirtualClock
from gpuenv.timing import sim_kernel

KEPT = Path(__file__).resolve().parents[1] / "docs" / "stable_session_h100.jsonl"

RECORDS = [
    Warmup(8, 0.0167, True, known=True),
    Warmup(200, 1.5, False),
    FirstBurst(0.0, True, from_start=True),
    FirstBurst(
        0.41,
        False,
        from_start=True,
        cold_start=True,
        state_probe=StateProbe(1.4e-3, 1755.0, 1980, False, free=False),
    ),
    FirstBurst(4.69, True, temperature=TemperatureFacts(31.0, 39.0, None, None)),
    BurstSchedule(rests=0),
    BurstSchedule(3, 4, 0.025, 0.31, 1, 0, 0.1, power_seen=True),
    Conditioning(12.5, True, 1755.0, 61.0, True, 0.002),
    Conditioning(30.0, False, None, None, False, None),
    Conditioned(
        "burst", "clocks not locked: each burst starts from the cool, uncapped state", (1,)
    ),
    Conditioned("none", "asked for"),
]


def _sim() -> SimBackend:
    sim = SimBackend("h100", clock=VirtualClock())
    sim.open_context(0)
    return sim


def _records(m: Measurement) -> tuple[object, ...]:
    return m.warmup, m.first_burst, m.bursts, m.precondition


def _reloaded(m: Measurement) -> Measurement:
    return Measurement.from_dict(json.loads(json.dumps(m.to_dict())))


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_each_record_reads_back_what_it_wrote(record):
    assert type(record).from_extra(record.to_extra()) == record
    # beside the rest of extra, as a Measurement holds it
    assert type(record).from_extra({"mode": "auto", **record.to_extra(), "l2": "warm"}) == record


def test_the_records_write_the_keys_files_hold_in_their_order():
    assert list(Warmup(8, 0.1, True).to_extra()) == [
        "warmup_reps",
        "warmup_s",
        "warmup_steady",
        "warmup_known",
    ]
    assert list(RECORDS[3].to_extra()) == [
        "burst_from_start",
        "burst_cold_start",
        "state_probe",
        "burst_first_wait_s",
        "burst_first_ready",
    ]
    assert list(RECORDS[4].to_extra()) == ["temperature", "burst_first_wait_s", "burst_first_ready"]
    assert BurstSchedule(rests=0).to_extra() == {"burst_rests": 0}  # another condition's
    assert list(RECORDS[6].to_extra()) == [
        "burst_rests",
        "bursts",
        "burst_max_s",
        "burst_rest_s",
        "burst_waits",
        "burst_clock_redos",
        "in_bursts_s",
        "burst_power_seen",
    ]
    assert [k.removeprefix("precondition_") for k in RECORDS[7].to_extra()] == [
        "s",
        "steady",
        "sm_mhz",
        "temp_c",
        "limited",
        "residual",
    ]


# the state probe's and a session's temperature facts as files hold them, in each shape
# gpuenv has written (a clock read from a sample is an int, and stays one)
PROBES = [
    # the clock not far enough down to tell: no reps run
    {"ref_s": 1.4e-3, "ref_clock_mhz": 1980.0, "clock_mhz": 1755, "light": False, "free": False},
    # the clock down, the time the same: measured at once
    {
        "ref_s": 3e-4,
        "ref_clock_mhz": 1980.0,
        "clock_mhz": 1395,
        "light": True,
        "time_s": 3.01e-4,
        "reps": 10,
        "moved": 0.0033,
        "free": True,
    },
    # no clock could be read
    {"ref_s": 1.4e-3, "ref_clock_mhz": 1980, "clock_mhz": None, "light": False, "free": False},
    # written before gpuenv judged light kernels
    {
        "ref_s": 1.4e-3,
        "ref_clock_mhz": 1980.0,
        "clock_mhz": 1395,
        "time_s": 1.55e-3,
        "reps": 3,
        "moved": 0.107,
        "free": False,
    },
]
TEMPERATURES = [
    {
        "idle_c": 31,
        "start_c": 58,
        "slope_per_c": None,
        "margin_c": None,
        "note": "measured at 58 C, 27 C above the session's start, without waiting to cool",
    },
    {"idle_c": 31.0, "start_c": 33.5, "slope_per_c": 8e-4, "margin_c": 6.25},
    {"idle_c": None, "start_c": None, "slope_per_c": None, "margin_c": None},
]


@pytest.mark.parametrize("written", PROBES + TEMPERATURES)
def test_a_probe_and_temperature_facts_read_back_and_write_the_bytes_a_file_holds(written):
    record = (StateProbe if "ref_s" in written else TemperatureFacts).from_extra(written)
    assert record is not None
    assert json.dumps(record.to_extra()) == json.dumps(written)
    key = "state_probe" if "ref_s" in written else "temperature"
    extra = {
        "burst_from_start": True,
        key: written,
        "burst_first_wait_s": 0.0,
        "burst_first_ready": True,
    }
    first = FirstBurst.from_extra(json.loads(json.dumps(extra)))
    assert first is not None and getattr(first, key) == record
    assert json.dumps(first.to_extra()) == json.dumps(extra)


def test_a_probe_says_what_it_found_in_fields():
    ran, before_light = StateProbe.from_extra(PROBES[1]), StateProbe.from_extra(PROBES[3])
    assert ran == StateProbe(3e-4, 1980.0, 1395, True, True, 3.01e-4, 10, 0.0033)
    assert before_light is not None and before_light.light is None and not before_light.free
    assert StateProbe.from_extra(PROBES[0]) == StateProbe(1.4e-3, 1980.0, 1755, False, False)
    assert TemperatureFacts.from_extra(TEMPERATURES[1]) == TemperatureFacts(31.0, 33.5, 8e-4, 6.25)


def test_a_burst_bench_reads_its_records_back_after_a_json_round_trip():
    sim = _sim()
    gemm = sim_kernel(sim, 0, seconds=1.4e-3)
    cold = gpuenv.bench(gemm, backend=sim, keep_trace=False)
    sim_kernel(sim, 0, seconds=5.0)()  # 5 s of heavy load: the GPU capped
    hot = gpuenv.bench(gemm, backend=sim, keep_trace=False)
    for m in (cold, hot):
        warm, first, bursts, pre = _records(m)
        assert warm is not None and warm.reps >= gpuenv.timing.WARMUP_MIN_REPS and warm.steady
        assert first is not None and first.from_start is not None and first.temperature is None
        assert bursts is not None and bursts.bursts is not None and bursts.bursts >= 1
        assert pre is None
        assert _records(_reloaded(m)) == _records(m)
    assert hot.warmup.known and not cold.warmup.known  # gemm was warmed up before
    assert hot.first_burst.wait_s > cold.first_burst.wait_s + 0.2  # it waited out the cap
    # the state probe: gemm measured before on a ready GPU, the GPU held down now
    probe = hot.first_burst.state_probe
    assert probe is not None and probe.ref_s > 0 and probe.light is not None
    assert probe.to_extra() == hot.extra["state_probe"]


def test_a_bench_begun_on_an_idle_gpu_says_it_waited_for_fresh_samples(ready_checks):
    sim = SimBackend("h100", clock=VirtualClock())  # no context yet: the GPU idles
    gemm = sim_kernel(sim, 0, seconds=1.4e-3)
    m = gpuenv.bench(gemm, backend=sim, burst_from_start=True, keep_trace=False)
    assert m.first_burst is not None and m.first_burst.from_start and m.first_burst.cold_start
    assert m.extra["burst_cold_start"] is True
    # samples taken after the check began alone: none read before the work counts
    assert ready_checks.lookback == [0.0]


def test_a_sustained_bench_holds_its_precondition_and_no_burst():
    sim = _sim()
    m = gpuenv.bench(sim_kernel(sim, 0), backend=sim, condition="sustained", keep_trace=False)
    assert m.precondition is not None and m.precondition.seconds > 0
    assert m.precondition.seconds == m.extra["precondition_s"]
    assert m.first_burst is None and m.bursts == BurstSchedule(rests=0)
    assert _records(_reloaded(m)) == _records(m)


def test_a_session_bench_holds_what_its_wait_knew_of_the_temperature():
    sim = _sim()
    sim.idle(120)
    with gpuenv.stable(backend=sim) as env:
        m = env.bench(sim_kernel(sim, 0))
    first = m.first_burst
    assert first is not None and first.from_start is None and first.ready
    assert first.temperature is not None and first.temperature.start_c is not None
    assert first.temperature.to_extra() == m.extra["temperature"]
    assert first.wait_s == m.extra["burst_first_wait_s"]


def test_a_bench_in_no_condition_holds_no_conditioning():
    sim = _sim()
    m = gpuenv.bench(sim_kernel(sim, 0), backend=sim, condition="none", keep_trace=False)
    assert m.warmup is not None and m.first_burst is None and m.precondition is None
    assert m.bursts == BurstSchedule(rests=0)


def test_a_file_written_before_the_records_reads_them_and_writes_its_extra_as_it_was():
    # docs/stable_session_h100.jsonl: a real H100 session's file, kept as it was written
    # (no warmup_known, and of the burst schedule only burst_rests)
    lines = KEPT.read_text().splitlines()
    run = load_run(KEPT)
    cold, load, after = run.measurements
    assert cold.warmup == Warmup(8, 0.1890465799999994, True, known=False)
    assert after.first_burst == FirstBurst(4.691273494999997, True)
    assert after.bursts == BurstSchedule(rests=0)
    assert cold.precondition is None
    assert _records(load) == (None, None, None, None)  # an env.measure region
    for line, m in zip(lines[1:], run.measurements, strict=True):
        written = json.loads(line)["extra"]
        assert json.dumps(m.to_dict()["extra"]) == json.dumps(written)


def test_a_bench_now_holds_the_kept_files_keys_in_their_order():
    kept = list(json.loads(KEPT.read_text().splitlines()[1])["extra"])  # a session's bench
    sim = _sim()
    with gpuenv.stable(backend=sim) as env:
        now = list(env.bench(sim_kernel(sim, 0)).extra)
    both = [k for k in kept if k in now]
    assert {"warmup_reps", "burst_first_wait_s", "burst_rests", "stop_reason"} <= set(both)
    assert [k for k in now if k in both] == both


@pytest.mark.parametrize(
    "extra",
    [
        {"warmup_reps": "8", "warmup_s": 0.1, "warmup_steady": True},
        {"warmup_reps": 8, "warmup_s": None, "warmup_steady": True},
        {"warmup_reps": 8, "warmup_s": 0.1, "warmup_steady": 1},
        {"burst_first_wait_s": "0.1", "burst_first_ready": True},
        {"burst_first_wait_s": 0.1, "burst_first_ready": True, "state_probe": [1]},
        {"burst_first_wait_s": 0.1, "burst_first_ready": True, "state_probe": {"ref_s": 1e-3}},
        {
            "burst_first_wait_s": 0.1,
            "burst_first_ready": True,
            "state_probe": {**PROBES[1], "reps": 10.0},
        },
        {
            "burst_first_wait_s": 0.1,
            "burst_first_ready": True,
            "state_probe": {**PROBES[0], "clock_mhz": "1755"},
        },
        {
            "burst_first_wait_s": 0.1,
            "burst_first_ready": True,
            "state_probe": {**PROBES[0], "light": 0},
        },
        {"burst_first_wait_s": 0.1, "burst_first_ready": True, "temperature": [31.0]},
        {
            "burst_first_wait_s": 0.1,
            "burst_first_ready": True,
            "temperature": {**TEMPERATURES[1], "start_c": "hot"},
        },
        {
            "burst_first_wait_s": 0.1,
            "burst_first_ready": True,
            "temperature": {**TEMPERATURES[0], "note": 5},
        },
        {"burst_rests": True},
        {"burst_rests": 0, "burst_max_s": "long"},
        {"precondition_s": 1.0, "precondition_steady": "yes"},
        {"precondition_s": float("nan"), "precondition_steady": True},
    ],
)
def test_values_of_the_wrong_type_read_as_no_record(extra):
    m = Measurement.build("x", [1.0], extra=extra)
    assert _records(m) == (None, None, None, None)


def test_the_condition_reads_back_with_its_gpus_and_a_file_without_them_reads_none_waited():
    sim = _sim()
    m = gpuenv.bench(sim_kernel(sim, 0, seconds=1.4e-3), backend=sim, keep_trace=False)
    assert (
        m.conditioned == Conditioned("burst", m.extra["condition_why"], (0,))
        and _reloaded(m).conditioned == m.conditioned
    )
    older = {"condition": "burst", "condition_why": "asked for"}  # written before the GPUs
    assert Measurement.build("x", [1.0], extra=older).conditioned == Conditioned(
        "burst", "asked for", ()
    )
    for bad in ({"condition": 1, "condition_why": "x"}, {**older, "condition_gpus": ["0"]}):
        assert Measurement.build("x", [1.0], extra=bad).conditioned is None


def test_an_extra_that_is_no_mapping_reads_as_no_record():
    # (a file's stats with the CI: from_dict does not look into this extra for it)
    stats = Measurement.build("x", [1.0]).to_dict()["stats"]
    m = Measurement.from_dict({"name": "x", "times_s": [1.0], "stats": stats, "extra": [1]})
    assert m.extra == [1]
    assert _records(m) == (None, None, None, None)


def test_a_bench_says_where_its_wall_went_phase_by_phase(monkeypatch):
    """Each phase's own step moves a fake perf_counter by its own amount: the wall record
    gives each amount to its phase (a mark out of place gives one phase another's)."""
    from gpuenv.timing import harness

    now = [0.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: now[0])
    cost = dict(zip(WALL_PHASES, (5.0, 7.0, 3.0, 11.0, 13.0, 17.0, 19.0), strict=True))

    def costs(phase, real):
        def step(*args, **kwargs):
            out = real(*args, **kwargs)
            now[0] += cost[phase]
            return out

        return step

    from gpuenv.telemetry import Sampler

    for owner, name, phase in (
        (harness, "_facts", "open"),  # inside _Place.open
        (harness, "_warmup", "warmup"),
        (harness._Run, "_choose_method", "method"),
        (harness._Run, "_condition", "condition"),
        (harness._Run, "_measure", "measure"),
        (harness._Run, "_judge", "judge"),
        (Sampler, "stop", "close"),  # inside _Place.close: bench's own sampler stops
    ):
        monkeypatch.setattr(owner, name, costs(phase, getattr(owner, name)))
    sim = _sim()
    m = gpuenv.bench(sim_kernel(sim, 0), backend=sim, keep_trace=False)
    assert m.wall == Wall(tuple(cost.items()))
    assert m.wall.total_s == sum(cost.values()) and m.wall.seconds("judge") == 17.0
    assert m.extra["wall_s"] == cost
    assert _reloaded(m).wall == m.wall


def test_a_wall_record_of_the_wrong_shape_reads_as_none():
    good = dict.fromkeys(WALL_PHASES, 0.1)
    assert Wall.from_extra({"wall_s": good}) == Wall(tuple(good.items()))
    for bad in ({**good, "open": "0.1"}, {k: good[k] for k in WALL_PHASES[1:]}, [0.1] * 7):
        assert Wall.from_extra({"wall_s": bad}) is None
    assert Measurement.build("x", [1.0]).wall is None  # a file written before it was kept
    with pytest.raises(ValueError, match="3 marks for 7 phases"):
        Wall.between([0.0, 1.0, 2.0])
