"""A finding's severity follows its measured effect on the number: one rule, for every door.

A finding about the GPU's state (the power cap, a cold start, heat, a clock that moved, a
lock that did not hold, another process) is a warning only where the number shows it:

- the reps it names differ from the other reps of the measurement, in time, by more than
  the median's CI or `VerdictConfig.effect_rel` (0.5%), whichever is wider; or
- the state probe's reference shows the state moved the number: fn's reps just before the
  measurement, in the state it ran in, against its time on a GPU found ready
  (`StateProbe.moved`, gpuenv.timing.stateprobe), by more than the same margin.

Otherwise the finding is "info", and its sentence says the number measured shows no effect.
Where neither can be measured (one rep, or every rep named, and no probe ran), the finding
keeps the severity its own evidence gives it: for these kinds that evidence is the clock
itself (below its maximum, outside the lock, cut by heat).

Findings about the number itself (drift, bimodal: the rep times moved by `level_rel`;
weak_ci, spread) or about evidence missing (telemetry_gap), and errors (the hardware cut
the clock), are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuenv import stats
from gpuenv.verdict.records import Finding, FindingKind, VerdictConfig, reps_text

# the kinds whose warning says "the GPU's state moved your number": weighed against the reps
WEIGHED: frozenset[FindingKind] = frozenset(
    {"warmup_ramp", "power_cap", "thermal", "clock_drift", "lock_not_held", "other_process"}
)


def margin(times_s: Sequence[float], config: VerdictConfig) -> float:
    """How far, relative, reps must differ to have moved the number: the CI of their median
    (at `config.confidence`), at least `config.effect_rel`. The reps passed are the
    baseline's (the others'): the named reps' own move must not widen the yardstick."""
    if len(times_s) < 2:
        return config.effect_rel
    ci = stats.summarize(times_s, config.confidence).rel_ci
    return max(config.effect_rel, ci)


def reps_effect(reps: Sequence[int], times_s: Sequence[float]) -> float | None:
    """The named reps' median time against the other reps', relative (0.03: 3% slower); None
    where there are no others (one rep, or every rep named) or a median is not positive."""
    named = set(reps)
    inside = [t for i, t in enumerate(times_s) if i in named]
    others = [t for i, t in enumerate(times_s) if i not in named]
    if not inside or not others:
        return None
    base = stats.median(others)
    return stats.median(inside) / base - 1 if base > 0 else None


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


def _weigh_one(
    f: Finding, times_s: Sequence[float], config: VerdictConfig, probe_moved: float | None
) -> Finding:
    if f.severity == "error":
        return f
    effect = reps_effect(f.reps, times_s)
    named = set(f.reps)
    others = [t for i, t in enumerate(times_s) if i not in named]
    room = margin(others if effect is not None else times_s, config)
    floor = config.effect_rel
    details = dict(f.details, effect_margin_rel=room)
    if effect is not None:
        details["effect_rel"] = effect
    if probe_moved is not None:
        details["probe_moved_rel"] = probe_moved
    if effect is None and probe_moved is None:
        # nothing to weigh against: the finding's own evidence (the clock) decides
        details["effect_measured"] = False
        return dataclasses.replace(f, details=details)
    by_reps = effect is not None and abs(effect) > room
    by_probe = probe_moved is not None and abs(probe_moved) > room
    moved = by_reps or by_probe
    details["effect_measured"] = True
    details["moved_number"] = moved
    text = f.message + "; " + _effect_text(f, times_s, effect, probe_moved, room, moved, floor)
    severity = f.severity if moved else "info"
    return dataclasses.replace(f, severity=severity, message=text, details=details)


def _effect_text(
    f: Finding,
    times_s: Sequence[float],
    effect: float | None,
    probe_moved: float | None,
    room: float,
    moved: bool,
    floor: float,
) -> str:
    """What the number shows: the named reps against the others, the probe against its
    reference, and whether that is more than the margin."""
    parts = []
    who = reps_text(f.reps, len(times_s))
    if effect is not None:
        parts.append(f"{who} read {effect:+.1%} against the other reps")
    if probe_moved is not None:
        parts.append(
            f"a few reps in this state read {probe_moved:+.1%} against this function's time "
            "on a GPU found ready"
        )
    said = " and ".join(parts)
    if moved:
        return f"the number moved: {said}, more than the {room:.1%} margin"
    return (
        f"the number measured shows no effect: {said}, within the {room:.1%} margin "
        f"(the median's CI, at least {floor:.1%})"
    )


__all__ = ["WEIGHED", "margin", "reps_effect", "weigh"]
