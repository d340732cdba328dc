"""Automatic regions: each measurement an unmodified Python benchmark makes is a region.

Under `gpuenv run`, each call a Python command makes to

    do_bench  triton.testing.do_bench, do_bench_cudagraph
    timer     torch.utils.benchmark.Timer's timeit, blocked_autorange and
              adaptive_autorange
    pytest    each pytest-benchmark benchmark (`benchmark(fn)`, `benchmark.pedantic`)

is a region, with no change to its code, and each call is its own measurement
(window, findings, verdict): a sweep's 32 calls from one line are 32
measurements, never 32 reps of one, so no finding compares one call with
another. A call is named by what distinguishes it:

    perf_report   "<plot_name> size=4096 provider=triton": the point of a
                  triton.testing.perf_report benchmark that called the function
                  which called do_bench (x_names' values and the line_arg's)
    autotune      "<kernel> BLOCK_M=128 num_warps=8 num_stages=3": the config the
                  triton autotuner benchmarks
    Timer         "Timer <label / sub_label / description>", else "Timer <stmt>"
    pytest        the test id, "test_mm.py::test_mm[64]"
    otherwise     "do_bench bench.py:12", the line the user wrote

and carries its site (`do_bench bench.py:12`: the kind and the first calling
frame outside triton, torch, gpuenv and pytest's machinery; "(autotune)" when the
autotuner made it), its labels and the time it returned, as facts on its begin
and end edges (gpuenv/run/region.py). The parent numbers calls whose names repeat
(`#2`) and groups calls by site for display only (report.py). The runner puts
gpuenv/run/childsite on the child's PYTHONPATH; its sitecustomize installs an
import hook that, when the command itself imports one of `MODULES`, calls
`patch()` here to wrap those functions (and triton's Mark._run, to know which
perf_report run a call belongs to). A command that imports none of them imports
nothing of gpuenv's.

The wrappers return exactly what the originals return and raise what they
raise (a call that raises ends its region with "x": discarded, not a
measurement); a name that cannot be made leaves the call unmarked.

Nesting: only the outermost automatic region of a thread is marked. A Timer
whose statement launches an autotuned kernel is one region (the Timer's): the
number the user reads is the Timer's, and its window already holds the
autotuner's do_bench calls; a region the user marks with `gpuenv.region()`
still contains automatic ones, and automatic regions at top level (an
autotuner run outside any Timer) are marked as usual.

pytest-benchmark gets one region per benchmark, not per round: the region
spans exactly what the benchmark's printed statistics come from (calibration,
warmup and rounds), costs two writes whatever the number of rounds (which can
reach 10^5 for a microsecond function, where per-round edges would cost a
visible share of each round), and needs only the fixture's public methods;
per-round edges would need its private runner and could not tell calibration
and warmup rounds from measured ones.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpuenv.errors import ConfigError

KINDS = ("do_bench", "timer", "pytest")
ENV_SELECT = "GPUENV_AUTO_REGIONS"  # what the user sets: "do_bench,timer" picks (default: all)
ENV_MODULES = "GPUENV_AUTO_MODULES"  # what the runner hands the child's import hook
# the module each kind's functions live in (the import hook watches these names)
MODULES = {
    "triton.testing": "do_bench",
    "torch.utils.benchmark.utils.timer": "timer",
    "pytest_benchmark.fixture": "pytest",
}
# GPUENV_AUTOTUNE=rank (what `gpuenv run --autotune` sets): the autotuners of the command
# choose with gpuenv, each switched on as its module finishes loading
ENV_AUTOTUNE = "GPUENV_AUTOTUNE"
AUTOTUNE_VALUES = ("rank", "none")
AUTOTUNE_MODULES = {
    "triton": "gpuenv.integrations.triton.autotuner:patch_autotuner",  # rank=True
    # each choice timed with gpuenv, where Inductor benchmarks without select_algorithm
    "torch._inductor.runtime.benchmarking": "gpuenv.integrations.inductor:patch_inductor",
    # max-autotune's selections ranked (rank=True); it loads after the benchmarking module
    "torch._inductor.select_algorithm": "gpuenv.integrations.inductor:patch_inductor",
}
_TIMED_ONLY = "torch._inductor.runtime.benchmarking"  # switched without rank=True...
_SELECT = "torch._inductor.select_algorithm"  # ...unless this one is on its way
CHILD_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "childsite")
MAX_STMT = 60  # characters of a Timer's statement in a region name
MAX_LABEL = 40  # characters of a label's value (a shape, a dtype) in a call's name
# frames of these top-level packages are machinery, not the line the user wrote
_MACHINERY = frozenset(
    {
        "triton",
        "torch",
        "gpuenv",
        "pytest_benchmark",
        "_pytest",
        "pluggy",
        "functools",
        "contextlib",
        "sitecustomize",
    }
)
_AUTOTUNER = "triton.runtime.autotuner"
_PERF_MODULE = "triton.testing"  # Mark._run: calls the benchmark function at each point


# -- the parent's side: which kinds, and the child's environment ----------------------


def select_kinds(value: str | None, *, enabled: bool = True) -> tuple[str, ...]:
    """The kinds to mark from GPUENV_AUTO_REGIONS (None or "": all; "none": none)."""
    if not enabled:
        return ()
    if value is None or not value.strip() or value.strip() == "all":
        return KINDS
    picked = [v.strip() for v in value.split(",") if v.strip()]
    if picked == ["none"]:
        return ()
    unknown = [p for p in picked if p not in KINDS]
    if unknown:
        raise ConfigError(
            f"{ENV_SELECT}={value}: {', '.join(unknown)} is not a kind of automatic region",
            hint=f"use a comma-separated list of {', '.join(KINDS)} (or 'none')",
        )
    return tuple(k for k in KINDS if k in picked)


def autotune_choice(value: str | None, *, flag: bool = False) -> bool:
    """Do the command's autotuners choose with gpuenv? `--autotune` (`flag`), or
    GPUENV_AUTOTUNE=rank; "none" or unset: they choose as they do."""
    if flag:
        return True
    value = (value or "").strip()
    if value and value not in AUTOTUNE_VALUES:
        raise ConfigError(
            f"{ENV_AUTOTUNE}={value}: not a choice",
            hint="use rank (autotuners choose with gpuenv.rank) or none",
        )
    return value == "rank"


def child_env(env: dict[str, str], kinds: Iterable[str], autotune: bool = False) -> None:
    """Put the import hook into `env` (the command's environment) for `kinds`, in place;
    `autotune`: and the switches of the autotuners (GPUENV_AUTOTUNE=rank)."""
    kinds = set(kinds)
    modules = [m for m, k in MODULES.items() if k in kinds]
    if autotune:
        env[ENV_AUTOTUNE] = "rank"
        modules += list(AUTOTUNE_MODULES)
    else:
        env.pop(ENV_AUTOTUNE, None)
    if not modules:
        return
    env[ENV_MODULES] = ",".join(modules)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = CHILD_SITE + (os.pathsep + old if old else "")


# -- the child's side: wrapping ------------------------------------------------------------

_depth = threading.local()
_perf = threading.local()  # .stack: the perf_report benchmarks this thread is running
_perf_serial = itertools.count(1)
Facts = tuple[str, dict[str, Any]]  # a call's name and its facts (region.py's "l" line)


def _wrap(
    orig: Callable[..., Any],
    facts_of: Callable[..., Facts | None],
    returned: Callable[[Any], float | None] | None = None,
    *,
    after_first_call: bool = False,
) -> Callable[..., Any]:
    """`orig`, marked as a region `facts_of(*args)` names, when it is the thread's outermost;
    `returned(result)`: the time in seconds the call returned, sent with its end.
    `after_first_call` (do_bench): the region begins once the function it was given has
    returned from its first call, so that what that call sets off (an `@triton.autotune`
    kernel benchmarking its configs, a lazy compile) stays out of the call's window; the
    autotuner's own do_bench calls in it are then regions of their own."""
    from gpuenv.run.region import active, region

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        facts = None
        if depth == 0 and active():
            try:
                facts = facts_of(*args)
            except Exception:  # naming must never break the command's own call
                facts = None
        if not facts:
            return orig(*args, **kwargs)
        r = region(facts[0], discard_on_error=True, meta=facts[1])
        if after_first_call and args and callable(args[0]):
            args = (_begins_after_first_call(args[0], r, depth), *args[1:])
        else:
            r.__enter__()
            _depth.n = depth + 1
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            if r.t0 is not None:
                r.__exit__(*sys.exc_info())
            raise
        finally:
            _depth.n = depth
        if r.t0 is not None:
            if returned is not None:
                with contextlib.suppress(Exception):
                    value = returned(result)
                    if value is not None:
                        r.end_meta = {"returned_s": value}
            r.__exit__(None, None, None)
        return result

    wrapper.__gpuenv_auto__ = True  # type: ignore[attr-defined]
    return wrapper


def _begins_after_first_call(fn: Callable[..., Any], r: Any, depth: int) -> Callable[..., Any]:
    """fn, entering region `r` (and the thread's nesting) when its first call returns."""

    @functools.wraps(fn)
    def called(*args: Any, **kwargs: Any) -> Any:
        if r.t0 is not None:
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)  # outside: an autotuner's do_bench calls are regions too
        r.__enter__()
        _depth.n = depth + 1
        return out

    return called


def _wrap_perf_run(orig: Callable[..., Any]) -> Callable[..., Any]:
    """triton's Mark._run, telling the do_bench calls inside which benchmark run they are in
    (the grid of its table: gpuenv/run/perfgrid.py); everything else is the original's."""

    @functools.wraps(orig)
    def _run(self: Any, bench: Any, *args: Any, **kwargs: Any) -> Any:
        stack = _perf.__dict__.setdefault("stack", [])
        stack.append(_perf_info(orig, self, bench, args, kwargs))
        try:
            return orig(self, bench, *args, **kwargs)
        finally:
            stack.pop()

    _run.__gpuenv_auto__ = True  # type: ignore[attr-defined]
    return _run


def _perf_info(orig: Any, mark: Any, bench: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"serial": next(_perf_serial)}
    try:
        import inspect

        bound = inspect.signature(orig).bind(mark, bench, *args, **kwargs).arguments
        save_path = bound.get("save_path") or ""
        fn = getattr(mark, "fn", None)
        info.update(
            name=str(getattr(bench, "plot_name", "") or getattr(fn, "__name__", "perf_report")),
            x_names=[str(x) for x in getattr(bench, "x_names", [])],
            line_vals=list(getattr(bench, "line_vals", [])),
            line_names=[str(n) for n in getattr(bench, "line_names", [])],
            line_arg=str(getattr(bench, "line_arg", "")),
            save_path=os.path.abspath(save_path) if save_path else "",
            print=bool(bound.get("print_data")),
        )
    except Exception:  # a triton whose Mark._run we do not know: name calls by their line
        info["name"] = None
    return info


_SHORT: dict[str, str] = {}  # file name -> as shown (relpath costs ~10 us a call)


def _short_path(path: str) -> str:
    """`path` relative to the working directory when it lies below it, else its base name."""
    short = _SHORT.get(path)
    if short is None:
        try:
            rel = os.path.relpath(path)
        except ValueError:  # another drive
            rel = ".."
        short = _SHORT[path] = os.path.basename(path) if rel.startswith("..") else rel
    return short


def _scan(frame: Any, perf: bool) -> tuple[Any, Any, Any]:
    """From `frame` outwards: the first frame outside the machinery (the line the user
    wrote), the triton autotuner's frame holding the `config` it benchmarks (or True when
    only its module is seen), and, when `perf`, perf_report's Mark._run frame."""
    first, site, tune, run = frame, None, None, None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if site is None:
            if module.partition(".")[0] not in _MACHINERY:
                site = frame
                if not perf:
                    break
            elif module.startswith(_AUTOTUNER) and tune in (None, True):
                tune = frame if hasattr(frame.f_locals.get("config"), "kwargs") else True
        elif frame.f_code.co_name == "_run" and module == _PERF_MODULE:
            run = frame
            break
        frame = frame.f_back
    return site or first, tune, run


def call_site(skip: int = 2) -> tuple[str, bool]:
    """'file:line' of the first frame outside the machinery, and whether the triton
    autotuner is on the way there."""
    site, tune, _ = _scan(sys._getframe(skip), False)
    return f"{_short_path(site.f_code.co_filename)}:{site.f_lineno}", tune is not None


@contextlib.contextmanager
def autotune_region(kernel: str, key: list[str]) -> Iterator[Any]:
    """Under gpuenv run: an autotuner's ranking as one region of kind "autotune" (the
    caller sets its `end_meta` to the decision record), named `<kernel> autotune <key>`
    and sited at the first frame outside the machinery; None outside gpuenv run."""
    from gpuenv.run.region import active, region

    if not active():
        yield None
        return
    where, _ = call_site(3)
    name = f"{kernel} autotune {' '.join(key)}".strip()
    meta = {"kind": "autotune", "site": f"autotune {kernel} {where}", "autotune": True}
    with region(name, discard_on_error=True, meta=meta) as r:
        yield r


def _value(v: Any) -> Any:
    """A label's value as JSON carries it and a name shows it (long ones cut)."""
    if isinstance(v, (bool, int, float)) or v is None:
        return v
    text = str(v)
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 3] + "..."


def _words(labels: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in labels.items())


def config_labels(config: Any) -> dict[str, Any]:
    """A triton Config as labels: its kwargs, num_warps, num_stages, and num_ctas / maxnreg
    when not their defaults (`BLOCK_M=128 num_warps=8 num_stages=3`)."""
    out = {str(k): _value(v) for k, v in (getattr(config, "kwargs", None) or {}).items()}
    for attr, default in (
        ("num_warps", None),
        ("num_stages", None),
        ("num_ctas", 1),
        ("maxnreg", None),
    ):
        v = getattr(config, attr, None)
        if v is not None and v != default:
            out[attr] = _value(v)
    return out


def _context(frame: Any, kind: str, label: str) -> tuple[list[str], dict[str, Any]]:
    """What names a call made under `frame`: the words of its name and its facts."""
    stack = getattr(_perf, "stack", None)
    site, tune, run = _scan(frame, bool(stack))
    where = f"{_short_path(site.f_code.co_filename)}:{site.f_lineno}"
    meta: dict[str, Any] = {
        "kind": kind,
        "site": f"{label} (autotune) {where}" if tune else f"{label} {where}",
    }
    words: list[str] = []
    labels: dict[str, Any] = {}
    info = stack[-1] if stack else None
    if run is not None and info is not None and info.get("name"):
        point = _perf_point(run.f_locals, info)
        if point is not None:
            labels.update(point["labels"])
            meta["plot"] = point["plot"]
            words += [info["name"], _words(point["labels"])]
    if tune is not None:
        if tune is not True:
            loc = tune.f_locals
            tuner = loc.get("self")
            fn = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
            config = config_labels(loc["config"])
            words += [str(getattr(fn, "__name__", "kernel")), _words(config)]
            meta["config"] = config
        meta["autotune"] = True
    if labels:
        meta["labels"] = labels
    return words, meta


def _perf_point(local: dict[str, Any], info: dict[str, Any]) -> dict[str, Any] | None:
    """The point of a perf_report benchmark that Mark._run's locals are at (x_args, y)."""
    x_args, y = local.get("x_args"), local.get("y")
    if not isinstance(x_args, dict) or "y" not in local:
        return None
    labels = {str(k): _value(v) for k, v in x_args.items()}
    labels[info["line_arg"] or "line"] = _value(y)
    try:
        line = info["line_names"][info["line_vals"].index(y)]
    except (ValueError, IndexError, KeyError):
        line = str(y)
    plot = {k: info[k] for k in ("serial", "name", "x_names", "line_names", "save_path", "print")}
    plot["x"] = [labels.get(n) for n in info["x_names"]]
    plot["line"] = line
    return {"labels": labels, "plot": plot}


def _do_bench_facts(label: str) -> Callable[..., Facts]:
    def facts(*_: Any) -> Facts:
        words, meta = _context(sys._getframe(2), "do_bench", label)
        return " ".join(words) if words else meta["site"], meta

    return facts


def _ms_returned(result: Any) -> float | None:
    """do_bench's answer in seconds: its number, or the first of its quantiles (in ms)."""
    first = result[0] if isinstance(result, (list, tuple)) and result else result
    return float(first) / 1e3 if isinstance(first, (int, float)) else None


def timer_name(timer: Any, *_: Any) -> str:
    """'Timer <label / sub_label / description>', else 'Timer <stmt>' (truncated)."""
    spec = getattr(timer, "_task_spec", None)
    parts = [getattr(spec, a, None) for a in ("label", "sub_label", "description")]
    text = " / ".join(str(p) for p in parts if p)
    if not text:
        stmt = str(getattr(spec, "stmt", "") or "")
        text = "; ".join(line.strip() for line in stmt.splitlines() if line.strip()) or "?"
        if len(text) > MAX_STMT:
            text = text[: MAX_STMT - 3] + "..."
    return f"Timer {text}"


def _timer_facts(timer: Any, *_: Any) -> Facts:
    words, meta = _context(sys._getframe(2), "timer", "Timer")
    return " ".join([*words, timer_name(timer)]), meta


def _timer_returned(result: Any) -> float | None:
    median = getattr(result, "median", None)  # torch's Measurement: seconds
    return float(median) if isinstance(median, (int, float)) else None


def _pytest_facts(fixture: Any, *_: Any) -> Facts | None:
    if getattr(fixture, "disabled", False):  # --benchmark-disable: a plain call, not measured
        return None
    name = str(getattr(fixture, "fullname", None) or getattr(fixture, "name", "benchmark"))
    meta: dict[str, Any] = {"kind": "pytest", "site": name.partition("[")[0]}
    params = getattr(fixture, "params", None)
    if isinstance(params, dict) and params:
        meta["labels"] = {str(k): _value(v) for k, v in params.items()}
    return name, meta


def _patch_functions(owner: Any, names: Iterable[str], wrap: Callable[[Any], Any]) -> None:
    for attr in names:
        orig = getattr(owner, attr, None)
        if orig is None or getattr(orig, "__gpuenv_auto__", False):
            continue
        setattr(owner, attr, wrap(orig))


def _switch_autotuner(name: str) -> None:
    """Turn on gpuenv's choice for the autotuner whose module `name` just loaded."""
    import importlib

    where, _, attr = AUTOTUNE_MODULES[name].partition(":")
    switch = getattr(importlib.import_module(where), attr)
    if name == _TIMED_ONLY:
        if _SELECT not in sys.modules:  # loading (it imports this one) or loaded: its switch
            switch()  # ranks and times both
        return
    try:
        switch(rank=True)
    except ConfigError:
        if name != _SELECT:
            raise
        switch()  # an Inductor without the hook: each choice still timed with gpuenv...
        raise  # ...and the command's stderr says why it is not ranked


def patch(module: Any) -> None:
    """Wrap the measuring functions of `module` (one of MODULES), once; switch an autotuner
    (AUTOTUNE_MODULES) to gpuenv's choice under GPUENV_AUTOTUNE=rank."""
    name = getattr(module, "__name__", "")
    if name in AUTOTUNE_MODULES and os.environ.get(ENV_AUTOTUNE) == "rank":
        _switch_autotuner(name)
    kind = MODULES.get(name)
    if kind == "do_bench":
        for attr in ("do_bench", "do_bench_cudagraph"):
            _patch_functions(
                module,
                (attr,),
                functools.partial(
                    _wrap,
                    facts_of=_do_bench_facts(attr),
                    returned=_ms_returned,
                    after_first_call=True,
                ),
            )
        if isinstance(getattr(module, "Mark", None), type):
            _patch_functions(module.Mark, ("_run",), _wrap_perf_run)
    elif kind == "timer" and hasattr(module, "Timer"):
        _patch_functions(
            module.Timer,
            ("timeit", "blocked_autorange", "adaptive_autorange"),
            lambda f: _wrap(f, _timer_facts, _timer_returned),
        )
    elif kind == "pytest" and hasattr(module, "BenchmarkFixture"):
        _patch_functions(
            module.BenchmarkFixture, ("__call__", "pedantic"), lambda f: _wrap(f, _pytest_facts)
        )


__all__ = [
    "AUTOTUNE_MODULES",
    "AUTOTUNE_VALUES",
    "CHILD_SITE",
    "ENV_AUTOTUNE",
    "ENV_MODULES",
    "ENV_SELECT",
    "KINDS",
    "MODULES",
    "autotune_choice",
    "autotune_region",
    "call_site",
    "child_env",
    "config_labels",
    "patch",
    "select_kinds",
    "timer_name",
]
