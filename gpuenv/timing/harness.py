"""The harness: `bench(fn)` -- warmup, conditioning, reps under the stopping rule,
telemetry windows per rep, findings and the policy -> a `Measurement`."""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpuenv import stats
from gpuenv.backend import Backend
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.timebase import Clock
from gpuenv.timing.conditioning_old import (
    BURST_DUTY,
    BURST_S,
    PRECONDITION_MAX_S,
    precondition,
    wait_until_ready,
)
from gpuenv.timing.cuda import PROFILER_BATCH, PROFILER_MAX_REPS, cuda_device, nvml_index_of_cuda
from gpuenv.timing.devices import MODES, BackToBack, Device, Rep, SimDevice
from gpuenv.timing.warmup import _warmup

log = logging.getLogger(__name__)

CONDITIONS = ("burst", "sustained")
DEFAULT_BUDGET_S = 10.0  # measuring time when no rep count is given


def _gpu_facts(backend: Any, gpu: int, lock_range: tuple[int, int] | None) -> Any:
    from gpuenv.verdict import GpuFacts

    def safe(get: Callable[[], Any]) -> Any:
        try:
            return get()
        except Exception:  # facts are best effort: a finding without them is still right
            return None

    return GpuFacts(
        max_sm_mhz=safe(lambda: backend.clock_limits(gpu).max_sm_mhz),
        slowdown_c=safe(lambda: backend.thresholds(gpu).slowdown_c),
        power_limit_w=safe(lambda: backend.power_limits(gpu).limit_w),
        lock_range_mhz=lock_range,
    )


def _trace(sampler: Any, gpu: int, t0: float, t1: float, max_points: int = 1000) -> dict[str, Any]:
    """The telemetry over the whole bench (warmup and conditioning included), downsampled,
    for `gpuenv plot`: times are seconds from t0."""
    samples = sampler.samples(t0, t1, gpu)
    step = max(1, math.ceil(len(samples) / max_points))
    kept = samples[::step]
    return {
        "t0": t0,
        "t_s": [round(s.t - t0, 4) for s in kept],
        "sm_mhz": [s.sm_mhz for s in kept],
        "power_w": [round(s.power_instant_w if s.power_instant_w is not None else s.power_w, 1)
                    for s in kept],
        "temp_c": [s.temp_c for s in kept],
        "reasons": [s.reasons for s in kept],
    }


def bench(
    fn: Callable[[], Any],
    *,
    name: str | None = None,
    session: Any = None,
    backend: Backend | None = None,
    gpu: int | None = None,
    device: Device | None = None,
    mode: str = "events",
    reps: int | None = None,
    budget_s: float | None = None,
    rel_ci: float = 0.01,
    min_reps: int = 10,
    max_reps: int = 10_000,
    confidence: float = 0.95,
    warmup: str | int = "auto",
    warmup_max_s: float = 5.0,
    warmup_max_reps: int = 1000,
    flush_l2: bool = True,
    saturate: bool = True,
    calls_per_rep: int | str = "auto",
    condition: str | None = None,
    burst_s: float = BURST_S,
    precondition_max_s: float = PRECONDITION_MAX_S,
    precondition_kw: dict[str, Any] | None = None,
    policy: str | None = None,
    verdict_config: Any = None,
    probe_clock: bool = True,
    keep_trace: bool = True,
    output: str | os.PathLike[str] | None = None,
    progress: bool | Callable[[str], None] = False,
) -> Any:
    """Time `fn` on the GPU, with telemetry on every rep; returns a `Measurement`.

    Reps continue until the median's `confidence` CI is within `rel_ci` of it, or
    `budget_s` of measuring (default 10 s; unlimited when `reps` fixes the count)
    or `max_reps` run out; `reps=N` takes exactly N. `warmup="auto"` runs reps
    until their times and clocks stop trending (at most `warmup_max_s`); an int
    runs that many. `mode`: "events" (CUDA events per rep), "graph" (a CUDA graph
    of `calls_per_rep` calls, for tiny kernels), "profiler" (summed device time of
    fn's kernels). `condition`: None, "burst" (short bursts from the uncapped
    state), "sustained" (precondition to equilibrium first, at most
    `precondition_max_s`; `precondition_kw` passes more settings to
    `precondition`); default: the session's mode. `policy`: "annotate" |
    "reject" | "retry" (default: the session's, else annotate).

    `device` injects what runs fn (tests: `SimDevice` with `sim_kernel`); by
    default the simulated GPU when the backend is "sim", else CUDA via torch.
    The stats of the kept reps are in `m.stats`; CI, warmup, conditioning,
    effective clocks and settings in `m.extra`.
    """
    from gpuenv import judge as jd
    from gpuenv import verdict as vd
    from gpuenv.results import Measurement

    if mode not in MODES:
        raise ConfigError(f"unknown timing mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    if reps is not None and reps < 1:
        raise ConfigError(f"reps must be at least 1 (got {reps})")
    name = name or getattr(fn, "__name__", None) or "bench"
    if name == "<lambda>":
        name = "bench"
    say = _progress_fn(progress)

    # -- where: backend, GPU, sampler, device ------------------------------------------
    own_sampler = None
    lock_range = None
    if session is not None:
        backend = session.backend
        sampler = session.sampler
        policy = policy or getattr(session, "policy", "annotate")
        condition = condition if condition is not None else getattr(session, "mode", None)
        verdict_config = verdict_config or getattr(session, "config", None)
        gpus = list(getattr(session, "gpus", []) or sampler.gpus)
    else:
        if backend is None:
            backend = _open_backend_quietly()
        sampler = None
        gpus = []
    policy = jd.check_policy(policy or "annotate")
    if condition is not None and condition not in CONDITIONS:
        raise ConfigError(
            f"unknown condition {condition!r}", hint="use 'burst', 'sustained' or None"
        )
    if device is None:
        if backend is not None and backend.workload is not None:
            gpu = gpus[0] if gpu is None and gpus else (gpu or 0)
            device = SimDevice(backend, gpu)
        else:
            device = cuda_device(mode, flush_l2=flush_l2, saturate=saturate,
                                 calls_per_rep=calls_per_rep,
                                 clock=sampler.clock if sampler is not None else None)
    if gpu is None and backend is not None and device.kind.startswith("cuda"):
        cuda_dev = getattr(device, "device", None)
        gpu = _safe(lambda: nvml_index_of_cuda(backend, cuda_dev))
    if gpu is None:
        gpu = gpus[0] if gpus else 0
    if sampler is None and backend is not None:
        from gpuenv.telemetry import Sampler

        own_sampler = sampler = Sampler(backend, [gpu], clock=device.clock)
        sampler.start()
    if session is not None:
        lock_range = getattr(sampler, "lock_ranges", {}).get(gpu)
        if gpu not in sampler.gpus:
            raise ConfigError(
                f"GPU {gpu} is not sampled by this session (it covers {sampler.gpus})",
                hint="open the session with gpus= including the GPU fn runs on",
            )
    clock = device.clock
    rule = stats.StopRule(
        rel_ci=0.0 if reps is not None else rel_ci,
        budget_s=budget_s if budget_s is not None else (math.inf if reps else DEFAULT_BUDGET_S),
        min_reps=reps if reps is not None else min(min_reps, max_reps),
        max_reps=reps if reps is not None else max_reps,
        confidence=confidence,
    ) if (budget_s is None or budget_s > 0) else stats.StopRule()
    config = verdict_config or vd.DEFAULT_CONFIG

    try:
        t_begin = sampler.mark() if sampler is not None else clock.now()
        started_at = clock.wall()
        extra: dict[str, Any] = {"mode": mode, "condition": condition, "policy": policy}
        # -- warmup, effective clock, conditioning --------------------------------------
        warm = _warmup(device, fn, sampler, gpu, warmup, warmup_max_s, warmup_max_reps)
        extra.update(warmup_reps=warm.reps, warmup_s=warm.seconds, warmup_steady=warm.steady)
        if not warm.steady:
            say(f"{name}: warmup did not settle in {warm.seconds:.1f} s ({warm.reps} reps)")
        device.prepare(fn)
        clock_before = device.probe_clock_mhz() if probe_clock else None
        if condition == "sustained":
            cond = precondition(device, fn, sampler, gpu, max_s=precondition_max_s,
                                progress=say if progress else None, **(precondition_kw or {}))
            extra.update(cond.to_dict())
        elif condition == "burst":
            if session is not None and hasattr(session, "wait_until_recovered"):
                # the session's own "cool and uncapped" (temperature near its idle one)
                t_wait = clock.now()
                session.wait_until_recovered()
                waited, ready = clock.now() - t_wait, True
            else:
                waited, ready = wait_until_ready(sampler, gpu, clock, since=clock.now())
            extra.update(burst_first_wait_s=waited, burst_first_ready=ready)

        # -- measure ---------------------------------------------------------------------
        t_measure = sampler.mark() if sampler is not None else clock.now()
        if condition == "sustained":
            device = BackToBack(device)
        all_reps, stop, rests = _measure(device, fn, rule, condition, burst_s, sampler, gpu,
                                         batch=PROFILER_BATCH if mode == "profiler" else 1,
                                         max_reps=PROFILER_MAX_REPS if mode == "profiler" else None)
        # -- findings and the policy (retry re-runs affected reps) ---------------------
        facts = {}
        if session is not None and gpu in getattr(session, "facts", {}):
            facts = {gpu: session.facts[gpu]}
        elif backend is not None:
            facts = {gpu: _gpu_facts(backend, gpu, lock_range)}
        findings, windows = _assess(vd, sampler, gpu, all_reps, config, facts)
        retried: list[int] = []
        if policy == "retry":
            for delay in jd.retry_delays(config):
                affected = jd.affected_reps(findings, config)
                if not affected:
                    break
                say(f"{name}: retrying {len(affected)} reps after {delay:.1f} s")
                clock.sleep(delay)
                if condition == "burst":
                    wait_until_ready(sampler, gpu, clock, since=clock.now())
                for i in affected:
                    all_reps[i] = device.reps(fn, 1)[0]
                retried = sorted(set(retried) | set(affected))
                findings, windows = _assess(vd, sampler, gpu, all_reps, config, facts)
        t_end = sampler.mark() if sampler is not None else clock.now()
        clock_after = device.probe_clock_mhz() if probe_clock else None
        result = jd.apply_policy(findings, len(all_reps), policy, config=config, name=name)

        times = [r.time_s for r in all_reps]
        kept = [t for i, t in enumerate(times) if i not in set(result.rejected_reps)]
        summary = stats.summarize(kept, confidence) if kept else None
        rep_clocks = [r.clock_mhz for r in all_reps if r.clock_mhz is not None]
        ref_mhz = facts[gpu].max_sm_mhz if facts and facts[gpu].max_sm_mhz else None
        extra.update(
            stop_reason=stop,
            measure_s=t_end - t_measure,
            burst_rests=rests,
            confidence=confidence,
            rel_ci_target=rule.rel_ci,
            clock_mhz_before=clock_before,
            clock_mhz_after=clock_after,
            rep_clock_mhz=[r.clock_mhz for r in all_reps] if rep_clocks else None,
            **device.settings(),
        )
        if summary is not None:
            extra["summary"] = summary.to_dict()
            extra["ci_s"] = [summary.ci_lo, summary.ci_hi]
            extra["rel_ci"] = summary.rel_ci
            if rep_clocks:
                extra["rep_clock_mhz_median"] = stats.median(rep_clocks)
            if rep_clocks and len(rep_clocks) == len(all_reps) and ref_mhz:
                # time x effective clock / reference clock: what the rep would take at the
                # reference clock. Meaningful for compute-bound kernels only.
                norm = [r.time_s * r.clock_mhz / ref_mhz for i, r in enumerate(all_reps)  # type: ignore[operator]
                        if i not in set(result.rejected_reps)]
                extra["time_at_ref_clock_s"] = stats.median(norm)
                extra["ref_clock_mhz"] = ref_mhz
            warnings_ = []
            if summary.high_spread:
                warnings_.append(
                    f"high spread: IQR is {summary.rel_iqr:.1%} of the median "
                    f"(over {stats.HIGH_SPREAD_REL_IQR:.0%})"
                )
            if rule.rel_ci > 0 and stop != "converged" and summary.rel_ci > rule.rel_ci:
                warnings_.append(
                    f"the median's CI is +-{summary.rel_ci:.2%}, not within the "
                    f"{rule.rel_ci:.2%} target ({stop})"
                )
            elif rule.rel_ci > 0 and stop != "converged":
                warnings_.append(
                    f"only {summary.n} reps before the {stop} ran out (min_reps is "
                    f"{rule.min_reps}): the CI of +-{summary.rel_ci:.2%} rests on few reps"
                )
            if warnings_:
                extra["warnings"] = warnings_
                for w in warnings_:
                    log.warning("%s: %s", name, w)
        if keep_trace and sampler is not None:
            extra["trace"] = _trace(sampler, gpu, t_begin, t_end)
        summary_windows = (sampler.window(t_measure, t_end, gpu),) if sampler is not None else ()
        m = Measurement.build(
            name,
            times,
            rejected_reps=result.rejected_reps,
            windows=tuple(windows),
            findings=tuple(findings),
            verdict=result.verdict,
            policy=policy,
            retried_reps=tuple(retried),
            summary_windows=summary_windows,
            gpus=(gpu,),
            timer=device.kind,
            started_at=started_at,
            extra=extra,
        )
    finally:
        if own_sampler is not None:
            own_sampler.stop()
    _record(session, m, output, backend, gpu, clock)
    return m


def _measure(
    device: Device,
    fn: Callable[[], Any],
    rule: stats.StopRule,
    condition: str | None,
    burst_s: float,
    sampler: Any,
    gpu: int,
    *,
    batch: int = 1,
    max_reps: int | None = None,
) -> tuple[list[Rep], str, int]:
    """Reps until the stopping rule says stop; in burst mode, rests between bursts."""
    clock = device.clock
    start = clock.now()
    out: list[Rep] = []
    rests = 0
    burst_start = start
    while True:
        out.extend(device.reps(fn, batch) if batch > 1 else [device.rep(fn)])
        reason = rule.check([r.time_s for r in out], clock.now() - start)
        if reason is None and max_reps is not None and len(out) >= max_reps:
            reason = "max_reps"
        if reason is not None:
            return out, reason, rests
        if condition == "burst" and clock.now() - burst_start >= burst_s:
            burst = clock.now() - burst_start
            wait_until_ready(sampler, gpu, clock, since=clock.now(),
                             min_rest_s=burst * (1 / BURST_DUTY - 1))
            rests += 1
            burst_start = clock.now()


def _assess(vd: Any, sampler: Any, gpu: int, reps: Sequence[Rep], config: Any,
            facts: dict[int, Any]) -> tuple[list[Any], list[Any]]:
    if sampler is None:
        return [], []
    windows = sampler.windows([(r.t0, r.t1) for r in reps], gpu)
    findings = vd.assess(windows, [r.time_s for r in reps], config=config, facts=facts)
    return findings, windows


def _record(session: Any, m: Any, output: Any, backend: Any, gpu: int, clock: Clock) -> None:
    if session is not None:
        keep = getattr(session, "_keep", None)  # results + the session's JSONL store
        if keep is not None:
            keep(m)
        else:
            session.results.add(m)
    if output is not None and session is None:
        from gpuenv.results import ResultStore, environment_metadata

        meta = environment_metadata(backend, [gpu], clock=clock) if backend is not None else {}
        with ResultStore(output, meta) as store:
            store.append(m)


def _open_backend_quietly() -> Backend | None:
    """The default backend, or None (timing without telemetry) when NVML is unavailable."""
    from gpuenv.backend import open_backend
    from gpuenv.errors import BackendError

    try:
        return open_backend()
    except BackendError as err:
        log.warning("timing without telemetry: %s", err)
        return None


def _safe(get: Callable[[], int]) -> int | None:
    try:
        return get()
    except GpuenvError as err:
        log.warning("cannot map the CUDA device to an NVML GPU (%s); using GPU 0", err)
        return None


def _progress_fn(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda text: print(text, file=sys.stderr, flush=True)
    return lambda text: log.info(text)

