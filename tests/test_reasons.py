"""gpuenv.reasons: the one clock-event reason vocabulary."""

from __future__ import annotations

import ast
import pathlib

import pytest

from gpuenv import reasons
from gpuenv.reasons import Reason

# Every bit nvidia-ml-py defines (nvmlClocksEventReason*), with its NVML name.
NVML_BITS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",
    0x400: "Reliability",
}


@pytest.mark.parametrize("bit", sorted(NVML_BITS))
def test_every_nvml_bit_round_trips(bit: int) -> None:
    flag = Reason(bit)
    assert int(flag) == bit
    assert flag.names() == [NVML_BITS[bit]]
    about = reasons.info(bit)
    assert about.bit == bit and about.name == NVML_BITS[bit]
    assert about.short and about.words
    if about.counter is not None:
        assert reasons.counter(about.counter).name == about.counter
    # the name decodes back to the bit
    assert {v: k for k, v in reasons.REASON_NAMES.items()}[NVML_BITS[bit]] == bit


def test_masks_decode_lowest_first_and_unknown_bits_generically() -> None:
    assert reasons.reason_names(0x24) == ["SwPowerCap", "SwThermalSlowdown"]
    assert reasons.reason_names(0x804) == ["SwPowerCap", "Unknown(0x800)"]
    assert reasons.short_names(0x44) == ["power cap", "HW thermal"]
    assert reasons.reason_names(0) == []
    assert reasons.info(0x1000).name == "Unknown(0x1000)"
    assert Reason(0x7FF).names() == list(NVML_BITS.values())


def test_masks_mean_what_the_judges_need() -> None:
    # burst mode waits while any of these is active: the power brake included
    for r in (
        Reason.SW_POWER_CAP,
        Reason.SW_THERMAL,
        Reason.HW_THERMAL,
        Reason.HW_SLOWDOWN,
        Reason.HW_POWER_BRAKE,
    ):
        assert r & reasons.HELD_DOWN
    assert not reasons.HELD_DOWN & (Reason.GPU_IDLE | Reason.APP_CLOCKS | Reason.SYNC_BOOST)
    assert not reasons.BAD & reasons.WARN
    assert [c.field_id for c in reasons.COUNTERS] == list(range(74, 82))


def test_one_place_defines_reason_names() -> None:
    """No module but gpuenv/reasons.py writes an NVML reason name as a dict or set literal."""
    root = pathlib.Path(reasons.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "reasons.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                values = [v.value for v in node.values if isinstance(v, ast.Constant)]
                if sum(v in NVML_BITS.values() for v in values) >= 2:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
