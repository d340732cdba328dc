"""Findings about the number itself, from the kept reps' times: a median whose CI fell short
of its target (`weak_ci`) and reps spread wide (`spread`).

They are judged after the policy, over the reps it kept (they name those reps, and never
make a rep "affected": re-running or dropping one rep does not narrow a CI). They are info:
they say how far the number can move (the median's CI), not that something moved it, and a
warning means "this number moved" (on an H200, 12 of 30 default measurements of tiny
kernels carried a weak_ci or spread warning whose number moved less than its CI cold vs
hot: benchmarks/warnings_moved.py). Where the CI is wider than `VerdictConfig.effect_rel`
(0.5%) and than its target, the sentence says the number can move that much and what buys
a narrower one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv import stats
from gpuenv.errors import ConfigError
from gpuenv.verdict.records import Finding, Severity, VerdictConfig


@dataclass(frozen=True)
class CiTarget:
    """What a measurement's stopping rule aimed for (gpuenv.bench's `StopRule`): the
    median's CI within `rel_ci` (0: a fixed count or time, no target), and why it stopped
    ("converged", "budget", "max_reps")."""

    rel_ci: float
    stop: str
    min_reps: int = 1
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.rel_ci < 0 or self.min_reps < 1 or not 0.0 < self.confidence < 1.0:
            raise ConfigError(
                f"a CI target needs rel_ci >= 0, min_reps >= 1 and a confidence in (0, 1) "
                f"(got {self.rel_ci}, {self.min_reps}, {self.confidence})"
            )

    @classmethod
    def of(cls, rule: stats.StopRule, stop: str) -> CiTarget:
        """The target of a stopping rule that stopped for `stop`."""
        return cls(rule.rel_ci, stop, rule.min_reps, rule.confidence)


def number_findings(
    times_s: Sequence[float],
    kept: Sequence[int],
    config: VerdictConfig,
    target: CiTarget | None = None,
    gpu: int | None = None,
) -> list[Finding]:
    """weak_ci and spread over the reps `kept` of `times_s`, for a measurement with a CI
    `target` (gpuenv.bench's stopping rule; none for a fixed count or time, whose reps are
    judged as every door's are: other doors report their own statistics)."""
    values = [times_s[i] for i in kept]
    if target is None or target.rel_ci <= 0 or len(values) < 2:
        return []
    summary = stats.summarize(values, target.confidence)
    reps = tuple(kept)
    wide = summary.rel_ci > config.effect_rel  # the number can move by more than 0.5%
    out: list[Finding] = []
    details = {"rel_ci": summary.rel_ci, "rel_iqr": summary.rel_iqr, "n": summary.n}
    if summary.high_spread:
        out.append(
            Finding(
                "spread",
                "info",
                reps,
                f"high spread: the IQR is {summary.rel_iqr:.1%} of the median "
                f"(over {stats.HIGH_SPREAD_REL_IQR:.0%}); "
                + (
                    f"the median's CI is +-{summary.rel_ci:.2%}: the number can move that much"
                    if wide
                    else f"the median's CI of +-{summary.rel_ci:.2%} holds it: the number "
                    "measured shows no effect"
                ),
                gpu,
                dict(details),
            )
        )
    if target.stop != "converged":
        out.append(_weak_ci(summary, target, wide, reps, gpu, details, config.effect_rel))
    return out


def _weak_ci(
    summary: stats.Summary,
    target: CiTarget,
    wide: bool,
    reps: tuple[int, ...],
    gpu: int | None,
    details: dict[str, float | int],
    floor: float,
) -> Finding:
    short = summary.rel_ci > target.rel_ci
    severity: Severity = "info"
    if short:
        text = (
            f"the median's CI is +-{summary.rel_ci:.2%}, not within the "
            f"{target.rel_ci:.2%} target ({target.stop})"
        )
    else:
        text = (
            f"only {summary.n} reps before the {target.stop} ran out (min_reps is "
            f"{target.min_reps}): the CI of +-{summary.rel_ci:.2%} rests on few reps"
        )
    text += (
        ": the number can move that much; give it a longer budget_s or more max_reps"
        if short and wide
        else f"; a CI within {floor:.1%}: the number measured shows no effect"
    )
    return Finding(
        "weak_ci",
        severity,
        reps,
        text,
        gpu,
        {**details, "rel_ci_target": target.rel_ci, "stop": target.stop},
    )


__all__ = ["CiTarget", "number_findings"]
