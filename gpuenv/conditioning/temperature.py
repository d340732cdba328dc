"""How much a kernel's time moves with the GPU's temperature, learned from its own
measurements: how long a session waits for the chip to cool before measuring it.

A GPU may take long to come back within 5 C of where it started after a few seconds of
heavy load: an H100 more than 30 s (~38 C to 50-57 C in 7 s of bf16 matmuls), where an
H200 is back at ~35 C 5 s after reaching 54-57 C. Nothing here assumes either: the slope
is the kernel's, learned on its GPU, and the wait ends on the GPU's readings. Whether that
matters depends on the kernel: heavy matmuls read 0.05-0.08% longer per C at the same
reported clock, while memory-bound kernels (a 1 GiB clone, a gather) read within
0.01-0.17% cold vs hot. Waiting for every kernel as if it were the heavy one cost a
`stable()` session 4-30 s a measurement after load and bought nothing on memory-bound
ones (0.7136 against 0.7139 ms after a 30 s wait).

So a session keeps, per function, the temperature each measurement began at and its
median, and fits the relative change per C (`slope`) once they span `min_span_c`. The wait
before a measurement then allows as many degrees above the idle temperature as keep the
expected shift under the target (`margin_c`): a kernel that does not move is measured
at once; one that does waits only until its expected shift is under the target. A
function not yet learned is not waited for (the cap and the clock still are): its
measurement says so, with the temperature it began at, and teaches the slope.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from gpuenv.conditioning.sustained import fit_slope
from gpuenv.stats.descriptive import median

MIN_SPAN_C = 3.0  # temperatures a slope is fitted over must span this much
MAX_POINTS = 16  # the newest measurements of a function a slope is fitted to


class Sensitivity:
    """What each function's time does with the temperature, in one session (held weakly:
    a function that goes away takes its points with it; one that cannot be weakly
    referenced is not learned, and so never waited for)."""

    def __init__(self, min_span_c: float = MIN_SPAN_C):
        self.min_span_c = min_span_c
        self._points: weakref.WeakKeyDictionary[Any, list[tuple[float, float]]] = (
            weakref.WeakKeyDictionary()
        )

    def observe(self, fn: Callable[..., Any], temp_c: float | None, median_s: float | None) -> None:
        """A measurement of fn that began at `temp_c` and read `median_s` (None: all its
        reps were rejected, nothing to learn)."""
        if temp_c is None or median_s is None or not median_s > 0:
            return
        try:
            points = self._points.setdefault(fn, [])
        except TypeError:  # not weakly referable
            return
        points.append((float(temp_c), float(median_s)))
        del points[:-MAX_POINTS]

    def slope(self, fn: Callable[..., Any]) -> float | None:
        """The relative change of fn's time per C (0.0008: +0.08%/C), or None until its
        measurements span `min_span_c`."""
        try:
            points = self._points.get(fn, [])
        except TypeError:
            return None
        temps = [t for t, _ in points]
        if len(points) < 2 or max(temps) - min(temps) < self.min_span_c:
            return None
        ref = median([m for _, m in points])
        return fit_slope(temps, [m / ref - 1 for _, m in points])

    def margin_c(self, fn: Callable[..., Any], target_rel: float) -> float | None:
        """How far above the idle temperature fn may be measured with its expected shift
        under `target_rel`; None: no limit (not learned yet, or its time does not rise
        with the temperature)."""
        s = self.slope(fn)
        if s is None or s <= 0:
            return None
        return target_rel / s


__all__ = ["MAX_POINTS", "MIN_SPAN_C", "Sensitivity"]
