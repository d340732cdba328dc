"""What every family of findings shares: the `Finding` record and its vocabulary, the
thresholds (`VerdictConfig`), what the findings compare against (`GpuFacts`), and the
words for the reps a finding touched (`reps_text`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gpuenv._records import JsonRecord
from gpuenv.clocks.status import LOCK_TOLERANCE_MHZ
from gpuenv.errors import ConfigError
from gpuenv.errors import MeasurementRejected as MeasurementRejected  # defined in gpuenv.errors

# The vocabularies are types (mypy refuses a kind or severity not listed here) and, as
# the tuples below, the values checked at the door. In a results file they are plain
# strings: a file keeps loading whatever kinds it holds.
Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
FindingKind = Literal[
    "warmup_ramp",
    "power_cap",
    "thermal",
    "hw_slowdown",
    "power_brake",
    "lock_not_held",
    "other_process",
    "clock_drift",
    "drift",  # the rep times moved (trend, step) or split in two ("bimodal")
    "bimodal",
    "tiny_kernel",
    "telemetry_gap",
    "command_failed",  # gpuenv run: the wrapped command exited non-zero or was killed
    "weak_ci",  # the median's CI short of its target (gpuenv.bench's stopping rule)
    "spread",  # the reps' times spread wide (IQR over 5% of the median)
]
KINDS: tuple[FindingKind, ...] = get_args(FindingKind)
# what a measurement's findings make of it, under which policy
Verdict = Literal["ok", "annotated", "rejected"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
Policy = Literal["annotate", "reject", "retry"]
POLICIES: tuple[Policy, ...] = get_args(Policy)


@dataclass(frozen=True)
class Finding(JsonRecord):
    """One thing the telemetry says about a measurement.

    `reps` are the indices of the repetitions it touched (all of them for a
    single region: (0,)). `details` holds the numbers behind the sentence
    (e.g. {"time_under_cap_s": 0.8, "clock_cost_mhz": 540}).
    """

    kind: FindingKind
    severity: Severity
    reps: tuple[int, ...]
    message: str
    gpu: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"


@dataclass(frozen=True)
class VerdictConfig:
    """Every threshold the findings use. The defaults were set on an H100 and checked on
    an H200, as measured read-only (docs/explanation/what-gpus-do.md); each clock
    threshold is a fraction of the GPU's own maximum and each temperature one a margin
    under the GPU's own thresholds (`GpuFacts`, read from it), so no H100 figure decides a
    finding on another model.

    Each threshold belongs to one finding (named first) or to the policies.

    Attributes:
        idle_clock_fraction: warmup_ramp: a region that starts with the SM clock below
            this fraction of the maximum (or with the GpuIdle reason), and whose clock
            then rises (or whose GpuIdle reason clears, or where this process holds a
            context), started cold; a GPU idle throughout, without our context, was
            not in use.
        ramp_rel: warmup_ramp: leading reps slower than the settled median (that of the
            last half of the reps) by more than this fraction, and by more than
            `ramp_mad_k` median absolute deviations, are still warming up.
        ramp_mad_k: warmup_ramp: see `ramp_rel`.
        ramp_min_reps: warmup_ramp: fewer reps than this: no trend test (only the
            start state).
        power_cap_min_fraction: power_cap: time under the power cap below this
            fraction of a region is not reported (one counter tick of noise).
        power_cap_moved_rel: power_cap: even with `stable_clocks`, the cap is a
            warning only where it moved the number: the capped reps' SM clock (while
            busy) averaged this fraction or more below the GPU's own maximum (one 15 MHz
            step is 0.76% of an H100's or H200's 1980 MHz, 1.06% of an A100's 1410), or
            their median time was this much over the other reps'. The cap's bit lingers
            after heavy load with the clock already back at its maximum (~0.5 s on an
            H100).
        stable_clocks: power_cap, clock_drift: True treats power capping and clock
            drift as problems (severity warning: the reject and retry policies act on
            them). False (the default unless a lock is asked for): capping at the
            default power limit is normal for heavy kernels, reported as info.
        thermal_margin_c: thermal: a temperature within this of the GPU's max
            operating temperature (else its slowdown threshold) is reported (info)
            before the GPU slows down.
        lock_tolerance_mhz: lock_not_held: how far outside the locked range the SM
            clock may read.
        clock_drift_rel: clock_drift: reps whose mean SM clock differs from the median
            rep's by more than this fraction have drifted.
        level_rel: drift, bimodal: rep times that drift, step or split in two modes
            further apart than this (`gpuenv.stats.levels`) get a warning naming both
            levels (warmup's head left out).
        effect_rel: every state finding (gpuenv.verdict.effect): a warning only where the
            number (the median of all reps) reads further than this, relative, from the
            median of the reps the finding does not name (or the state probe's reps from
            fn's time on a ready GPU), and further than that median's CI; otherwise info,
            saying the number held (or showed no effect).
        confidence: effect_rel, spread, weak_ci: the confidence of the median's CI.
        reject_severity: findings at or above this severity make their reps
            "affected": dropped by reject, re-run by retry.
        min_reps: reject and retry raise `MeasurementRejected` when fewer repetitions
            than this remain (single regions are never raised on: their verdict says
            "rejected").
        retry_delay_s: retry waits this long before its first round.
        retry_backoff: ... then that times this each further round ...
        retry_max_delay_s: ... at most this long ...
        max_retries: ... for at most this many rounds; reps still affected afterwards
            are rejected.

    Raises:
        ConfigError: a threshold out of range, or an unknown severity.
    """

    idle_clock_fraction: float = 0.5
    ramp_rel: float = 0.05
    ramp_mad_k: float = 5.0
    ramp_min_reps: int = 5
    power_cap_min_fraction: float = 0.01
    power_cap_moved_rel: float = 0.005
    stable_clocks: bool = False
    thermal_margin_c: float = 5.0
    lock_tolerance_mhz: float = LOCK_TOLERANCE_MHZ
    clock_drift_rel: float = 0.02
    level_rel: float = 0.02
    effect_rel: float = 0.005
    confidence: float = 0.95
    reject_severity: Severity = "warning"
    min_reps: int = 3
    retry_delay_s: float = 1.0
    retry_backoff: float = 2.0
    retry_max_delay_s: float = 30.0
    max_retries: int = 3

    def __post_init__(self) -> None:
        if self.reject_severity not in SEVERITIES:
            raise ConfigError(
                f"reject_severity {self.reject_severity!r} is not a severity",
                hint=f"use one of {', '.join(SEVERITIES)}",
            )
        for name in (
            "ramp_rel",
            "clock_drift_rel",
            "level_rel",
            "power_cap_min_fraction",
            "power_cap_moved_rel",
            "effect_rel",
            "retry_delay_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative (got {getattr(self, name)})")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"confidence must be between 0 and 1 (got {self.confidence})")
        if self.min_reps < 1 or self.max_retries < 0:
            raise ConfigError("min_reps must be at least 1 and max_retries not negative")


DEFAULT_CONFIG = VerdictConfig()


def severity_rank(severity: Severity) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class GpuFacts:
    """What the findings compare against, per GPU (read once per session)."""

    max_sm_mhz: float | None = None
    slowdown_c: float | None = None
    gpu_max_c: float | None = None  # max operating temperature: SW thermal slowdown begins
    power_limit_w: float | None = None
    lock_range_mhz: tuple[int, int] | None = None


def reps_text(reps: Sequence[int], n: int) -> str:
    """The reps a finding touched, in words: "the region", "all 10 reps", "reps 0-3, 7"."""
    if n == 1:
        return "the region"
    if len(reps) == n:
        return f"all {n} reps"
    spans: list[str] = []
    start = prev = reps[0]
    for r in [*reps[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rep " if len(reps) == 1 else "reps ") + ", ".join(spans)
