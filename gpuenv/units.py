"""Numbers as a person reads them: durations, energy, clocks. One place for all of them.

Durations come in three styles, chosen by where they are read:
  - "precise" (records, compare): 1.234 s, 1.234 ms, 12.34 us;
  - "table" (`gpuenv run`'s summary): 123 s, 1.23 s, 1.23 ms, 12.3 us;
  - "short" (sentences in findings and window summaries): 1.23 s, 1.2 ms, 12 us.
Elapsed wall time (the monitor's "locked for") reads "1 min 05 s".

    >>> fmt_s(1.234e-3), fmt_s(1.234e-3, "table"), fmt_s(12.34e-6, "short")
    ('1.234 ms', '1.23 ms', '12 us')
    >>> fmt_elapsed(65), fmt_j(1234.0), fmt_mhz(1980)
    ('1 min 05 s', '1.23 kJ', '1980')
"""

from __future__ import annotations

import math

# style -> decimals for (>= 100 s, >= 1 s, >= 1 ms, below)
_STYLES: dict[str, tuple[int, int, int, int]] = {
    "precise": (3, 3, 3, 2),
    "table": (0, 2, 2, 1),
    "short": (2, 2, 1, 0),
}


def fmt_s(seconds: float | None, style: str = "precise") -> str:
    """A duration in s, ms or us ("-" for None or NaN)."""
    if seconds is None or math.isnan(seconds):
        return "-"
    big, s, ms, us = _STYLES[style]
    if seconds >= 100:
        return f"{seconds:.{big}f} s"
    if seconds >= 1:
        return f"{seconds:.{s}f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.{ms}f} ms"
    if 0 < seconds * 1e6 < 0.5 * 10.0**-us:  # a positive time never reads "0 us"
        return f"{seconds * 1e6:.2g} us"
    return f"{seconds * 1e6:.{us}f} us"


def fmt_elapsed(seconds: float, *, compact: bool = False) -> str:
    """Wall time elapsed, to the second: "42 s", "3 min 05 s", "2 h 07 min"; `compact`
    fits 6 cells: "42 s", "3m05s", "2h07m"."""
    s = int(seconds)
    h, m = s // 3600, (s % 3600) // 60
    if s < (100 if compact else 60):
        return f"{s} s"
    if s < 3600:
        return f"{m}m{s % 60:02d}s" if compact else f"{m} min {s % 60:02d} s"
    return f"{h}h{m:02d}m" if compact else f"{h} h {m:02d} min"


def fmt_j(joules: float | None, *, approx: bool = False, kj_from: float = 1000.0) -> str:
    """Energy: kJ from `kj_from` J, J from 1 J, mJ below; "~" first when interpolated."""
    if joules is None or math.isnan(joules):
        return "-"
    sign = "~" if approx else ""
    if joules >= kj_from:
        return f"{sign}{joules / 1000:.2f} kJ"
    if joules >= 100:
        return f"{sign}{joules:.0f} J"
    if joules >= 1:
        return f"{sign}{joules:.3g} J"
    return f"{sign}{joules * 1e3:.3g} mJ"


def fmt_mhz(value: float | None) -> str:
    """A clock in whole MHz, "?" when unknown."""
    return "?" if value is None or math.isnan(value) else f"{value:.0f}"


def fmt_pct(fraction: float, digits: int = 1) -> str:
    """A fraction as a percentage: 0.0123 -> "1.2%"."""
    return f"{100 * fraction:.{digits}f}%"


__all__ = ["fmt_elapsed", "fmt_j", "fmt_mhz", "fmt_pct", "fmt_s"]
