"""Telemetry during timed regions: Sample records, the Sampler, Window summaries.

The sampler reads the cheap values (clocks, power, temperature, reasons: ~2 us
each on an H100) on every tick, and the slow cumulative counters (energy ~3 ms,
time under each reason ~0.1-0.2 ms) at most every `slow_period` and at region
edges, always on its own thread in real time. A region's `Window` summarises
the samples that cover it, including the ones just before and after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import from_dict, to_dict


@dataclass(frozen=True)
class Sample:
    """One cheap reading of one GPU (`nvidia-smi dmon -s pc`)."""

    t: float  # host monotonic seconds (clock.now()) when the reading was taken
    gpu: int  # NVML index
    sm_mhz: int
    mem_mhz: int
    power_w: float  # nvmlDeviceGetPowerUsage: a 1 s average on Ampere and newer
    temp_c: float
    reasons: int  # clock-event reasons bitmask
    driver_ts_us: int | None = None  # the driver's timestamp of the value, where NVML gives one
    power_instant_w: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return from_dict(cls, data)


@dataclass(frozen=True)
class SlowSample:
    """One read of the cumulative counters (energy, time under each reason)."""

    t: float
    gpu: int
    energy_mj: int | None  # since driver load
    reason_ns: dict[str, int]  # REASON_COUNTERS name -> cumulative ns
    mem_temp_c: float | None = None
    other_pids: tuple[int, ...] = ()  # processes on the GPU other than this one
    edge: bool = False  # read because a region started or ended

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlowSample:
        return from_dict(cls, data)


@dataclass(frozen=True)
class Gap:
    """A read that failed: the sampler records it and carries on."""

    t: float
    gpu: int
    op: str  # "read_fast" | "read_slow" | "processes"
    error: str  # str() of the exception, one line

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gap:
        return from_dict(cls, data)


@dataclass(frozen=True)
class Window:
    """What one GPU did over [t0, t1] (host monotonic seconds).

    Clock and power means are time-weighted: each sample holds until the next
    one. Values are None where no sample covered the region. `energy_j` comes
    from the energy counter; the driver refreshes it every ~100 ms, so for a
    shorter region it is interpolated between reads and `energy_interpolated`
    says so. `reason_s` is the time spent under each cumulative reason counter
    (REASON_COUNTERS names), interpolated between counter reads.
    """

    gpu: int
    t0: float
    t1: float
    n_samples: int  # samples inside [t0, t1] (the ones just outside are used but not counted)
    sm_mhz_min: float | None = None
    sm_mhz_mean: float | None = None
    sm_mhz_max: float | None = None
    sm_mhz_start: float | None = None  # the clock in force when the region began
    sm_mhz_end: float | None = None
    mem_mhz_mean: float | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    energy_j: float | None = None
    energy_interpolated: bool = False
    temp_c_start: float | None = None
    temp_c_end: float | None = None
    temp_c_max: float | None = None
    mem_temp_c_max: float | None = None
    reasons: int = 0  # union of reasons bitmasks seen over the region
    reasons_start: int = 0  # reasons in force when the region began
    reason_s: dict[str, float] = field(default_factory=dict)
    lock_held: bool | None = None  # None: no lock asked for
    lock_range_mhz: tuple[int, int] | None = None
    other_pids: tuple[int, ...] = ()  # other processes seen on the GPU during the region
    gap: bool = False  # a read failed during the region: the summary may be incomplete

    @property
    def duration_s(self) -> float:
        return self.t1 - self.t0

    @property
    def reason_names(self) -> list[str]:
        from gpuenv.backend import reason_names

        return reason_names(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Window:
        return from_dict(cls, data)

    def summary(self) -> str:
        """One line a person reads: clock, power, energy, temperature, reasons."""
        parts = [f"GPU {self.gpu} {_fmt_s(self.duration_s)}"]
        if self.sm_mhz_mean is not None:
            if self.sm_mhz_min == self.sm_mhz_max:
                parts.append(f"SM {self.sm_mhz_mean:.0f} MHz")
            else:
                parts.append(
                    f"SM {self.sm_mhz_mean:.0f} MHz ({self.sm_mhz_min:.0f}-{self.sm_mhz_max:.0f})"
                )
        if self.power_w_mean is not None:
            parts.append(f"{self.power_w_mean:.0f} W (max {self.power_w_max:.0f})")
        if self.energy_j is not None:
            approx = "~" if self.energy_interpolated else ""
            parts.append(f"{approx}{self.energy_j:.3g} J")
        if self.temp_c_start is not None:
            parts.append(f"{self.temp_c_start:.0f}->{self.temp_c_end:.0f} C")
        names = self.reason_names
        parts.append("reasons: " + (", ".join(names) if names else "none"))
        timed = {k: v for k, v in self.reason_s.items() if v > 0}
        if timed:
            parts.append(
                "under " + ", ".join(f"{k} {_fmt_s(v)}" for k, v in sorted(timed.items()))
            )
        if self.lock_held is not None:
            parts.append("lock held" if self.lock_held else "lock NOT held")
        if self.other_pids:
            parts.append("other processes: " + ", ".join(map(str, self.other_pids)))
        if self.gap:
            parts.append("telemetry gap")
        return "; ".join(parts)

    def __str__(self) -> str:
        return self.summary()


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"
