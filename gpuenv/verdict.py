"""Findings: what in the telemetry makes a measurement less than trustworthy.

`assess()` turns per-rep Windows (and the rep times) into Findings;
`apply_policy()` turns findings into a verdict: annotate (keep everything,
attach findings; the default), reject (drop affected reps), retry (re-run the
affected reps after a recovery delay; the caller runs them, see `retry_delays`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv._records import from_dict, to_dict

POLICIES = ("annotate", "reject", "retry")
SEVERITIES = ("info", "warning", "error")
KINDS = (
    "warmup_ramp",
    "power_cap",
    "thermal",
    "hw_slowdown",
    "power_brake",
    "lock_not_held",
    "other_process",
    "clock_drift",
    "telemetry_gap",
)


@dataclass(frozen=True)
class Finding:
    """One thing the telemetry says about a measurement.

    `reps` are the indices of the repetitions it touched (all of them for a
    single region: (0,)). `details` holds the numbers behind the sentence
    (e.g. {"time_under_cap_s": 0.8, "clock_cost_mhz": 540}).
    """

    kind: str  # one of KINDS
    severity: str  # "info" | "warning" | "error"
    reps: tuple[int, ...]
    message: str
    gpu: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return from_dict(cls, data)
