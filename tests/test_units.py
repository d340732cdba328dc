"""gpuenv.units: every number a person reads is formatted here."""

from __future__ import annotations

import math

from gpuenv.units import fmt_elapsed, fmt_j, fmt_mhz, fmt_pct, fmt_s


def test_elapsed_reads_as_wall_time() -> None:
    # moved from test_monitor_view (the monitor's "locked for ...")
    assert fmt_elapsed(42.7) == "42 s"
    assert fmt_elapsed(192) == "3 min 12 s"
    assert fmt_elapsed(3720) == "1 h 02 min"
    # compact, for the monitor's 8-cell value column
    assert [fmt_elapsed(x, compact=True) for x in (42.7, 99, 125, 3720)] == [
        "42 s",
        "99 s",
        "2m05s",
        "1h02m",
    ]


def test_durations_by_style() -> None:
    assert fmt_s(1.5) == "1.500 s"
    assert fmt_s(1.5e-3) == "1.500 ms"
    assert fmt_s(12.5e-6) == "12.50 us"
    assert fmt_s(0.8, "short") == "800.0 ms"
    assert fmt_s(2.0, "short") == "2.00 s"
    assert fmt_s(5e-6, "short") == "5 us"
    assert fmt_s(250.0, "table") == "250 s"
    assert fmt_s(1.2345e-3, "table") == "1.23 ms"
    assert fmt_s(None) == "-"
    assert fmt_s(math.nan, "table") == "-"


def test_a_positive_duration_never_reads_zero() -> None:
    assert fmt_s(3e-7, "short") == "0.3 us"
    assert fmt_s(4e-9, "table") == "0.004 us"
    assert fmt_s(6e-7, "short") == "1 us"  # rounds up, not to zero
    assert fmt_s(0.0, "short") == "0 us"


def test_energy_and_clocks() -> None:
    assert fmt_j(1234.0) == "1.23 kJ"
    assert fmt_j(123.4) == "123 J"
    assert fmt_j(12.34, approx=True) == "~12.3 J"
    assert fmt_j(0.5) == "500 mJ"
    assert fmt_j(None) == "-"
    assert fmt_mhz(1349.6) == "1350"
    assert fmt_mhz(None) == "?"
    assert fmt_pct(0.0123) == "1.2%"
