"""gpuenv monitor's option checks (gpuenv/monitor/app.py)."""

from __future__ import annotations

import pytest

from gpuenv.errors import ConfigError
from gpuenv.monitor.app import check_options

OK = dict(interval=1.0, count=None, duration=None, once=False, as_json=False, as_csv=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"interval": 0.0}, "--interval 0 is not a positive number"),
        ({"count": 0}, "--count 0 must be at least 1"),
        ({"duration": -2.0}, "--duration -2 must be positive"),
        ({"once": True, "count": 3}, "--once and --count disagree"),
        ({"as_json": True, "as_csv": True}, "--json and --csv disagree"),
    ],
)
def test_options_that_disagree_are_refused(change, message) -> None:
    with pytest.raises(ConfigError, match=message):
        check_options(**{**OK, **change})


@pytest.mark.parametrize(
    ("change", "fmt"), [({}, None), ({"as_json": True}, "json"), ({"as_csv": True}, "csv")]
)
def test_the_stream_format(change, fmt) -> None:
    assert check_options(**{**OK, **change}) == fmt
