"""What the simulated driver answers to `details()`: the profile's board, as `nvidia-smi -q`.

The board facts (PCI ids, VBIOS, link, ECC, fan) are the profile's; what moves is
the model's: the PCIe link and the video clock drop while the GPU idles, memory
free is what the processes leave, the fan (where the card has one) follows the
temperature, and T.Limit is the distance to the max operating temperature.
"""

from __future__ import annotations

from gpuenv.backend.details import ECC_COUNTERS, ECC_KINDS, GpuDetails
from gpuenv.backend.sim_reads import SimReads

# the locations an H100 counts in (nvidia-smi -q: SRAM and DRAM); others answer N/A
_ECC_LOCATIONS_ANSWERED = ("device_memory", "dram", "sram")


class SimDetails(SimReads):
    """`details()` of `SimBackend`."""

    def details(self, index: int) -> GpuDetails:
        """`nvidia-smi -q`: memory breakdown, board, PCIe link, fan, engines, ECC, health."""
        used = sum(p.used_memory_mib or 0 for p in self.processes(index))
        with self._lock:
            g = self._get(index, "details")
            p = self.profile
            busy = bool(g.contexts or g.background)
            bus = int(self._pci_bus_id(index).split(":")[1], 16)
            ecc = {
                f"{kind}.{counter}.{loc}": 0
                for kind in ECC_KINDS
                for counter in ECC_COUNTERS
                for loc in (*_ECC_LOCATIONS_ANSWERED, "total")
            }
            fan = None
            if p.fan_pct is not None:  # the fan curve: its floor until 50 C, then up
                fan = min(100, p.fan_pct + max(0, round((g.r_temp - 50) * 2)))
            retired = p.ecc and not p.row_remapping
            return GpuDetails(
                memory_free_mib=max(0, p.memory_total_mib - p.reserved_mib - used),
                memory_reserved_mib=p.reserved_mib,
                minor_number=index,
                vbios_version=p.vbios_version,
                fan_pct=fan,
                compute_mode=0,
                display_mode=p.display,
                display_active=p.display,
                power_management=True,
                mig_pending=False if p.mig_capable else None,
                accounting_mode=False,
                accounting_buffer_size=4000,
                inforom_image=p.inforom[0],
                inforom_oem=p.inforom[1],
                inforom_ecc=p.inforom[2],
                inforom_power=p.inforom[3],
                power_average_w=round(g.r_power_avg, 2),
                video_mhz=p.video_mhz[1] if busy else p.video_mhz[0],
                tlimit_c=round(p.sw_thermal_c - g.r_temp),
                pci_domain=0,
                pci_bus=bus,
                pci_device=0,
                pci_device_id=p.pci_device_id,
                pci_sub_device_id=p.pci_sub_device_id,
                pcie_gen_current=p.pcie_gen if busy else 1,
                pcie_gen_max=p.pcie_gen,
                pcie_gen_gpu_max=p.pcie_gen,
                pcie_width_current=p.pcie_width,
                pcie_width_max=p.pcie_width,
                encoder_pct=0,
                decoder_pct=0,
                jpeg_pct=0,
                ofa_pct=0,
                encoder_sessions=0,
                encoder_fps=0,
                encoder_latency_us=0,
                ecc_current=p.ecc,
                ecc_pending=p.ecc,
                ecc_errors=ecc if p.ecc else {},
                retired_sbe=0 if retired else None,
                retired_dbe=0 if retired else None,
                retired_pending=False if retired else None,
                remapped_correctable=0 if p.row_remapping else None,
                remapped_uncorrectable=0 if p.row_remapping else None,
                remapped_pending=False if p.row_remapping else None,
                remapped_failure=False if p.row_remapping else None,
            )


__all__ = ["SimDetails"]
