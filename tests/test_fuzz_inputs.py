"""Property-based fuzzing of every input door (hypothesis, fixed seed, time-bounded): the
Python API's parameters, each file format's records and the CLI's numeric options get
NaN, inf, huge, negative and wrong-typed values. The property: a value is either taken
(and then it is a sane one) or refused with a ConfigError that names the parameter,
the flag or the file's line and field; never another exception, never a traceback.

`derandomize=True` makes every run try the same cases (CI never flakes on a new seed);
`max_examples` keeps the whole module within about 30 s on the 2-core CI machine.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.inputs import json_paths, json_set
from gpuenv import validate
from gpuenv.errors import ConfigError

FUZZ = settings(
    derandomize=True,
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# what a confused caller passes: NaN, inf, huge, negative, zero, text, None, containers
ODD = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 0.5, 1.5, 2, 10**30, -(10**30)]),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.text(max_size=6),
    st.sampled_from(["auto", "1", "nan", "", "yes", "abc", "1e309"]),
    st.none(),
    st.booleans(),
    st.lists(st.floats(allow_nan=True), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def refused_naming(err: ConfigError, name: str) -> None:
    assert str(err).startswith(name) or f" {name}" in str(err), (name, str(err))


# -- the Python API ---------------------------------------------------------------------------

BENCH_FIELDS = (
    "reps",
    "budget_s",
    "rel_ci",
    "min_reps",
    "max_reps",
    "confidence",
    "warmup",
    "warmup_max_s",
    "warmup_max_reps",
    "flush_l2",
    "saturate",
    "calls_per_rep",
    "burst_from_start",
    "probe_clock",
    "keep_trace",
    "conditioning",
    "verdict_config",
)


@FUZZ
@given(field=st.sampled_from(BENCH_FIELDS), value=ODD)
def test_bench_config_takes_a_sane_value_or_names_the_field(field: str, value: Any) -> None:
    from gpuenv.timing import BenchConfig

    try:
        cfg = BenchConfig(**{field: value})
    except ConfigError as err:
        refused_naming(err, field)
        return
    got = getattr(cfg, field)
    if isinstance(got, float):
        assert math.isfinite(got)
    if field in ("reps", "min_reps", "max_reps", "calls_per_rep") and got not in (None, "auto"):
        assert isinstance(got, int) and got >= 1
    assert cfg.min_reps <= cfg.max_reps


@FUZZ
@given(
    field=st.sampled_from(
        ("period", "config", "mode_config", "load", "stable_clocks", "output", "policy", "mode")
    ),
    value=ODD,
)
def test_stable_takes_a_sane_value_or_names_the_parameter(field: str, value: Any) -> None:
    from gpuenv.session import Session

    try:
        session = Session(**{field: value})
    except ConfigError as err:
        if field not in ("policy", "mode"):  # those two name the value they do not know
            refused_naming(err, field)
        return
    if field == "period" and value is not None:
        assert 0 < session.period <= validate.MAX_SAMPLE_PERIOD_S


@FUZZ
@given(sm=ODD, sm_max=st.one_of(st.none(), ODD), power=st.one_of(st.none(), ODD))
def test_a_lock_request_is_sane_or_refused(sm: Any, sm_max: Any, power: Any) -> None:
    from gpuenv.clocks.request import make_request

    try:
        req = make_request(sm, sm_max=sm_max, power_limit_w=power)
    except ConfigError as err:
        assert "--" not in str(err).split(":")[0]  # Python names, never a flag
        return
    if isinstance(req.sm, tuple):
        assert 1 <= req.sm[0] <= req.sm[1]
    elif isinstance(req.sm, int):
        assert req.sm >= 1
    if req.power_limit_w is not None:
        assert math.isfinite(req.power_limit_w) and req.power_limit_w > 0


@FUZZ
@given(quantiles=st.one_of(ODD, st.lists(ODD, max_size=4)), rep=ODD)
def test_do_bench_arguments_are_sane_or_refused(quantiles: Any, rep: Any) -> None:
    from gpuenv.integrations.triton.bench import _check

    try:
        _check("mean", quantiles, lambda: None, rep=rep)
    except ConfigError:
        return
    assert math.isfinite(rep) and rep >= 0


# -- the files gpuenv reads -------------------------------------------------------------------


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A results file's header line and a measurement record, as gpuenv writes them."""
    import gpuenv
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    path = tmp_path_factory.mktemp("rec") / "run.jsonl"
    sim = SimBackend(clock=VirtualClock())
    with gpuenv.stable(backend=sim, output=path) as env:
        sim.open_context(0)
        env.repeat(lambda: sim.run_work(0, 1e8), reps=3)
    sim.close()
    header, line = path.read_text().splitlines()[:2]
    return header, json.loads(line)


def _paths(doc: Any) -> list[tuple[Any, ...]]:
    return json_paths(doc, width=3)


JSON_ODD = st.one_of(
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            None,
            "x",
            "",
            [],
            {},
            True,
            -1,
            0,
            10**400,
            1e308,
            [None],
            {"a": None},
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.text(max_size=4),
)


@settings(FUZZ, max_examples=80)
@given(data=st.data(), value=JSON_ODD)
def test_a_results_record_loads_sane_or_is_refused_by_line_and_field(
    data: st.DataObject, value: Any, record: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    from gpuenv import reader
    from gpuenv.results import load_runs

    header, rec = record
    where = data.draw(st.sampled_from(_paths(rec)))
    path = tmp_path / "fuzz.jsonl"
    path.write_text(header + "\n" + json.dumps(json_set(rec, where, value)) + "\n")
    try:
        runs = load_runs(path)
    except reader.BadRecord as err:
        assert err.line == 2
        return
    except ConfigError:
        return
    for m in runs[-1].measurements:
        m.summary()  # what compare and plot read: it must work on what was let in
        assert all(math.isfinite(t) for t in m.times_s)


@FUZZ
@given(
    field=st.sampled_from(
        ("uuid", "sustained_mhz", "measured_at", "power_limit_w", "gpu_name", "details")
    ),
    value=JSON_ODD,
)
def test_a_calibration_record_is_sane_or_refused(field: str, value: Any, tmp_path: Path) -> None:
    from gpuenv.clocks.calibration_store import load_calibration

    good = {"uuid": "GPU-1", "sustained_mhz": 1500, "measured_at": 1.0}
    (tmp_path / "calibration").mkdir(exist_ok=True)
    (tmp_path / "calibration" / "GPU-1.json").write_text(json.dumps({**good, field: value}))
    try:
        cal = load_calibration("GPU-1", state_dir=tmp_path)
    except ConfigError:
        return
    assert cal is not None and isinstance(cal.sustained_mhz, int)


@FUZZ
@given(data=st.data(), value=JSON_ODD)
def test_a_journal_record_is_sane_or_damaged(
    data: st.DataObject, value: Any, tmp_path: Path
) -> None:
    from gpuenv.clocks.journal import JournalDamaged, decode
    from gpuenv.clocks.records import ClockState, JournalEntry

    state = ClockState("GPU-1", None, None, True, 1980, 2619, 700.0, True)
    body = {**JournalEntry("GPU-1", 0, "GPU 0", "sim", state, _applied()).to_dict(), "version": 1}
    doc = json_set(body, data.draw(st.sampled_from(_paths(body))), value)
    try:
        entry = decode(tmp_path / "GPU-1.json", json.dumps(doc).encode(), "GPU-1")
    except JournalDamaged:
        return
    assert math.isfinite(entry.original.power_limit_w)


def _applied() -> Any:
    from gpuenv.clocks.records import Applied

    return Applied(locked_sm=(1350, 1350), power_limit_w=500.0)


@FUZZ
@given(
    key=st.sampled_from(
        (
            "socket_group",
            "max_connections_per_user",
            "idle_timeout",
            "sample_period",
            "metrics",
            "socket",
        )
    ),
    value=st.one_of(
        st.sampled_from(["nan", "inf", "-1", "0", "1e309", "", "abc", "9" * 30]),
        st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc"]), max_size=8),
    ),
)
def test_a_daemon_config_value_is_taken_or_refused(key: str, value: str) -> None:
    from gpuenv.daemon.auth import parse_config

    try:
        config = parse_config(f"[daemon]\n{key} = {value}\n")
    except ConfigError:
        return
    for f in dataclasses.fields(config):
        got = getattr(config, f.name)
        if isinstance(got, float):
            assert math.isfinite(got), (f.name, got)


# -- the CLI's numeric options ----------------------------------------------------------------

NUMBERS = st.one_of(
    st.sampled_from(
        [
            "nan",
            "-nan",
            "inf",
            "-inf",
            "1e309",
            "-1",
            "0",
            "1e-320",
            "abc",
            "",
            "9" * 40,
            "0x10",
            "1_000",
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


@settings(FUZZ, max_examples=40)
@given(
    option=st.sampled_from(
        (
            ("compare", "--alpha"),
            ("compare", "--fail-above"),
            ("compare", "--min-change"),
            ("lock", "--power-limit"),
            ("lock", "--sm-max"),
            ("lock", "--sm"),
            ("restore", "-i"),
        )
    ),
    value=NUMBERS,
)
def test_a_cli_number_is_taken_or_one_sentence(
    option: tuple[str, str], value: str, record: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    from gpuenv.cli import cli

    command, flag = option
    if command == "compare":
        path = tmp_path / "r.jsonl"
        path.write_text(record[0] + "\n" + json.dumps(record[1]) + "\n")
        args = ["compare", flag, value, str(path), str(path)]
    elif command == "lock":
        args = [
            "--dry-run",
            "--sim",
            "lock",
            *(["--sm", "1350"] if flag != "--sm" else []),
            flag,
            value,
        ]
    else:
        args = ["--dry-run", "--sim", "restore", flag, value]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in (0, 1, 2, 3, 6), result.output  # 6: no such GPU (-i nan)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


@FUZZ
@given(value=ODD, check=st.sampled_from(("display_interval", "sample_period")))
def test_an_interval_is_finite_and_bounded_or_refused(value: Any, check: str) -> None:
    """status -l, monitor -d, run --interval, daemon --interval and stable(period=)."""
    try:
        got = getattr(validate, check)(value, "-d")
    except ConfigError as err:
        refused_naming(err, "-d")
        return
    assert math.isfinite(got) and got > 0


@pytest.fixture(scope="module")
def sim_state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The simulated driver's state document, as a locked simulated GPU leaves it."""
    from gpuenv.backend.sim import SimBackend

    path = tmp_path_factory.mktemp("sim") / "s.json"
    sim = SimBackend(state_file=str(path))
    sim.set_locked_sm_clocks(0, 1350, 1350)
    sim.close()
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@FUZZ
@given(data=st.data(), value=JSON_ODD)
def test_a_sim_state_value_is_taken_or_refused_by_field(
    data: st.DataObject, value: Any, sim_state: dict[str, Any], tmp_path: Path
) -> None:
    from gpuenv.backend.sim import SimBackend

    path = tmp_path / "s.json"
    where = data.draw(st.sampled_from(_paths(sim_state)))
    path.write_text(json.dumps(json_set(sim_state, where, value)))
    try:
        sim = SimBackend(state_file=str(path))
    except ConfigError as err:
        assert "the simulated GPU's state" in str(err)
        return
    try:
        sim.read_fast(0)
        sim.power_limits(0)
    finally:
        sim.close()
