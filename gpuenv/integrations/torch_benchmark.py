"""torch.utils.benchmark with GPU telemetry in `Measurement.metadata["gpuenv"]`.

    import torch.utils.benchmark as tb
    from gpuenv.integrations.torch_benchmark import blocked_autorange
    m = blocked_autorange(tb.Timer("a @ b", globals={"a": a, "b": b}))
    print(m.median, m.metadata["gpuenv"]["telemetry"], m.metadata["gpuenv"]["verdict"])

or `Timer(...)`, a torch.utils.benchmark.Timer whose `timeit`,
`blocked_autorange` and `adaptive_autorange` do the same. The telemetry covers
the whole call (torch's Measurement has no per-block timestamps): SM clock,
power, temperature, reasons and time under each, one summary per sampled GPU;
the findings and verdict judge that region.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def observe(
    run: Callable[[], T],
    *,
    session: Any = None,
    backend: Any = None,
    gpus: str | int | Sequence[str | int] | None = None,
) -> tuple[T, dict[str, Any]]:
    """Run `run()` under the sampler; return its result and the telemetry record
    (JSON values): {"gpus", "telemetry": [Window dicts], "findings", "verdict", "summary"}.

    Uses the session's sampler when given, else opens the backend (read-only) and
    samples `gpus` (default: all) for the duration. If NVML cannot be opened, the
    record says so in "error" and `run` still runs.
    """
    from gpuenv.judge import Evidence, read_facts

    own = None
    if session is not None:
        sampler, be, gpu_list = session.sampler, session.backend, list(session.gpus)
        facts = dict(getattr(session, "facts", {}))
    else:
        from gpuenv.backend import open_backend
        from gpuenv.devices import select_gpus
        from gpuenv.errors import BackendError
        from gpuenv.telemetry import Sampler

        try:
            be = backend if backend is not None else open_backend(readonly=True)
            gpu_list = select_gpus(be, gpus)
        except BackendError as err:
            return run(), {"error": str(err)}
        facts = read_facts(be, gpu_list)
        own = sampler = Sampler(be, gpu_list)
        sampler.start()
    try:
        t0 = sampler.mark()
        result = run()
        t1 = sampler.mark()
        evidence = Evidence.sampled(sampler, [(t0, t1)], gpu_list)
    finally:
        if own is not None:
            own.stop()
            if backend is None:
                be.close()
    return result, record(evidence, t1 - t0, facts=facts, session=session)


def record(evidence: Any, seconds: float, *, facts: dict[int, Any], session: Any = None
           ) -> dict[str, Any]:  # fmt: skip
    """The judged telemetry record of one timed call (what `observe` attaches): the call is
    one rep for gpuenv.judge, under the session's policy and verdict config."""
    from gpuenv.judge import judge
    from gpuenv.verdict import DEFAULT_CONFIG

    policy = getattr(session, "policy", "annotate") if session is not None else "annotate"
    if policy == "retry":
        policy = "reject"  # torch's Timer ran the reps: they cannot be re-run from here
    m = judge(
        "torch.utils.benchmark", [seconds], evidence, facts=facts, policy=policy,
        config=getattr(session, "config", None) or DEFAULT_CONFIG,
    )  # fmt: skip
    return {
        "gpus": list(evidence.gpus),
        "telemetry": [w.to_dict() for w in m.windows],
        "findings": [f.to_dict() for f in m.findings],
        "verdict": m.verdict,
        "summary": " | ".join(w.summary() for w in m.windows),
    }


def _annotated(run: Callable[[], Any], **kwargs: Any) -> Any:
    measurement, record = observe(run, **kwargs)
    meta = dict(getattr(measurement, "metadata", None) or {})
    meta["gpuenv"] = record
    measurement.metadata = meta
    return measurement


def blocked_autorange(timer: Any, min_run_time: float = 0.2, **kwargs: Any) -> Any:
    """`timer.blocked_autorange(min_run_time=...)` with telemetry in its metadata.
    kwargs: session, backend, gpus (see `observe`)."""
    return _annotated(lambda: timer.blocked_autorange(min_run_time=min_run_time), **kwargs)


def adaptive_autorange(timer: Any, threshold: float = 0.1, *, max_run_time: float = 10.0,
                       **kwargs: Any) -> Any:
    """`timer.adaptive_autorange(...)` with telemetry in its metadata."""
    return _annotated(
        lambda: timer.adaptive_autorange(threshold=threshold, max_run_time=max_run_time), **kwargs
    )


def timeit(timer: Any, number: int = 1_000_000, **kwargs: Any) -> Any:
    """`timer.timeit(number)` with telemetry in its metadata."""
    return _annotated(lambda: timer.timeit(number), **kwargs)


def Timer(*args: Any, gpuenv_session: Any = None, gpuenv_gpus: Any = None,
          **kwargs: Any) -> Any:
    """A torch.utils.benchmark.Timer whose measurements carry telemetry.

    Same arguments as torch's Timer, plus `gpuenv_session` / `gpuenv_gpus`.
    """
    import torch.utils.benchmark as tb

    extra = {"session": gpuenv_session, "gpus": gpuenv_gpus}

    class _Timer(tb.Timer):  # named as the class it stands in for
        def timeit(self, number: int = 1_000_000) -> Any:
            return _annotated(lambda: super(_Timer, self).timeit(number), **extra)

        def blocked_autorange(self, callback: Any = None, min_run_time: float = 0.2) -> Any:
            return _annotated(
                lambda: super(_Timer, self).blocked_autorange(
                    callback=callback, min_run_time=min_run_time), **extra)

        def adaptive_autorange(self, threshold: float = 0.1, *, min_run_time: float = 0.01,
                               max_run_time: float = 10.0, callback: Any = None) -> Any:
            return _annotated(
                lambda: super(_Timer, self).adaptive_autorange(
                    threshold=threshold, min_run_time=min_run_time, max_run_time=max_run_time,
                    callback=callback), **extra)

    return _Timer(*args, **kwargs)


__all__ = ["Timer", "adaptive_autorange", "blocked_autorange", "observe", "timeit"]
