"""patch_inductor: torch Inductor's max-autotune times its choices with gpuenv, or
(`rank=True`) chooses with gpuenv.rank.

    from gpuenv.integrations.inductor import patch_inductor
    patch_inductor()             # each choice timed with gpuenv's do_bench
    patch_inductor(rank=True)    # each selection's choices ranked together by gpuenv.rank
    # then torch.compile(mode="max-autotune") as usual

Inductor's benchmarker (`torch._inductor.runtime.benchmarking`: `InductorBenchmarker`,
`TritonBenchmarker`, `TorchProfilerBenchmarker`) times each autotuning choice with its
own CUDA events, one after the other, in whatever state the choices before it left the
GPU; it never calls `triton.testing.do_bench` (InductorBenchmarker), so
`patch_autotuner()` does not reach it. Patched, each class's `benchmark_gpu` times the
choice with gpuenv's do_bench drop-in (gpuenv.integrations.triton: gpuenv.bench's default
conditioning, each call begun on a cool, uncapped GPU, telemetry on every rep) and
returns the median of its reps in ms (Inductor's own returns the least of its events;
`return_mode="all"` every rep's time).

`rank=True` ranks the choices of each selection together. `AlgorithmSelectorCache`
(`torch._inductor.select_algorithm`) makes one benchmark function per selection
(`make_benchmark_fn`: the mm, addmm, bmm ... of one shape) and calls it with all its
choices. Wrapped, the in-process one first runs Inductor's own benchmarking of the
choices (all in one call, one set of example inputs; each choice alone where the calls
kept cannot be matched to the choices so) while the patched `benchmark_gpu` keeps the
GPU work it is handed instead of timing it (called once: a choice that fails is inf, as
Inductor makes it), with each Triton template's module kept loaded (`cleanup_run_fn`
deferred); then `gpuenv.rank` times the kept calls in interleaved rounds in one GPU
state, and every choice's timing is its median in ms, the winner's the least, so that
Inductor's `min` keeps gpuenv's choice (a declared tie: the first of the tie in
Inductor's order of choices). The decision is kept (`rankings()`) and under `gpuenv run`
sent as a region of kind "autotune", as triton's.
Left to Inductor's own timing: a selection of one choice, a collective one, one
benchmarked in subprocesses (`autotune_in_subproc`, CUTLASS), and one whose choices do
not each hand `benchmark_gpu` exactly one call (the profiler's benchmarking, choices timed
on the CPU; a choice benchmarked as a CUDA graph hands over the graph's replay). Other
callers of `benchmark_gpu` (the runtime autotuning of pointwise kernels, the
epilogue-fusion check after a selection) time with gpuenv's do_bench call by call, as
without `rank`, but with no more reps or warmup than a ranking's call (`RANK_CALL`: 10 ms
of reps, up to 50 ms of warmup) whatever `rep` they ask (`_caps`), and, as a ranking's
calls, judged with the reason-counter reads already in (`wait_counters=False`: no wait of
up to 20 ms for the sampler process's next read after the reps: 17 of a ranking's call's
23 ms of judging on an H200 before its calls dropped it). On an H200 that took a call of
a Triton-template race's from 41.2 to 28.4 ms (plain Inductor's: 15.1 ms), as the
simulated H200 under a sampler process had it (benchmarks/inductor_calls.py: 40.7 to
25.4 ms; docs/benchmarks/inductor_rank.md, `-triton-nowait`).

Under `gpuenv run --autotune` (GPUENV_AUTOTUNE=rank) both are switched on as Inductor's
modules load: the benchmarkers when its benchmarking module loads, the ranking when
select_algorithm does.

Switched on with a GPU present, `rank=True` opens ahead at once (`gpuenv.rank.prepare`, on
a thread, no CUDA context made): NVML and the sampler process start while Inductor
traces and compiles, and the first selection finds them (the process lingers 60 s). On an
H200 that opening, begun at the selection, was 0.45 s of its 0.86 s; begun at the switch,
0.02 s of 0.39 s (docs/benchmarks/inductor_rank.md).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import math
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gpuenv.errors import ConfigError

MODULE = "torch._inductor.runtime.benchmarking"
SELECT_MODULE = "torch._inductor.select_algorithm"
SELECTOR = "AlgorithmSelectorCache"
CLASSES = ("TritonBenchmarker", "InductorBenchmarker", "TorchProfilerBenchmarker")
_patched: dict[str, Any] = {}  # class name -> (class, its own benchmark_gpu)
_selector: dict[str, Any] = {}  # "make_benchmark_fn": (class, its own), "settings": rank's
_capture = threading.local()  # .calls: the GPU work kept instead of timed, while capturing
_RANKINGS: deque[dict[str, Any]] = deque(maxlen=256)
# what Inductor names its benchmark functions (a partial's func, or a nested function)
IN_PROCESS = "benchmark_in_current_process"
# the parts of a Triton template's description that tell its configs apart
_CONFIG_KEYS = re.compile(r"^(BLOCK_\w+|GROUP_M|num_stages|num_warps|num_consumer_groups)$")
log = logging.getLogger(__name__)


def patch_inductor(*, rank: bool = False, **defaults: Any) -> None:
    """Make Inductor's benchmarkers time each choice with gpuenv, or (`rank=True`) rank each
    max-autotune selection's choices together with gpuenv.rank (the module docstring).

    `defaults` go to every do_bench call (its keywords: `warmup=`, `rep=`, `condition=`,
    `backend=`, ...); with `rank=True` to every ranking instead (gpuenv.rank's keywords
    and BenchConfig's: `tolerance=`, `budget_s=`, `backend=`, ...), and those that say
    where and how to time (`backend=`, `session=`, `device=`, `condition=`, `policy=`)
    also to the do_bench calls of `benchmark_gpu`'s other callers. Undo with
    `unpatch_inductor()`.

    Raises:
        ConfigError: an unknown setting; no torch with Inductor; an Inductor whose
            benchmarkers, or (`rank=True`) whose `AlgorithmSelectorCache.make_benchmark_fn`,
            gpuenv does not know (the message names the torch version).
    """
    from gpuenv import validate

    validate.boolean(rank, "rank")
    _check_settings(rank, defaults)
    module = _import(MODULE)
    selector = _selector_class(_import(SELECT_MODULE)) if rank else None
    unpatch_inductor()
    for name in CLASSES:
        cls = getattr(module, name, None)
        if isinstance(cls, type) and "benchmark_gpu" in vars(cls):
            _patched[name] = (cls, vars(cls)["benchmark_gpu"])
            cls.benchmark_gpu = _benchmark_gpu(_bench_defaults(rank, defaults), rank)  # type: ignore[attr-defined]
    if not _patched:
        raise ConfigError(
            f"{MODULE} of torch {_torch_version()} has none of {', '.join(CLASSES)}: "
            "an Inductor gpuenv does not know",
            hint="report the torch version; until then max-autotune times choices itself",
        )
    if selector is not None:
        own = vars(selector)["make_benchmark_fn"]
        _selector.update(make_benchmark_fn=(selector, own), settings=dict(defaults))
        selector.make_benchmark_fn = classmethod(_ranked_benchmark_fn(own.__func__))
        _open_ahead(defaults)


def _open_ahead(settings: dict[str, Any]) -> None:
    """With a GPU present, begin the first ranking's opening now (see the module
    docstring); its selection's own `prepare` then finds it done."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return
    from gpuenv.timing.rank import prepare

    prepare(**settings)  # not waited for: a thread, which only logs a failure


def unpatch_inductor() -> None:
    """Put back what patch_inductor replaced (nothing when it was not called)."""
    for cls, orig in _patched.values():
        cls.benchmark_gpu = orig
    _patched.clear()
    if "make_benchmark_fn" in _selector:
        cls, orig = _selector["make_benchmark_fn"]
        cls.make_benchmark_fn = orig
    _selector.clear()


def ranking_on() -> bool:
    """Is patch_inductor(rank=True) in force?"""
    return "make_benchmark_fn" in _selector


def rankings() -> list[dict[str, Any]]:
    """The decisions the ranked selections made (at most 256), oldest first: each a dict of
    `kernel` (the selection, as "inductor mm"), `key` (its inputs' shapes and dtypes),
    `choices` (the names ranked, in Inductor's order) and `ranking` (the gpuenv.Ranking)."""
    return list(_RANKINGS)


def _check_settings(rank: bool, defaults: dict[str, Any]) -> None:
    if rank:
        from gpuenv.timing.rank import unknown_settings

        unknown = unknown_settings(defaults)
        hint = "pass keywords of gpuenv.rank or BenchConfig's fields"
    else:
        from gpuenv.integrations.triton.bench import do_bench

        unknown = sorted(set(defaults) - set(inspect.signature(do_bench).parameters))
        hint = "pass keywords of gpuenv.integrations.triton.do_bench"
    if unknown:
        who = "patch_inductor(rank=True)" if rank else "patch_inductor"
        raise ConfigError(f"{who} got unknown settings: {', '.join(unknown)}", hint=hint)


def _bench_defaults(rank: bool, defaults: dict[str, Any]) -> dict[str, Any]:
    """What every do_bench call gets: `defaults`; with rank=True those of rank's settings that
    say where and how to time (`backend=`, `session=`, `device=`, `condition=`, `policy=`)."""
    if not rank:
        return defaults
    shared = ("backend", "session", "device", "condition", "policy")
    return {k: v for k, v in defaults.items() if k in shared}


def _caps(rank: bool) -> dict[str, float]:
    """The most `warmup` and `rep` (ms) a do_bench call gets: with rank=True, a ranking's
    call's (`RANK_CALL`: 10 ms of reps, up to 50 ms of warmup), whatever Inductor's caller
    asks. Inductor's own benchmarker spends at most 25 ms a call and ignores the 40-100 ms
    of `rep` its callers hand it. Honoured, with the burst rests they brought, 10-13 such
    calls took 0.9-2.5 s of a 1024^3 mm's compile on an H200 (profiled); capped, 0.42 s
    (the median of 9 processes: benchmarks/inductor_rank.py's "other benchmarking")."""
    if not rank:
        return {}
    from gpuenv.timing.rank import RANK_CALL

    caps = {"warmup": RANK_CALL.warmup_max_s * 1e3}
    if RANK_CALL.budget_s is not None:
        caps["rep"] = RANK_CALL.budget_s * 1e3
    return caps


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(
            "patch_inductor needs torch with Inductor", hint="pip install torch"
        ) from err


def _torch_version() -> str:
    return str(getattr(sys.modules.get("torch"), "__version__", "(unknown)"))


def _selector_class(module: Any) -> Any:
    """AlgorithmSelectorCache, when its `make_benchmark_fn` is the classmethod gpuenv hooks
    (tested on torch 2.13; older releases nest a function of the same name in it)."""
    cls = getattr(module, SELECTOR, None)
    own = vars(cls).get("make_benchmark_fn") if isinstance(cls, type) else None
    if not isinstance(own, classmethod):
        raise ConfigError(
            f"torch {_torch_version()}: {SELECT_MODULE} has no {SELECTOR}.make_benchmark_fn "
            "classmethod, where patch_inductor(rank=True) ranks max-autotune's choices",
            hint="report the torch version; patch_inductor() without rank still times each "
            "choice with gpuenv",
        )
    return cls


# -- the benchmarkers: each call timed with gpuenv, or kept while a ranking captures ----


def _benchmark_gpu(defaults: dict[str, Any], rank: bool) -> Callable[..., Any]:
    """A benchmarker's `benchmark_gpu`: each call timed by gpuenv's do_bench with `defaults`;
    with `rank`, a call a ranking is capturing keeps its work, and the others are limited
    and judged as a ranking's calls are (`_caps`, no wait for a counter read)."""
    from gpuenv.integrations.triton.bench import do_bench
    from gpuenv.timing.cuda.events import cuda_ordinal

    own = {k: p.default for k, p in inspect.signature(do_bench).parameters.items()}
    caps = _caps(rank)

    @functools.wraps(do_bench)
    def benchmark_gpu(
        self: Any,
        _callable: Callable[[], Any],
        *args: Any,
        return_mode: str = "median",
        grad_to_none: Any = None,
        quantiles: Any = None,
        warmup: float | None = None,
        rep: float | None = None,
        **kwargs: Any,
    ) -> Any:
        del self, args, kwargs  # Inductor's own sizing (estimation_iters, ...): gpuenv's
        kept = getattr(_capture, "calls", None)
        if kept is not None:  # a ranking collects this choice's work: run it once, keep it
            _callable()
            kept.append((_callable, cuda_ordinal()))  # its tensors' device is current
            return 0.0
        settings = dict(defaults)
        for key, value in (("warmup", warmup), ("rep", rep)):
            if value is not None:
                settings.setdefault(key, value)
        for key, most in caps.items():  # rank=True: no call longer than a ranking's
            settings[key] = min(settings.get(key, own[key]), most)
        if rank:  # ...and, as a ranking's, judged with the counter reads already in
            settings["wait_counters"] = False
        mode = "all" if return_mode == "all" else "median"
        return do_bench(
            _callable,
            grad_to_none=grad_to_none,
            quantiles=quantiles,
            return_mode=mode,
            name="inductor autotune",
            **settings,
        )

    benchmark_gpu.__gpuenv__ = True  # type: ignore[attr-defined]
    return benchmark_gpu


# -- rank=True: each selection's choices ranked together ----------------------------------


def _ranked_benchmark_fn(own: Callable[..., Any]) -> Callable[..., Any]:
    """AlgorithmSelectorCache.make_benchmark_fn, whose in-process benchmark function ranks."""

    @functools.wraps(own)
    def make_benchmark_fn(cls: Any, *args: Any, **kwargs: Any) -> Any:
        fn = own(cls, *args, **kwargs)
        func = getattr(fn, "func", fn)
        collective = (getattr(fn, "keywords", None) or {}).get("is_collective")
        if getattr(func, "__name__", "") != IN_PROCESS or collective:
            return fn  # subprocesses, collectives: Inductor's own
        nodes = kwargs.get("input_nodes", args[1] if len(args) > 1 else ())
        return functools.partial(_rank_selection, fn, _key(nodes))

    make_benchmark_fn.__gpuenv_rank__ = True  # type: ignore[attr-defined]
    return make_benchmark_fn


def _rank_selection(
    fn: Callable[..., Any], key: list[str], choices: Sequence[Any]
) -> dict[Any, float]:
    """What Inductor's in-process benchmark function `fn` returns for `choices`, from a
    ranking of them all: each choice's timing in ms, the winner's the least."""
    choices = list(choices)
    if len(choices) < 2:
        return dict(fn(choices))
    from gpuenv.timing.rank import prepare

    opened = prepare(**_selector.get("settings", {}))
    with _kept_loaded(choices):
        try:  # the sampler starts while Inductor benchmarks each choice once
            captured = _capture_choices(fn, choices)
        finally:
            opened()
        if captured is None:  # a choice not timed through benchmark_gpu: Inductor's way
            return dict(fn(choices))
        timings, work = captured
        if work:
            timings.update(_ranked(choices, work, key))
    return {c: timings[c] for c in choices}


Captured = tuple[dict[Any, float], dict[Any, tuple[Callable[[], Any], int | None]]]


def _capture_choices(fn: Callable[..., Any], choices: list[Any]) -> Captured | None:
    """Inductor's benchmarking of the choices, the work each hands benchmark_gpu kept: (the
    timings of the choices that failed (inf), each other choice's work and CUDA device), or
    None when a choice handed over other than exactly one call. First all at once, as
    Inductor benchmarks them (one set of example inputs, shared by every choice's work);
    where the calls kept cannot be told apart that way, each choice alone."""
    got, kept = _kept(fn, choices)
    failed = {c: t for c, t in got.items() if not math.isfinite(t)}
    handed = [c for c, t in got.items() if t == 0.0]  # benchmark_gpu's, while capturing
    if len(handed) == len(kept) and len(handed) + len(failed) == len(choices):
        return failed, dict(zip(handed, kept, strict=True))
    if not kept:  # nothing handed over, and a choice timed otherwise (on the CPU, say)
        log.info("gpuenv: %s were not timed through benchmark_gpu: not ranked", choices)
        return None
    return _capture_each(fn, choices)


def _kept(
    fn: Callable[..., Any], choices: list[Any]
) -> tuple[dict[Any, float], list[tuple[Callable[[], Any], int | None]]]:
    """Inductor's benchmark function `fn` on `choices`, while benchmark_gpu keeps the work
    it is handed: its timings, and the calls kept, in the order handed over."""
    _capture.calls = []
    try:
        got = fn(choices)
        kept: list[tuple[Callable[[], Any], int | None]] = _capture.calls
    finally:
        _capture.calls = None
    return got, kept


def _capture_each(fn: Callable[..., Any], choices: list[Any]) -> Captured | None:
    """`_capture_choices` one choice at a time: each call kept is that choice's."""
    failed: dict[Any, float] = {}
    work: dict[Any, tuple[Callable[[], Any], int | None]] = {}
    for choice in choices:
        got, kept = _kept(fn, [choice])
        timing = got.get(choice, math.inf)
        if not math.isfinite(timing):
            failed[choice] = timing
        elif len(kept) == 1:
            work[choice] = kept[0]
        else:
            log.info("gpuenv: %s was not timed through benchmark_gpu: not ranked", choice)
            return None
    return failed, work


def _ranked(
    choices: list[Any], work: dict[Any, tuple[Callable[[], Any], int | None]], key: list[str]
) -> dict[Any, float]:
    """Rank the choices' work with gpuenv.rank; each one's timing in ms."""
    from gpuenv.run.autoregions import autotune_region
    from gpuenv.timing.cuda.events import on_cuda_device
    from gpuenv.timing.decision import decision_record
    from gpuenv.timing.rank import rank

    names = choice_names(choices)
    cands = {names[c]: call for c, (call, _) in work.items()}
    kernel = _selection_name(choices)
    device = next((d for _, d in work.values() if d is not None), None)
    with on_cuda_device(device), autotune_region(kernel, key) as region:
        r = rank(cands, **_selector.get("settings", {}))
        if region is not None:
            region.end_meta = {"autotune": decision_record(kernel, key, r)}
    _RANKINGS.append({"kernel": kernel, "key": key, "choices": list(cands), "ranking": r})
    times = r.times_s  # the winner's the least: Inductor's min keeps gpuenv's choice
    return {c: times[names[c]] * 1e3 for c in work}


@contextlib.contextmanager
def _kept_loaded(choices: list[Any]) -> Iterator[None]:
    """Defer each Triton template's `cleanup_run_fn` (recent torch, 2.13 here, unloads its
    benchmark module after each benchmark) until the ranking is done."""
    deferred = []
    for choice in choices:
        req = getattr(choice, "_bmreq", None) or getattr(choice, "bmreq", None)
        if req is not None and callable(getattr(req, "cleanup_run_fn", None)):
            with contextlib.suppress(AttributeError, TypeError):
                req.cleanup_run_fn = _later
                deferred.append(req)
    try:
        yield
    finally:
        for req in deferred:
            vars(req).pop("cleanup_run_fn", None)
            req.cleanup_run_fn()


def _later() -> None:
    """A benchmark request's cleanup while a ranking still calls its kernel."""


def choice_names(choices: Sequence[Any]) -> dict[Any, str]:
    """Each choice's name in a ranking: Inductor's (`triton_mm_4`) and, for a template,
    its config (`BLOCK_M=128 BLOCK_N=128 BLOCK_K=64 num_stages=3 num_warps=8`); unique."""
    out: dict[Any, str] = {}
    seen: set[str] = set()
    for i, choice in enumerate(choices):
        name = str(getattr(choice, "name", "") or f"choice {i}")
        config = _config_words(str(getattr(choice, "description", "") or ""))
        text = f"{name} {config}".strip()
        if text in seen:
            text = f"{text} #{i}"
        seen.add(text)
        out[choice] = text
    return out


def _config_words(description: str) -> str:
    words = []
    for part in description.split(","):
        key, eq, value = part.strip().partition("=")
        if eq and _CONFIG_KEYS.match(key):
            words.append(f"{key}={value.strip()}")
    return " ".join(words)


def _selection_name(choices: list[Any]) -> str:
    """The selection as its kernel name in a record: "inductor" and the name of its ATen
    choice (`mm`, `addmm`, `bmm`), else of its first choice without the trailing number."""
    names = [str(getattr(c, "name", "") or "") for c in choices]
    extern = [n for c, n in zip(choices, names, strict=True) if "Extern" in type(c).__name__]
    stem = (extern or names or ["select"])[0]
    stem = re.sub(r"^extern_", "", re.sub(r"_\d+$", "", stem)) or "select"
    return f"inductor {stem}"


def _key(nodes: Any) -> list[str]:
    """The selection's key in a record: its input nodes' sizes and dtypes, as Inductor's
    AUTOTUNE log shows them (`4096x4096 float16`); none where a node will not say."""
    out = []
    with contextlib.suppress(Exception):  # IR nodes of any torch: what they say, or nothing
        for node in list(nodes)[:4]:
            dims = "x".join(str(d) for d in node.get_size()) or "scalar"
            out.append(f"{dims} {str(node.get_dtype()).removeprefix('torch.')}")
    return out


__all__ = [
    "CLASSES",
    "IN_PROCESS",
    "MODULE",
    "SELECTOR",
    "SELECT_MODULE",
    "choice_names",
    "patch_inductor",
    "ranking_on",
    "rankings",
    "unpatch_inductor",
]
