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

Each call is one measurement: its own telemetry window over the whole call (torch's
Measurement has no per-block timestamps), judged by gpuenv.judge, named by the
Timer's label / sub_label / description (`metadata["gpuenv"]["name"]`), with a
one-line `note`. All of it is plain values, and a flagged call's description
carries its verdict (`bf16 [gpuenv: annotated, power_cap]`): torch's own Compare
keys its columns on the description and drops metadata, so its table shows which
cells to distrust, and a pickled Measurement is torch's own class: it loads and
compares where gpuenv is not installed. An ok call keeps its description. torch is
imported only when `Timer`, `Measurement` or `Compare` is first used
(gpuenv.integrations.torch_classes); the records are gpuenv.integrations.torch_record's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gpuenv._lazy import lazy_exports
from gpuenv.integrations.torch_record import (
    marked_description,
    merge_records,
    note,
    observe,
    record,
    task_name,
)


def _annotated(run: Callable[[], Any], **kwargs: Any) -> Any:
    """Run torch's timing call under the sampler; its Measurement as gpuenv's subclass with
    the judged record in `metadata["gpuenv"]`."""
    measurement, rec = observe(run, **kwargs)
    tb = sys.modules.get("torch.utils.benchmark")
    if tb is not None and isinstance(measurement, tb.Measurement):
        from gpuenv.integrations.torch_classes import Measurement

        return Measurement.wrap(measurement, rec)
    rec["name"] = task_name(getattr(measurement, "task_spec", None))
    measurement.metadata = {**(getattr(measurement, "metadata", None) or {}), "gpuenv": rec}
    return measurement  # not torch's (a stand-in in tests): annotated in place


def blocked_autorange(
    timer: Any,
    callback: Callable[[int, float], Any] | None = None,
    min_run_time: float = 0.2,
    **kwargs: Any,
) -> Any:
    """`timer.blocked_autorange(callback, min_run_time)` with telemetry in its metadata.
    kwargs: session, backend, gpus (see `observe`)."""
    return _annotated(
        lambda: timer.blocked_autorange(callback=callback, min_run_time=min_run_time), **kwargs
    )


def adaptive_autorange(
    timer: Any,
    threshold: float = 0.1,
    *,
    min_run_time: float = 0.01,
    max_run_time: float = 10.0,
    callback: Callable[[int, float], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """`timer.adaptive_autorange(...)` (torch's keywords) with telemetry in its metadata."""
    return _annotated(
        lambda: timer.adaptive_autorange(
            threshold=threshold,
            min_run_time=min_run_time,
            max_run_time=max_run_time,
            callback=callback,
        ),
        **kwargs,
    )


def timeit(timer: Any, number: int = 1_000_000, **kwargs: Any) -> Any:
    """`timer.timeit(number)` with telemetry in its metadata."""
    return _annotated(lambda: timer.timeit(number), **kwargs)


# Timer, Measurement and Compare subclass torch's: defined on first use, so importing
# this module (and gpuenv) never imports torch
_TORCH_CLASSES = dict.fromkeys(
    ("Compare", "Measurement", "Timer"), "gpuenv.integrations.torch_classes"
)
__getattr__, __dir__ = lazy_exports(__name__, _TORCH_CLASSES, globals())


# Compare, Measurement and Timer (module __getattr__) are left out: `import *` must not
# import torch
__all__ = [
    "adaptive_autorange",
    "blocked_autorange",
    "marked_description",
    "merge_records",
    "note",
    "observe",
    "record",
    "task_name",
    "timeit",
]
