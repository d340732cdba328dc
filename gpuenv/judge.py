"""The one judge: rep times + telemetry windows + GPU facts -> findings -> policy -> Measurement.

Every door to a measurement comes here: `gpuenv.bench` and the do_bench drop-in
(gpuenv.timing), `stable().measure/repeat/record` (gpuenv.session), the regions of
`gpuenv run` (gpuenv.run), the pytest-benchmark plugin and the torch.utils.benchmark
adapter (gpuenv.integrations). None of them assesses windows or applies a policy
itself, so the same reps and telemetry get the same findings and verdict whichever
door they came through.

    facts = read_facts(backend, gpus, lock_ranges)          # once per session
    m = judge("gemm", times, Evidence.sampled(sampler, spans, gpus), facts=facts,
              config=config, policy="retry", retry=Retry(rerun, clock, recover))

Policies (`policy=`): "annotate" keeps every rep and attaches the findings;
"reject" drops the reps that findings at or above `config.reject_severity` touch;
"retry" re-runs those reps after growing recovery delays (`retry_delays`), then
acts as reject.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuenv.backend import Backend
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.results import Measurement
from gpuenv.telemetry import Window
from gpuenv.timebase import Clock
from gpuenv.verdict import (
    DEFAULT_CONFIG,
    POLICIES,
    Finding,
    GpuFacts,
    MeasurementRejected,
    Policy,
    Verdict,
    VerdictConfig,
    assess,
    severity_rank,
)
from gpuenv.verdict.effect import weigh
from gpuenv.verdict.number import CiTarget, number_findings

# -- what the findings compare against ------------------------------------------------


def read_facts(
    backend: Backend, gpus: Sequence[int], lock_ranges: Mapping[int, tuple[int, int]] | None = None
) -> dict[int, GpuFacts]:
    """Each GPU's maximum clock, thermal thresholds, power limit and lock range: the one
    place they are read. What cannot be read stays None (a finding without it is still
    right, only less specific)."""
    facts = {}
    for g in gpus:
        max_sm = slowdown = gpu_max = limit = None
        with contextlib.suppress(GpuenvError):
            max_sm = float(backend.clock_limits(g).max_sm_mhz)
        with contextlib.suppress(GpuenvError):
            th = backend.thresholds(g)
            slowdown, gpu_max = th.slowdown_c, th.gpu_max_c
        with contextlib.suppress(GpuenvError):
            limit = backend.power_limits(g).limit_w
        facts[g] = GpuFacts(
            max_sm_mhz=max_sm,
            slowdown_c=slowdown,
            gpu_max_c=gpu_max,
            power_limit_w=limit,
            lock_range_mhz=(lock_ranges or {}).get(g),
        )
    return facts


# -- policies ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyResult:
    verdict: Verdict
    rejected_reps: tuple[int, ...] = ()
    affected_reps: tuple[int, ...] = ()


def check_policy(policy: str) -> Policy:
    """`policy` as a Policy, or a ConfigError naming the ones there are."""
    for known in POLICIES:
        if policy == known:
            return known
    raise ConfigError(f"unknown policy {policy!r}", hint=f"use one of {', '.join(POLICIES)}")


def affected_reps(findings: Sequence[Finding], config: VerdictConfig = DEFAULT_CONFIG) -> list[int]:
    """Reps touched by findings at or above `config.reject_severity`."""
    floor = severity_rank(config.reject_severity)
    return sorted({r for f in findings if severity_rank(f.severity) >= floor for r in f.reps})


def apply_policy(
    findings: Sequence[Finding],
    n_reps: int,
    policy: Policy = "annotate",
    *,
    config: VerdictConfig = DEFAULT_CONFIG,
    name: str = "measurement",
    raise_if_too_few: bool = True,
) -> PolicyResult:
    """The verdict under `policy` (retry: after its re-runs, as reject).

    annotate: everything kept; "annotated" when there are findings.
    reject/retry: affected reps are dropped; "rejected" when none (or, for several
    reps, fewer than `config.min_reps`) remain, which raises `MeasurementRejected`
    for several reps when `raise_if_too_few`.
    """
    check_policy(policy)
    affected = tuple(affected_reps(findings, config))
    if policy == "annotate":
        return PolicyResult("annotated" if findings else "ok", (), affected)
    kept = n_reps - len(affected)
    if kept <= 0 or (n_reps > 1 and kept < config.min_reps):
        if raise_if_too_few and n_reps > 1:
            kinds = sorted({f.kind for f in findings if set(f.reps) & set(affected)})
            raise MeasurementRejected(
                f"only {kept} of {n_reps} reps of {name!r} remain after rejecting those with "
                f"{', '.join(kinds)} (min_reps is {config.min_reps})",
                hint="let the GPU settle (mode='burst' or 'sustained'), lock a clock it can hold, "
                "or use policy='annotate' to keep them with their findings",
            )
        return PolicyResult("rejected", affected, affected)
    return PolicyResult("annotated" if findings else "ok", affected, affected)


def retry_delays(config: VerdictConfig = DEFAULT_CONFIG) -> list[float]:
    """Recovery delays before each retry round: retry_delay_s growing by retry_backoff, capped."""
    return [
        min(config.retry_delay_s * config.retry_backoff**k, config.retry_max_delay_s)
        for k in range(config.max_retries)
    ]


# -- the evidence: rep windows, and how to read them again after a retry ---------------


class WindowSource(Protocol):
    """Where rep windows come from: a `gpuenv.telemetry.Sampler`, or a recorded trace."""

    def windows(self, spans: Sequence[tuple[float, float]], gpu: int) -> list[Window]: ...

    def window(self, t0: float, t1: float, gpu: int) -> Window: ...


@dataclass
class Evidence:
    """The reps of one measurement and their telemetry, rep-major over `gpus`.

    Built from spans on a sampler (`sampled`), or from windows already summarised
    (`given`: `gpuenv run` merges each region's chunks as they arrive).
    """

    gpus: tuple[int, ...]
    windows: list[Window]  # rep 0 GPU a, rep 0 GPU b, rep 1 GPU a, ...
    spans: list[tuple[float, float]] = field(default_factory=list)
    source: WindowSource | None = None

    @classmethod
    def sampled(
        cls,
        source: WindowSource | None,
        spans: Sequence[tuple[float, float]],
        gpus: Sequence[int],
    ) -> Evidence:
        ev = cls(tuple(gpus), [], [(float(a), float(b)) for a, b in spans], source)
        ev.windows = ev._read(ev.spans)
        return ev

    @classmethod
    def given(cls, windows: Sequence[Window], gpus: Sequence[int]) -> Evidence:
        return cls(tuple(gpus), list(windows))

    def _read(self, spans: Sequence[tuple[float, float]]) -> list[Window]:
        if self.source is None or not spans:
            return []
        per_gpu = {g: self.source.windows(spans, g) for g in self.gpus}
        return [per_gpu[g][i] for i in range(len(spans)) for g in self.gpus]

    def replace_reps(self, idx: Sequence[int], spans: Sequence[tuple[float, float]]) -> None:
        """Reps `idx` were re-run over `spans`: read their windows anew."""
        fresh = self._read(spans)
        k = len(self.gpus)
        for j, i in enumerate(idx):
            self.spans[i] = spans[j]
            self.windows[i * k : (i + 1) * k] = fresh[j * k : (j + 1) * k]

    def summary(self) -> tuple[Window, ...]:
        """One window per GPU over the whole measurement (given windows: the first rep's;
        pass `summary_windows` to `judge` to say otherwise)."""
        if self.source is not None and len(self.spans) > 1:
            first = min(a for a, _ in self.spans)
            last = max(b for _, b in self.spans)
            return tuple(self.source.window(first, last, g) for g in self.gpus)
        return tuple(self.windows[: len(self.gpus)])


@dataclass(frozen=True)
class Retry:
    """How the retry policy re-runs reps: `rerun(indices)` times them again and returns
    (time_s, (t0, t1)) for each, in order; `recover()` (optional) waits until the GPU is
    back in the state the measurement asks for, after each delay."""

    rerun: Callable[[list[int]], list[tuple[float, tuple[float, float]]]]
    clock: Clock
    recover: Callable[[], object] | None = None


# -- the judge --------------------------------------------------------------------------


def judge(
    name: str,
    times_s: Sequence[float],
    evidence: Evidence,
    *,
    facts: Mapping[int, GpuFacts],
    config: VerdictConfig = DEFAULT_CONFIG,
    policy: Policy = "annotate",
    retry: Retry | None = None,
    extra_findings: Sequence[Finding] = (),
    amend: Callable[[list[Finding]], list[Finding]] | None = None,
    probe_moved: float | None = None,
    target: CiTarget | None = None,
    raise_if_too_few: bool | None = None,
    summary_windows: Sequence[Window] | None = None,
    keep_rep_windows: bool = True,
    timer: str = "host",
    started_at: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Measurement:
    """Judge one measurement's reps and make its `Measurement`.

    `times_s` are the reps' times, `evidence` their windows. Under policy "retry",
    `retry` re-runs the affected reps after each of `retry_delays(config)` until none
    is affected (without `retry`, retry acts as reject). `amend` may adjust findings
    (e.g. `gpuenv run` demotes a whole run's cold start); `extra_findings` are added
    as they are. `raise_if_too_few` (default: when there are several reps) raises
    `MeasurementRejected` when reject leaves fewer than `config.min_reps`.

    Every finding about the GPU's state is weighed against the number
    (gpuenv.verdict.effect): a warning only where the number (the median of all reps) reads
    differently from the median of the reps it does not name, or where `probe_moved` (the
    state probe's reps against fn's time on a ready GPU, relative) shows the state moved
    it; where no rep stands outside it, a power_cap's clock bounds the move (before
    `amend`, which sees the sentences as weighed). With a `target` (gpuenv.bench's stopping
    rule), a wide spread of the reps the policy kept and a CI short of the target are
    findings too (gpuenv.verdict.number).
    """
    check_policy(policy)
    times = _rep_times(name, times_s, evidence)

    def findings_now() -> list[Finding]:
        # without telemetry the rep times still say whether they held one level
        found = assess(evidence.windows, times, config=config, facts=dict(facts))
        found = weigh([*found, *extra_findings], times, config, probe_moved=probe_moved)
        return amend(found) if amend is not None else found

    findings = findings_now()
    retried: list[int] = []
    if policy == "retry" and retry is not None:
        findings, retried = _retry(retry, times, evidence, findings, findings_now, config)
    result = apply_policy(
        findings,
        len(times),
        policy,
        config=config,
        name=name,
        raise_if_too_few=len(times) > 1 if raise_if_too_few is None else raise_if_too_few,
    )
    findings, verdict = _about_number(findings, result, times, evidence, config, target)
    summary = tuple(summary_windows) if summary_windows is not None else evidence.summary()
    return Measurement.build(
        name,
        times,
        rejected_reps=result.rejected_reps,
        windows=tuple(evidence.windows) if keep_rep_windows else (),
        findings=tuple(findings),
        verdict=verdict,
        policy=policy,
        retried_reps=tuple(retried),
        summary_windows=summary,
        gpus=evidence.gpus,
        timer=timer,
        started_at=started_at,
        extra=dict(extra or {}),
    )


def _about_number(
    findings: list[Finding],
    result: PolicyResult,
    times: list[float],
    evidence: Evidence,
    config: VerdictConfig,
    target: CiTarget | None,
) -> tuple[list[Finding], Verdict]:
    """The findings and verdict with what the kept reps say of the number (a wide spread,
    a CI short of `target`): after the policy, which they do not steer."""
    rejected = set(result.rejected_reps)
    kept = [i for i in range(len(times)) if i not in rejected]
    gpu = evidence.gpus[0] if evidence.gpus else None
    about = number_findings(times, kept, config, target, gpu)
    if not about:
        return findings, result.verdict
    return [*findings, *about], "annotated" if result.verdict == "ok" else result.verdict


def _rep_times(name: str, times_s: Sequence[float], evidence: Evidence) -> list[float]:
    """The rep times as floats, refused when there are none or the windows do not match."""
    times = [float(t) for t in times_s]
    if not times:
        raise ConfigError(f"{name!r}: a measurement needs at least one rep")
    if evidence.windows and len(evidence.windows) != len(times) * len(evidence.gpus):
        raise ConfigError(
            f"{name!r}: {len(evidence.windows)} windows for {len(times)} reps on "
            f"{len(evidence.gpus)} GPU(s)",
            hint="pass one window per rep and GPU, rep-major",
        )
    return times


def _retry(
    retry: Retry,
    times: list[float],
    evidence: Evidence,
    findings: list[Finding],
    findings_now: Callable[[], list[Finding]],
    config: VerdictConfig,
) -> tuple[list[Finding], list[int]]:
    """The retry policy's rounds: after each of `retry_delays(config)` (and `recover`), the
    affected reps are re-run until none is; `times` and `evidence` are updated in place.
    Returns the findings of the last round and the reps re-run."""
    retried: list[int] = []
    for delay in retry_delays(config):
        bad = affected_reps(findings, config)
        if not bad:
            break
        retry.clock.sleep(delay)
        if retry.recover is not None:
            retry.recover()
        redone = retry.rerun(bad)
        for i, (t, _) in zip(bad, redone, strict=True):
            times[i] = float(t)
        evidence.replace_reps(bad, [span for _, span in redone])
        retried = sorted(set(retried) | set(bad))
        findings = findings_now()
    return findings, retried


__all__ = [
    "POLICIES",
    "Evidence",
    "PolicyResult",
    "Retry",
    "WindowSource",
    "affected_reps",
    "apply_policy",
    "check_policy",
    "judge",
    "read_facts",
    "retry_delays",
]
