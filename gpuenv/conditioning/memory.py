"""What conditioning learned from earlier measurements: one `Memory` per owner.

A `stable()` session owns one (its `Conditioner`'s): what its measurements learn stays in
the session, so two sessions in one process, or a `gpuenv.bench` after a session, measure
as each would alone. A `gpuenv.bench` outside a session, and the do_bench drop-in, share
the process's (`process_memory()`): an autotuner times the same function again and again,
and what does not change between two calls need not be found out twice. Tests reset it
with `process_memory().forget()` (`gpuenv.timing.memo.forget()` does too).

What is kept, per function (held weakly: a function that goes away takes its entries
with it; one that cannot be weakly referenced, a bound method, is simply not remembered),
then per GPU (`gpu_key`: the clock its times are on, held weakly, and the GPU's UUID, never
an index another GPU may hold):
  - that fn was warmed up on that GPU (the next warmup there need not be as long: what a
    first call loads, a CUDA module, is loaded per GPU);
  - fn's state reference: its time and probed clock on a GPU found ready, and whether it is
    light (gpuenv.timing.stateprobe);
  - the cap's onset: how long fn may work unbroken before the cap meets it
    (conditioning.Bursts, `burst_learn`);
  - how fn's time moves with the temperature (`sensitivity`: a session waits for the chip
    to cool only as long as that asks).
And per GPU: where the burst schedule's power filter was left (`filter_left`), so the next
measurement, a moment later, starts from it rather than from the 1 s average that lags it;
and the cap's onset as that GPU's heavy kernels met it (`cap_onset`): how soon the cap
comes on is the GPU's (its power controller, its limit), so a heavy function measured there
for the first time starts from what the others learned, not from the schedule's starting
bound (`ConditionConfig.heavy_run_s`, set on the H100).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Hashable
from typing import Any

from gpuenv.conditioning.temperature import Sensitivity
from gpuenv.timebase import Clock


def gpu_key(clock: Any, gpu: str | None) -> Hashable:
    """Which GPU an entry is about: the clock its times are on (REAL_CLOCK for every real
    GPU, each simulated GPU its own) and `gpu`, its UUID. The clock is held weakly: a
    clock that goes away (a simulated GPU's) matches nothing after, even where a new one
    takes its place in memory."""
    try:
        return (weakref.ref(clock), gpu)
    except TypeError:  # not weakly referable: nothing is carried (an id may be reused)
        return object()


class ByFunction:
    """Values kept per function (weakly) and key, each under the GPU `gpu_key` names."""

    def __init__(self) -> None:
        self._by_fn: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def recall(self, fn: Any, key: Hashable, *, on: Hashable = None) -> Any:
        """What was remembered about `fn` under `key` (on the GPU `on` names), or None."""
        try:
            return self._by_fn.get(fn, {}).get((key, on))
        except TypeError:  # not weakly referable
            return None

    def remember(self, fn: Any, key: Hashable, value: Any, *, on: Hashable = None) -> None:
        with contextlib.suppress(TypeError):  # not weakly referable: not remembered
            self._by_fn.setdefault(fn, {})[(key, on)] = value

    def keys(self, fn: Any) -> list[Hashable]:
        """The keys remembered about `fn` (on any GPU)."""
        try:
            entries = self._by_fn.get(fn, {})
        except TypeError:
            return []
        return [entry[0] for entry in entries if isinstance(entry, tuple)]

    def __len__(self) -> int:
        return len(self._by_fn)

    def clear(self) -> None:
        self._by_fn.clear()


class Memory:
    """What one owner's measurements learned (the module docstring)."""

    def __init__(self) -> None:
        self.by_fn = ByFunction()
        self.sensitivity = Sensitivity()
        self._filter: weakref.WeakKeyDictionary[Clock, dict[str, tuple[float, float, float]]] = (
            weakref.WeakKeyDictionary()
        )
        self._onset: dict[Hashable, float] = {}

    def warmed(self, fn: Any, on: Hashable) -> bool:
        """fn was warmed up on this GPU before."""
        return self.by_fn.recall(fn, "warmed", on=on) is not None

    def remember_warmed(self, fn: Any, on: Hashable, median_s: float | None) -> None:
        self.by_fn.remember(fn, "warmed", median_s if median_s is not None else 0.0, on=on)

    def state_reference(
        self, fn: Any, kind: str, on: Hashable
    ) -> tuple[float, float, bool | None] | None:
        """fn's (time, probed clock, light) on a GPU found ready, timed by `kind`."""
        ref = self.by_fn.recall(fn, ("state", kind), on=on)
        return (ref[0], ref[1], ref[2]) if ref is not None else None

    def remember_state_reference(
        self, fn: Any, kind: str, on: Hashable, ref: tuple[float, float, bool | None]
    ) -> None:
        self.by_fn.remember(fn, ("state", kind), ref, on=on)

    def burst_limit(self, fn: Any, kind: str, on: Hashable) -> float | None:
        """The longest unbroken work fn's burst measurements let through before the cap met
        it (None: none met it yet)."""
        limit = self.by_fn.recall(fn, ("burst_limit", kind), on=on)
        return float(limit) if limit is not None else None

    def remember_burst_limit(self, fn: Any, kind: str, on: Hashable, limit_s: float) -> None:
        self.by_fn.remember(fn, ("burst_limit", kind), limit_s, on=on)

    def cap_onset(self, on: Hashable) -> float | None:
        """The longest unbroken heavy work the GPU `on` names may do before a rest: half the
        shortest stretch of work any function's burst measurement met the cap in there
        (None: the cap met none yet)."""
        return self._onset.get(on) if on is not None else None

    def remember_cap_onset(self, on: Hashable, limit_s: float) -> None:
        """A burst measurement on `on` met the cap and held its work to `limit_s`: the
        shortest such limit is the GPU's."""
        if on is not None:
            known = self._onset.get(on)
            self._onset[on] = limit_s if known is None else min(known, limit_s)

    def filter_left(self, clock: Clock) -> dict[str, tuple[float, float, float]]:
        """Where the power filter of each GPU (by UUID) was left, on `clock`'s time: (clock
        time, watts, watts at rest). A time means nothing on another clock: each simulated
        GPU's virtual one keeps its own."""
        try:
            return self._filter.setdefault(clock, {})
        except TypeError:  # a clock that cannot be weakly referenced: nothing carried
            return {}

    def forget(self) -> None:
        """Forget everything learned (tests; a process default that must start afresh)."""
        self.by_fn.clear()
        self.sensitivity = Sensitivity()
        self._filter.clear()
        self._onset.clear()


_PROCESS = Memory()


def process_memory() -> Memory:
    """The memory `gpuenv.bench` outside a session, and the do_bench drop-in, share."""
    return _PROCESS


__all__ = ["ByFunction", "Memory", "gpu_key", "process_memory"]
