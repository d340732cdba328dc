"""The cheap samples over a region (`Held`): the sample in force at its start and those
inside hold over it, the reading just after it covers it too; what they say of the SM and
memory clocks, the power readings' highest, the temperature, the reasons and the lock.
One of `gpuenv.telemetry.summary`'s parts: regions with the same samples share one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuenv.clocks.status import lock_holds
from gpuenv.reasons import Reason, reason_names
from gpuenv.telemetry.samples import Sample

_NOT_IDLE = ~Reason.GPU_IDLE  # computed once: enum arithmetic costs microseconds
_IDLE = int(Reason.GPU_IDLE)
_NAMES: dict[int, tuple[str, ...]] = {}  # reasons bitmask -> its names (a handful of masks)


class Held:
    """The cheap samples covering regions with the same samples inside and around them,
    and what they say that does not depend on where a region starts and ends: the
    sample in force at t0 and those inside hold over it (`held`); the reading just
    `after` it, if any, covers it too (see `summarize`)."""

    def __init__(
        self,
        fast: Sequence[Sample],
        i0: int,
        i1: int,
        has_after: bool,
        lock_range: tuple[int, int] | None,
        lock_tolerance_mhz: float,
    ):
        inside = list(fast[i0:i1])
        after = fast[i1] if has_after else None
        held = ([fast[i0 - 1]] if i0 > 0 else []) + inside
        if not held and after is not None:
            held = [after]
        self.held = held
        self.fixed: dict[str, Any] = {"n_samples": len(inside)}
        if not held:
            return
        covering = held + ([after] if after is not None and held[-1] is not after else [])
        first, last = held[0], covering[-1]
        self.names = [_names(s.reasons) for s in held]
        self.sm = [s.sm_mhz for s in held]
        self.busy = [not s.reasons & _IDLE for s in held]
        self.mem = [s.mem_mhz for s in held]
        union = 0
        for s in covering:
            union |= s.reasons & _NOT_IDLE if s is after and s not in held else s.reasons
        self.fixed.update(
            sm_mhz_min=float(min(s.sm_mhz for s in covering)),
            sm_mhz_max=float(max(s.sm_mhz for s in covering)),
            sm_mhz_start=float(first.sm_mhz),
            sm_mhz_end=float(last.sm_mhz),
            power_w_max=max(power_of(s) for s in covering),
            temp_c_start=first.temp_c,
            temp_c_end=last.temp_c,
            temp_c_max=max(s.temp_c for s in covering),
            reasons=union,
            reasons_start=first.reasons,
            reasons_end=last.reasons,
        )
        if lock_range is not None:
            busy = [s for s in held if not s.reasons & _IDLE]
            if busy:
                self.fixed["lock_held"] = all(
                    lock_holds(s.sm_mhz, lock_range, lock_tolerance_mhz) for s in busy
                )

    def values(self, t0: float, t1: float) -> dict[str, Any]:
        """The Window's values from the samples over [t0, t1]: time-weighted means and the
        time under each reason bit, each sample holding until the next."""
        if not self.held:
            return dict(self.fixed)
        if len(self.held) == 1:  # a rep between two ticks: the sample in force holds all along
            w = 1.0 if t1 <= t0 else t1 - t0  # as _hold_weights and _weighted compute it
            return {
                **self.fixed,
                "sm_mhz_mean": (self.sm[0] * w) / w,
                "sm_mhz_busy_mean": (self.sm[0] * w) / w if self.busy[0] else None,
                "mem_mhz_mean": (self.mem[0] * w) / w,
                "reason_sampled_s": {name: 0.0 + w for name in self.names[0]},
            }
        weights = _hold_weights(self.held, t0, t1)
        bits_s: dict[str, float] = {}
        for names, w in zip(self.names, weights, strict=True):
            for name in names:
                bits_s[name] = bits_s.get(name, 0.0) + w
        busy_w = [w if b else 0.0 for w, b in zip(weights, self.busy, strict=True)]
        return {
            **self.fixed,
            "sm_mhz_mean": _weighted(self.sm, weights),
            "sm_mhz_busy_mean": _weighted(self.sm, busy_w) if any(busy_w) else None,
            "mem_mhz_mean": _weighted(self.mem, weights),
            "reason_sampled_s": bits_s,
        }


def _names(mask: int) -> tuple[str, ...]:
    names = _NAMES.get(mask)
    if names is None:
        names = _NAMES[int(mask)] = tuple(reason_names(mask))
    return names


def power_of(s: Sample) -> float:
    # the instantaneous power where the GPU gives it: power_w is a 1 s average on Ampere+
    return s.power_instant_w if s.power_instant_w is not None else s.power_w


def _hold_weights(held: Sequence[Sample], t0: float, t1: float) -> list[float]:
    """Seconds of [t0, t1] over which each held sample is the value in force."""
    if t1 <= t0:
        return [0.0] * (len(held) - 1) + [1.0]  # an instant: the value in force
    weights = []
    for k, s in enumerate(held):
        start = t0 if k == 0 else max(t0, s.t)
        end = held[k + 1].t if k + 1 < len(held) else t1
        weights.append(max(0.0, min(end, t1) - start))
    if not any(weights):
        weights[-1] = 1.0
    return weights


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


__all__ = ["Held", "power_of"]
