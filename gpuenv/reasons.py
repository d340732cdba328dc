"""Clock-event ("throttle") reasons: the one vocabulary.

NVML reports why the SM clock is where it is as a bitmask
(`nvmlDeviceGetCurrentClocksEventReasons`; `nvidia-smi -q -d PERFORMANCE`).
Every bit has, here and nowhere else:
  - NVML's name ("SwPowerCap"), as nvidia-smi and nvidia-ml-py spell it;
  - a short form for tables and the monitor ("power cap");
  - words saying what it means for a benchmark;
  - the cumulative time-under-reason counter that measures it, where one exists
    (NVML field ids 74-81, nanoseconds: `COUNTERS`).
And the masks the rest of gpuenv judges by: `HELD_DOWN` (burst mode waits until
none is active), `THERMAL`, `BAD` and `WARN` (how the monitor colours them).

    >>> Reason(0x24).names()
    ['SwPowerCap', 'SwThermalSlowdown']
    >>> reason_names(0x800)
    ['Unknown(0x800)']

A leaf module: it imports nothing from gpuenv.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reason(enum.IntFlag):
    """One bit of NVML's clock-event reasons mask (`nvmlClocksEventReason*`)."""

    GPU_IDLE = 0x1
    APP_CLOCKS = 0x2  # ApplicationsClocksSetting (= UserDefinedClocks)
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8  # set whenever HW_THERMAL or HW_POWER_BRAKE is
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCK = 0x100
    BOARD_LIMIT = 0x200
    RELIABILITY = 0x400

    def names(self) -> list[str]:
        """NVML's names of the bits set, lowest first; unknown bits as 'Unknown(0x...)'."""
        return reason_names(int(self))


@dataclass(frozen=True)
class ReasonInfo:
    """Everything said about one reason bit."""

    bit: int
    name: str  # NVML's, e.g. "SwPowerCap"
    short: str  # for tables: "power cap"
    words: str  # what it means for a benchmark
    counter: str | None  # the cumulative counter (COUNTERS) measuring time under it


_INFO: dict[int, ReasonInfo] = {
    i.bit: i
    for i in (
        ReasonInfo(0x1, "GpuIdle", "idle", "no work: clocks parked", "low_utilization"),
        ReasonInfo(
            0x2,
            "ApplicationsClocksSetting",
            "clock setting",
            "held by locked or application clocks",
            None,
        ),
        ReasonInfo(
            0x4, "SwPowerCap", "power cap", "clock lowered to stay under the power limit", "power"
        ),
        ReasonInfo(
            0x8,
            "HwSlowdown",
            "HW slowdown",
            "clock cut hard by the hardware (heat or power brake)",
            None,
        ),
        ReasonInfo(
            0x10, "SyncBoost", "sync boost", "held to the slowest GPU of its group", "sync_boost"
        ),
        ReasonInfo(
            0x20, "SwThermalSlowdown", "thermal", "clock lowered: the GPU is too hot", "thermal"
        ),
        ReasonInfo(
            0x40, "HwThermalSlowdown", "HW thermal", "clock cut hard: the GPU is too hot", "thermal"
        ),
        ReasonInfo(
            0x80, "HwPowerBrakeSlowdown", "power brake", "the board asked for less power", None
        ),
        ReasonInfo(
            0x100, "DisplayClockSetting", "display clock", "held by the display clock", None
        ),
        ReasonInfo(0x200, "BoardLimit", "board limit", "held by a board limit", "board_limit"),
        ReasonInfo(
            0x400, "Reliability", "reliability", "held by a reliability limit", "reliability"
        ),
    )
}

# NVML's name for each bit it defines (0x1 ... 0x400).
REASON_NAMES: dict[int, str] = {bit: i.name for bit, i in _INFO.items()}

# Masks. HELD_DOWN: the clock is held below what the GPU could run (burst mode waits
# until none is active; a measurement under one is not a cool GPU's number).
HELD_DOWN = (
    Reason.SW_POWER_CAP
    | Reason.SW_THERMAL
    | Reason.HW_THERMAL
    | Reason.HW_SLOWDOWN
    | Reason.HW_POWER_BRAKE
)
THERMAL = Reason.SW_THERMAL | Reason.HW_THERMAL
HARDWARE = Reason.HW_SLOWDOWN | Reason.HW_THERMAL | Reason.HW_POWER_BRAKE
BAD = Reason.HW_SLOWDOWN | Reason.SW_THERMAL | Reason.HW_THERMAL | Reason.HW_POWER_BRAKE
WARN = Reason.SW_POWER_CAP | Reason.SYNC_BOOST | Reason.BOARD_LIMIT | Reason.RELIABILITY


@dataclass(frozen=True)
class Counter:
    """A cumulative time-under-reason counter (NVML field id, nanoseconds)."""

    name: str
    field_id: int
    label: str  # in a summary line: "under power cap"
    short: str  # in a table: "power cap"


# NVML_FI_DEV_PERF_POLICY_* (field ids 74-81), in field-id order.
COUNTERS: tuple[Counter, ...] = (
    Counter("power", 74, "under power cap", "power cap"),
    Counter("thermal", 75, "under thermal limit", "thermal"),
    Counter("sync_boost", 76, "under sync boost", "sync boost"),
    Counter("board_limit", 77, "under board limit", "board limit"),
    Counter("low_utilization", 78, "low utilization", "idle"),
    Counter("reliability", 79, "under reliability limit", "reliability"),
    Counter("total_app_clocks", 80, "below app clocks", "below app clocks"),
    Counter("total_base_clocks", 81, "below base clock", "below base clock"),
)
COUNTER_NAMES: tuple[str, ...] = tuple(c.name for c in COUNTERS)
_COUNTER_BY_NAME = {c.name: c for c in COUNTERS}


def info(bit: int) -> ReasonInfo:
    """What is said about one bit; an unknown bit gets a generic entry."""
    known = _INFO.get(bit)
    if known is not None:
        return known
    name = f"Unknown({bit:#x})"
    return ReasonInfo(bit, name, name, "a reason this version of gpuenv does not know", None)


def bits(mask: int) -> list[int]:
    """The set bits of a reasons mask, lowest first."""
    out = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            out.append(bit)
        bit <<= 1
    return out


def reason_names(mask: int) -> list[str]:
    """Decode a reasons bitmask into NVML's names; unknown bits become 'Unknown(0x...)'."""
    return [info(b).name for b in bits(mask)]


def short_names(mask: int) -> list[str]:
    """The short forms of a mask's bits ("power cap", "thermal"), lowest first."""
    return [info(b).short for b in bits(mask)]


def counter(name: str) -> Counter:
    """A time-under-reason counter by name ("power", "thermal", ...)."""
    try:
        return _COUNTER_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown reason counter {name!r}") from None


__all__ = [
    "BAD",
    "COUNTERS",
    "COUNTER_NAMES",
    "HARDWARE",
    "HELD_DOWN",
    "REASON_NAMES",
    "THERMAL",
    "WARN",
    "Counter",
    "Reason",
    "ReasonInfo",
    "bits",
    "counter",
    "info",
    "reason_names",
    "short_names",
]
