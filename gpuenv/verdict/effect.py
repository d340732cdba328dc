"""A finding's severity follows its measured effect on the number: one rule, for every door.

The number a measurement returns is the median of its reps. A finding about the GPU's state
(the power cap, a cold start, heat, a clock that moved, a lock that did not hold, another
process) names the reps it touched; it is a warning only where the number shows it:

- the number (the median of all the reps) reads further from the median of the reps the
  finding does not name than the margin: the CI of those others' median, at least
  `VerdictConfig.effect_rel` (0.5%); or
- the state probe's reference shows the state moved the number: fn's reps just before the
  measurement, in the state it ran in, against its time on a GPU found ready
  (`StateProbe.moved`, gpuenv.timing.stateprobe), by more than the same margin.

The named reps may read slower than the others while the number holds: a median does not
follow a minority of slow reps (on an H200, a hot 8192^3 matmul's capped reps read slower
by more than the margin, its number 0.00% from the kernel's typical one). Such a finding is
info, and its sentence says both: how far the named reps read, and that the number held.
Where the named reps read as the others did, it is info and says the number measured shows
no effect.

Where no rep stands outside the finding (one rep, or every rep named) and no probe ran, the
time cannot weigh it; its clock can: a kernel's time grows at most as its SM clock falls,
so a power_cap whose clock's deficit under the maximum (`max_sm_mhz / sm_mhz_mean - 1`) is
within the margin (here the CI of all the reps' median, at least 0.5%) moved the number no
more than that, and is info. Otherwise the finding keeps the severity its own evidence
gives it (the clock below its maximum, outside the lock, cut by heat; a region that began
idle), with `details["effect_measured"] == False`.

Findings about the number itself (drift, bimodal: the rep times moved by `level_rel`;
weak_ci, spread) or about evidence missing (telemetry_gap), and errors (the hardware cut
the clock), are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv import stats
from gpuenv.verdict.records import Finding, FindingKind, VerdictConfig, reps_text

# the kinds whose warning says "the GPU's state moved your number": weighed against the reps
WEIGHED: frozenset[FindingKind] = frozenset(
    {"warmup_ramp", "power_cap", "thermal", "clock_drift", "lock_not_held", "other_process"}
)


def margin(times_s: Sequence[float], config: VerdictConfig) -> float:
    """How far, relative, the number must read from a baseline to have moved: the CI of
    the baseline's median (at `config.confidence`), at least `config.effect_rel`. The reps
    passed are the baseline's (the others'): the named reps' own move must not widen the
    yardstick."""
    if len(times_s) < 2:
        return config.effect_rel
    ci = stats.summarize(times_s, config.confidence).rel_ci
    return max(config.effect_rel, ci)


def _split(reps: Sequence[int], times_s: Sequence[float]) -> tuple[list[float], list[float]]:
    named = set(reps)
    inside = [t for i, t in enumerate(times_s) if i in named]
    others = [t for i, t in enumerate(times_s) if i not in named]
    return inside, others


def _against_others(reps: Sequence[int], times_s: Sequence[float], whole: bool) -> float | None:
    """The named reps' median (`whole`: every rep's, the number) against the median of the
    reps not named, relative; None where there are no others or that median is not positive."""
    inside, others = _split(reps, times_s)
    if not inside or not others:
        return None
    base = stats.median(others)
    return stats.median(times_s if whole else inside) / base - 1 if base > 0 else None


def reps_effect(reps: Sequence[int], times_s: Sequence[float]) -> float | None:
    """The named reps' median time against the other reps', relative (0.03: 3% slower); None
    where there are no others (one rep, or every rep named) or a median is not positive."""
    return _against_others(reps, times_s, whole=False)


def number_effect(reps: Sequence[int], times_s: Sequence[float]) -> float | None:
    """The number the measurement returns (the median of all its reps) against the median of
    the reps not named, relative (0.03: the number reads 3% slower for the named reps); None
    where there are no others (one rep, or every rep named) or a median is not positive."""
    return _against_others(reps, times_s, whole=True)


def clock_bound(f: Finding) -> float | None:
    """How far, relative, the finding's own clock says the number can have moved, where no
    rep outside it is there to compare with: a kernel's time grows at most as its SM clock
    falls, so the capped reps' clock (power_cap's `sm_mhz_mean`) under the GPU's maximum
    bounds it (`max / mean - 1`). None: the finding gives no such bound."""
    if f.kind != "power_cap":
        return None
    mean, top = f.details.get("sm_mhz_mean"), f.details.get("max_sm_mhz")
    if not mean or not top or mean <= 0:
        return None
    return max(0.0, float(top) / float(mean) - 1)


def weigh(
    findings: Sequence[Finding],
    times_s: Sequence[float],
    config: VerdictConfig,
    *,
    probe_moved: float | None = None,
) -> list[Finding]:
    """`findings` with each state finding's severity set by its measured effect on the
    number (the module docstring), the effect in its details and its sentence.
    `probe_moved`: the state probe's reps against its reference, relative (None: no probe)."""
    if not times_s:
        return list(findings)
    return [
        _weigh_one(f, times_s, config, probe_moved) if f.kind in WEIGHED else f for f in findings
    ]


@dataclass(frozen=True)
class _Effect:
    """What a finding's weighing found: the named reps against the others (`reps_rel`), the
    number against the others' median (`number_rel`), the probe against its reference, the
    margin, and which of them moved beyond it."""

    who: str
    reps_rel: float | None
    number_rel: float | None
    probe_rel: float | None
    room: float
    floor: float

    @property
    def by_number(self) -> bool:
        return self.number_rel is not None and abs(self.number_rel) > self.room

    @property
    def by_probe(self) -> bool:
        return self.probe_rel is not None and abs(self.probe_rel) > self.room

    @property
    def reps_moved(self) -> bool:
        return self.reps_rel is not None and abs(self.reps_rel) > self.room


def _weigh_one(
    f: Finding, times_s: Sequence[float], config: VerdictConfig, probe_moved: float | None
) -> Finding:
    if f.severity == "error":
        return f
    _, others = _split(f.reps, times_s)
    reps_rel = reps_effect(f.reps, times_s)
    room = margin(others if reps_rel is not None else times_s, config)
    details = dict(f.details, effect_margin_rel=room)
    if reps_rel is None and probe_moved is None:
        return _weigh_by_clock(f, times_s, config, room, details)
    e = _Effect(
        reps_text(f.reps, len(times_s)),
        reps_rel,
        number_effect(f.reps, times_s) if reps_rel is not None else None,
        probe_moved,
        room,
        config.effect_rel,
    )
    if e.reps_rel is not None:
        details["effect_rel"] = e.reps_rel
    if e.number_rel is not None:
        details["number_moved_rel"] = e.number_rel
    if e.probe_rel is not None:
        details["probe_moved_rel"] = e.probe_rel
    moved = e.by_number or e.by_probe
    details["effect_measured"] = True
    details["moved_number"] = moved
    severity = f.severity if moved else "info"
    return dataclasses.replace(
        f, severity=severity, message=f"{f.message}; {_effect_text(e)}", details=details
    )


def _weigh_by_clock(
    f: Finding,
    times_s: Sequence[float],
    config: VerdictConfig,
    room: float,
    details: dict[str, object],
) -> Finding:
    """No rep outside the finding and no probe: its clock bounds the number's move (see
    `clock_bound`); without a bound, its own evidence decides its severity."""
    details["effect_measured"] = False
    bound = clock_bound(f)
    if bound is None or f.severity == "info":
        return dataclasses.replace(f, details=details)
    details["clock_bound_rel"] = bound
    who = reps_text(f.reps, len(times_s))
    if bound > room:
        text = (
            f"{f.message}; no rep ran outside it to weigh the number against: at that clock "
            f"the number can read up to {bound:.1%} slow, more than the {room:.1%} margin"
        )
        return dataclasses.replace(f, message=text, details=details)
    details["moved_number"] = False
    text = (
        f"{f.message}; the number measured shows no effect: no rep ran outside it to weigh "
        f"against, and {who} ran at a clock that slows a kernel by at most {bound:.1%}, "
        f"within the {room:.1%} margin (the median's CI, at least {config.effect_rel:.1%})"
    )
    return dataclasses.replace(f, severity="info", message=text, details=details)


def _effect_text(e: _Effect) -> str:
    """What the number shows: the named reps against the others, the number (the median of
    all reps) against the others' median, the probe against its reference, and whether
    that is more than the margin."""
    reps = (
        f"{e.who} read {e.reps_rel:+.1%} against the other reps" if e.reps_rel is not None else ""
    )
    number = (
        f"the median of all reps read {e.number_rel:+.1%} against the other reps' median"
        if e.number_rel is not None
        else ""
    )
    probe = (
        f"a few reps in this state read {e.probe_rel:+.1%} against this function's time "
        "on a GPU found ready"
        if e.probe_rel is not None
        else ""
    )
    base = "the other reps' median" if e.reps_rel is not None else "the median"
    yardstick = f"the {e.room:.1%} margin (the CI of {base}, at least {e.floor:.1%})"
    if e.by_number or e.by_probe:
        why = " and ".join(s for s, moved in ((number, e.by_number), (probe, e.by_probe)) if moved)
        also = "; ".join(
            s for s, moved in ((number, e.by_number), (probe, e.by_probe)) if s and not moved
        )
        text = f"the number moved: {why}, more than {yardstick}"
        if reps and e.by_number:
            text += f": {reps}"
        elif reps:
            text += f"; {reps}"
        return text + (f"; {also}" if also else "")
    if e.reps_moved and e.number_rel is not None:
        held = f"{reps}, but the number held: {number}, within {yardstick}"
        return held + (f"; {probe}, within it too" if probe else "")
    said = " and ".join(s for s in (reps, probe) if s)
    return f"the number measured shows no effect: {said}, within {yardstick}"


__all__ = ["WEIGHED", "clock_bound", "margin", "number_effect", "reps_effect", "weigh"]
