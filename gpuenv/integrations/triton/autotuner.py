"""patch_autotuner: make triton's autotuner (and whatever calls triton.testing's do_bench)
measure with gpuenv's drop-ins, or (`rank=True`) choose its config with gpuenv.rank.

With `rank=True`, the first `Autotuner._bench` call of a sweep (triton's `run` calls it for
each config it kept, one after the other, and keeps the least) ranks all those configs at
once: each config's `kernel_call` is taken from triton's own `_bench` (through the
benchmarker it calls, here a stand-in that keeps the call instead of timing it), called
once (compiling it: a config triton's `_bench` would give inf, out of resources, gets inf
here too), then `gpuenv.rank` times them in interleaved rounds in one GPU state. Each
config's `_bench` then returns `[median, 20%, 80%]` of its calls' medians in ms, the
winner's lowest, so that triton's `min` keeps gpuenv's choice, a declared tie broken by
the order of the configs. The decision is kept (`rankings()`), and under `gpuenv run`
sent as one region of kind "autotune" (its table shows key, winner, tie, margins, state).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpuenv.errors import ConfigError
from gpuenv.integrations.triton.bench import do_bench, do_bench_cudagraph

_patched: dict[str, Any] = {}  # what patch_autotuner replaced: name -> original


def patch_autotuner(*, rank: bool = False, **defaults: Any) -> None:
    """Make triton measure with these drop-ins: `triton.testing.do_bench` and
    `do_bench_cudagraph` (what `@triton.autotune` calls through the driver's benchmarker),
    and the autotuners made before this call (an Autotuner keeps the do_bench it first
    resolved). `defaults` go to every call (e.g. `condition="none"`).

    `rank=True`: the autotuners' choice is gpuenv.rank's over their configs (the module
    docstring); `defaults` then go to rank (its keywords and BenchConfig's), and
    `triton.testing.do_bench` stays triton's for every other caller. An autotuner given its
    own `do_bench=` keeps it. Undo with `unpatch_autotuner()`."""
    from gpuenv import validate

    validate.boolean(rank, "rank")
    if rank:
        _check_rank_settings(defaults)
    else:
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
    _patched.update(do_bench=testing.do_bench, do_bench_cudagraph=testing.do_bench_cudagraph)
    if rank:  # triton's own benchmarkers, but for the calls a ranking collects
        bench = _with_defaults(testing.do_bench, {})
        graph = _with_defaults(testing.do_bench_cudagraph, {})
    else:
        bench = _with_defaults(do_bench, defaults)
        graph = _with_defaults(do_bench_cudagraph, defaults)
        testing.do_bench, testing.do_bench_cudagraph = bench, graph
    _patched["ours"] = bench
    for attr, ours in (("do_bench", bench), ("do_bench_cudagraph", graph)):
        if attr in vars(autotuner):  # triton 2.x-3.0 imported them into the module
            _patched[f"module_{attr}"] = getattr(autotuner, attr)
            setattr(autotuner, attr, ours)
    cls = autotuner.Autotuner
    _patched["class_attr"] = vars(cls).get("do_bench", _ABSENT)
    cls.do_bench = _AutotunerDoBench()
    if rank:
        _patched["class_bench"] = vars(cls).get("_bench", _ABSENT)
        _patched["rank_settings"] = dict(defaults)
        cls._bench = _ranked_bench(cls._bench)


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
    if "class_bench" in _patched:
        if _patched["class_bench"] is _ABSENT:
            del autotuner.Autotuner._bench
        else:
            autotuner.Autotuner._bench = _patched["class_bench"]
    _patched.clear()


_ABSENT = object()


def _with_defaults(fn: Callable[..., Any], defaults: dict[str, Any]) -> Callable[..., Any]:
    """fn with `defaults` for the keywords it takes (do_bench_cudagraph has no warmup).
    While a ranking collects the configs' calls (`_capture.calls`), the call is kept, not
    timed."""
    mine = {k: v for k, v in defaults.items() if k in inspect.signature(fn).parameters}

    def bench(*args: Any, **kwargs: Any) -> Any:
        kept = getattr(_capture, "calls", None)
        if kept is not None and args:
            kept.append(args[0])
            return [0.0] * len(kwargs.get("quantiles") or QUANTILES)
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


# -- rank=True: the choice is gpuenv.rank's ---------------------------------------------

QUANTILES = (0.5, 0.2, 0.8)  # what triton's _bench asks its benchmarker for
# what triton's _bench turns into inf (a config that cannot run): by name, as their modules
# moved between releases
TRITON_CONFIG_ERRORS = ("OutOfResources", "CompileTimeAssertionFailure", "PTXASError")
_RANKINGS: deque[Any] = deque(maxlen=256)
_capture = threading.local()  # .calls: kernel_calls kept instead of timed, while ranking


def rankings() -> list[Any]:
    """The decisions the patched autotuners made (at most 256), oldest first: each a dict
    of `kernel`, `key` (the arguments' values triton keys its cache on), `configs` and
    `ranking` (the `gpuenv.Ranking`)."""
    return list(_RANKINGS)


def _check_rank_settings(settings: dict[str, Any]) -> None:
    from gpuenv.timing.rank import unknown_settings

    unknown = unknown_settings(settings)
    if unknown:
        raise ConfigError(
            f"patch_autotuner(rank=True) got unknown settings: {', '.join(unknown)}",
            hint="pass keywords of gpuenv.rank or BenchConfig's fields",
        )


def _ranked_bench(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Autotuner._bench, answering from a ranking of the whole sweep."""

    @functools.wraps(orig)
    def _bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
        sweep = vars(self).get("_gpuenv_sweep")
        if sweep is None or sweep.key != _key(self, args, meta) or config not in sweep.answers:
            configs = _sweep_configs(self, config, meta)
            calls = _kernel_calls(orig, self, configs, args, meta)
            if calls is None:  # the autotuner's own benchmarker: triton's timing
                return orig(self, *args, config=config, **meta)
            sweep = _Sweep.rank(self, configs, calls, args, meta)
            vars(self)["_gpuenv_sweep"] = sweep
        return sweep.answers.pop(config)

    _bench.__gpuenv_rank__ = True  # type: ignore[attr-defined]
    return _bench


def _sweep_configs(tuner: Any, first: Any, meta: dict[str, Any]) -> list[Any]:
    """The configs triton's run is about to time, from `first` on: what prune_configs
    gives (run called it just before), else every config of the autotuner."""
    configs: list[Any] = list(getattr(tuner, "configs", None) or [first])
    with contextlib.suppress(Exception):
        configs = list(tuner.prune_configs(meta))
    return configs[configs.index(first) :] if first in configs else [first]


def _kernel_calls(
    orig: Callable[..., Any], tuner: Any, configs: list[Any], args: tuple[Any, ...], meta: Any
) -> list[Any] | None:
    """Each config's kernel_call as triton's _bench builds it (None where the autotuner has a
    benchmarker of its own, which never hands the call to us)."""
    out = []
    for config in configs:
        _capture.calls = []
        try:
            orig(tuner, *args, config=config, **meta)
            got = _capture.calls
        finally:
            _capture.calls = None
        if len(got) != 1:
            return None
        out.append(got[0])
    return out


@dataclasses.dataclass
class _Sweep:
    """One ranking of a sweep: what each config's _bench call returns."""

    key: list[str]
    answers: dict[Any, list[float]]

    @classmethod
    def rank(cls, tuner: Any, configs: list[Any], calls: list[Any], args: Any, meta: Any) -> _Sweep:
        from gpuenv.run.autoregions import autotune_region, config_labels
        from gpuenv.timing.decision import decision_record
        from gpuenv.timing.rank import prepare, rank

        names = [_config_name(config_labels(c), i) for i, c in enumerate(configs)]
        cands, answers = {}, {}
        opened = prepare(**_patched.get("rank_settings", {}))  # the sampler starts meanwhile
        try:
            for name, config, call in zip(names, configs, calls, strict=True):
                try:
                    call()  # compiles it, and finds what cannot run
                except Exception as err:
                    if type(err).__name__ not in TRITON_CONFIG_ERRORS:
                        raise
                    answers[config] = [math.inf] * 3
                    continue
                cands[name] = call
        finally:
            opened()
        fn = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
        kernel = str(getattr(fn, "__name__", "kernel"))
        key = _key(tuner, args, meta)
        if not cands:
            return cls(key, answers)
        with autotune_region(kernel, key) as region:
            r = rank(cands, **_patched.get("rank_settings", {}))
            if region is not None:
                region.end_meta = {"autotune": decision_record(kernel, key, r)}
        _RANKINGS.append({"kernel": kernel, "key": key, "configs": names, "ranking": r})
        times = r.times_s  # the winner's the least: triton's min keeps gpuenv's choice
        for name, config in zip(names, configs, strict=True):
            if name in cands:
                ms = [t * 1e3 for t in r.calls_s(name)]
                answers[config] = [times[name] * 1e3, min(ms), max(ms)]
        return cls(key, answers)


def _config_name(labels: dict[str, Any], i: int) -> str:
    text = " ".join(f"{k}={v}" for k, v in labels.items())
    return text or f"config {i}"


def _key(tuner: Any, args: tuple[Any, ...], meta: dict[str, Any]) -> list[str]:
    """The values triton keys its autotune cache on (its `key=` arguments), as text."""
    names = list(getattr(tuner, "arg_names", None) or [])
    given = {**dict(zip(names, args, strict=False)), **meta}
    return [f"{k}={given[k]}" for k in getattr(tuner, "keys", None) or () if k in given]


__all__ = ["QUANTILES", "TRITON_CONFIG_ERRORS", "patch_autotuner", "rankings", "unpatch_autotuner"]
