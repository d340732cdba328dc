"""What root may change through NVML: locked clocks, application clocks, the power limit.

Each method names its `nvidia-smi` equivalent. Nothing here is ever called on a
real GPU by the tests: every write is tested on the simulated GPU, and
`ReadOnlyBackend` refuses them before they reach this module.
"""

from __future__ import annotations

from gpuenv.backend.nvml_queries import NvmlQueries
from gpuenv.errors import InvalidValue


class NvmlWrites(NvmlQueries):
    """The writes of `NvmlBackend` (`set_power_limit` reads the limits to check against)."""

    # -- writes (root) ------------------------------------------------------------
    def set_locked_sm_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lgc min,max`. Accepts CLOCK_LIMIT_TDP / CLOCK_LIMIT_UNLIMITED for both."""
        self._q(
            "nvmlDeviceSetGpuLockedClocks",
            self._handle(index),
            int(min_mhz),
            int(max_mhz),
            gpu=index,
        )

    def reset_locked_sm_clocks(self, index: int) -> None:
        """`nvidia-smi -rgc`."""
        self._q("nvmlDeviceResetGpuLockedClocks", self._handle(index), gpu=index)

    def set_locked_mem_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lmc min,max`."""
        self._q(
            "nvmlDeviceSetMemoryLockedClocks",
            self._handle(index),
            int(min_mhz),
            int(max_mhz),
            gpu=index,
        )

    def reset_locked_mem_clocks(self, index: int) -> None:
        """`nvidia-smi -rmc`."""
        self._q("nvmlDeviceResetMemoryLockedClocks", self._handle(index), gpu=index)

    def set_app_clocks(self, index: int, mem_mhz: int, sm_mhz: int) -> None:
        """`nvidia-smi -ac mem,sm`: deprecated in NVML 13, the fallback without locked clocks."""
        self._q(
            "nvmlDeviceSetApplicationsClocks",
            self._handle(index),
            int(mem_mhz),
            int(sm_mhz),
            gpu=index,
        )

    def reset_app_clocks(self, index: int) -> None:
        """`nvidia-smi -rac`."""
        self._q("nvmlDeviceResetApplicationsClocks", self._handle(index), gpu=index)

    def set_power_limit(self, index: int, watts: float) -> None:
        """`nvidia-smi -pl W`. Checked against the constraints first, and read back after:
        nvidia-ml-py's `_v2` setter ignores the driver's return code, so only the read-back
        proves the limit took."""
        h = self._handle(index)
        limits = self.power_limits(index)
        if not limits.min_w <= watts <= limits.max_w:
            raise InvalidValue(
                f"power limit {watts:g} W is outside {limits.min_w:g}-{limits.max_w:g} W",
                op="set_power_limit",
                gpu=index,
                hint="choose a value in range ('nvidia-smi -q -d POWER')",
            )
        milliwatts = round(watts * 1000)
        self._q("nvmlDeviceSetPowerManagementLimit", h, milliwatts, gpu=index)
        now_mw = self._q("nvmlDeviceGetPowerManagementLimit", h, gpu=index)
        if abs(now_mw - milliwatts) >= 1000:
            raise InvalidValue(
                f"the power limit reads {now_mw / 1000:g} W after setting {watts:g} W",
                op="set_power_limit",
                gpu=index,
                hint="the driver did not apply it; check 'nvidia-smi -q -d POWER'",
            )


__all__ = ["NvmlWrites"]
