"""patch_autotuner: make triton's autotuner (and whatever calls triton.testing's do_bench)
measure with gpuenv's drop-ins."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from gpuenv.errors import ConfigError
from gpuenv.integrations.triton.bench import do_bench, do_bench_cudagraph

_patched: dict[str, Any] = {}  # what patch_autotuner replaced: name -> original


def patch_autotuner(**defaults: Any) -> None:
    """Make triton measure with these drop-ins: `triton.testing.do_bench` and
    `do_bench_cudagraph` (what `@triton.autotune` calls through the driver's benchmarker),
    and the autotuners made before this call (an Autotuner keeps the do_bench it first
    resolved). `defaults` go to every call (e.g. `condition="none"`). An autotuner given
    its own `do_bench=` keeps it. Undo with `unpatch_autotuner()`."""
    known = {
        *inspect.signature(do_bench).parameters,
        *inspect.signature(do_bench_cudagraph).parameters,
    }
    unknown = sorted(set(defaults) - known)
    if unknown:
        raise ConfigError(
            f"patch_autotuner got unknown settings: {', '.join(unknown)}",
            hint="pass keywords of do_bench or do_bench_cudagraph",
        )
    try:
        import triton.runtime.autotuner as autotuner
        import triton.testing as testing
    except ImportError as err:
        raise ConfigError("patch_autotuner needs triton", hint="pip install triton") from err
    unpatch_autotuner()
    bench = _with_defaults(do_bench, defaults)
    graph = _with_defaults(do_bench_cudagraph, defaults)
    _patched.update(
        do_bench=testing.do_bench, do_bench_cudagraph=testing.do_bench_cudagraph, ours=bench
    )
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


__all__ = ["patch_autotuner", "unpatch_autotuner"]
