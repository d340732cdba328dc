"""What a caller asks a lock for: parse and validate user input into a `LockRequest`.

    make_request("1350")                 # SM 1350 MHz
    make_request("1200,1500")            # an SM range
    make_request("base", power_limit_w=500)

Reads nothing from the GPU; `plan.plan_lock` checks the request against each GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuenv.backend import CLOCK_LIMIT_TDP
from gpuenv.errors import ConfigError

NAMED_SM = ("max", "base", "sustained")
TDP_LOCK = (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)  # the symbolic "lock to the base clock" range


@dataclass(frozen=True)
class LockRequest:
    """What a caller asks for. `sm`: MHz, (min, max) MHz, or 'max' | 'base' | 'sustained'."""

    sm: int | tuple[int, int] | str | None = None
    mem: int | tuple[int, int] | None = None
    power_limit_w: float | None = None

    def describe(self) -> str:
        parts = []
        if self.sm is not None:
            parts.append(f"SM {fmt_clock(self.sm)}")
        if self.mem is not None:
            parts.append(f"memory {fmt_clock(self.mem)}")
        if self.power_limit_w is not None:
            parts.append(f"power limit {self.power_limit_w:g} W")
        return ", ".join(parts) or "nothing"


def make_request(
    sm: int | str | tuple[int, int] | None = None,
    *,
    sm_max: int | None = None,
    mem: int | str | tuple[int, int] | None = None,
    power_limit_w: float | None = None,
) -> LockRequest:
    """Normalise user input ('1350', '1200,1500', 'base', sm_max=...) into a LockRequest."""
    sm_value = _parse_clock(sm, "--sm", named=True)
    if sm_max is not None:
        if not isinstance(sm_value, int):
            raise ConfigError(
                "--sm-max needs --sm as one number", hint="e.g. --sm 1200 --sm-max 1500"
            )
        sm_value = (sm_value, int(sm_max))
    mem_value = _parse_clock(mem, "--mem", named=False)
    if isinstance(mem_value, str):  # unreachable: named=False
        raise ConfigError(f"--mem {mem_value!r} is not a clock")
    if power_limit_w is not None and power_limit_w <= 0:
        raise ConfigError(f"power limit {power_limit_w} W must be positive")
    if sm_value is None and mem_value is None and power_limit_w is None:
        raise ConfigError("nothing to lock", hint="give an SM clock (--sm), --mem or --power-limit")
    return LockRequest(sm=sm_value, mem=mem_value, power_limit_w=power_limit_w)


def _parse_clock(value: Any, flag: str, *, named: bool) -> int | tuple[int, int] | str | None:
    if value is None or isinstance(value, tuple):
        if isinstance(value, tuple) and value[0] > value[1]:
            raise ConfigError(f"{flag} range {value[0]},{value[1]} has min above max")
        return None if value is None else (int(value[0]), int(value[1]))
    if isinstance(value, bool):
        raise ConfigError(f"{flag} {value!r} is not a clock")
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if named and text in NAMED_SM:
        return text
    try:
        if "," in text:
            lo, hi = (int(p) for p in text.split(","))
            return _parse_clock((lo, hi), flag, named=named)
        return int(text)
    except ValueError:
        names = ", or one of " + ", ".join(NAMED_SM) if named else ""
        raise ConfigError(
            f"{flag} {value!r} is not understood",
            hint=f"give a clock in MHz (1350), a range MIN,MAX (1200,1500){names}",
        ) from None


def fmt_clock(value: int | tuple[int, int] | str) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, int):
        return f"{value} MHz"
    if tuple(value) == TDP_LOCK:
        return "the base clock (TDP)"
    lo, hi = value
    return f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"
