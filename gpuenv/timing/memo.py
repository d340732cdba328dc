"""What CUDA timing learned in this process, kept for the next call: facts of the process
and its CUDA device, never of the GPU's state (what conditioning learns, a warmup, a state
reference, the cap's onset, is its owner's: gpuenv.conditioning.memory).

  per function (held weakly, gpuenv.conditioning.memory.ByFunction): the launch cover its
    reps need (the host time of enqueueing it: CudaEvents.prepare);
  per process: whether CUPTI (torch.profiler) could be had. Only another profiler in
    the process or a tool attached to it (Nsight) holds it; the tool stays for the
    process's life, and a torch.profiler session of the process is checked at each
    call (`torch_profiler_active`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from gpuenv.conditioning.memory import ByFunction, process_memory

_BY_FN = ByFunction()
_PROCESS: dict[str, Any] = {}


def recall(fn: Any, key: Hashable, *, on: Hashable = None) -> Any:
    """What was remembered about `fn` under `key` (on the GPU `on` names), or None."""
    return _BY_FN.recall(fn, key, on=on)


def remember(fn: Any, key: Hashable, value: Any, *, on: Hashable = None) -> None:
    _BY_FN.remember(fn, key, value, on=on)


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
    """Forget everything this process learned, conditioning's process memory too (tests)."""
    _BY_FN.clear()
    _PROCESS.clear()
    process_memory().forget()


__all__ = [
    "cupti_found",
    "cupti_known",
    "forget",
    "recall",
    "remember",
    "torch_profiler_active",
]
