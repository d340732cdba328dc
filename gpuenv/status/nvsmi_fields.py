"""The rest of nvidia-smi's `--query-gpu` fields: the board, PCIe, fan, ECC, engines.

Data only (query.py turns each spec into a `QueryField`): names (canonical first,
then aliases), a line of help, how to read the value from a `GpuReads` (None: the
GPU does not answer, printed "[N/A]"), the unit and how a value is written, as
nvidia-smi 580 writes it. `UNANSWERED` are the fields gpuenv knows by name but
does not read (vGPU, fabric, confidential computing ...): they print "[N/A]" for
every GPU, so a script written for nvidia-smi's CSV still gets its columns.
`ORDER` is `nvidia-smi --help-query-gpu`'s order, which `--help-query-gpu` keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuenv.backend.details import COMPUTE_MODES, ECC_COUNTERS, ECC_KINDS, ECC_LOCATIONS

DEPRECATED = "[Requested functionality has been deprecated]"  # nvidia-smi 580's words

# (names, help, read, unit, show)
Spec = tuple[tuple[str, ...], str, Callable[[Any], Any], "str | None", Callable[[Any], str]]


def _detail(attr: str) -> Callable[[Any], Any]:
    return lambda r: getattr(r.get("details"), attr)


def _hex(width: int) -> Callable[[Any], str]:
    return lambda v: f"0x{int(v):0{width}X}"


def enabled(v: Any) -> str:
    return "Enabled" if v else "Disabled"


def _yes(v: Any) -> str:
    return "Yes" if v else "No"


def _num(v: Any) -> str:
    return f"{int(v)}"


def _watts(v: Any) -> str:
    return f"{float(v):.2f}"


def _spec(
    names: str, help_: str, attr: str, unit: str | None = None, show: Callable[[Any], str] = str
) -> Spec:
    return (tuple(names.split()), help_, _detail(attr), unit, show)


def _counter(name: str) -> Callable[[Any], Any]:
    """A cumulative time-under-reason counter (ns) in us, as nvidia-smi prints it."""

    def read(r: Any) -> Any:
        ns = r.get("read_slow_cheap").reason_ns.get(name)
        return None if ns is None else ns // 1000

    return read


def _ecc_read(key: str) -> Callable[[Any], Any]:
    return lambda r: r.get("details").ecc_errors.get(key)


def _ecc_specs() -> list[Spec]:
    out: list[Spec] = []
    for kind in ECC_KINDS:
        for counter in ECC_COUNTERS:
            since = "since the driver loaded" if counter == "volatile" else "lifetime"
            for loc in (*ECC_LOCATIONS, "total"):
                where = "the whole chip" if loc == "total" else loc.replace("_", " ")
                key = f"{kind}.{counter}.{loc}"
                text = f"{kind.capitalize()} ECC errors, {counter} ({since}), in {where}."
                out.append(((f"ecc.errors.{key}",), text, _ecc_read(key), None, _num))
    return out


DETAIL_SPECS: list[Spec] = [
    _spec("pci.domain", "PCI domain number, in hex.", "pci_domain", show=_hex(4)),
    _spec("pci.bus", "PCI bus number, in hex.", "pci_bus", show=_hex(2)),
    _spec("pci.device", "PCI device number, in hex.", "pci_device", show=_hex(2)),
    _spec("pci.device_id", "PCI vendor device id, in hex.", "pci_device_id", show=_hex(8)),
    _spec("pci.sub_device_id", "PCI Sub System id, in hex.", "pci_sub_device_id", show=_hex(8)),
    _spec(
        "pcie.link.gen.current",
        "The current PCIe link generation (drops while idle); "
        "nvidia-smi calls it deprecated in favour of pcie.link.gen.gpucurrent.",
        "pcie_gen_current",
        show=_num,
    ),
    _spec(
        "pcie.link.gen.gpucurrent",
        "The current PCIe link generation (drops while idle).",
        "pcie_gen_current",
        show=_num,
    ),
    _spec(
        "pcie.link.gen.max",
        "The highest PCIe generation this GPU and this system allow.",
        "pcie_gen_max",
        show=_num,
    ),
    _spec(
        "pcie.link.gen.gpumax",
        "The highest PCIe generation the GPU supports.",
        "pcie_gen_gpu_max",
        show=_num,
    ),
    _spec(
        "pcie.link.width.current",
        "The current PCIe link width (lanes).",
        "pcie_width_current",
        show=_num,
    ),
    _spec(
        "pcie.link.width.max",
        "The widest PCIe link this GPU and this system allow.",
        "pcie_width_max",
        show=_num,
    ),
    (
        ("display_mode",),
        "Deprecated by nvidia-smi 580 for display_attached: prints its "
        "deprecation notice, as nvidia-smi does.",
        lambda r: DEPRECATED,
        None,
        str,
    ),
    _spec(
        "display_attached",
        "Whether a physical display is connected: Yes or No.",
        "display_mode",
        show=_yes,
    ),
    _spec(
        "display_active",
        "Whether a display is initialised on the GPU: Enabled or Disabled.",
        "display_active",
        show=enabled,
    ),
    _spec(
        "accounting.mode",
        "Whether per-process accounting is on: Enabled or Disabled.",
        "accounting_mode",
        show=enabled,
    ),
    _spec(
        "accounting.buffer_size",
        "How many processes the accounting buffer holds.",
        "accounting_buffer_size",
        show=_num,
    ),
    _spec("vbios_version", "The BIOS of the GPU board.", "vbios_version"),
    _spec("inforom.img inforom.image", "Version of the infoROM image.", "inforom_image"),
    _spec("inforom.oem", "infoROM version of the OEM configuration data.", "inforom_oem"),
    _spec("inforom.ecc", "infoROM version of the ECC recording data.", "inforom_ecc"),
    _spec(
        "inforom.pwr inforom.power",
        "infoROM version of the power management data.",
        "inforom_power",
    ),
    _spec(
        "fan.speed",
        "The intended fan speed, in percent of its maximum; [N/A] on boards "
        "cooled by the chassis (SXM).",
        "fan_pct",
        unit="%",
        show=_num,
    ),
    _spec(
        "memory.reserved",
        "Memory reserved by the driver and firmware.",
        "memory_reserved_mib",
        unit="MiB",
        show=_num,
    ),
    _spec(
        "memory.free",
        "Memory free (total - reserved - used).",
        "memory_free_mib",
        unit="MiB",
        show=_num,
    ),
    _spec(
        "compute_mode",
        "Whether one or many compute contexts may run: Default, "
        "Exclusive_Thread, Prohibited or Exclusive_Process.",
        "compute_mode",
        show=lambda v: COMPUTE_MODES.get(int(v), f"Unknown({int(v)})"),
    ),
    _spec(
        "utilization.encoder",
        "Percent of time the encoder engine was busy over the driver's last sample period.",
        "encoder_pct",
        unit="%",
        show=_num,
    ),
    _spec(
        "utilization.decoder",
        "Percent of time the decoder engine was busy.",
        "decoder_pct",
        unit="%",
        show=_num,
    ),
    _spec(
        "utilization.jpeg",
        "Percent of time the JPEG engine was busy.",
        "jpeg_pct",
        unit="%",
        show=_num,
    ),
    _spec(
        "utilization.ofa",
        "Percent of time the optical flow accelerator was busy.",
        "ofa_pct",
        unit="%",
        show=_num,
    ),
    _spec(
        "encoder.stats.sessionCount",
        "Number of encoder sessions running.",
        "encoder_sessions",
        show=_num,
    ),
    _spec(
        "encoder.stats.averageFps",
        "Average frames per second of all encoder sessions.",
        "encoder_fps",
        show=_num,
    ),
    _spec(
        "encoder.stats.averageLatency",
        "Average latency of all encoder sessions, in us.",
        "encoder_latency_us",
        show=_num,
    ),
    _spec(
        "ecc.mode.current", "The ECC mode now: Enabled or Disabled.", "ecc_current", show=enabled
    ),
    _spec("ecc.mode.pending", "The ECC mode after the next reboot.", "ecc_pending", show=enabled),
    *_ecc_specs(),
    _spec(
        "retired_pages.single_bit_ecc.count retired_pages.sbe",
        "Device memory pages retired after multiple single-bit ECC errors.",
        "retired_sbe",
        show=_num,
    ),
    _spec(
        "retired_pages.double_bit.count retired_pages.dbe",
        "Device memory pages retired after a double-bit ECC error.",
        "retired_dbe",
        show=_num,
    ),
    _spec(
        "retired_pages.pending",
        "Whether pages wait to be retired at the next reboot: Yes or No.",
        "retired_pending",
        show=_yes,
    ),
    _spec(
        "remapped_rows.correctable remapped_rows.sbe",
        "Rows remapped after correctable errors.",
        "remapped_correctable",
        show=_num,
    ),
    _spec(
        "remapped_rows.uncorrectable remapped_rows.dbe",
        "Rows remapped after uncorrectable errors.",
        "remapped_uncorrectable",
        show=_num,
    ),
    _spec(
        "remapped_rows.pending",
        "Whether a row remapping waits for a GPU reset: Yes or No.",
        "remapped_pending",
        show=_yes,
    ),
    _spec(
        "remapped_rows.failure",
        "Whether a row remapping failed: Yes or No.",
        "remapped_failure",
        show=_yes,
    ),
    _spec(
        "temperature.gpu.tlimit",
        "Degrees C below the GPU's throttle limit (T.Limit).",
        "tlimit_c",
        show=_num,
    ),
    _spec(
        "power.management",
        "Whether power management is on: Enabled or Disabled.",
        "power_management",
        show=enabled,
    ),
    _spec(
        "power.draw.average gpu.power.draw.average",
        "Average power draw of the board over the last second, in watts.",
        "power_average_w",
        unit="W",
        show=_watts,
    ),
    _spec(
        "clocks.current.video clocks.video",
        "Current frequency of the video encoder/decoder clock.",
        "video_mhz",
        unit="MHz",
        show=_num,
    ),
    # field ids 74 and 76 (gpuenv's read_slow counters "power" and "sync_boost"); nvidia-smi's
    # thermal ones (269-271) answer unrelated values on driver 580 (what-gpus-do.md): not read
    (
        ("clocks_event_reasons_counters.sw_power_cap",),
        "Time the SW power cap has held the clocks down since the driver loaded, in us.",
        _counter("power"),
        "us",
        _num,
    ),
    (
        ("clocks_event_reasons_counters.sync_boost",),
        "Time sync boost has held the clocks down since the driver loaded, in us.",
        _counter("sync_boost"),
        "us",
        _num,
    ),
    _spec(
        "mig.mode.pending",
        "The MIG mode after the next GPU reset: Enabled or Disabled.",
        "mig_pending",
        show=enabled,
    ),
]

# nvidia-smi 580's names that gpuenv does not read: "[N/A]" on every GPU. "names [unit]"
UNANSWERED: list[str] = """
vgpu_driver_capability.heterogenous_multivGPU
vgpu_device_capability.fractional_multiVgpu
vgpu_device_capability.heterogeneous_timeSlice_profile
vgpu_device_capability.heterogeneous_timeSlice_sizes
vgpu_device_capability.homogeneous_placements
vgpu_device_capability.mig_timeSlicing
vgpu_device_capability.mig_timeSlicing_mode
pci.baseClass
pci.subClass
pcie.link.gen.hostmax
addressing_mode
driver_model.current
driver_model.pending
inforom.checksum_validation
gpu_recovery_action
gom.current gpu_operation_mode.current
gom.pending gpu_operation_mode.pending
clocks_event_reasons_counters.sw_thermal_slowdown [us]
clocks_event_reasons_counters.hw_thermal_slowdown [us]
clocks_event_reasons_counters.hw_power_brake_slowdown [us]
dramEncryption.mode.current
dramEncryption.mode.pending
ecc.errors.uncorrected.volatile.sram.parity
ecc.errors.uncorrected.volatile.sram.secded
ecc.errors.uncorrected.aggregate.sram.parity
ecc.errors.uncorrected.aggregate.sram.secded
ecc.errors.uncorrected.aggregate.sram.thresholdExceeded
ecc.errors.uncorrected.aggregate.sram.l2
ecc.errors.uncorrected.aggregate.sram.sm
ecc.errors.uncorrected.aggregate.sram.mcu
ecc.errors.uncorrected.aggregate.sram.pcie
ecc.errors.uncorrected.aggregate.sram.other
remapped_rows.correctable_inactive
remapped_rows.uncorrectable_inactive
remapped_rows.histogram.max
remapped_rows.histogram.high
remapped_rows.histogram.partial
remapped_rows.histogram.low
remapped_rows.histogram.none
module.power.draw.average [W]
module.power.draw.instant [W]
module.power.limit module.power.requested_limit [W]
module.enforced.power.limit module.power.current_limit [W]
module.power.default_limit [W]
module.power.min_limit [W]
module.power.max_limit [W]
power_smoothing.delayed_power_smoothing_supported
power_smoothing.primary_power_floor [W]
power_smoothing.secondary_power_floor [W]
power_smoothing.min_primary_floor_activation_offset [W]
power_smoothing.min_primary_floor_activation_point [W]
power_smoothing.window_multiplier [ms]
power_smoothing.curr_profile.secondary_power_floor [W]
power_smoothing.curr_profile.primary_floor_act_window_multiplier
power_smoothing.curr_profile.primary_floor_tar_window_multiplier
power_smoothing.curr_profile.primary_floor_act_offset [W]
power_smoothing.admin_override.secondary_power_floor [W]
power_smoothing.admin_override.primary_floor_act_window_multiplier
power_smoothing.admin_override.primary_floor_tar_window_multiplier
power_smoothing.admin_override.primary_floor_act_offset [W]
gsp.mode.current
gsp.mode.default
c2c.mode
protected_memory.total [MiB]
protected_memory.used [MiB]
protected_memory.free [MiB]
fabric.state
fabric.status
fabric.cliqueId
fabric.clusterUuid
fabric.health.summary
fabric.health.bandwidth
fabric.health.route_recovery_in_progress
fabric.health.route_unhealthy
fabric.health.access_timeout_recovery
fabric.health.incorrect_configuration
fabric.health.partition_assigned
platform.chassis_serial_number
platform.slot_number
platform.tray_index
platform.host_id
platform.peer_type
platform.module_id
platform.gpu_fabric_guid
hostname
""".strip().splitlines()

# `nvidia-smi --help-query-gpu`'s order (580, recorded on an H100: tests/data/nvidia_smi),
# canonical names; a prefix ending in "*" covers the names it starts; gpuenv's own come last
ORDER = """
timestamp driver_version vgpu_driver_capability.heterogenous_multivGPU count name serial
uuid pci.bus_id pci.domain pci.bus pci.device pci.baseClass pci.subClass pci.device_id
pci.sub_device_id vgpu_device_capability.fractional_multiVgpu
vgpu_device_capability.heterogeneous_timeSlice_profile
vgpu_device_capability.heterogeneous_timeSlice_sizes
vgpu_device_capability.homogeneous_placements vgpu_device_capability.mig_timeSlicing
vgpu_device_capability.mig_timeSlicing_mode pcie.link.gen.current pcie.link.gen.gpucurrent
pcie.link.gen.max pcie.link.gen.gpumax pcie.link.gen.hostmax pcie.link.width.current
pcie.link.width.max index display_mode display_attached display_active persistence_mode
addressing_mode accounting.mode accounting.buffer_size driver_model.current
driver_model.pending vbios_version inforom.img inforom.oem inforom.ecc inforom.pwr
inforom.checksum_validation gpu_recovery_action gom.current gom.pending fan.speed pstate
clocks_event_reasons.supported clocks_event_reasons.active clocks_event_reasons.gpu_idle
clocks_event_reasons.applications_clocks_setting clocks_event_reasons.sw_power_cap
clocks_event_reasons.hw_slowdown clocks_event_reasons.hw_thermal_slowdown
clocks_event_reasons.hw_power_brake_slowdown clocks_event_reasons.sw_thermal_slowdown
clocks_event_reasons.sync_boost clocks_event_reasons_counters.sw_power_cap
clocks_event_reasons_counters.sync_boost clocks_event_reasons_counters.sw_thermal_slowdown
clocks_event_reasons_counters.hw_thermal_slowdown
clocks_event_reasons_counters.hw_power_brake_slowdown memory.total memory.reserved
memory.used memory.free compute_mode compute_cap utilization.gpu utilization.memory
utilization.encoder utilization.decoder utilization.jpeg utilization.ofa
encoder.stats.sessionCount encoder.stats.averageFps encoder.stats.averageLatency
dramEncryption.mode.current dramEncryption.mode.pending ecc.mode.current ecc.mode.pending
ecc.errors.corrected.volatile.device_memory ecc.errors.corrected.volatile.dram
ecc.errors.corrected.volatile.register_file ecc.errors.corrected.volatile.l1_cache
ecc.errors.corrected.volatile.l2_cache ecc.errors.corrected.volatile.texture_memory
ecc.errors.corrected.volatile.cbu ecc.errors.corrected.volatile.sram
ecc.errors.corrected.volatile.total ecc.errors.corrected.aggregate.device_memory
ecc.errors.corrected.aggregate.dram ecc.errors.corrected.aggregate.register_file
ecc.errors.corrected.aggregate.l1_cache ecc.errors.corrected.aggregate.l2_cache
ecc.errors.corrected.aggregate.texture_memory ecc.errors.corrected.aggregate.cbu
ecc.errors.corrected.aggregate.sram ecc.errors.corrected.aggregate.total
ecc.errors.uncorrected.volatile.device_memory ecc.errors.uncorrected.volatile.dram
ecc.errors.uncorrected.volatile.register_file ecc.errors.uncorrected.volatile.l1_cache
ecc.errors.uncorrected.volatile.l2_cache ecc.errors.uncorrected.volatile.texture_memory
ecc.errors.uncorrected.volatile.cbu ecc.errors.uncorrected.volatile.sram
ecc.errors.uncorrected.volatile.total ecc.errors.uncorrected.aggregate.device_memory
ecc.errors.uncorrected.aggregate.dram ecc.errors.uncorrected.aggregate.register_file
ecc.errors.uncorrected.aggregate.l1_cache ecc.errors.uncorrected.aggregate.l2_cache
ecc.errors.uncorrected.aggregate.texture_memory ecc.errors.uncorrected.aggregate.cbu
ecc.errors.uncorrected.aggregate.sram ecc.errors.uncorrected.aggregate.total
ecc.errors.uncorrected.volatile.sram.parity ecc.errors.uncorrected.volatile.sram.secded
ecc.errors.uncorrected.aggregate.sram.parity ecc.errors.uncorrected.aggregate.sram.secded
ecc.errors.uncorrected.aggregate.sram.thresholdExceeded
ecc.errors.uncorrected.aggregate.sram.l2 ecc.errors.uncorrected.aggregate.sram.sm
ecc.errors.uncorrected.aggregate.sram.mcu ecc.errors.uncorrected.aggregate.sram.pcie
ecc.errors.uncorrected.aggregate.sram.other retired_pages.single_bit_ecc.count
retired_pages.double_bit.count retired_pages.pending remapped_rows.correctable
remapped_rows.correctable_inactive remapped_rows.uncorrectable
remapped_rows.uncorrectable_inactive remapped_rows.pending remapped_rows.failure
remapped_rows.histogram.max remapped_rows.histogram.high remapped_rows.histogram.partial
remapped_rows.histogram.low remapped_rows.histogram.none temperature.gpu
temperature.gpu.tlimit temperature.memory power.management power.draw power.draw.average
power.draw.instant power.limit enforced.power.limit power.default_limit power.min_limit
power.max_limit module.power.draw.average module.power.draw.instant module.power.limit
module.enforced.power.limit module.power.default_limit module.power.min_limit
module.power.max_limit power_smoothing.delayed_power_smoothing_supported
power_smoothing.primary_power_floor power_smoothing.secondary_power_floor
power_smoothing.min_primary_floor_activation_offset
power_smoothing.min_primary_floor_activation_point power_smoothing.window_multiplier
power_smoothing.curr_profile.secondary_power_floor
power_smoothing.curr_profile.primary_floor_act_window_multiplier
power_smoothing.curr_profile.primary_floor_tar_window_multiplier
power_smoothing.curr_profile.primary_floor_act_offset
power_smoothing.admin_override.secondary_power_floor
power_smoothing.admin_override.primary_floor_act_window_multiplier
power_smoothing.admin_override.primary_floor_tar_window_multiplier
power_smoothing.admin_override.primary_floor_act_offset clocks.current.graphics
clocks.current.sm clocks.current.memory clocks.current.video clocks.applications.graphics
clocks.applications.memory clocks.default_applications.graphics
clocks.default_applications.memory clocks.max.graphics clocks.max.sm clocks.max.memory
mig.mode.current mig.mode.pending gsp.mode.current gsp.mode.default c2c.mode
protected_memory.total protected_memory.used protected_memory.free fabric.state
fabric.status fabric.cliqueId fabric.clusterUuid fabric.health.summary
fabric.health.bandwidth fabric.health.route_recovery_in_progress
fabric.health.route_unhealthy fabric.health.access_timeout_recovery
fabric.health.incorrect_configuration fabric.health.partition_assigned
platform.chassis_serial_number platform.slot_number platform.tray_index platform.host_id
platform.peer_type platform.module_id platform.gpu_fabric_guid hostname gpuenv.*
""".split()  # noqa: SIM905


_EXACT = {name: i for i, name in enumerate(ORDER) if not name.endswith("*")}


def order_key(name: str) -> int:
    """Where `name` (canonical) stands in --help-query-gpu: its ORDER index."""
    if name in _EXACT:
        return _EXACT[name]
    for i, entry in enumerate(ORDER):
        if entry.endswith("*") and name.startswith(entry[:-1]):
            return i
    return len(ORDER)


__all__ = ["DEPRECATED", "DETAIL_SPECS", "ORDER", "UNANSWERED", "Spec", "enabled", "order_key"]
