"""Drop-ins for `triton.testing`: do_bench, do_bench_cudagraph and set_gpu_clock, measured
by gpuenv (telemetry on every rep, findings, a verdict) at triton's pace.

    from gpuenv.integrations.triton import do_bench, last_measurement
    ms = do_bench(lambda: a @ b)                       # same call, same return value
    ms, lo, hi = do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    m = last_measurement()                             # the gpuenv Measurement behind it
    print(m.telemetry, m.findings, m.verdict)

    gpuenv.integrations.triton.patch_autotuner()       # @triton.autotune measures with it

`warmup` and `rep` are time budgets in ms, as in triton, and everything a rep costs
counts in them: the L2 flush, the synchronize, the launch-cover spin and the host's
own time. After a first call (set-up, as triton's) a few reps are timed on the host
clock; their median cost gives the counts: warmup reps until their times and clocks
stop trending, at most `warmup` ms worth (triton's warmup calls skip the flush, so for
a small kernel its warmup takes a fraction of `warmup` ms: a steady kernel stops here
after 8 reps), and `rep` ms of measured reps (the budget is also a hard limit on
measuring, so a slower GPU cannot overrun it). Each measured rep gets its telemetry
window, and gpuenv.bench's judge turns them into the Measurement.

The L2 flush writes twice the device's L2 before each rep (100 MiB on an H100; 50 us
less per rep than triton's 256 MiB); `flush_bytes=256 * 2**20` flushes as triton does.

The condition is gpuenv's safe default ("auto"): as it is when gpuenv's clock lock
holds, else burst, for which the whole call is one burst started from a cool,
uncapped GPU: the check reads the samples taken while the call warms up, so it costs
nothing on a GPU that is not held down, and waits until the power cap clears (about
0.5 s on an H100, at most WAIT_MAX_S) when it is. Back-to-back calls on heavy kernels
(an autotuner's sweep of big GEMMs) pay that wait once the cap engages; a cap that
engaged in the last 0.1 s before a call is not yet reported by the driver: then it
shows in the reps' telemetry as a finding. `condition="none"` measures as triton does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from gpuenv import stats
from gpuenv.conditioning import ConditionConfig
from gpuenv.errors import ConfigError

log = logging.getLogger(__name__)

RETURN_MODES = ("min", "max", "mean", "median", "all")
TRITON_FLUSH_BYTES = 256 * 2**20  # triton's flush buffer (get_empty_cache_for_benchmark)
ESTIMATE_REPS = 5  # reps timed to estimate one rep's cost (triton times 5 calls)
ESTIMATE_MAX_FRAC = 0.1  # ...or fewer, once they took this much of warmup + rep
CUDAGRAPH_REPLAYS = 10  # triton's do_bench_cudagraph replays its graph 10 times
WAIT_MAX_S = 2.0  # the longest a call waits for a held-down GPU, then measures anyway
POLL_S = 0.005  # how often that wait looks (the sampler reads every 25 ms)
SIM_L2_BYTES = 50 * 2**20  # the simulated H100's L2
SIM_REP_OVERHEAD_S = 25e-6  # host time of a flushed, synchronized rep, on the simulated GPU

_recent: deque[Any] = deque(maxlen=256)
_default_backend: list[Any] = []  # opened once per process (NVML start-up is not free)


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
    session: Any = None,
    backend: Any = None,
    device: Any = None,
    mode: str = "events",
    condition: str | None = None,
    policy: str | None = None,
    output: Any = None,
    fast_flush: bool = True,
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
    `condition`, `policy` and `output` (a JSONL file), as for gpuenv.bench. `fast_flush`
    (older triton's) is accepted and has no effect.
    """
    from gpuenv.timing import MODES

    _check(return_mode, quantiles, warmup=warmup, rep=rep)
    if flush_bytes is not None and flush_bytes < 0:
        raise ConfigError(f"flush_bytes must be >= 0 (got {flush_bytes})", hint="0: no flush")
    if mode not in ("auto", *MODES):
        raise ConfigError(f"unknown timing mode {mode!r}",
                          hint=f"use one of auto, {', '.join(MODES)}")  # fmt: skip
    backend, gpu = _where(session, backend)
    dev = device or _device(mode, backend, gpu, session, flush_bytes=flush_bytes)
    call = _Call(fn, grad_to_none)
    dev.rep(call)  # the first call pays set-up (cuBLAS handles, compiling), as triton's
    per_rep_s, n_est = _estimate(dev, call, budget_s=(warmup + rep) / 1e3, gpu_time=False)
    n_warmup = max(1, int(warmup / 1e3 / per_rep_s))
    n_rep = max(1, int(rep / 1e3 / per_rep_s))
    plan = {"warmup_ms": warmup, "rep_ms": rep, "rep_cost_s": per_rep_s,
            "estimate_reps": n_est, "warmup_max_reps": n_warmup, "reps": n_rep}  # fmt: skip
    m = _bench(call, _Phases(dev, call, plan), name or _name(fn, "do_bench"), session, backend,
               output, mode=mode, reps=n_rep, budget_s=rep / 1e3 or None, warmup="auto",
               warmup_max_s=warmup / 1e3, warmup_max_reps=n_warmup, condition=condition,
               policy=policy)  # fmt: skip
    return _summarize(_times_ms(m), quantiles, return_mode)


def do_bench_cudagraph(
    fn: Callable[[], Any],
    rep: float = 20,
    grad_to_none: Sequence[Any] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
    *,
    name: str | None = None,
    session: Any = None,
    backend: Any = None,
    condition: str | None = None,
    policy: str | None = None,
    output: Any = None,
) -> float | list[float]:
    """Time `fn` in ms as triton.testing.do_bench_cudagraph does: about `rep` ms of calls
    captured in one CUDA graph (no L2 flush, as triton), replayed 10 times; each replay
    gives the time per call, and the result is over those 10. On the simulated GPU a
    replay is the same number of calls back to back. Keywords as for `do_bench`."""
    _check(return_mode, quantiles, rep=rep)
    backend, gpu = _where(session, backend)
    probe = _device("events", backend, gpu, session, flush_bytes=0)
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
    plan = {"rep_ms": rep, "call_s": per_call_s, "calls_per_replay": calls,
            "replays": CUDAGRAPH_REPLAYS}  # fmt: skip
    m = _bench(call, _Phases(dev, call, plan, clear_in_capture=True),
               name or _name(fn, "do_bench_cudagraph"), session, backend, output, mode="graph",
               reps=CUDAGRAPH_REPLAYS, budget_s=None, warmup=0, condition=condition,
               policy=policy)  # fmt: skip
    return _summarize(_times_ms(m), quantiles, return_mode)


def last_measurement() -> Any:
    """The gpuenv Measurement of the latest do_bench call (None before the first)."""
    return _recent[-1] if _recent else None


def measurements() -> list[Any]:
    """The Measurements of the recent do_bench calls (at most 256), oldest first."""
    return list(_recent)


# -- the measurement -------------------------------------------------------------------


def _check(return_mode: str, quantiles: Sequence[float] | None, **budgets: float) -> None:
    """Refuse what triton refuses (it asserts on return_mode; ValueError on a quantile)."""
    if return_mode not in RETURN_MODES:
        raise ConfigError(f"return_mode {return_mode!r} is not one of {', '.join(RETURN_MODES)}")
    if quantiles is not None and not all(0.0 <= float(q) <= 1.0 for q in quantiles):
        raise ConfigError(f"quantiles must be in the range [0, 1], got {list(quantiles)}")
    for key, ms in budgets.items():
        if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms >= 0):
            raise ConfigError(f"{key} is a time in milliseconds >= 0, not {ms!r}")


def _where(session: Any, backend: Any) -> tuple[Any, int]:
    """The backend (the session's, the given one, else the default opened once) and GPU."""
    if session is not None:
        return session.backend, (getattr(session, "gpus", None) or session.sampler.gpus)[0]
    if backend is None:
        if not _default_backend:
            from gpuenv.timing.harness import _open_backend_quietly

            _default_backend.append(_open_backend_quietly())
        backend = _default_backend[0]
    return backend, 0


def _device(mode: str, backend: Any, gpu: int, session: Any, *, flush_bytes: int | None,
            calls: int | None = None) -> Any:  # fmt: skip
    """What runs fn: the simulated GPU when the backend has one, else CUDA through torch."""
    from gpuenv import timing

    if backend is not None and backend.workload is not None:
        flush = 2 * SIM_L2_BYTES if flush_bytes is None else flush_bytes
        return timing.SimDevice(backend, gpu, flush_bytes=flush, batch=calls or 1,
                                rep_overhead_s=SIM_REP_OVERHEAD_S)
    clock = session.sampler.clock if session is not None else None
    return timing.cuda_device("events" if mode == "auto" else mode, flush_l2=flush_bytes != 0,
                              flush_bytes=flush_bytes, calls_per_rep=calls or "auto", clock=clock)


def _estimate(dev: Any, call: _Call, *, budget_s: float, gpu_time: bool) -> tuple[float, int]:
    """The cost of one rep: the median over up to ESTIMATE_REPS reps of the host time each
    took (flush, sync and Python included), or with `gpu_time` of the device's time for
    fn (what a call costs inside a CUDA graph)."""
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


def _bench(call: _Call, dev: _Phases, name: str, session: Any, backend: Any, output: Any,
           **settings: Any) -> Any:  # fmt: skip
    """gpuenv.bench with the drop-in's settings: budgeted counts, the whole call one burst
    (see the module docstring), no before/after clock probe (each rep probes its own)."""
    from gpuenv import timing

    cond = dataclasses.replace(ConditionConfig(), burst_s=math.inf,
                               burst_timeout_s=WAIT_MAX_S, poll_s=POLL_S)
    cfg = timing.BenchConfig(conditioning=cond, probe_clock=False, burst_from_start=True,
                             **settings)  # fmt: skip
    m = timing.bench(call, cfg, name=name, session=session, backend=backend, device=dev,
                     output=output)  # fmt: skip
    _recent.append(m)
    return m


def _times_ms(m: Any) -> list[float]:
    """The measured reps in ms: all of them, less those a policy="reject" dropped (all of
    them again when it dropped every one: the verdict says so)."""
    return [t * 1e3 for t in (m.kept_times_s or m.times_s)]


def _summarize(times_ms: list[float], quantiles: Sequence[float] | None,
               return_mode: str) -> float | list[float]:  # fmt: skip
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

    def __init__(self, inner: Any, call: _Call, plan: dict[str, Any],
                 clear_in_capture: bool = False):  # fmt: skip
        self.inner, self.call, self.plan = inner, call, plan
        self.clear_in_capture = clear_in_capture
        self.kind: str = inner.kind
        self.clock: Any = inner.clock

    def __getattr__(self, attr: str) -> Any:  # `device` (the torch device) and the like
        return getattr(self.inner, attr)

    def prepare(self, fn: Callable[[], Any]) -> None:
        self.call.clear = self.clear_in_capture
        self.inner.prepare(fn)
        self.call.clear = True

    def for_tiny(self, fn: Callable[[], Any], calls: int) -> tuple[Any, str]:
        """mode="auto" on a tiny kernel: the device bench switches to (prepared here)."""
        self.call.clear = self.clear_in_capture
        tiny, how = self.inner.for_tiny(fn, calls)
        self.call.clear = True
        return _Phases(tiny, self.call, self.plan, self.clear_in_capture), how

    def rep(self, fn: Callable[[], Any]) -> Any:
        return self.inner.rep(fn)

    def reps(self, fn: Callable[[], Any], n: int) -> list[Any]:
        return list(self.inner.reps(fn, n))

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        return float(self.inner.run_for(fn, seconds))

    def probe_clock_mhz(self) -> float | None:
        out = self.inner.probe_clock_mhz()
        return None if out is None else float(out)

    def settings(self) -> dict[str, Any]:
        return {**self.inner.settings(), "dropin": dict(self.plan)}


# -- set_gpu_clock ---------------------------------------------------------------------


A100_SMS, A100_TENSOR_CORES_PER_SM, A100_FMA_PER_TENSOR_CORE = 108, 4, 256
A100_BUS_BYTES = 640  # 5120-bit HBM2e, two transfers a clock


class ClockRef(NamedTuple):
    """What triton's set_gpu_clock yields: reference peaks at the locked clocks, from an
    A100's figures whatever the GPU (as triton computes them): dense fp16 tensor-core
    TFLOP/s and DRAM GB/s (None when the memory clock is left alone)."""

    tflops: float
    gbps: float | None

    @classmethod
    def of(cls, sm_mhz: int, mem_mhz: int | None) -> ClockRef:
        per_clock = 2 * A100_SMS * A100_TENSOR_CORES_PER_SM * A100_FMA_PER_TENSOR_CORE
        gbps = 2 * A100_BUS_BYTES * mem_mhz / 1e3 if mem_mhz is not None else None
        return cls(per_clock * sm_mhz / 1e6, gbps)


@contextlib.contextmanager
def set_gpu_clock(
    ref_sm_clock: int = 1350,
    ref_mem_clock: int | None = 1215,
    *,
    gpus: Any = 0,
    backend: Any = None,
) -> Iterator[ClockRef]:
    """Lock the SM (and memory) clock of GPU 0, as triton.testing.set_gpu_clock does, and
    on exit put back exactly what was there before (triton resets to factory defaults and
    turns persistence mode off). Locks through gpuenv (the daemon when one serves the GPU,
    else locally as root: `nvidia-smi -lgc`/`-lmc`), so the lock shows in `gpuenv status`
    and a watchdog restores it if this process dies. `ref_mem_clock=None` leaves the
    memory clock alone (Hopper GPUs cannot lock it now). Refused under GPUENV_READONLY=1.
    """
    from gpuenv.backend import env_readonly
    from gpuenv.errors import ReadOnlyError
    from gpuenv.locking import acquire

    what = f"lock GPU clocks for set_gpu_clock (SM {ref_sm_clock} MHz" + (
        f", memory {ref_mem_clock} MHz)" if ref_mem_clock is not None else ")")
    if env_readonly():
        raise ReadOnlyError(what, gpu=gpus)
    if backend is not None and backend.readonly:
        raise ReadOnlyError(what, gpu=gpus, reason=getattr(backend, "reason", "read-only"))
    held = acquire(ref_sm_clock, mem=ref_mem_clock, gpus=gpus, backend=backend,
                   command="set_gpu_clock")  # fmt: skip
    for note in held.notes:
        log.info("set_gpu_clock: %s", note)
    try:
        yield ClockRef.of(ref_sm_clock, ref_mem_clock)
    finally:
        held.release()


# -- triton's autotuner ----------------------------------------------------------------

_patched: dict[str, Any] = {}  # what patch_autotuner replaced: name -> original


def patch_autotuner(**defaults: Any) -> None:
    """Make triton measure with these drop-ins: `triton.testing.do_bench` and
    `do_bench_cudagraph` (what `@triton.autotune` calls through the driver's benchmarker),
    and the autotuners made before this call (an Autotuner keeps the do_bench it first
    resolved). `defaults` go to every call (e.g. `condition="none"`). An autotuner given
    its own `do_bench=` keeps it. Undo with `unpatch_autotuner()`."""
    known = {*inspect.signature(do_bench).parameters,
             *inspect.signature(do_bench_cudagraph).parameters}  # fmt: skip
    unknown = sorted(set(defaults) - known)
    if unknown:
        raise ConfigError(f"patch_autotuner got unknown settings: {', '.join(unknown)}",
                          hint="pass keywords of do_bench or do_bench_cudagraph")  # fmt: skip
    try:
        import triton.runtime.autotuner as autotuner
        import triton.testing as testing
    except ImportError as err:
        raise ConfigError("patch_autotuner needs triton", hint="pip install triton") from err
    unpatch_autotuner()
    bench = _with_defaults(do_bench, defaults)
    graph = _with_defaults(do_bench_cudagraph, defaults)
    _patched.update(do_bench=testing.do_bench, do_bench_cudagraph=testing.do_bench_cudagraph,
                    ours=bench)  # fmt: skip
    testing.do_bench, testing.do_bench_cudagraph = bench, graph
    for attr, ours in (("do_bench", bench), ("do_bench_cudagraph", graph)):
        if attr in vars(autotuner):  # triton 2.x-3.0 imported them into the module
            _patched[f"module_{attr}"] = getattr(autotuner, attr)
            setattr(autotuner, attr, ours)
    cls = autotuner.Autotuner
    _patched["class_attr"] = vars(cls).get("do_bench", _ABSENT)
    cls.do_bench = _AutotunerDoBench()


def unpatch_autotuner() -> None:
    """Put back what patch_autotuner replaced (nothing when it was not called)."""
    if not _patched:
        return
    import triton.runtime.autotuner as autotuner
    import triton.testing as testing

    testing.do_bench = _patched["do_bench"]
    testing.do_bench_cudagraph = _patched["do_bench_cudagraph"]
    for attr in ("do_bench", "do_bench_cudagraph"):
        if f"module_{attr}" in _patched:
            setattr(autotuner, attr, _patched[f"module_{attr}"])
    if _patched["class_attr"] is _ABSENT:
        del autotuner.Autotuner.do_bench
    else:
        autotuner.Autotuner.do_bench = _patched["class_attr"]
    _patched.clear()


_ABSENT = object()


def _with_defaults(fn: Callable[..., Any], defaults: dict[str, Any]) -> Callable[..., Any]:
    """fn with `defaults` for the keywords it takes (do_bench_cudagraph has no warmup)."""
    mine = {k: v for k, v in defaults.items() if k in inspect.signature(fn).parameters}

    def bench(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{**mine, **kwargs})

    bench.__name__ = fn.__name__
    bench.__doc__ = fn.__doc__
    return bench


class _AutotunerDoBench:
    """`Autotuner.do_bench` while patched: the drop-in, unless the autotuner was given its
    own benchmarker. It reads what triton stored: `do_bench` set by the constructor
    (triton 3.0-3.2) or cached by its property (3.3 and later), else `_do_bench` (the
    user's, or None). A data descriptor, so it wins over that instance value; what it
    stores is triton's own function, so unpatching leaves every autotuner as it was."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        value = vars(obj).get("do_bench", _ABSENT)
        if value is _ABSENT:
            value = vars(obj).get("_do_bench")
        if value is None or value is _patched.get("do_bench") or value is _patched.get("ours"):
            return _patched.get("ours", value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        if value is _patched.get("ours"):
            value = _patched["do_bench"]  # resolved through the patch: remember triton's
        vars(obj)["do_bench"] = value


__all__ = [
    "ClockRef",
    "do_bench",
    "do_bench_cudagraph",
    "last_measurement",
    "measurements",
    "patch_autotuner",
    "set_gpu_clock",
    "unpatch_autotuner",
]
