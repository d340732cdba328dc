"""What an earlier bench() in this process learned, kept for the next one.

An autotuner or a test suite measures the same function again and again, and many
functions in one process: what does not change between two calls need not be found
out twice.

  per function (held weakly: a function that goes away takes its entries with it;
  one that cannot be weakly referenced, a bound method, is simply not remembered),
  then per GPU (`on=`: the clock its times are on, held weakly, and the GPU's UUID,
  never an index another GPU may hold): the launch cover its reps need (the host time
  of enqueueing it: CudaEvents.prepare), and that it was warmed up before on that GPU
  (the next warmup there need not be as long; what a first call loads, a CUDA module,
  is loaded per GPU, and another GPU's clock ramped, not this one's). A function
  warmed up on one simulated GPU was once warmed up short on the next.
  per process: whether CUPTI (torch.profiler) could be had. Only another profiler in
    the process or a tool attached to it (Nsight) holds it; the tool stays for the
    process's life, and a torch.profiler session of the process is checked at each
    call (`torch_profiler_active`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Hashable
from typing import Any

_BY_FN: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_PROCESS: dict[str, Any] = {}


def on_gpu(clock: Any, gpu: str | None) -> Hashable:
    """Which GPU an entry is about: the clock its times are on (REAL_CLOCK for every real
    GPU, each simulated GPU its own) and `gpu`, its UUID. The clock is held weakly: a
    clock that goes away (a simulated GPU's) matches nothing after, even where a new one
    takes its place in memory."""
    try:
        return (weakref.ref(clock), gpu)
    except TypeError:  # not weakly referable: nothing is carried (an id may be reused)
        return object()


def recall(fn: Any, key: Hashable, *, on: Hashable = None) -> Any:
    """What was remembered about `fn` under `key` (on the GPU `on_gpu` names), or None."""
    try:
        return _BY_FN.get(fn, {}).get((key, on))
    except TypeError:  # not weakly referable
        return None


def remember(fn: Any, key: Hashable, value: Any, *, on: Hashable = None) -> None:
    with contextlib.suppress(TypeError):  # not weakly referable: not remembered
        _BY_FN.setdefault(fn, {})[(key, on)] = value


def cupti_known() -> bool | None:
    """Whether CUPTI could be had in this process (None: not tried yet)."""
    return _PROCESS.get("cupti")


def cupti_found(works: bool) -> None:
    _PROCESS["cupti"] = works


def torch_profiler_active(torch: Any) -> bool:
    """A torch.profiler (or autograd profiler) session of this process is running now."""
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except (AttributeError, RuntimeError):  # an API that moved: the trial then finds out
        return True


def forget() -> None:
    """Forget everything (tests)."""
    _BY_FN.clear()
    _PROCESS.clear()


__all__ = [
    "cupti_found",
    "cupti_known",
    "forget",
    "on_gpu",
    "recall",
    "remember",
    "torch_profiler_active",
]
