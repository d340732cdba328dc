"""The cumulative reason counters over a region (`Counters`): each counter's points,
placed at the driver's refresh, interpolated, and extrapolated past the last one only
while the cheap samples show a reason it measures. One of
`gpuenv.telemetry.summary`'s parts."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from gpuenv.telemetry.samples import SlowSample


class Counters:
    """The cumulative reason counters (ns), each a list of points placed at the driver's
    refresh time (value_t) where known: linear between points and, up to ~2 refreshes
    past the last one, at the rate of the last interval (at most 1 ns per ns) but only
    while the cheap samples show a reason the counter measures: a counter that has not
    refreshed since the power cap cleared would otherwise carry the cap into a region
    run at full clock. Counters read together share their points' times, so each region
    bisects once per group."""

    def __init__(self, slow: Sequence[SlowSample], lag_s: float):
        self.keys = sorted({k for s in slow for k in s.reason_ns})
        groups: dict[tuple[float, ...], list[tuple[str, list[float], float]]] = {}
        for key in self.keys:
            ts: list[float] = []
            vs: list[float] = []
            for s in slow:
                if key in s.reason_ns:
                    at = s.value_t if s.value_t is not None else s.t
                    if not ts or at > ts[-1]:
                        ts.append(at)
                        vs.append(float(s.reason_ns[key]))
            rate = 0.0
            if len(ts) >= 2:
                rate = min(1e9, max(0.0, (vs[-1] - vs[-2]) / (ts[-1] - ts[-2])))
            groups.setdefault(tuple(ts), []).append((key, vs, rate))
        self.groups = [(list(ts), ts[-1] + 2 * lag_s, members) for ts, members in groups.items()]

    def reason_s(
        self, t0: float, t1: float, sampled_s: Callable[[float, float, str], float]
    ) -> dict[str, float]:
        """Seconds under each counter over [t0, t1]; `sampled_s(a, b, key)`: the seconds
        of [a, b] the cheap samples show the counter's reasons (bounds extrapolation)."""
        got: dict[str, float] = {}
        span = t1 - t0
        for ts, until, members in self.groups:
            p0, p1 = _place(ts, until, t0), _place(ts, until, t1)
            if p0 is None or p1 is None:
                continue
            for (key, vs, _), a, b in zip(
                members, _at(ts, members, p0, t0), _at(ts, members, p1, t1), strict=True
            ):
                if p0 < 0:  # past the last point: grown no more than the samples show
                    a = min(a, vs[-1] + sampled_s(ts[-1], t0, key) * 1e9)
                if p1 < 0:
                    b = min(b, vs[-1] + sampled_s(ts[-1], t1, key) * 1e9)
                got[key] = min(max(0.0, b - a) / 1e9, span)
        return {k: got[k] for k in self.keys if k in got} if len(self.groups) > 1 else got


def _place(ts: list[float], until: float, t: float) -> int | None:
    """Where t falls among a counter's point times: k (ts[k] == t, or between k-1 and k),
    -1 past the last point (extrapolated up to `until`), None outside."""
    if t < ts[0]:
        return None
    if t <= ts[-1]:
        return bisect.bisect_left(ts, t)
    return -1 if t <= until else None


def _at(
    ts: list[float], members: list[tuple[str, list[float], float]], k: int, t: float
) -> list[float]:
    """The counters' values at t, placed at k by `_place`: interpolated, or past the last
    point at the last interval's rate."""
    if k < 0:
        if len(ts) < 2:
            return [vs[-1] for _, vs, _ in members]
        dt = t - ts[-1]
        return [vs[-1] + rate * dt for _, vs, rate in members]
    if ts[k] == t:
        return [vs[k] for _, vs, _ in members]
    ta, tb = ts[k - 1], ts[k]
    return [vs[k - 1] + (vs[k] - vs[k - 1]) * (t - ta) / (tb - ta) for _, vs, _ in members]


__all__ = ["Counters"]
