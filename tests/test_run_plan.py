"""gpuenv run's checks before anything runs (gpuenv/run/plan.py)."""

from __future__ import annotations

import sys

import pytest

from gpuenv.clocks import LockRequest
from gpuenv.errors import ConfigError
from gpuenv.run.plan import plan_run

OK = dict(
    sm=None,
    sm_max=None,
    mem=None,
    power_limit=None,
    period=None,
    policy="annotate",
    no_auto_regions=False,
    gpu="0",
    output=None,
    env={},
)


@pytest.mark.parametrize(
    ("command", "change", "message"),
    [
        (("--",), {}, "no command to run"),
        ((), {}, "no command to run"),
        ((sys.executable,), {"period": 0.0}, "--interval must be a finite number.*not 0.0"),
        ((sys.executable,), {"period": -1.0}, "--interval must be a finite number.*not -1.0"),
        ((sys.executable,), {"output": "/no/such/dir/run.jsonl"}, "does not exist"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(command, change, message) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_run(command, **{**OK, **change})


def test_a_plan_drops_the_separator_and_keeps_the_options(tmp_path) -> None:
    out = tmp_path / "run.jsonl"
    plan = plan_run(("--", sys.executable, "-c", "pass"), **{**OK, "output": str(out)})
    assert plan.argv == [sys.executable, "-c", "pass"]
    assert plan.lock is None and plan.selector == "0"
    assert str(plan.output) == str(out)
    locked = plan_run((sys.executable,), **{**OK, "sm": "1350"})
    assert locked.lock == LockRequest(sm=1350)  # the request the runner locks, judged once
