"""A drop-in for `triton.testing.do_bench` that also records GPU telemetry.

    from gpuenv.integrations.triton import do_bench
    ms = do_bench(lambda: a @ b)                       # same call, same return value
    ms, lo, hi = do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    m = last_measurement()                             # the gpuenv Measurement behind it
    print(m.telemetry, m.findings, m.verdict)

Like triton's, it estimates the time of one call, then runs about `warmup` ms of
warmup and `rep` ms of repetitions with an L2 flush before each, timed with CUDA
events. Unlike it, warmup continues until times and clocks stop trending (at
least `warmup` ms' worth), the flush is sized from the device's L2, launch
latency is kept out of the events, and every rep carries its telemetry window.
Keyword-only extras: `name`, `session` (a gpuenv.stable() session: its mode,
policy and results), `backend`, `device`, `mode`, `condition`, `output`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gpuenv import stats
from gpuenv.errors import ConfigError

RETURN_MODES = ("min", "max", "mean", "median", "all")
_recent: deque[Any] = deque(maxlen=256)


def do_bench(
    fn: Callable[[], Any],
    warmup: float = 25,
    rep: float = 100,
    grad_to_none: Sequence[Any] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
    *,
    name: str | None = None,
    session: Any = None,
    backend: Any = None,
    device: Any = None,
    mode: str = "events",
    condition: str | None = None,
    output: Any = None,
) -> float | list[float]:
    """Time `fn` in milliseconds, as triton.testing.do_bench does (see the module docstring).

    Returns the quantiles of the rep times when `quantiles` is given (a list, or
    one float for one quantile), else per `return_mode`: "min", "max", "mean",
    "median" (a float) or "all" (every rep's time, a list).
    """
    from gpuenv import timing

    if return_mode not in RETURN_MODES:
        raise ConfigError(f"return_mode {return_mode!r} is not one of {', '.join(RETURN_MODES)}")
    if quantiles is not None and not all(0.0 <= q <= 1.0 for q in quantiles):
        raise ConfigError(f"quantiles must lie in [0, 1], got {list(quantiles)}")

    call = fn
    if grad_to_none:
        def call() -> Any:  # triton clears the gradients before every rep, as here
            for x in grad_to_none:
                x.grad = None
            return fn()

    # triton's budget: estimate one call, then ~rep ms worth of reps
    if device is None and session is None and (backend is None or backend.workload is None):
        device = timing.cuda_device(mode)
    est = _estimate_s(call, session=session, backend=backend, device=device)
    n_warmup = max(1, int(warmup / 1e3 / est))
    n_rep = max(1, int(rep / 1e3 / est))
    m = timing.bench(
        call,
        name=name or getattr(fn, "__name__", None) or "do_bench",
        session=session,
        backend=backend,
        device=device,
        mode=mode,
        reps=n_rep,
        warmup="auto",
        warmup_max_s=max(2 * warmup / 1e3, n_warmup * est),
        condition=condition,
        output=output,
    )
    _recent.append(m)
    times_ms = [t * 1e3 for t in m.kept_times_s] or [t * 1e3 for t in m.times_s]
    if quantiles is not None:
        out = [stats.quantile(times_ms, q) for q in quantiles]
        return out[0] if len(out) == 1 else out
    if return_mode == "all":
        return times_ms
    if return_mode == "mean":
        return math.fsum(times_ms) / len(times_ms)
    if return_mode == "min":
        return min(times_ms)
    if return_mode == "max":
        return max(times_ms)
    return stats.median(times_ms)


def _estimate_s(call: Callable[[], Any], *, session: Any, backend: Any, device: Any) -> float:
    """Time of one call from 5 calls (triton's estimate), on the device bench will use."""
    if device is None:
        from gpuenv import timing

        be = session.backend if session is not None else backend
        if be is not None and be.workload is not None:
            gpu = session.gpus[0] if session is not None else 0
            device = timing.SimDevice(be, gpu, rep_probe_cycles=0)
        else:
            device = timing.cuda_device("events")
    call()  # the first call pays set-up: not part of the estimate
    times = [device.rep(call).time_s for _ in range(5)]
    return max(stats.median(times), 1e-7)


def last_measurement() -> Any:
    """The gpuenv Measurement of the latest do_bench call (None before the first)."""
    return _recent[-1] if _recent else None


def measurements() -> list[Any]:
    """The Measurements of the recent do_bench calls (at most 256), oldest first."""
    return list(_recent)


__all__ = ["do_bench", "last_measurement", "measurements"]
