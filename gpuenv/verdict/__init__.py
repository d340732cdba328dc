"""Findings: what in the telemetry makes a measurement less than trustworthy.

`assess()` turns per-rep Windows (and the rep times) into Findings. What a
policy makes of them, and the Measurement, are gpuenv.judge's: every door to a
measurement calls `gpuenv.judge.judge()`, which calls `assess()`.

The findings come in families, a module each:
    records.py     Finding, its kinds and severities, VerdictConfig, GpuFacts
    reps.py        the reps over time: warmup_ramp, drift, bimodal, clock_drift, tiny_kernel
    slowdown.py    the driver or board cut the clock: power_cap, thermal, power_brake,
                   hw_slowdown
    state.py       the GPU not as assumed, or not seen: lock_not_held, other_process,
                   telemetry_gap
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuenv.errors import ConfigError
from gpuenv.telemetry import Window
from gpuenv.verdict.records import (
    DEFAULT_CONFIG,
    KINDS,
    POLICIES,
    SEVERITIES,
    VERDICTS,
    Finding,
    FindingKind,
    GpuFacts,
    MeasurementRejected,
    Policy,
    Severity,
    Verdict,
    VerdictConfig,
    severity_rank,
)
from gpuenv.verdict.reps import clock_drift, levels_moved, tiny_call, warmup_ramp
from gpuenv.verdict.slowdown import cap_time_s, hw_slowdown, power_cap, thermal
from gpuenv.verdict.state import lock_not_held, other_process, telemetry_gap


def assess(
    windows: Sequence[Window],
    times_s: Sequence[float] | None = None,
    *,
    config: VerdictConfig = DEFAULT_CONFIG,
    facts: dict[int, GpuFacts] | None = None,
) -> list[Finding]:
    """Findings for one measurement.

    `windows` are per rep, rep-major when several GPUs are sampled (rep 0 GPU a,
    rep 0 GPU b, rep 1 GPU a, ...). `times_s` (one per rep) enables the trend
    test for warmup. `facts` gives each GPU's maximum clock, slowdown
    temperature and lock range.
    """
    facts = facts or {}
    gpus = list(dict.fromkeys(w.gpu for w in windows))
    if not gpus:  # no telemetry: what the rep times alone say
        return levels_moved(None, times_s, config) if times_s is not None else []
    if len(windows) % len(gpus):
        raise ConfigError(
            f"{len(windows)} windows do not split evenly over GPUs {gpus}",
            hint="pass one window per rep and GPU, rep-major",
        )
    n_reps = len(windows) // len(gpus)
    if times_s is not None and len(times_s) != n_reps:
        raise ConfigError(f"{len(times_s)} rep times for {n_reps} reps of windows")
    findings: list[Finding] = []
    for g in gpus:
        per_rep = [w for w in windows if w.gpu == g]
        f = facts.get(g, GpuFacts())
        findings += telemetry_gap(g, per_rep)
        findings += warmup_ramp(g, per_rep, times_s if g == gpus[0] else None, f, config)
        findings += power_cap(g, per_rep, f, config, times_s if g == gpus[0] else None)
        findings += thermal(g, per_rep, f, config)
        findings += hw_slowdown(g, per_rep)
        findings += lock_not_held(g, per_rep, f, config)
        findings += other_process(g, per_rep)
        findings += clock_drift(g, per_rep, config)
    if times_s is not None:
        findings += levels_moved(gpus[0], times_s, config)
    return findings


__all__ = [
    "DEFAULT_CONFIG",
    "KINDS",
    "POLICIES",
    "SEVERITIES",
    "VERDICTS",
    "Finding",
    "FindingKind",
    "GpuFacts",
    "MeasurementRejected",
    "Policy",
    "Severity",
    "Verdict",
    "VerdictConfig",
    "assess",
    "cap_time_s",
    "severity_rank",
    "tiny_call",
]
