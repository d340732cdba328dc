"""Automatic regions: each measurement an unmodified Python benchmark makes is a region.

Under `gpuenv run`, a Python command gets a region for each call of

    do_bench  triton.testing.do_bench, do_bench_cudagraph: "do_bench bench.py:12"
    timer     torch.utils.benchmark.Timer's timeit, blocked_autorange and
              adaptive_autorange: "Timer <label / sub_label / description>", or
              "Timer <stmt>" (truncated)
    pytest    each pytest-benchmark benchmark (`benchmark(fn)`, `benchmark.pedantic`):
              its test id, "test_mm.py::test_mm[64]"

with no change to its code. The runner puts gpuenv/run/childsite on the child's
PYTHONPATH; its sitecustomize installs an import hook that, when the command
itself imports one of `MODULES`, calls `patch()` here to wrap those functions.
A command that imports none of them imports nothing of gpuenv's.

The wrappers return exactly what the originals return and raise what they
raise (a call that raises ends its region with "x": discarded, not a
measurement). do_bench regions are named after the first calling frame outside
triton, torch, gpuenv and pytest's machinery: the line the user wrote; a
do_bench the triton autotuner makes is "do_bench (autotune) bench.py:30", the
line that launched the kernel. Repeated calls from one site share a name, so
they are one row with a rep per call.

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

import os
import sys
import threading
from collections.abc import Callable, Iterable
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
CHILD_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "childsite")
MAX_STMT = 60  # characters of a Timer's statement in a region name
# frames of these top-level packages are machinery, not the line the user wrote
_MACHINERY = frozenset({"triton", "torch", "gpuenv", "pytest_benchmark", "_pytest", "pluggy",
                        "functools", "contextlib", "sitecustomize"})  # fmt: skip
_AUTOTUNER = "triton.runtime.autotuner"


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


def child_env(env: dict[str, str], kinds: Iterable[str]) -> None:
    """Put the import hook into `env` (the command's environment) for `kinds`, in place."""
    kinds = set(kinds)
    modules = [m for m, k in MODULES.items() if k in kinds]
    if not modules:
        return
    env[ENV_MODULES] = ",".join(modules)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = CHILD_SITE + (os.pathsep + old if old else "")


# -- the child's side: wrapping ------------------------------------------------------------

_depth = threading.local()


def _wrap(orig: Callable[..., Any], name_of: Callable[..., str | None]) -> Callable[..., Any]:
    """`orig`, marked as a region named `name_of(*args)` when it is the thread's outermost."""
    import functools

    from gpuenv.run.region import active, region

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        name = None
        if depth == 0 and active():
            try:
                name = name_of(*args)
            except Exception:  # naming must never break the command's own call
                name = None
        if not name:
            return orig(*args, **kwargs)
        _depth.n = depth + 1
        try:
            with region(name, discard_on_error=True):
                return orig(*args, **kwargs)
        finally:
            _depth.n = depth

    wrapper.__gpuenv_auto__ = True  # type: ignore[attr-defined]
    return wrapper


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


def call_site(skip: int = 2) -> tuple[str, bool]:
    """'file:line' of the first frame outside the machinery, and whether the triton
    autotuner is on the way there."""
    frame: Any = sys._getframe(skip)
    first, autotune = frame, False
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(_AUTOTUNER):
            autotune = True
        if module.partition(".")[0] not in _MACHINERY:
            break
        frame = frame.f_back
    if frame is None:
        frame = first
    return f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno}", autotune


def _do_bench_name(label: str) -> Callable[..., str]:
    def name(*_: Any) -> str:
        site, autotune = call_site(3)
        return f"{label} (autotune) {site}" if autotune else f"{label} {site}"

    return name


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


def _pytest_name(fixture: Any, *_: Any) -> str | None:
    if getattr(fixture, "disabled", False):  # --benchmark-disable: a plain call, not measured
        return None
    return str(getattr(fixture, "fullname", None) or getattr(fixture, "name", "benchmark"))


def _patch_functions(owner: Any, names: Iterable[str], name_of: Callable[[str], Any]) -> None:
    for attr in names:
        orig = getattr(owner, attr, None)
        if orig is None or getattr(orig, "__gpuenv_auto__", False):
            continue
        setattr(owner, attr, _wrap(orig, name_of(attr)))


def patch(module: Any) -> None:
    """Wrap the measuring functions of `module` (one of MODULES), once."""
    kind = MODULES.get(getattr(module, "__name__", ""))
    if kind == "do_bench":
        _patch_functions(module, ("do_bench", "do_bench_cudagraph"), _do_bench_name)
    elif kind == "timer" and hasattr(module, "Timer"):
        _patch_functions(module.Timer, ("timeit", "blocked_autorange", "adaptive_autorange"),
                         lambda _: timer_name)  # fmt: skip
    elif kind == "pytest" and hasattr(module, "BenchmarkFixture"):
        _patch_functions(module.BenchmarkFixture, ("__call__", "pedantic"),
                         lambda _: _pytest_name)  # fmt: skip


__all__ = [
    "CHILD_SITE",
    "ENV_MODULES",
    "ENV_SELECT",
    "KINDS",
    "MODULES",
    "call_site",
    "child_env",
    "patch",
    "select_kinds",
    "timer_name",
]
