"""What a caller asks a lock for: parse and validate user input into a `LockRequest`.

    make_request("1350")                 # SM 1350 MHz
    make_request("1200,1500")            # an SM range
    make_request("base", power_limit_w=500)

Reads nothing from the GPU; `plan.plan_lock` checks the request against each GPU.

One `LockRequest` travels from every door (`gpuenv.lock(sm=...)`, `gpuenv lock --sm`,
`gpuenv run --sm`, `stable(sm=)`) through `gpuenv.locking` and gpuenvd's protocol to the
code that applies it (`plan.plan_lock`, `restoring.apply_state`). A door that takes
keywords turns them into a request once (`requested`); gpuenvd's wire carries the request
as `to_wire` writes it and `from_wire` reads it back. A new lockable setting is a field
here (with its keyword in `LockSettings` and its check in `make_request`) and a step in
the code that applies it: nothing in between names it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypedDict

from gpuenv import validate
from gpuenv.backend import CLOCK_LIMIT_TDP
from gpuenv.errors import ConfigError

NAMED_SM = ("max", "base", "sustained")
TDP_LOCK = (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)  # the symbolic "lock to the base clock" range


class LockSettings(TypedDict, total=False):
    """The keywords a door takes for a lock (`gpuenv.lock(sm=1350, power_limit_w=500)`),
    turned into a `LockRequest` by `make_request`. `sm_max` is the top of an SM range whose
    bottom is `sm`."""

    sm: int | str | tuple[int, int] | None
    sm_max: int | None
    mem: int | str | tuple[int, int] | None
    power_limit_w: float | None


@dataclass(frozen=True)
class LockRequest:
    """What a caller asks for.

    Attributes:
        sm: the SM clock: MHz, (min, max) MHz, or 'max' | 'base' | 'sustained'.
        mem: the memory clock: MHz or (min, max) MHz.
        power_limit_w: the power limit, in watts.
    """

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

    def to_wire(self) -> dict[str, Any]:
        """The request as gpuenvd's protocol carries it (the lock op's fields; unset ones left
        out): a range as [min, max]. The wire format of protocol version 1, unchanged."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> LockRequest:
        """The request a lock op carries (`to_wire`'s fields; an older client's `sm_max` too),
        judged by `make_request` like any other door's."""
        settings: dict[str, Any] = {k: v for k, v in wire.items() if v is not None}
        for name, value in settings.items():
            if isinstance(value, list):
                settings[name] = tuple(value)
        return make_request(**settings)

    @classmethod
    def wire_fields(cls) -> tuple[str, ...]:
        """Every field a lock op may carry for its request: the request's own, and `sm_max`
        (clients before the request was one object sent a range's top apart)."""
        return (*(f.name for f in fields(cls)), "sm_max")


def requested(
    request: LockRequest | None,
    sm: int | str | tuple[int, int] | None,
    settings: LockSettings,
) -> LockRequest:
    """What a door that takes a request or keywords was asked for: `request`, or the keywords
    (`sm` given by position, `settings` by name) made into one. Both at once is an error."""
    if request is not None:
        if sm is not None or any(v is not None for v in settings.values()):
            raise ConfigError(
                "give a LockRequest or lock keywords, not both",
                hint="e.g. gpuenv.lock(sm=1350) or gpuenv.lock(request=make_request(1350))",
            )
        if not isinstance(request, LockRequest):
            raise ConfigError(
                f"request {validate.shown(request)} is not a LockRequest",
                hint="make one with gpuenv.clocks.make_request(...)",
            )
        return request
    unknown = sorted(set(settings) - set(LockSettings.__annotations__))
    if unknown:  # **settings takes any name at run time: say it as Python would
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} for a lock")
    if sm is not None:
        if settings.get("sm") is not None:
            raise ConfigError("sm is given twice", hint="e.g. gpuenv.lock(sm=1350)")
        settings = {**settings, "sm": sm}
    return make_request(**settings)


# what each parameter is called where the caller wrote it: Python names by default; the
# CLI passes CLI_NAMES, so one rule speaks each door's language (gpuenv.validate)
PY_NAMES = {"sm": "sm", "sm_max": "sm_max", "mem": "mem", "power_limit_w": "power_limit_w"}
CLI_NAMES = {"sm": "--sm", "sm_max": "--sm-max", "mem": "--mem", "power_limit_w": "--power-limit"}


def cli_request(
    sm: str | None, sm_max: int | None, mem: str | None, power_limit: float | None
) -> LockRequest | None:
    """The lock a command's `--sm`, `--sm-max`, `--mem` and `--power-limit` ask for, judged
    in the flags' names; None where none was given (`gpuenv run`, `gpuenv check`: no lock)."""
    if sm is None and sm_max is None and mem is None and power_limit is None:
        return None
    return make_request(sm, sm_max=sm_max, mem=mem, power_limit_w=power_limit, names=CLI_NAMES)


def make_request(
    sm: int | str | tuple[int, int] | None = None,
    *,
    sm_max: int | None = None,
    mem: int | str | tuple[int, int] | None = None,
    power_limit_w: float | None = None,
    names: dict[str, str] | None = None,
) -> LockRequest:
    """Normalise user input ('1350', '1200,1500', 'base', sm_max=...) into a LockRequest.
    `names`: what to call each parameter in an error (CLI_NAMES from the CLI)."""
    n = names or PY_NAMES
    sm_value = _parse_clock(sm, n["sm"], named=True)
    if sm_max is not None:
        if not isinstance(sm_value, int):
            raise ConfigError(
                f"{n['sm_max']} needs {n['sm']} as one number",
                hint=f"e.g. {n['sm']} 1200 {n['sm_max']} 1500"
                if n is CLI_NAMES
                else "e.g. sm=1200, sm_max=1500",
            )
        sm_value = (sm_value, validate.integer(sm_max, n["sm_max"], lo=1))
        _parse_clock(sm_value, n["sm"], named=True)
    mem_value = _parse_clock(mem, n["mem"], named=False)
    if isinstance(mem_value, str):  # unreachable: named=False
        raise ConfigError(f"{n['mem']} {mem_value!r} is not a clock")
    if power_limit_w is not None:
        power_limit_w = validate.number(
            power_limit_w, n["power_limit_w"], lo=0, lo_open=True, unit="watts"
        )
    if sm_value is None and mem_value is None and power_limit_w is None:
        raise ConfigError(
            "nothing to lock",
            hint=f"give an SM clock ({n['sm']}), {n['mem']} or {n['power_limit_w']}",
        )
    return LockRequest(sm=sm_value, mem=mem_value, power_limit_w=power_limit_w)


def _parse_clock(value: Any, flag: str, *, named: bool) -> int | tuple[int, int] | str | None:
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ConfigError(
                f"{flag} range must be (min, max) in MHz, not {validate.shown(value)}"
            )
        lo = validate.integer(value[0], f"{flag} min", lo=1)
        hi = validate.integer(value[1], f"{flag} max", lo=1)
        if lo > hi:
            raise ConfigError(f"{flag} range {lo},{hi} has min above max")
        return (lo, hi)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"{flag} {validate.shown(value)} is not a clock",
            hint="give MHz (1350), a range (1200, 1500)"
            + (", 'max', 'base' or 'sustained'" if named else ""),
        )
    if isinstance(value, int):
        return validate.integer(value, flag, lo=1)
    text = str(value).strip().lower()
    if named and text in NAMED_SM:
        return text
    try:
        if "," in text:
            lo, hi = (int(p) for p in text.split(","))
            return _parse_clock((lo, hi), flag, named=named)
        return validate.integer(int(text), flag, lo=1)
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
