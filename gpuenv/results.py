"""Measurement and Run records, the JSONL store, and environment metadata.

Records are immutable with units in field names and round-trip through JSON.
A run file is JSON lines: a first line {"type": "run", "metadata": {...}},
then one {"type": "measurement", ...} line per measurement, appended, flushed
and fsynced as each measurement ends, so a crash loses nothing already measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import from_dict, to_dict
from gpuenv.telemetry import Window
from gpuenv.verdict import Finding

VERDICTS = ("ok", "annotated", "rejected")


@dataclass(frozen=True)
class Stats:
    """Statistics of the kept repetitions' times, in seconds."""

    n: int
    median_s: float | None
    mean_s: float | None
    stdev_s: float | None  # sample standard deviation; None for fewer than 2 reps
    min_s: float | None
    max_s: float | None
    iqr_s: float | None = None  # interquartile range; None for fewer than 4 reps

    @classmethod
    def of(cls, times_s: tuple[float, ...] | list[float]) -> Stats:
        xs = sorted(float(t) for t in times_s)
        n = len(xs)
        if n == 0:
            return cls(0, None, None, None, None, None, None)
        iqr = None
        if n >= 4:
            q = statistics.quantiles(xs, n=4, method="inclusive")
            iqr = q[2] - q[0]
        return cls(
            n=n,
            median_s=statistics.median(xs),
            mean_s=math.fsum(xs) / n,
            stdev_s=statistics.stdev(xs) if n >= 2 else None,
            min_s=xs[0],
            max_s=xs[-1],
            iqr_s=iqr,
        )

    @property
    def cv(self) -> float | None:
        """Coefficient of variation (stdev / mean)."""
        if self.stdev_s is None or not self.mean_s:
            return None
        return self.stdev_s / self.mean_s


@dataclass(frozen=True)
class Measurement:
    """One named measurement: per-rep times and telemetry, findings, and a verdict.

    `times_s` and `windows` hold every repetition measured (windows: one per rep
    for the first measured GPU, or per rep and GPU: see `gpus`); `rejected_reps`
    are the ones the reject policy dropped, and `stats` covers the others.
    `telemetry` summarises the whole measurement per GPU.
    """

    name: str
    times_s: tuple[float, ...]
    stats: Stats
    windows: tuple[Window, ...] = ()  # per rep (and per GPU, in rep order then GPU order)
    findings: tuple[Finding, ...] = ()
    verdict: str = "ok"  # "ok" | "annotated" | "rejected"
    policy: str = "annotate"
    rejected_reps: tuple[int, ...] = ()
    retried_reps: tuple[int, ...] = ()
    summary_windows: tuple[Window, ...] = ()  # one per GPU over the whole measurement
    gpus: tuple[int, ...] = ()
    timer: str = "host"  # "host" (monotonic clock) | "cuda_events" | what the harness used
    started_at: float | None = None  # seconds since the epoch
    extra: dict[str, Any] = field(default_factory=dict)  # harness settings (warmup, L2 flush, ...)

    @classmethod
    def build(
        cls,
        name: str,
        times_s: tuple[float, ...] | list[float],
        *,
        rejected_reps: tuple[int, ...] | list[int] = (),
        **kwargs: Any,
    ) -> Measurement:
        """Compute `stats` from the reps not rejected and make the record."""
        times = tuple(float(t) for t in times_s)
        rejected = tuple(sorted(set(rejected_reps)))
        kept = [t for i, t in enumerate(times) if i not in rejected]
        return cls(name=name, times_s=times, stats=Stats.of(kept), rejected_reps=rejected, **kwargs)

    @property
    def telemetry(self) -> Window | None:
        """The whole-measurement telemetry of the first GPU (see `summary_windows` for all)."""
        return self.summary_windows[0] if self.summary_windows else None

    @property
    def kept_times_s(self) -> tuple[float, ...]:
        return tuple(t for i, t in enumerate(self.times_s) if i not in self.rejected_reps)

    @property
    def median_s(self) -> float | None:
        return self.stats.median_s

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return from_dict(cls, data)


@dataclass(frozen=True)
class Run:
    """Environment metadata and the measurements taken in it."""

    metadata: dict[str, Any]
    measurements: tuple[Measurement, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Run:
        return from_dict(cls, data)
