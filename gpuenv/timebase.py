"""Time, real or virtual.

Everything in gpuenv that waits or timestamps takes a `Clock`. The real one is
`time.monotonic` and real threads. The virtual one makes tests deterministic and
fast: `sleep(s)` advances time at once and runs, in time order, every periodic
callback that falls due (this is how the sampler "ticks" under test, with no
thread), and the simulated GPU advances its physics on the same clock.

    >>> clock = VirtualClock(start=0.0)
    >>> ticks = []
    >>> timer = clock.call_every(0.1, lambda: ticks.append(round(clock.now(), 3)))
    >>> clock.sleep(0.35)  # returns at once
    >>> clock.now(), ticks
    (0.35, [0.1, 0.2, 0.3])
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """A source of monotonic time in seconds."""

    virtual: bool

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wall(self) -> float:
        """Seconds since the epoch, for records read by people."""
        ...


class RealClock:
    virtual = False

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wall(self) -> float:
        return time.time()


class _VirtualTimer:
    def __init__(self, clock: VirtualClock, period: float, fn: Callable[[], None]):
        self.period = period
        self.fn = fn
        self.cancelled = False
        self._clock = clock

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Deterministic time. `sleep` and `advance` move it; periodic callbacks fire on the way.

    Callbacks run on the thread that advances time, in order of due time, with
    the clock set to their due time while they run. A callback may itself read
    the clock but must not sleep.
    """

    virtual = True

    def __init__(self, start: float = 1000.0, epoch: float = 1_790_000_000.0):
        self._t = start
        self._start = start
        self._epoch = epoch
        self._heap: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self._advancing = False

    def now(self) -> float:
        return self._t

    def wall(self) -> float:
        return self._epoch + (self._t - self._start)

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            target = self._t + seconds
            if self._advancing:  # a callback sleeping: move time, fire nothing re-entrantly
                self._t = max(self._t, target)
                return
            self._advancing = True
            try:
                while self._heap and self._heap[0][0] <= target:
                    due, _, timer = heapq.heappop(self._heap)
                    if timer.cancelled:
                        continue
                    self._t = max(self._t, due)
                    timer.fn()
                    if not timer.cancelled:
                        heapq.heappush(self._heap, (due + timer.period, next(self._seq), timer))
                self._t = max(self._t, target)
            finally:
                self._advancing = False

    def call_every(
        self, period: float, fn: Callable[[], None], *, first_in: float | None = None
    ) -> Timer:
        """Run `fn` every `period` seconds of virtual time, first after `first_in` (default:
        one period)."""
        if period <= 0:
            raise ValueError("period must be positive")
        timer = _VirtualTimer(self, period, fn)
        with self._lock:
            due = self._t + (period if first_in is None else first_in)
            heapq.heappush(self._heap, (due, next(self._seq), timer))
        return timer


REAL_CLOCK = RealClock()


def wait_on(cond: threading.Condition, clock: Clock, seconds: float) -> None:
    """Wait under `cond` (held) for a notify or `seconds` on `clock`, whichever comes first.

    On real time, `cond.wait`: another thread's notify ends it at once. On virtual time
    nothing else moves the clock, so the wait moves it by `seconds` and returns; callers
    re-check their condition in a loop either way, so a deadline read from `clock` comes
    in virtual seconds, without sleeping."""
    if clock.virtual:
        clock.sleep(seconds)
    else:
        cond.wait(seconds)
