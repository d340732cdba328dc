"""What the simulated driver lets root change: locked clocks, application clocks, power limit.

Each write validates as NVML does (supported clocks, ranges, what the profile's
GPU supports at all, the permission model) and then commits the change to the
driver state (`SimCore._commit`): with a state file, every process sharing it
sees the change at its next call.
"""

from __future__ import annotations

from gpuenv.backend.base import CLOCK_LIMIT_TDP, CLOCK_LIMIT_UNLIMITED
from gpuenv.backend.nvml_codes import INVALID_ARGUMENT, NOT_SUPPORTED
from gpuenv.backend.sim_core import SimCore
from gpuenv.backend.sim_gpu import Settings
from gpuenv.errors import InvalidValue, NotSupported


class SimWrites(SimCore):
    """The write side of `SimBackend` (nvidia-smi's equivalents in each docstring)."""

    def _resolve_locked_sm(self, index: int, min_mhz: int, max_mhz: int) -> tuple[int, int]:
        p = self.profile
        symbolic = (CLOCK_LIMIT_TDP, CLOCK_LIMIT_UNLIMITED)
        if (min_mhz in symbolic) != (max_mhz in symbolic):
            raise InvalidValue(
                "cannot mix a clock in MHz with a symbolic limit (TDP/UNLIMITED)",
                op="set_locked_sm_clocks",
                gpu=index,
                code=INVALID_ARGUMENT,
                hint="pass two clocks in MHz, or CLOCK_LIMIT_TDP / CLOCK_LIMIT_UNLIMITED for both",
            )
        if min_mhz in symbolic:
            if CLOCK_LIMIT_TDP in (min_mhz, max_mhz) and p.base_sm_mhz is None:
                raise NotSupported(
                    "this GPU reports no base (TDP) clock",
                    op="set_locked_sm_clocks",
                    gpu=index,
                    code=NOT_SUPPORTED,
                    hint="lock to a clock in MHz",
                )
            lo = p.base_sm_mhz if min_mhz == CLOCK_LIMIT_TDP else p.sm_clocks_mhz[-1]
            hi = p.base_sm_mhz if max_mhz == CLOCK_LIMIT_TDP else p.max_sm_mhz
            assert lo is not None and hi is not None
            return (min(lo, hi), hi)
        return _snap_range(p.sm_clocks_mhz, min_mhz, max_mhz, "SM", "set_locked_sm_clocks", index)

    def set_locked_sm_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lgc min,max`: takes effect at once; the power cap can still pull below it.

        In-range values that are not supported clocks are rounded inward (min up, max
        down) as the driver rounds; values outside the supported range raise InvalidValue.
        """
        with self._lock:
            op = "set_locked_sm_clocks"
            self._get(index, op)
            self._need_locked(index, op)
            self._need_root(index, op, "lock SM clocks")
            rng = self._resolve_locked_sm(index, min_mhz, max_mhz)
            self._commit(index, lambda s: setattr(s, "locked_sm", rng))

    def _need_locked(self, index: int, op: str) -> None:
        if not self.profile.locked_clocks_supported:
            raise self._unsupported(
                "locked clocks are not supported",
                index,
                op,
                "use application clocks (nvidia-smi -ac) instead",
            )

    def _need_app_clocks(self, index: int, op: str) -> None:
        if not self.profile.app_clocks_supported:
            raise self._unsupported(
                "application clocks cannot be set",
                index,
                op,
                "lock clocks instead (nvidia-smi -lgc)",
            )

    def _unsupported(self, what: str, index: int, op: str, hint: str) -> NotSupported:
        return NotSupported(
            f"{what} on {self.profile.gpu_name}",
            op=op,
            gpu=index,
            code=NOT_SUPPORTED,
            hint=hint,
        )

    def _reset_locked(self, index: int, op: str, field: str, what: str) -> None:
        with self._lock:
            self._get(index, op)
            self._need_locked(index, op)
            self._need_root(index, op, what)
            self._commit(index, lambda s: setattr(s, field, None))

    def reset_locked_sm_clocks(self, index: int) -> None:
        """`nvidia-smi -rgc`."""
        self._reset_locked(index, "reset_locked_sm_clocks", "locked_sm", "reset locked SM clocks")

    def set_locked_mem_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """`nvidia-smi -lmc min,max`. NotSupported on Hopper (only the deferred -lmcd works)."""
        with self._lock:
            op = "set_locked_mem_clocks"
            self._get(index, op)
            p = self.profile
            if not p.locked_mem_supported:
                hint = (
                    "Hopper applies locked memory clocks only at the next GPU initialisation "
                    "(nvidia-smi -lmcd); lock the SM clock only"
                    if p.locked_clocks_supported
                    else "use application clocks (nvidia-smi -ac) to set the memory clock"
                )
                raise self._unsupported("locking memory clocks is not supported", index, op, hint)
            self._need_root(index, op, "lock memory clocks")
            rng = _snap_range(p.mem_clocks_mhz, min_mhz, max_mhz, "memory", op, index)
            self._commit(index, lambda s: setattr(s, "locked_mem", rng))

    def reset_locked_mem_clocks(self, index: int) -> None:
        """`nvidia-smi -rmc`. Succeeds (nothing to reset) where only SM clocks can be locked."""
        self._reset_locked(
            index, "reset_locked_mem_clocks", "locked_mem", "reset locked memory clocks"
        )

    def set_app_clocks(self, index: int, mem_mhz: int, sm_mhz: int) -> None:
        """`nvidia-smi -ac mem,sm`: a supported pair; applies at the next context creation."""
        with self._lock:
            op = "set_app_clocks"
            self._get(index, op)
            p = self.profile
            self._need_app_clocks(index, op)
            self._need_root(index, op, "set application clocks")
            if mem_mhz not in p.mem_clocks_mhz or sm_mhz not in p.sm_clocks_mhz:
                raise InvalidValue(
                    f"application clocks mem {mem_mhz} / SM {sm_mhz} MHz are not a supported pair",
                    op=op,
                    gpu=index,
                    code=INVALID_ARGUMENT,
                    hint=f"memory {'/'.join(map(str, p.mem_clocks_mhz))} MHz; SM a supported clock "
                    f"{p.sm_clocks_mhz[-1]}-{p.max_sm_mhz} MHz (nvidia-smi -q -d SUPPORTED_CLOCKS)",
                )
            self._commit(index, lambda s: _set_app(s, int(sm_mhz), int(mem_mhz)))

    def reset_app_clocks(self, index: int) -> None:
        """`nvidia-smi -rac`."""
        with self._lock:
            op = "reset_app_clocks"
            self._get(index, op)
            p = self.profile
            self._need_app_clocks(index, op)
            self._need_root(index, op, "reset application clocks")
            self._commit(index, lambda s: _set_app(s, p.default_app_sm_mhz, p.default_app_mem_mhz))

    def set_power_limit(self, index: int, watts: float) -> None:
        """`nvidia-smi -pl W`: within [min, max] of power_limits(), else InvalidValue."""
        with self._lock:
            op = "set_power_limit"
            self._get(index, op)
            self._need_root(index, op, "set the power limit")
            p = self.profile
            if (
                isinstance(watts, bool)
                or not isinstance(watts, (int, float))
                or not (p.power_min_w <= watts <= p.power_max_w)
            ):
                raise InvalidValue(
                    f"power limit {watts!r} W is out of range",
                    op=op,
                    gpu=index,
                    code=INVALID_ARGUMENT,
                    hint=f"use {p.power_min_w:g} to {p.power_max_w:g} W",
                )
            value = int(watts * 1000) / 1000.0  # NVML takes milliwatts
            self._commit(index, lambda s: setattr(s, "power_limit_w", value))

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        """`nvidia-smi -pm 1|0` (a simulator helper; gpuenv itself never changes it)."""
        with self._lock:
            op = "set_persistence_mode"
            self._get(index, op)
            self._need_root(index, op, "change persistence mode")
            self._commit(index, lambda s: setattr(s, "persistence", bool(enabled)))


def _set_app(s: Settings, sm: int, mem: int) -> None:
    s.app_sm, s.app_mem = sm, mem


def _snap_range(
    clocks_desc: tuple[int, ...], lo: int, hi: int, what: str, op: str, index: int
) -> tuple[int, int]:
    """Round an in-range request to supported clocks: min up, max down (never wider than asked)."""
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidValue(
                f"{what} clock {v!r} is not a number",
                op=op,
                gpu=index,
                code=INVALID_ARGUMENT,
            )
    low, high = clocks_desc[-1], clocks_desc[0]
    if lo > hi:
        raise InvalidValue(
            f"{what} clock range {lo}-{hi} MHz has min above max",
            op=op,
            gpu=index,
            code=INVALID_ARGUMENT,
            hint="pass min <= max",
        )
    if lo < low or hi > high:
        raise InvalidValue(
            f"{what} clock range {lo}-{hi} MHz is outside the supported {low}-{high} MHz",
            op=op,
            gpu=index,
            code=INVALID_ARGUMENT,
            hint="pick clocks from 'gpuenv status' / nvidia-smi -q -d SUPPORTED_CLOCKS",
        )
    up = min(c for c in clocks_desc if c >= lo)
    down = max(c for c in clocks_desc if c <= hi)
    if up > down:  # both inside one gap between supported clocks: the nearest one
        mid = (lo + hi) / 2
        up = down = min(clocks_desc, key=lambda c: (abs(c - mid), -c))
    return (up, down)


__all__ = ["SimWrites"]
