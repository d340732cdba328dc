"""`NvmlBackend.details()`: the board, PCIe link, fan, ECC and engines, as `nvidia-smi -q`.

Each value is its own NVML call through the chokepoint, and a call the GPU does not
answer (not supported, an argument it refuses, no permission) leaves that value None
(`_extra`, stricter than `_opt`: these are extras), so one getter never costs
the others; a lost or hung GPU still raises. Values that cannot change while the
driver runs (PCI identity, VBIOS, inforom versions, link maxima) are read once per GPU.
"""

from __future__ import annotations

from typing import Any

import pynvml as nv

from gpuenv.backend.details import ECC_COUNTERS, ECC_KINDS, ECC_LOCATIONS, GpuDetails
from gpuenv.backend.nvml_base import NvmlCore, text
from gpuenv.backend.nvml_fields import field_value
from gpuenv.errors import BackendError, DriverTimeout, GpuLost

FI_POWER_AVERAGE = 185  # NVML_FI_DEV_POWER_AVERAGE, mW

_ECC_LOCATION_IDS = {
    name: getattr(nv, f"NVML_MEMORY_LOCATION_{name.upper()}", None) for name in ECC_LOCATIONS
}
_ECC_KIND_IDS = {
    "corrected": nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
_ECC_COUNTER_IDS = {"volatile": nv.NVML_VOLATILE_ECC, "aggregate": nv.NVML_AGGREGATE_ECC}


def _on(value: Any) -> bool | None:
    return None if value is None else int(value) == nv.NVML_FEATURE_ENABLED


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


class NvmlDetails(NvmlCore):
    """`details()` of `NvmlBackend`."""

    def _extra(self, fn_name: str, *args: Any, gpu: int | None = None) -> Any:
        """None where this value cannot be read (not supported, an argument this GPU
        refuses, no permission); a lost or hung GPU still raises, as every read does."""
        try:
            return self._q(fn_name, *args, gpu=gpu)
        except (GpuLost, DriverTimeout):
            raise
        except BackendError:
            return None

    def _static_details(self, index: int) -> dict[str, Any]:
        """What cannot change while the driver runs: read once per GPU."""
        cache: dict[int, dict[str, Any]] = self.__dict__.setdefault("_static_details_cache", {})
        if index in cache:
            return cache[index]
        h = self._handle(index)
        pci = self._extra("nvmlDeviceGetPciInfo", h, gpu=index)
        vbios = self._extra("nvmlDeviceGetVbiosVersion", h, gpu=index)
        img = self._extra("nvmlDeviceGetInforomImageVersion", h, gpu=index)

        def inforom(obj: int) -> str | None:
            value = self._extra("nvmlDeviceGetInforomVersion", h, obj, gpu=index)
            return text(value) if value else None

        out: dict[str, Any] = {
            "minor_number": _int(self._extra("nvmlDeviceGetMinorNumber", h, gpu=index)),
            "vbios_version": text(vbios) if vbios else None,
            "inforom_image": text(img) if img else None,
            "inforom_oem": inforom(nv.NVML_INFOROM_OEM),
            "inforom_ecc": inforom(nv.NVML_INFOROM_ECC),
            "inforom_power": inforom(nv.NVML_INFOROM_POWER),
            "pcie_gen_max": _int(self._extra("nvmlDeviceGetMaxPcieLinkGeneration", h, gpu=index)),
            "pcie_gen_gpu_max": _int(
                self._extra("nvmlDeviceGetGpuMaxPcieLinkGeneration", h, gpu=index)
            ),
            "pcie_width_max": _int(self._extra("nvmlDeviceGetMaxPcieLinkWidth", h, gpu=index)),
        }
        if pci is not None:
            out.update(
                pci_domain=int(pci.domain),
                pci_bus=int(pci.bus),
                pci_device=int(pci.device),
                pci_device_id=int(pci.pciDeviceId),
                pci_sub_device_id=int(pci.pciSubSystemId),
            )
        cache[index] = out
        return out

    def _ecc_errors(self, index: int, h: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind in ECC_KINDS:
            for counter in ECC_COUNTERS:
                args = (_ECC_KIND_IDS[kind], _ECC_COUNTER_IDS[counter])
                total = self._extra("nvmlDeviceGetTotalEccErrors", h, *args, gpu=index)
                if total is None:  # no ECC on this GPU: the locations will not answer either
                    continue
                out[f"{kind}.{counter}.total"] = int(total)
                for loc, loc_id in _ECC_LOCATION_IDS.items():
                    if loc_id is None:
                        continue
                    n = self._extra("nvmlDeviceGetMemoryErrorCounter", h, *args, loc_id, gpu=index)
                    if n is not None:
                        out[f"{kind}.{counter}.{loc}"] = int(n)
        return out

    def _engines(self, index: int, h: Any) -> dict[str, Any]:
        def util(fn: str) -> int | None:
            value = self._extra(fn, h, gpu=index)
            return None if value is None else int(value[0])

        stats = self._extra("nvmlDeviceGetEncoderStats", h, gpu=index)
        return {
            "encoder_pct": util("nvmlDeviceGetEncoderUtilization"),
            "decoder_pct": util("nvmlDeviceGetDecoderUtilization"),
            "jpeg_pct": util("nvmlDeviceGetJpgUtilization"),
            "ofa_pct": util("nvmlDeviceGetOfaUtilization"),
            "encoder_sessions": None if stats is None else int(stats[0]),
            "encoder_fps": None if stats is None else int(stats[1]),
            "encoder_latency_us": None if stats is None else int(stats[2]),
        }

    def _health(self, index: int, h: Any) -> dict[str, Any]:
        """ECC mode and counters, retired pages, remapped rows."""
        ecc = self._extra("nvmlDeviceGetEccMode", h, gpu=index)
        out: dict[str, Any] = {
            "ecc_current": None if ecc is None else _on(ecc[0]),
            "ecc_pending": None if ecc is None else _on(ecc[1]),
            "ecc_errors": self._ecc_errors(index, h) if ecc is not None else {},
        }
        causes = (
            ("retired_sbe", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            ("retired_dbe", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        )
        for key, cause in causes:
            pages = self._extra("nvmlDeviceGetRetiredPages", h, cause, gpu=index)
            out[key] = None if pages is None else len(pages)
        out["retired_pending"] = _on(
            self._extra("nvmlDeviceGetRetiredPagesPendingStatus", h, gpu=index)
        )
        rows = self._extra("nvmlDeviceGetRemappedRows", h, gpu=index)
        if rows is not None:
            out.update(
                remapped_correctable=int(rows[0]),
                remapped_uncorrectable=int(rows[1]),
                remapped_pending=bool(rows[2]),
                remapped_failure=bool(rows[3]),
            )
        return out

    def _power_average_w(self, index: int, h: Any) -> float | None:
        entries = self._extra("nvmlDeviceGetFieldValues", h, [FI_POWER_AVERAGE], gpu=index)
        if not entries:
            return None
        entry = entries[0]
        value = field_value(entry)
        return None if value is None else value / 1000.0

    def details(self, index: int) -> GpuDetails:
        """`nvidia-smi -q`: memory breakdown, board, PCIe link, fan, engines, ECC, health."""
        h = self._handle(index)
        v2 = getattr(nv, "nvmlMemory_v2", None)
        mem = self._extra("nvmlDeviceGetMemoryInfo", h, v2, gpu=index) if v2 is not None else None
        mig = self._extra("nvmlDeviceGetMigMode", h, gpu=index)
        margin = self._extra("nvmlDeviceGetMarginTemperature", h, gpu=index)
        acct = self._extra("nvmlDeviceGetAccountingMode", h, gpu=index)
        return GpuDetails(
            memory_free_mib=None if mem is None else int(mem.free) // (1024 * 1024),
            memory_reserved_mib=None if mem is None else int(mem.reserved) // (1024 * 1024),
            fan_pct=_int(self._extra("nvmlDeviceGetFanSpeed", h, gpu=index)),
            compute_mode=_int(self._extra("nvmlDeviceGetComputeMode", h, gpu=index)),
            display_mode=_on(self._extra("nvmlDeviceGetDisplayMode", h, gpu=index)),
            display_active=_on(self._extra("nvmlDeviceGetDisplayActive", h, gpu=index)),
            power_management=_on(self._extra("nvmlDeviceGetPowerManagementMode", h, gpu=index)),
            mig_pending=None if mig is None else bool(mig[1]),
            accounting_mode=_on(acct),
            accounting_buffer_size=_int(
                self._extra("nvmlDeviceGetAccountingBufferSize", h, gpu=index)
            ),
            power_average_w=self._power_average_w(index, h),
            video_mhz=_int(
                self._extra("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_VIDEO, gpu=index)
            ),
            tlimit_c=_int(margin),
            pcie_gen_current=_int(self._extra("nvmlDeviceGetCurrPcieLinkGeneration", h, gpu=index)),
            pcie_width_current=_int(self._extra("nvmlDeviceGetCurrPcieLinkWidth", h, gpu=index)),
            **self._static_details(index),
            **self._engines(index, h),
            **self._health(index, h),
        )


__all__ = ["FI_POWER_AVERAGE", "NvmlDetails"]
