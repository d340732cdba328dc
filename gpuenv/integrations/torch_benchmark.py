"""torch.utils.benchmark with GPU telemetry in `Measurement.metadata["gpuenv"]`.

    from gpuenv.integrations.torch_benchmark import Compare, Timer
    t = Timer("a @ b", globals={"a": a, "b": b}, label="mm", description="bf16")
    m = t.blocked_autorange(min_run_time=1.0)      # torch's signature and Measurement
    print(m.median, m.metadata["gpuenv"]["verdict"], m.metadata["gpuenv"]["summary"])
    Compare([m, t.blocked_autorange()]).print()    # torch's table + gpuenv's row notes

`Timer` is a subclass of torch.utils.benchmark.Timer (same constructor, plus
`gpuenv_session=` and `gpuenv_gpus=`); its `timeit`, `blocked_autorange` and
`adaptive_autorange` keep torch's signatures and return `Measurement`, a subclass
of torch's whose `merge` keeps gpuenv's record (torch's own `merge` drops every
metadata: "it might differ between replicates"): the replicates' telemetry merged
per GPU, their findings kept, the worst verdict. `Compare`, a subclass of torch's,
merges that way and adds a note under each table: each cell's verdict and
telemetry. The functions `timeit(timer, ...)`, `blocked_autorange(timer, ...)` and
`adaptive_autorange(timer, ...)` do the same for a plain torch Timer.

The telemetry covers the whole call (torch's Measurement has no per-block
timestamps): SM clock, power, temperature, reasons and time under each, one
summary per sampled GPU; gpuenv.judge judges that region. torch is imported only
when `Timer`, `Measurement` or `Compare` is first used (gpuenv.integrations.torch_classes).
"""

from __future__ import annotations

import sys
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


VERDICT_ORDER = ("ok", "annotated", "rejected")


def merge_records(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record from several replicates' (torch's `merge` of one task): per GPU the
    telemetry merged (gpuenv.telemetry's one merge), every finding kept with the replicate
    it came from, the worst verdict."""
    from gpuenv.telemetry import Window
    from gpuenv.telemetry.window import merge_windows

    if len(records) == 1:
        return dict(records[0])
    errors = [r["error"] for r in records if "error" in r]
    judged = [r for r in records if "error" not in r]
    if not judged:
        return {"error": errors[0], "replicates": len(records)}
    by_gpu: dict[int, list[Any]] = {}
    for r in judged:
        for w in r.get("telemetry", []):
            by_gpu.setdefault(int(w["gpu"]), []).append(Window.from_dict(w))
    windows = [merge_windows(sorted(ws, key=lambda w: w.t0)) for _, ws in sorted(by_gpu.items())]
    findings = [{**f, "replicate": i} for i, r in enumerate(judged) for f in r.get("findings", [])]
    out: dict[str, Any] = {
        "gpus": sorted({g for r in judged for g in r.get("gpus", [])}),
        "telemetry": [w.to_dict() for w in windows],
        "findings": findings,
        "verdict": max((r.get("verdict", "ok") for r in judged), key=VERDICT_ORDER.index),
        "summary": " | ".join(w.summary() for w in windows),
        "replicates": len(records),
    }
    if errors:
        out["errors"] = errors
    return out


def note(record: dict[str, Any] | None) -> str:
    """A Compare row note: 'annotated (power_cap): GPU 0 1.2 s; SM 1380 MHz; ...'."""
    if not record:
        return "no gpuenv record"
    if "error" in record:
        return f"no telemetry: {record['error']}"
    kinds = sorted({f["kind"] for f in record.get("findings", [])})
    head = record.get("verdict", "?") + (f" ({', '.join(kinds)})" if kinds else "")
    return f"{head}: {record.get('summary', '')}"


def _annotated(run: Callable[[], Any], **kwargs: Any) -> Any:
    """Run torch's timing call under the sampler; its Measurement as gpuenv's subclass with
    the judged record in `metadata["gpuenv"]`."""
    measurement, rec = observe(run, **kwargs)
    tb = sys.modules.get("torch.utils.benchmark")
    if tb is not None and isinstance(measurement, tb.Measurement):
        from gpuenv.integrations.torch_classes import Measurement

        return Measurement.wrap(measurement, rec)
    measurement.metadata = {**(getattr(measurement, "metadata", None) or {}), "gpuenv": rec}
    return measurement  # not torch's (a stand-in in tests): annotated in place


def blocked_autorange(timer: Any, callback: Callable[[int, float], Any] | None = None,
                      min_run_time: float = 0.2, **kwargs: Any) -> Any:
    """`timer.blocked_autorange(callback, min_run_time)` with telemetry in its metadata.
    kwargs: session, backend, gpus (see `observe`)."""
    return _annotated(
        lambda: timer.blocked_autorange(callback=callback, min_run_time=min_run_time), **kwargs
    )


def adaptive_autorange(timer: Any, threshold: float = 0.1, *, min_run_time: float = 0.01,
                       max_run_time: float = 10.0,
                       callback: Callable[[int, float], Any] | None = None,
                       **kwargs: Any) -> Any:  # fmt: skip
    """`timer.adaptive_autorange(...)` (torch's keywords) with telemetry in its metadata."""
    return _annotated(
        lambda: timer.adaptive_autorange(threshold=threshold, min_run_time=min_run_time,
                                         max_run_time=max_run_time, callback=callback),
        **kwargs,
    )  # fmt: skip


def timeit(timer: Any, number: int = 1_000_000, **kwargs: Any) -> Any:
    """`timer.timeit(number)` with telemetry in its metadata."""
    return _annotated(lambda: timer.timeit(number), **kwargs)


def __getattr__(name: str) -> Any:
    # Timer, Measurement and Compare subclass torch's: defined on first use, so importing
    # this module (and gpuenv) never imports torch
    if name in ("Compare", "Measurement", "Timer"):
        from gpuenv.integrations import torch_classes

        return getattr(torch_classes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Compare, Measurement and Timer (module __getattr__) are left out: `import *` must not
# import torch
__all__ = [
    "adaptive_autorange",
    "blocked_autorange",
    "merge_records",
    "note",
    "observe",
    "record",
    "timeit",
]
