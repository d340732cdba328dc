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
from typing import Any, Literal, get_args

from gpuenv import validate as v
from gpuenv.conditioning import ConditionConfig
from gpuenv.errors import ConfigError
from gpuenv.judge import check_policy
from gpuenv.timing.devices import MODES
from gpuenv.verdict import Policy, VerdictConfig

# what bench may be asked to measure in: a Condition, "none" (as the GPU is), or "auto"
# (bench picks: harness._choose_condition)
BenchCondition = Literal["auto", "burst", "sustained", "none"]
CONDITIONS: tuple[BenchCondition, ...] = get_args(BenchCondition)
DEFAULT_BUDGET_S = 10.0  # measuring time when no rep count is given
# Below this a call timed alone between CUDA events (mode "events", the do_bench drop-in)
# gets a tiny_kernel finding: on the lent H100 one call per event pair held 1.6-5 us of
# launch and event overhead, and a 6.4 us matmul so timed read +13% slower in one of
# three hot runs with the SM clock at its maximum (benchmarks/tiny.py --part ways).
TINY_REP_S = 20e-6
# bench()'s burst schedule (issue 22: time to the answer). Between bursts a rest as long as
# the burst (duty 0.5, the do_bench drop-in's; 0.2 rested 4x each burst), then a wait only
# while the GPU is seen held down (the drop-in's "seen", which kept cold vs hot within
# 0.01-0.8% on the H100: docs/benchmarks/dropin.md); a wait looks every 5 ms (the
# sampler reads every 25 ms), not every 50. At duty 0.5 and 25 ms bursts the power the cap
# controller filters (~0.15 s) stays near the mean of load and rest: far under the cap.
# The burst (25 ms) is a starting bound set on the H100 (cap onset 100-300 ms; the H200's
# 127-178 ms), every other threshold relative to the GPU's own facts (ConditionConfig).
BENCH_CONDITIONING = ConditionConfig(burst_wait="seen", burst_duty=0.5, poll_s=0.005)


@dataclass(frozen=True)
class BenchConfig:
    """Settings of one `bench()` call.

    Reps continue until the median's `confidence` CI is within `rel_ci` of it, or
    `budget_s` of measuring (default 10 s; unlimited when `reps` fixes the count)
    or `max_reps` run out; `reps=N` takes exactly N. `warmup="auto"` runs reps
    until their times and clocks stop trending (at most `warmup_max_s`); an int
    runs that many. `mode`: "auto" (default: the device time of each call's
    kernels, copies and memsets from CUPTI, one method at every size; CUDA events
    where another profiler of the process holds CUPTI; `m.extra["method"]` says which),
    "events" (CUDA events around one call per rep), "graph" (a CUDA graph of
    `calls_per_rep` calls), "profiler" (CUPTI, as "auto" but never falling back).
    `flush_l2`: the L2 state a call starts in, `m.extra["l2"]`: flushed before each
    call (default: what the call costs when its inputs come from memory, as triton's
    do_bench and NVBench's cold measurement) or warm (False: back to back, its inputs
    left in L2 by the call before).
    `condition`: "auto" (default: "none" when gpuenv's clock lock
    holds on the GPU, else the session's mode, else "burst"), "burst", "sustained"
    (precondition to equilibrium, then reps of fn back to back) or "none" (measure
    in whatever state the GPU is in). `conditioning` holds their thresholds
    (default `BENCH_CONDITIONING`).
    `burst_from_start`: the first burst starts with bench (its warmup included), so
    the GPU is checked cool and uncapped on the samples taken since bench began
    instead of one driver refresh after the warmup: for short, budgeted warmups (the
    do_bench drop-in); a warmup longer than a burst could itself cap the GPU. bench does
    so anyway when the warmup took less than a burst and `conditioning.burst_wait` is
    "seen" (the default; `m.first_burst.from_start`).
    `budget_in_bursts`: `budget_s` counts the time measured inside bursts, not the
    rests between them (the drop-in: triton's `rep` ms are ms of reps). `burst_lead_s`:
    work fn did just before bench (the drop-in's first call and estimate): the first
    burst began that much earlier, and the samples since count in its check for a ready
    GPU (a short call waits for no two taken after bench opened). Where the first burst
    begins with the call, that check may judge the sample read just before the call as
    the older of its two (within `telemetry.EDGE_MIN_INTERVAL_S`), the newest always one
    taken since. `rested_since`: where the first burst begins with the call (as above),
    the time on the GPU's clock at which its last work before the call ended (gpuenv.rank:
    its previous call's last rep). The check for a ready GPU then counts the samples since
    that time, the rest included, not only those taken after the call began. The two
    newest samples must still show the GPU not held down.
    `policy`: "annotate" | "reject" | "retry" (default: the session's, else annotate).
    `wait_power`: outside a session, the energy and power of the reps at the end and of
    the whole call come from the driver's power sample after the last rep (the call
    waits for it after its clock probe and judging, at most 45 ms after the rep ends:
    `telemetry.sampler.POWER_WAIT_S`); False waits for nothing, and that energy is
    marked an estimate where the sample is not out (the do_bench drop-in and
    gpuenv.rank's calls, each a few ms of reps, whose time is what they are for).
    `wait_counters`: the judging waits (at most `telemetry.EDGE_WAIT_S`) for a read of the
    reason counters after the last rep. A sampler process reads them at most every
    `telemetry.EDGE_MIN_INTERVAL_S` (20 ms), so a short call's end read waits for the read
    at its reps' start (most of a gpuenv.rank call's judging on an H200). False judges with
    the reads already in: past the last one a counter is extrapolated only while the cheap
    samples show its reason (`telemetry.counters`). gpuenv.rank's calls, whose times are
    what they are for, wait for none.
    """

    mode: str = "auto"
    reps: int | None = None
    budget_s: float | None = None
    # +-1% let the median move 0.5-3% run to run on the H100, +-0.5% up to 1.2% on 4 of 8
    # kernels, +-0.25% 0.12-0.62% but for one kernel whose calls differ (issue 22)
    rel_ci: float = 0.0025
    min_reps: int = 10
    max_reps: int = 10_000
    confidence: float = 0.95
    warmup: str | int = "auto"
    warmup_max_s: float = 5.0
    warmup_max_reps: int = 1000
    flush_l2: bool = True
    saturate: bool = True
    calls_per_rep: int | str = "auto"
    condition: BenchCondition | None = None  # None = "auto"
    conditioning: ConditionConfig = field(default_factory=lambda: BENCH_CONDITIONING)
    burst_from_start: bool = False
    budget_in_bursts: bool = False
    burst_lead_s: float = 0.0
    rested_since: float | None = None
    policy: Policy | None = None
    verdict_config: VerdictConfig | None = None
    probe_clock: bool = True
    keep_trace: bool = True
    wait_power: bool = True
    wait_counters: bool = True

    def __post_init__(self) -> None:
        """Every field judged here (gpuenv.validate), with its name: a bad value is refused
        before anything runs, never taken as a strange setting (budget_s=nan, rel_ci=2)."""
        if self.mode not in ("auto", *MODES):
            raise ConfigError(
                f"unknown timing mode {self.mode!r}", hint=f"use one of auto, {', '.join(MODES)}"
            )
        if self.reps is not None:
            self._set("reps", v.integer(self.reps, "reps", lo=1))
        if self.budget_s is not None:
            v.number(
                self.budget_s,
                "budget_s",
                lo=0,
                lo_open=True,
                unit="seconds",
                hint="None (the default) measures for 10 s, or until reps= is done",
            )
        v.number(
            self.rel_ci,
            "rel_ci",
            lo=0,
            hi=1,
            lo_open=True,
            hi_open=True,
            hint="a fraction of the median: 0.01 stops at +-1%",
        )
        self._set("min_reps", v.integer(self.min_reps, "min_reps", lo=1))
        self._set("max_reps", v.integer(self.max_reps, "max_reps", lo=1))
        v.ordered("min_reps", self.min_reps, "max_reps", self.max_reps)
        v.number(self.confidence, "confidence", lo=0, hi=1, lo_open=True, hi_open=True)
        if self.warmup != "auto":
            self._set(
                "warmup",
                v.integer(
                    self.warmup, "warmup", lo=0, hint="'auto' (the default) or a number of reps"
                ),
            )
        v.number(self.warmup_max_s, "warmup_max_s", lo=0, unit="seconds")
        self._set("warmup_max_reps", v.integer(self.warmup_max_reps, "warmup_max_reps", lo=0))
        self._check_switches()
        if self.calls_per_rep != "auto":
            self._set(
                "calls_per_rep",
                v.integer(
                    self.calls_per_rep,
                    "calls_per_rep",
                    lo=1,
                    hint="'auto' (the default) or a count >= 1",
                ),
            )
        if self.condition is not None and self.condition not in CONDITIONS:
            raise ConfigError(
                f"unknown condition {self.condition!r}",
                hint="use 'auto' (the default), 'burst', 'sustained' or 'none'",
            )
        v.instance(
            self.conditioning,
            "conditioning",
            ConditionConfig,
            "a gpuenv.conditioning.ConditionConfig",
        )
        if self.verdict_config is not None:
            v.instance(
                self.verdict_config,
                "verdict_config",
                VerdictConfig,
                "a gpuenv.VerdictConfig (or None)",
            )
        if self.policy is not None:
            check_policy(self.policy)

    def _check_switches(self) -> None:
        """The on/off fields, and the rest's start (a time, or None)."""
        for flag in (
            "flush_l2",
            "saturate",
            "burst_from_start",
            "probe_clock",
            "keep_trace",
            "wait_power",
            "wait_counters",
        ):
            v.boolean(getattr(self, flag), flag)
        if self.rested_since is not None:
            v.number(self.rested_since, "rested_since", unit="seconds on the GPU's clock")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: the normalised value (2.0 -> 2)

    @classmethod
    def of(cls, config: BenchConfig | None, settings: dict[str, Any]) -> BenchConfig:
        """`config` with `settings` (keywords of bench()) laid over it.

        Two short forms reach into `conditioning`: `burst_s` (GPU time per burst) and
        `precondition_max_s` (the longest sustained precondition).
        """
        if config is not None:
            v.instance(config, "config", cls, "a gpuenv.timing.BenchConfig (or None)")
        base = config or cls()
        cond = settings.get("conditioning", base.conditioning)
        if "burst_s" in settings:
            burst_s = v.number(settings.pop("burst_s"), "burst_s", lo=0, lo_open=True)
            cond = dataclasses.replace(cond, burst_s=burst_s)
        if "precondition_max_s" in settings:
            cond = dataclasses.replace(
                cond,
                sustained_timeout_s=v.number(
                    settings.pop("precondition_max_s"), "precondition_max_s", lo=0
                ),
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


__all__ = [
    "BENCH_CONDITIONING",
    "CONDITIONS",
    "DEFAULT_BUDGET_S",
    "TINY_REP_S",
    "BenchConfig",
]
