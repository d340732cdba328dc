"""What `bench()` is asked to do: one config object instead of thirty keywords.

    cfg = BenchConfig(condition="sustained", reps=50)
    m = gpuenv.bench(fn, cfg)                 # or gpuenv.bench(fn, condition=..., reps=...)

Every field has the default a user who passes nothing should get. The condition
default ("auto") is the safe one: measure as is only when gpuenv's own clock lock
holds on the GPU; otherwise burst (each burst starts from the cool, uncapped
state), so the number does not depend on what ran before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpuenv.conditioning import ConditionConfig
from gpuenv.errors import ConfigError
from gpuenv.judge import check_policy
from gpuenv.timing.devices import MODES
from gpuenv.verdict import VerdictConfig

CONDITIONS = ("auto", "burst", "sustained", "none")
DEFAULT_BUDGET_S = 10.0  # measuring time when no rep count is given
# Below this a call is timed as many calls a rep (mode "auto"). On the lent H100
# (scripts/probe_tiny.py, 2026-11-22) a 6.4 us matmul timed one call per event pair
# read +13% slower in one of three hot runs with the SM clock at its maximum, while a
# CUDA graph of calls agreed within 0.6% cold vs hot for kernels of 1.4 to 7 us.
TINY_REP_S = 20e-6
TINY_TARGET_S = 1e-3  # a tiny kernel's rep: about this much GPU time of calls


@dataclass(frozen=True)
class BenchConfig:
    """Settings of one `bench()` call.

    Reps continue until the median's `confidence` CI is within `rel_ci` of it, or
    `budget_s` of measuring (default 10 s; unlimited when `reps` fixes the count)
    or `max_reps` run out; `reps=N` takes exactly N. `warmup="auto"` runs reps
    until their times and clocks stop trending (at most `warmup_max_s`); an int
    runs that many. `mode`: "auto" (default: CUDA events per rep, and for a call
    under `TINY_REP_S` a CUDA graph of calls per rep, or calls back to back between
    the events when fn cannot be captured; `m.extra["tiny_kernel"]` says which),
    "events" (CUDA events around one call per rep), "graph" (a CUDA graph of
    `calls_per_rep` calls), "profiler" (summed device time of fn's kernels).
    `condition`: "auto" (default: "none" when gpuenv's clock lock
    holds on the GPU, else the session's mode, else "burst"), "burst", "sustained"
    (precondition to equilibrium, then reps of fn back to back) or "none" (measure
    in whatever state the GPU is in). `conditioning` holds their thresholds.
    `burst_from_start`: the first burst starts with bench (its warmup included), so
    the GPU is checked cool and uncapped on the samples taken since bench began
    instead of one driver refresh after the warmup: for short, budgeted warmups (the
    do_bench drop-in); a warmup longer than a burst could itself cap the GPU.
    `budget_in_bursts`: `budget_s` counts the time measured inside bursts, not the
    rests between them (the drop-in: triton's `rep` ms are ms of reps). `burst_lead_s`:
    work fn did just before bench (the drop-in's first call and estimate): the first
    burst began that much earlier.
    `policy`: "annotate" | "reject" | "retry" (default: the session's, else annotate).
    """

    mode: str = "auto"
    reps: int | None = None
    budget_s: float | None = None
    rel_ci: float = 0.01
    min_reps: int = 10
    max_reps: int = 10_000
    confidence: float = 0.95
    warmup: str | int = "auto"
    warmup_max_s: float = 5.0
    warmup_max_reps: int = 1000
    flush_l2: bool = True
    saturate: bool = True
    calls_per_rep: int | str = "auto"
    condition: str | None = None  # None = "auto"
    conditioning: ConditionConfig = field(default_factory=ConditionConfig)
    burst_from_start: bool = False
    budget_in_bursts: bool = False
    burst_lead_s: float = 0.0
    policy: str | None = None
    verdict_config: VerdictConfig | None = None
    probe_clock: bool = True
    keep_trace: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("auto", *MODES):
            raise ConfigError(
                f"unknown timing mode {self.mode!r}", hint=f"use one of auto, {', '.join(MODES)}"
            )
        if self.reps is not None and self.reps < 1:
            raise ConfigError(f"reps must be at least 1 (got {self.reps})")
        if self.condition is not None and self.condition not in CONDITIONS:
            raise ConfigError(
                f"unknown condition {self.condition!r}",
                hint="use 'auto' (the default), 'burst', 'sustained' or 'none'",
            )
        if self.policy is not None:
            check_policy(self.policy)

    @classmethod
    def of(cls, config: BenchConfig | None, settings: dict[str, Any]) -> BenchConfig:
        """`config` with `settings` (keywords of bench()) laid over it.

        Two short forms reach into `conditioning`: `burst_s` (GPU time per burst) and
        `precondition_max_s` (the longest sustained precondition).
        """
        base = config or cls()
        cond = settings.get("conditioning", base.conditioning)
        if "burst_s" in settings:
            cond = dataclasses.replace(cond, burst_s=float(settings.pop("burst_s")))
        if "precondition_max_s" in settings:
            cond = dataclasses.replace(
                cond, sustained_timeout_s=float(settings.pop("precondition_max_s"))
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(
                f"bench() got unknown settings: {', '.join(unknown)}",
                hint=f"settings are the fields of BenchConfig: {', '.join(sorted(known))}",
            )
        settings["conditioning"] = cond
        return dataclasses.replace(base, **settings)


__all__ = ["CONDITIONS", "DEFAULT_BUDGET_S", "TINY_REP_S", "TINY_TARGET_S", "BenchConfig"]
