"""NVML field values: decoding on real ctypes structs, and the stable field ids (CPU)."""

from __future__ import annotations

import pynvml
import pytest

from gpuenv.backend import REASON_COUNTERS, nvml_fields

# -- field values (CPU) ------------------------------------------------------------------


def _entry(field_id: int, value_type: int, attr: str, value: float, ret: int = 0):
    entry = pynvml.c_nvmlFieldValue_t()
    entry.fieldId = field_id
    entry.valueType = value_type
    entry.nvmlReturn = ret
    entry.timestamp = 1_790_000_000_000_000
    setattr(entry.value, attr, value)
    return entry


@pytest.mark.parametrize(
    ("value_type", "attr", "value"),
    [
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 12.5),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 698_123),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 7),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 123_456_789_012),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -5),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -3),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65),
    ],
)
def test_field_value_decodes_each_value_type(value_type: int, attr: str, value: float) -> None:
    assert nvml_fields.field_value(_entry(186, value_type, attr, value)) == value


def test_field_value_is_none_when_that_entry_failed() -> None:
    # nvmlDeviceGetFieldValues succeeds when any field was filled: each entry has its own code
    failed = _entry(
        82, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 0, ret=pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    assert nvml_fields.field_value(failed) is None


def test_reason_counter_fields_are_the_stable_ids_74_to_81() -> None:
    assert tuple(range(74, 82)) == nvml_fields.FI_PERF_POLICY
    assert pynvml.NVML_FI_DEV_PERF_POLICY_POWER == 74
    assert pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS == 81
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP == nvml_fields.FI_MEMORY_TEMP
    assert pynvml.NVML_FI_DEV_POWER_INSTANT == nvml_fields.FI_POWER_INSTANT
    assert len(REASON_COUNTERS) == len(nvml_fields.FI_PERF_POLICY)


# -- memory (CPU, NVML's calls faked) ---------------------------------------------------


def _queries(monkeypatch: pytest.MonkeyPatch, get_memory_info) -> object:
    from gpuenv.backend import nvml_queries

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", get_memory_info)
    q = object.__new__(nvml_queries.NvmlQueries)
    q._handles, q._count, q._chosen = {0: "handle-0"}, 1, {}  # type: ignore[attr-defined]
    return q


def test_memory_used_leaves_out_the_reserved_memory_as_nvidia_smi_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mib = 1024 * 1024
    calls = []

    def info(handle, version=None):
        calls.append((handle, version))
        m = pynvml.c_nvmlMemory_v2_t() if version else pynvml.c_nvmlMemory_t()
        m.total, m.used = 81_559 * mib, (1_000 + (0 if version else 530)) * mib
        return m

    usage = _queries(monkeypatch, info).memory(0)  # type: ignore[attr-defined]
    assert calls == [("handle-0", pynvml.nvmlMemory_v2)]
    assert (usage.used_mib, usage.total_mib) == (1_000, 81_559)


def test_memory_falls_back_to_v1_on_a_driver_without_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    mib = 1024 * 1024

    def info(handle, version=None):
        if version:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        m = pynvml.c_nvmlMemory_t()
        m.total, m.used = 16_384 * mib, 1_530 * mib
        return m

    q = _queries(monkeypatch, info)
    usage = q.memory(0)  # type: ignore[attr-defined]
    assert (usage.used_mib, usage.total_mib) == (1_530, 16_384)
    tries = []
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda h, version=None: tries.append(version) or info(h, version),
    )
    assert q.memory(0).used_mib == 1_530  # type: ignore[attr-defined]
    assert tries == [None]  # v2 is not asked again on this driver
