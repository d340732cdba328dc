"""Telemetry records: `Sample` (the cheap values read every tick), `SlowSample`
(counters, energy, processes, read at most every slow period and at region edges)
and `Gap` (a read that failed), plus the driver refresh and sampling period that
the sampler and the window summaries share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuenv._records import from_dict, to_dict

# The driver refreshes SM/memory clock, power and the reasons bitmask about every
# 100 ms, temperature every ~200 ms, and the energy counter every ~100 ms (measured on an
# H100: docs/explanation/what-gpus-do.md).
DRIVER_REFRESH_S = 0.1
# One sample per driver refresh while nobody waits on the sampler: reading faster finds
# the same values, and on a launch-bound loop the sampler thread's cost follows how often
# it wakes, not what it reads (a cheap read took 236 us of its wall time under launches,
# 29 us alone): +1.65% ticking every 25 ms, 0.00% (95% -0.69..+0.67) every 100 ms on the
# lent H100 (docs/benchmarks/sampler_overhead.md). What a window needs between refreshes
# it gets from the reason counters, read at its edges (`Sampler.mark`).
DEFAULT_PERIOD_S = DRIVER_REFRESH_S
# Four samples per driver refresh while a caller waits for fresh samples (`Sampler.hurry`:
# a conditioning wait asks for two taken one refresh after the work): a change is seen
# within 25 ms of the driver making it, so the wait ends that soon after the GPU is back.
# Never polling without sleeping matters more: a no-sleep poller made a launch-bound loop
# 3.8x slower through the GIL.
HURRY_PERIOD_S = 0.025


@dataclass(frozen=True, slots=True)
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


# How the sampler passes and keeps a Sample: its fields in order, a plain tuple
# (`Sample(*record)` makes the Sample). Tuples of numbers and None are not tracked by
# CPython's garbage collector, so a ring of minutes of them costs a collection nothing.
FastRecord = tuple[float, int, int, int, float, float, int, int | None, float | None]


@dataclass(frozen=True)
class SlowSample:
    """One read of the cumulative counters (energy, time under each reason) and/or of the
    processes on the GPU; a process check alone has energy_mj None and reason_ns {}."""

    t: float
    gpu: int
    energy_mj: int | None  # since driver load
    reason_ns: dict[str, int]  # REASON_COUNTERS name -> cumulative ns
    mem_temp_c: float | None = None
    other_pids: tuple[int, ...] = ()  # processes on the GPU other than this one
    edge: bool = False  # read because a region started or ended
    # when the driver refreshed these counters, on the host clock (from driver_ts_us); the
    # counters refresh every ~100 ms, so this can be up to that long before `t`
    value_t: float | None = None
    own_present: bool | None = None  # this process (own_pids) held a context; None: not read
    # the GPU memory each of other_pids held, in MiB, in its order (None: not known)
    other_mib: tuple[int | None, ...] = ()

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
