"""gpuenv.validate: every bad Python argument of the issue is refused at the door with one
ConfigError naming the parameter (never a CLI flag), before anything runs or changes.

Each case here was either an internal error (TypeError/AttributeError/ValueError from
inside gpuenv) or a bad value silently accepted on the code before the validation layer.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import gpuenv
from gpuenv import validate
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.integrations.triton.bench import do_bench
from gpuenv.timebase import VirtualClock
from gpuenv.timing import BenchConfig


def fn() -> None:
    pass


@pytest.fixture
def be() -> SimBackend:
    backend = SimBackend(clock=VirtualClock())
    yield backend
    backend.close()


# (call, the parameter the message must name): each was an internal error before
INTERNAL_ERRORS = {
    "lock power_limit_w='abc'": (
        lambda b: gpuenv.lock(power_limit_w="abc", backend=b),
        "power_limit_w",
    ),
    "lock sm=[1]": (lambda b: gpuenv.lock(sm=[1], backend=b), "sm"),
    "lock sm=1.5": (lambda b: gpuenv.lock(sm=1.5, backend=b), "sm"),
    "bench(None)": (lambda b: gpuenv.bench(None, backend=b), "fn"),
    "bench(123)": (lambda b: gpuenv.bench(123, backend=b), "fn"),
    "bench(lambda x: x)": (lambda b: gpuenv.bench(lambda x: x, backend=b), "fn"),
    "bench config='abc'": (lambda b: gpuenv.bench(fn, config="abc", backend=b), "config"),
    "bench warmup='bogus'": (lambda b: gpuenv.bench(fn, warmup="bogus", backend=b), "warmup"),
    "bench burst_s='x'": (lambda b: gpuenv.bench(fn, burst_s="x", backend=b), "burst_s"),
    "bench gpu='a'": (lambda b: gpuenv.bench(fn, gpu="a", backend=b), "gpu"),
    "do_bench quantiles='abc'": (lambda b: do_bench(fn, quantiles="abc", backend=b), "quantiles"),
    "do_bench(None)": (lambda b: do_bench(None, backend=b), "fn"),
    "do_bench(lambda x: x)": (lambda b: do_bench(lambda x: x, backend=b), "fn"),
    "stable period='abc'": (lambda b: gpuenv.stable(period="abc", backend=b), "period"),
    "stable config='x'": (lambda b: gpuenv.stable(config="x", backend=b), "config"),
    "stable mode_config='x'": (lambda b: gpuenv.stable(mode_config="x", backend=b), "mode_config"),
    # issue 31: a TypeError from inside, or (rep=0) a number for a budget of nothing
    "lock socket=123": (lambda b: gpuenv.lock(sm=1350, socket=123, backend=b), "socket"),
    "lock gpus=object()": (lambda b: gpuenv.lock(sm=1350, gpus=object(), backend=b), "gpus"),
    "do_bench grad_to_none=123": (
        lambda b: do_bench(fn, grad_to_none=123, backend=b),
        "grad_to_none",
    ),
    "do_bench rep=0": (lambda b: do_bench(fn, rep=0, backend=b), "rep"),
}

# each was taken as a (strange) setting before
ACCEPTED = {
    "budget_s=0": ({"budget_s": 0}, "budget_s"),
    "budget_s=-1": ({"budget_s": -1}, "budget_s"),
    "budget_s=nan": ({"budget_s": math.nan}, "budget_s"),
    "budget_s=inf": ({"budget_s": math.inf}, "budget_s"),
    "rel_ci=0": ({"rel_ci": 0}, "rel_ci"),
    "rel_ci=2": ({"rel_ci": 2}, "rel_ci"),
    "reps=1.5": ({"reps": 1.5}, "reps"),
    "min_reps=50, max_reps=10": ({"min_reps": 50, "max_reps": 10}, "min_reps"),
    "warmup=-1": ({"warmup": -1}, "warmup"),
    "calls_per_rep=0": ({"calls_per_rep": 0}, "calls_per_rep"),
    "flush_l2='yes'": ({"flush_l2": "yes"}, "flush_l2"),
    "confidence=1": ({"confidence": 1}, "confidence"),
    "max_reps=0": ({"max_reps": 0}, "max_reps"),
    "warmup_max_s=nan": ({"warmup_max_s": math.nan}, "warmup_max_s"),
    "reps=10**400": ({"reps": 10**400}, "reps"),  # an int no float holds: ran for ever
}


@pytest.mark.parametrize("case", sorted(INTERNAL_ERRORS))
def test_an_internal_error_is_now_a_sentence_naming_the_parameter(case: str, be) -> None:
    call, param = INTERNAL_ERRORS[case]
    with pytest.raises(ConfigError) as info:
        call(be)
    assert str(info.value).startswith(param)
    assert "--" not in str(info.value).split(":")[0]  # no CLI flag in a Python error


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_a_bad_bench_setting_is_refused_before_anything_runs(case: str, be) -> None:
    settings, param = ACCEPTED[case]
    with pytest.raises(ConfigError, match=rf"^{param}"):
        gpuenv.bench(fn, backend=be, **settings)
    with pytest.raises(ConfigError, match=rf"^{param}"):
        BenchConfig(**settings)
    assert be.truth(0).locked_sm is None


def test_the_python_lock_names_its_parameters_and_the_cli_its_flags(be) -> None:
    from gpuenv.clocks.request import CLI_NAMES, make_request

    with pytest.raises(ConfigError, match=r"^sm True is not a clock"):
        gpuenv.lock(sm=True, backend=be)
    with pytest.raises(ConfigError, match=r"^--sm True is not a clock"):
        make_request(True, names=CLI_NAMES)
    with pytest.raises(ConfigError, match=r"^--power-limit must be a finite number"):
        make_request(power_limit_w=math.nan, names=CLI_NAMES)
    assert be.truth(0).locked_sm is None


def test_stable_refuses_a_load_it_cannot_call_and_a_period_it_cannot_keep(be) -> None:
    with pytest.raises(ConfigError, match=r"^load must be a function"):
        gpuenv.stable(load="notcallable", backend=be)
    for period in (1e9, math.nan, math.inf, 0, -1):
        with pytest.raises(ConfigError, match=r"^period must be a finite number"):
            gpuenv.stable(period=period, backend=be)


def test_measure_and_repeat_judge_their_arguments(be) -> None:
    with gpuenv.stable(backend=be) as env:
        with pytest.raises(ConfigError, match=r"^name must be a non-empty string"):
            env.measure(None)
        with pytest.raises(ConfigError, match=r"^reps must be a whole number"):
            env.repeat(fn, reps="a")
        with pytest.raises(ConfigError, match=r"^fn must be a function"):
            env.repeat(None)
        assert len(env.results) == 0


def test_output_into_a_missing_directory_creates_nothing(be, tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "r.jsonl"
    with pytest.raises(ConfigError, match=r"^output: .* does not exist"):
        gpuenv.bench(fn, reps=2, output=target, backend=be)
    with pytest.raises(ConfigError, match=r"^output: .* does not exist"):
        gpuenv.stable(output=target, backend=be)
    assert not (tmp_path / "no").exists()
    from gpuenv.results import Results

    Results({}).save(target, mkdir=True)  # asked for: then it is created
    assert target.exists()


def test_a_good_value_passes_normalised() -> None:
    assert validate.integer(2.0, "reps", lo=1) == 2
    assert BenchConfig(reps=3.0).reps == 3  # type: ignore[arg-type]
    assert validate.number(1, "x", lo=0) == 1.0
    assert validate.quantiles([0.5, 0.2]) == [0.5, 0.2]
    assert validate.env_number("GPUENV_X", 60.0, environ={}) == 60.0
    with pytest.raises(ConfigError, match=r"^GPUENV_X must be a finite number >= 0, not 'abc'"):
        validate.env_number("GPUENV_X", 60.0, lo=0, environ={"GPUENV_X": "abc"})
