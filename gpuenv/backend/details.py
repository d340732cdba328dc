"""`GpuDetails`: what `nvidia-smi -q` shows of a GPU beyond gpuenv's own reads.

The board, its PCIe link, fan, ECC, display, encoder and memory breakdown: what
`gpuenv status --query-gpu` answers for nvidia-smi's field names and what the
monitor shows beside clocks and power. One record, read at once by
`Backend.details()` (a few dozen NVML calls of a few us each: status, the
monitor's tick, never a sampler's hot path). Every value is None where the GPU
or driver does not answer (an H100 SXM has no fan, no display, no retired-page
list), never an error: one missing value never costs the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# nvmlMemoryLocation_t names as nvidia-smi spells them (ecc.errors.<kind>.<counter>.<loc>)
ECC_LOCATIONS = (
    "device_memory",
    "dram",
    "register_file",
    "l1_cache",
    "l2_cache",
    "texture_memory",
    "cbu",
    "sram",
)
ECC_KINDS = ("corrected", "uncorrected")
ECC_COUNTERS = ("volatile", "aggregate")

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


@dataclass(frozen=True)
class GpuDetails:
    """One GPU as `nvidia-smi -q` sees it; None: not answered by this GPU or driver."""

    # -- memory (nvmlDeviceGetMemoryInfo_v2), MiB
    memory_free_mib: int | None = None
    memory_reserved_mib: int | None = None
    # -- board
    minor_number: int | None = None  # /dev/nvidiaN: dcgm-exporter's `device` label
    vbios_version: str | None = None
    fan_pct: int | None = None  # intended fan speed, % of the maximum
    compute_mode: int | None = None  # COMPUTE_MODES
    display_mode: bool | None = None  # a monitor is connected
    display_active: bool | None = None  # a display is initialised
    power_management: bool | None = None
    mig_pending: bool | None = None
    accounting_mode: bool | None = None
    accounting_buffer_size: int | None = None
    inforom_image: str | None = None
    inforom_oem: str | None = None
    inforom_ecc: str | None = None
    inforom_power: str | None = None
    # -- power, clocks, temperature
    power_average_w: float | None = None  # field NVML_FI_DEV_POWER_AVERAGE
    video_mhz: int | None = None
    tlimit_c: int | None = None  # degrees below the throttle limit (nvmlDeviceGetMarginTemperature)
    # -- PCI / PCIe
    pci_domain: int | None = None
    pci_bus: int | None = None
    pci_device: int | None = None
    pci_device_id: int | None = None  # 0x233010DE: device << 16 | vendor
    pci_sub_device_id: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None  # what GPU and host together allow
    pcie_gen_gpu_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    # -- engines, %
    encoder_pct: int | None = None
    decoder_pct: int | None = None
    jpeg_pct: int | None = None
    ofa_pct: int | None = None
    encoder_sessions: int | None = None
    encoder_fps: int | None = None
    encoder_latency_us: int | None = None
    # -- ECC and memory health
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    # "corrected.volatile.dram" / "uncorrected.aggregate.total" -> count; missing: unanswered
    ecc_errors: Mapping[str, int] = field(default_factory=dict)
    retired_sbe: int | None = None  # pages retired for multiple single-bit errors
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remapped_correctable: int | None = None  # rows remapped (Ampere and newer)
    remapped_uncorrectable: int | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None

    def ecc_total(self, kind: str = "uncorrected", counter: str = "volatile") -> int | None:
        """The chip's total of `kind` ECC errors (`counter`: volatile or aggregate), or None."""
        return self.ecc_errors.get(f"{kind}.{counter}.total")


__all__ = ["COMPUTE_MODES", "ECC_COUNTERS", "ECC_KINDS", "ECC_LOCATIONS", "GpuDetails"]
