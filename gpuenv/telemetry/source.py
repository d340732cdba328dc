"""`SampleSource`: what a measurement needs of a sampler, typed (`SampleFeed`: what a
trace needs, the samples alone).

The harness, the conditioning waits, the burst schedule and the session's trace take
their sampler through this protocol: a `gpuenv.telemetry.Sampler` is one, and so is
anything else with these members (a recorded source in a test). Renaming one of them
on `Sampler` is a type error where they are used, not a silent `AttributeError` at
run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from gpuenv.backend import Backend
from gpuenv.telemetry.samples import Sample
from gpuenv.telemetry.window import Window
from gpuenv.timebase import Clock


class SampleFeed(Protocol):
    """The samples since a time: all a telemetry trace reads (`TracePieces`, `SampleLog`)."""

    def samples(self, t0: float | None, t1: float | None, gpu: int, /) -> list[Sample]:
        """One GPU's samples in [t0, t1] (None: unbounded), in time order."""
        ...


class SampleSource(SampleFeed, Protocol):
    """A sampler's caller's side: its GPUs and clock, edges, samples and windows."""

    @property
    def backend(self) -> Backend: ...

    @property
    def gpus(self) -> list[int]: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def period(self) -> float: ...

    def mark(self) -> float:
        """Timestamp a region edge (the clock's now) and ask for an edge read."""
        ...

    def hurry(self) -> AbstractContextManager[None]:
        """Sample at the hurried period while inside (a caller polling for fresh samples)."""
        ...

    def no_edge_wait(self) -> AbstractContextManager[None]:
        """Windows asked for on this thread while inside wait for no counter read after
        their end."""
        ...

    def latest(self, gpu: int | None = None) -> Sample | None: ...

    def window(
        self,
        t0: float,
        t1: float,
        gpu: int | None = None,
        *,
        lock_range: tuple[int, int] | None = None,
    ) -> Window: ...

    def windows(
        self,
        intervals: Sequence[tuple[float, float]],
        gpu: int | None = None,
        *,
        lock_range: tuple[int, int] | None = None,
    ) -> list[Window]: ...

    def power_due(self, spans: Sequence[tuple[float, float]], gpus: Iterable[int]) -> bool:
        """Whether the driver's power sample that closes a span is still to come."""
        ...

    def await_power(self, spans: Sequence[tuple[float, float]], gpus: Iterable[int]) -> bool:
        """Wait (at most POWER_WAIT_S after the last span's end) while one is due."""
        ...

    def stop(self) -> None: ...


__all__ = ["SampleFeed", "SampleSource"]
