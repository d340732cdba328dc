"""NVML field values: the ids gpuenv reads, and decoding one `c_nvmlFieldValue_t`.

`nvmlDeviceGetFieldValues` succeeds when any field was filled, so each entry's
own return code is checked. Time under each clock-event reason comes from the
stable field ids 74-81 (not the 251-253 / 269-271 ones, whose numbers changed
between headers); memory temperature is field 82; the instantaneous power 186.
"""

from __future__ import annotations

from typing import Any

import pynvml as nv

from gpuenv.backend.base import REASON_COUNTERS

# Field ids (nvml.h). 74-81: cumulative ns under each perf policy, in REASON_COUNTERS order.
FI_PERF_POLICY = tuple(range(74, 82))
FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT, mW
SLOW_FIELDS = (*FI_PERF_POLICY, FI_MEMORY_TEMP)
assert len(FI_PERF_POLICY) == len(REASON_COUNTERS)

# nvmlValueType_t (nvml.h; numbers, since older bindings lack the newer names) -> the
# member of c_nvmlValue_t that holds it
VALUE_ATTR = {
    0: "dVal",  # NVML_VALUE_TYPE_DOUBLE
    1: "uiVal",  # UNSIGNED_INT
    2: "ulVal",  # UNSIGNED_LONG
    3: "ullVal",  # UNSIGNED_LONG_LONG
    4: "sllVal",  # SIGNED_LONG_LONG
    5: "siVal",  # SIGNED_INT
    6: "usVal",  # UNSIGNED_SHORT
}


def field_value(entry: Any) -> float | int | None:
    """The value of one c_nvmlFieldValue_t, or None where its own return code is not SUCCESS."""
    if entry.nvmlReturn != nv.NVML_SUCCESS:
        return None
    attr = VALUE_ATTR.get(int(entry.valueType))
    if attr is None:
        return None
    value = getattr(entry.value, attr)
    return float(value) if attr == "dVal" else int(value)


__all__ = [
    "FI_MEMORY_TEMP",
    "FI_PERF_POLICY",
    "FI_POWER_INSTANT",
    "SLOW_FIELDS",
    "VALUE_ATTR",
    "field_value",
]
