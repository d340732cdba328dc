"""do_bench and do_bench_cudagraph: triton's budgets and return values, measured by
gpuenv.bench (see the package docstring)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuenv import stats
from gpuenv.conditioning import ConditionConfig
from gpuenv.errors import ConfigError

if TYPE_CHECKING:
    from gpuenv.seams import BenchSession
    from gpuenv.timing.devices import Device, Rep

RETURN_MODES = ("min", "max", "mean", "median", "all")
TRITON_FLUSH_BYTES = 256 * 2**20  # triton's flush buffer (get_empty_cache_for_benchmark)
ESTIMATE_REPS = 5  # reps timed to estimate one rep's cost (triton times 5 calls)
ESTIMATE_MAX_FRAC = 0.1  # ...or fewer, once they took this much of warmup + rep
CUDAGRAPH_REPLAYS = 10  # triton's do_bench_cudagraph replays its graph 10 times
WAIT_MAX_S = 2.0  # the longest a call waits for a held-down GPU, then measures anyway
POLL_S = 0.005  # how often that wait looks (the sampler reads every 25 ms)
# The schedule (conditioning.Bursts, as gpuenv.bench's; the package docstring says why):
# bursts of DROPIN_BURST_S, rests that keep the power the cap controller acts on (a filter
# of DROPIN_POWER_TAU_S) under DROPIN_POWER_TARGET x the limit; without a power reading,
# a rest of (1 / DROPIN_DUTY - 1) x the burst.
# a starting bound: the H100's cap engages 100-300 ms into a heavy load, the H200's
# 127-178 ms; where a GPU's comes on sooner the schedule learns it (DROPIN_LEARN)
DROPIN_BURST_S = 0.03
DROPIN_POWER_TAU_S = 0.15
DROPIN_POWER_TARGET = 0.9
DROPIN_DUTY = 0.5
# A burst that met the cap shortens the unbroken work before a rest (this call's and the
# next call's of the same function), and reps whose telemetry windows show the cap are
# measured again, at most DROPIN_WINDOW_REDOS times a call (ConditionConfig.burst_learn,
# burst_window_redos; benchmarks/dropin_mlp.py's learn=0 and redo=0 turn them off)
DROPIN_LEARN = True
DROPIN_WINDOW_REDOS = 4
# the drop-in's conditioning, all of the above in one config: `do_bench(...,
# conditioning=dataclasses.replace(DROPIN_CONDITIONING, burst_s=0.02))` tries another
DROPIN_CONDITIONING = ConditionConfig(
    burst_s=DROPIN_BURST_S,
    burst_duty=DROPIN_DUTY,
    burst_wait="seen",
    burst_power_tau_s=DROPIN_POWER_TAU_S,
    burst_power_target=DROPIN_POWER_TARGET,
    burst_learn=DROPIN_LEARN,
    burst_window_redos=DROPIN_WINDOW_REDOS,
    burst_timeout_s=WAIT_MAX_S,
    poll_s=POLL_S,
)
SIM_REP_OVERHEAD_S = 25e-6  # host time of a flushed, synchronized rep, on the simulated GPU

# Process state that changes no number: `_recent` is what last_measurement() and
# measurements() hand the caller back, and nothing of gpuenv reads it to measure. The
# default backend (gpuenv.backend.shared_backend, gpuenv.rank's too) is the one door
# to the same GPUs for every call; what a GPU carries from one call to the next, the
# process's conditioning memory keeps by its clock and UUID.
_recent: deque[Any] = deque(maxlen=256)


def do_bench(
    fn: Callable[[], Any],
    warmup: float = 25,
    rep: float = 100,
    grad_to_none: Sequence[Any] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
    *,
    flush_bytes: int | None = None,
    name: str | None = None,
    session: BenchSession | None = None,
    backend: Any = None,
    device: Device | None = None,
    mode: str = "events",
    condition: str | None = None,
    policy: str | None = None,
    output: Any = None,
    fast_flush: bool = True,
    conditioning: ConditionConfig | None = None,
    wait_counters: bool = True,
) -> float | list[float]:
    """Time `fn` in milliseconds, as triton.testing.do_bench does (see the module docstring).

    Returns the quantiles of the measured reps' times when `quantiles` is given (a
    list, or a float for one quantile), else per `return_mode`: "min", "max", "mean",
    "median" (a float) or "all" (every measured rep's time, a list). `grad_to_none`:
    tensors whose `.grad` is set to None before each measured rep (not in warmup).
    Keyword-only extras: `flush_bytes` (default 2x the L2; 0: no flush), `name`,
    `session` (a gpuenv.stable() session: its sampler, policy and results), `backend`,
    `device` (a gpuenv.timing Device), `mode` ("events": one call a rep, as triton;
    "auto": gpuenv.bench's tiny-kernel switch; "graph", "profiler"),
    `condition`, `policy` and `output` (a JSONL file), as for gpuenv.bench;
    `conditioning` (a ConditionConfig: default `DROPIN_CONDITIONING`); `wait_counters`
    (False: judged with the reason-counter reads already in, as a ranking's calls are:
    `BenchConfig.wait_counters`). `fast_flush` (older triton's) has no effect.
    """
    _check(return_mode, quantiles, fn, grad_to_none=grad_to_none, warmup=warmup, rep=rep)
    _check_extras(flush_bytes, mode, wait_counters)
    backend, gpu = _where(session, backend)
    dev = device or _device(mode, backend, gpu, session, flush_bytes=flush_bytes)
    call = _Call(fn, grad_to_none)
    t_setup = dev.clock.now()
    dev.rep(call)  # the first call pays set-up (cuBLAS handles, compiling), as triton's
    per_rep_s, n_est = _estimate(dev, call, budget_s=(warmup + rep) / 1e3, gpu_time=False)
    setup_s = dev.clock.now() - t_setup  # work the first burst began with
    n_warmup = max(1, int(warmup / 1e3 / per_rep_s))
    n_rep = max(1, int(rep / 1e3 / per_rep_s))
    plan = {
        "warmup_ms": warmup,
        "rep_ms": rep,
        "rep_cost_s": per_rep_s,
        "estimate_reps": n_est,
        "warmup_max_reps": n_warmup,
        "reps": n_rep,
    }
    m = _bench(
        call,
        _Phases(dev, call, plan),
        name or _name(fn, "do_bench"),
        session,
        backend,
        output,
        mode=mode,
        reps=n_rep,
        budget_s=rep / 1e3 or None,
        warmup="auto",
        warmup_max_s=warmup / 1e3,
        warmup_max_reps=n_warmup,
        condition=condition,
        policy=policy,
        burst_lead_s=setup_s,
        conditioning=_conditioning(conditioning),
        wait_counters=wait_counters,
    )
    return _summarize(_times_ms(m), quantiles, return_mode)


def do_bench_cudagraph(
    fn: Callable[[], Any],
    rep: float = 20,
    grad_to_none: Sequence[Any] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
    *,
    name: str | None = None,
    session: BenchSession | None = None,
    backend: Any = None,
    condition: str | None = None,
    policy: str | None = None,
    output: Any = None,
    conditioning: ConditionConfig | None = None,
) -> float | list[float]:
    """Time `fn` in ms as triton.testing.do_bench_cudagraph does: about `rep` ms of calls
    captured in one CUDA graph (no L2 flush, as triton), replayed 10 times; each replay
    gives the time per call, and the result is over those 10. On the simulated GPU a
    replay is the same number of calls back to back. Keywords as for `do_bench`.

    The calls per graph are sized as triton sizes them: `rep` ms over a call timed by
    events with nothing queued before it, so its launch latency counts (median of up
    to 5 such calls, where triton times one). A tiny kernel so gets as many calls as in
    triton's graph (for a few-us kernel, several times fewer than its time alone
    gives), and capturing them, host time per call, costs what triton's costs."""
    _check(return_mode, quantiles, fn, grad_to_none=grad_to_none, rep=rep)
    backend, gpu = _where(session, backend)
    probe = _device("events", backend, gpu, session, flush_bytes=0, cover=False)
    call = _Call(fn, grad_to_none)
    probe.rep(call)  # triton's warmup call
    if grad_to_none:
        for x in grad_to_none:  # as triton: fresh leaves, no gradient, before the capture
            x.detach_()
            x.requires_grad_(True)
            x.grad = None
    per_call_s, _ = _estimate(probe, call, budget_s=rep / 1e3, gpu_time=True)
    calls = max(1, int(rep / 1e3 / per_call_s)) if per_call_s > 0 else 1000
    dev = _device("graph", backend, gpu, session, flush_bytes=0, calls=calls)
    plan = {
        "rep_ms": rep,
        "call_s": per_call_s,
        "calls_per_replay": calls,
        "replays": CUDAGRAPH_REPLAYS,
    }
    m = _bench(
        call,
        _Phases(dev, call, plan, clear_in_capture=True),
        name or _name(fn, "do_bench_cudagraph"),
        session,
        backend,
        output,
        mode="graph",
        reps=CUDAGRAPH_REPLAYS,
        budget_s=None,
        warmup=0,
        condition=condition,
        policy=policy,
        conditioning=_conditioning(conditioning),
    )
    return _summarize(_times_ms(m), quantiles, return_mode)


def last_measurement() -> Any:
    """The gpuenv Measurement of the latest do_bench call (None before the first)."""
    return _recent[-1] if _recent else None


def measurements() -> list[Any]:
    """The Measurements of the recent do_bench calls (at most 256), oldest first."""
    return list(_recent)


# -- the measurement -------------------------------------------------------------------


def _check(
    return_mode: str,
    quantiles: Sequence[float] | None,
    fn: Any,
    *,
    grad_to_none: Sequence[Any] | None = None,
    **budgets: float,
) -> None:
    """Refuse what triton refuses (it asserts on return_mode; ValueError on a quantile), and
    what it would fail on later (fn None or needing arguments, rep=0): gpuenv.validate's
    words."""
    from gpuenv import validate

    validate.no_arg_callable(fn, "fn")
    validate.grads(grad_to_none, "grad_to_none")
    if return_mode not in RETURN_MODES:
        raise ConfigError(f"return_mode {return_mode!r} is not one of {', '.join(RETURN_MODES)}")
    validate.quantiles(quantiles)
    for key, ms in budgets.items():
        # rep=0 measured one rep (triton's max(1, ...)): a budget of nothing is no request
        validate.number(ms, key, lo=0, lo_open=key == "rep", unit="milliseconds")


def _check_extras(flush_bytes: int | None, mode: str, wait_counters: bool) -> None:
    """Refuse bad values of do_bench's own keywords (not triton's) before anything runs."""
    from gpuenv import validate
    from gpuenv.timing import MODES

    if flush_bytes is not None and flush_bytes < 0:
        raise ConfigError(f"flush_bytes must be >= 0 (got {flush_bytes})", hint="0: no flush")
    if mode not in ("auto", *MODES):
        raise ConfigError(
            f"unknown timing mode {mode!r}", hint=f"use one of auto, {', '.join(MODES)}"
        )
    validate.boolean(wait_counters, "wait_counters")


def _where(session: BenchSession | None, backend: Any) -> tuple[Any, int]:
    """The backend (the session's, the given one, else the default opened once) and GPU."""
    if session is not None:
        from gpuenv.seams import session_gpus

        return session.backend, session_gpus(session)[0]
    if backend is None:
        from gpuenv.backend import shared_backend

        backend = shared_backend()
    return backend, 0


def _device(
    mode: str,
    backend: Any,
    gpu: int,
    session: BenchSession | None,
    *,
    flush_bytes: int | None,
    calls: int | None = None,
    cover: bool = True,
) -> Device:
    """What runs fn: the simulated GPU when the backend has one, else CUDA through torch.
    `cover=False`: no spin before fn, so a rep's time includes fn's launch latency (the
    simulated GPU has none)."""
    from gpuenv import timing

    if backend is not None and backend.workload is not None:
        # twice the simulated GPU's own L2, as on CUDA (timing.cuda.events): 100 MiB on an
        # H100, 120 MiB on an H200
        l2 = backend.workload.memory_system(gpu).l2_bytes
        flush = 2 * l2 if flush_bytes is None else flush_bytes
        return timing.SimDevice(
            backend,
            gpu,
            flush_bytes=flush,
            batch=calls or 1,
            rep_overhead_s=SIM_REP_OVERHEAD_S,
            **({} if cover else {"rep_probe_cycles": 0}),
        )
    clock = session.sampler.clock if session is not None else None
    return timing.cuda_device(
        "events" if mode == "auto" else mode,
        flush_l2=flush_bytes != 0,
        flush_bytes=flush_bytes,
        calls_per_rep=calls or "auto",
        clock=clock,
        saturate=cover,
    )


def _estimate(dev: Device, call: _Call, *, budget_s: float, gpu_time: bool) -> tuple[float, int]:
    """The cost of one rep: the median over up to ESTIMATE_REPS reps of the host time each
    took (flush, sync and Python included), or with `gpu_time` of the device's time for
    fn (with an uncovered device, launch latency included: triton's estimate)."""
    clock = dev.clock
    costs: list[float] = []
    start = clock.now()
    while len(costs) < ESTIMATE_REPS:
        t0 = clock.now()
        r = dev.rep(call)
        costs.append(r.time_s if gpu_time else clock.now() - t0)
        if clock.now() - start >= ESTIMATE_MAX_FRAC * budget_s:
            break
    per = stats.median(costs)
    return (per if gpu_time else max(per, 1e-7)), len(costs)


def _bench(
    call: _Call,
    dev: _Phases,
    name: str,
    session: BenchSession | None,
    backend: Any,
    output: Any,
    **settings: Any,
) -> Any:
    """gpuenv.bench with the drop-in's settings: budgeted counts, the budget counted in
    bursts (see the package docstring), no before/after clock probe (each rep probes its own),
    no telemetry trace in `m.extra` (for `gpuenv plot`: an autotuner's calls need none)."""
    from gpuenv import timing

    settings.setdefault("conditioning", DROPIN_CONDITIONING)
    # no wait for the power sample after the reps (up to 45 ms a call, an autotuner's tens
    # of calls) unless the call is written to a file: its energy is then the samples'
    settings.setdefault("wait_power", output is not None)
    cfg = timing.BenchConfig(
        probe_clock=False,
        burst_from_start=True,
        budget_in_bursts=True,
        keep_trace=False,
        **settings,
    )
    m = timing.bench(
        call, cfg, name=name, session=session, backend=backend, device=dev, output=output
    )
    _recent.append(m)
    return m


def _conditioning(given: ConditionConfig | None) -> ConditionConfig:
    if given is None:
        return DROPIN_CONDITIONING
    if not isinstance(given, ConditionConfig):
        raise ConfigError(
            f"conditioning must be a ConditionConfig, not {type(given).__name__}",
            hint="dataclasses.replace(gpuenv.integrations.triton.DROPIN_CONDITIONING, ...)",
        )
    return given


def _times_ms(m: Any) -> list[float]:
    """The measured reps in ms: all of them, less those a policy="reject" dropped (all of
    them again when it dropped every one: the verdict says so)."""
    return [t * 1e3 for t in (m.kept_times_s or m.times_s)]


def _summarize(
    times_ms: list[float], quantiles: Sequence[float] | None, return_mode: str
) -> float | list[float]:
    """triton's statistics: quantiles interpolate linearly between order statistics."""
    if quantiles is not None:
        out = [stats.quantile(times_ms, float(q)) for q in quantiles]
        return out[0] if len(out) == 1 else out
    if return_mode == "all":
        return list(times_ms)
    if return_mode == "min":
        return min(times_ms)
    if return_mode == "max":
        return max(times_ms)
    if return_mode == "median":
        return stats.median(times_ms)
    return math.fsum(times_ms) / len(times_ms)


def _name(fn: Callable[[], Any], default: str) -> str:
    name = getattr(fn, "__name__", None)
    return default if not name or name == "<lambda>" else str(name)


class _Call:
    """fn, clearing `grad_to_none` before each call once `clear` is on (the measured reps)."""

    def __init__(self, fn: Callable[[], Any], grad_to_none: Sequence[Any] | None):
        self.fn = fn
        self.memo_subject = fn  # what gpuenv.timing remembers between calls is fn's
        self.grads = list(grad_to_none or ())
        self.clear = False
        self.__name__ = _name(fn, "do_bench")

    def __call__(self) -> Any:
        if self.clear:
            for x in self.grads:
                x.grad = None
        return self.fn()


class _Phases:
    """The device bench runs on, telling `call` when the measured reps begin (after
    `prepare`: warmup and set-up calls keep their gradients), and adding the drop-in's
    plan to the Measurement's `extra["dropin"]`. A CUDA graph's capture is the measured
    calls (`clear_in_capture`: triton clears inside its capture loop)."""

    def __init__(
        self, inner: Device, call: _Call, plan: dict[str, Any], clear_in_capture: bool = False
    ):
        self.inner, self.call, self.plan = inner, call, plan
        self.clear_in_capture = clear_in_capture
        self.kind = inner.kind
        self.clock = inner.clock
        self.rep_batch = inner.rep_batch

    @property
    def batch(self) -> int:
        return self.inner.batch

    @property
    def flush_l2(self) -> bool | None:
        return self.inner.flush_l2

    @property
    def device(self) -> object:
        return self.inner.device

    def prepare(self, fn: Callable[[], Any]) -> None:
        self.call.clear = self.clear_in_capture
        self.inner.prepare(fn)
        self.call.clear = True

    def for_auto(self, fn: Callable[[], Any]) -> tuple[_Phases, str]:
        """mode="auto": the device bench times fn's device time with (prepared here)."""
        self.call.clear = self.clear_in_capture
        timed, how = self.inner.for_auto(fn)
        self.call.clear = True
        return _Phases(timed, self.call, self.plan, self.clear_in_capture), how

    def rep(self, fn: Callable[[], Any]) -> Rep:
        return self.inner.rep(fn)

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        return list(self.inner.reps(fn, n))

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        return float(self.inner.run_for(fn, seconds))

    def probe_clock_mhz(self) -> float | None:
        out = self.inner.probe_clock_mhz()
        return None if out is None else float(out)

    def settings(self) -> dict[str, Any]:
        return {**self.inner.settings(), "dropin": dict(self.plan)}


__all__ = ["do_bench", "do_bench_cudagraph", "last_measurement", "measurements"]
