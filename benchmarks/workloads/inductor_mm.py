"""The child process of benchmarks/inductor_rank.py: one GEMM compiled by
`torch.compile(mode="max-autotune")` in a fresh process, its max-autotune selection timed
by plain Inductor, by Inductor under gpuenv's switch (`patch_inductor(rank=True)`), or
carefully: the true ranking, each choice timed with gpuenv's do_bench (100 ms of reps from
a cool, uncapped GPU) in `CAREFUL_PASSES` interleaved passes, each pass starting one
choice later, its time the median of its passes'. A few-us kernel's time can sit at one
of two levels for seconds at a time (the spread of its passes shows it): one 0.5 s call
per choice, in Inductor's order, would read whichever level each met. The careful mode
also times each choice's device time from CUPTI (`device_times`), which has no such
levels.

    python benchmarks/workloads/inductor_mm.py MODE OP SIZE DTYPE [STATE [HOT_S]]

MODE: plain, gpuenv, gpuenv-nowait (ranked with `condition="none"`: no wait for a ready
GPU, the candidates interleaved in whatever state they find) or careful. OP: `mm_relu`
(relu(a @ b)), `addmm_relu` (relu(a @ b + bias), the bias and relu Inductor's epilogue)
or `bmm` (a batched a @ b); SIZE `MxNxK`, or `BxMxNxK` for bmm; DTYPE float16 or
bfloat16; STATE `rested` (the default: the GPU idle while Inductor compiles) or `hot`
(each selection benchmarked right after HOT_S seconds, default 7, of heavy load). The
caller gives each process a fresh TORCHINDUCTOR_CACHE_DIR (nothing of Inductor's cached:
every selection autotunes) and may share a TRITON_CACHE_DIR (compiled kernels reused:
the wall is Inductor's, not ptxas's). Prints one JSON line: the mode, the selection (its
name and choices' times in ms as the tuner returned them), the winner (the least: the
choice Inductor keeps), gpuenv's tie set and ranking wall (gpuenv's modes), each
choice's pass times and device time (careful), the compile wall (the first call:
compiling, autotuning, running once) and what of it went to benchmarking
(`clock_benchmarking`). Reads the GPU only (run it with GPUENV_READONLY=1); needs CUDA
torch.
"""

import json
import statistics
import sys
import time

import torch

from benchmarks.autotune_rank import ranking_parts
from gpuenv.integrations import inductor

OPS = ("mm_relu", "addmm_relu", "bmm")
MODES = ("plain", "gpuenv", "gpuenv-nowait", "careful")
RANKED = ("gpuenv", "gpuenv-nowait")  # under patch_inductor(rank=True)
STATES = ("rested", "hot")
CAREFUL_PASSES = 5


def careful_passes(cands, passes=CAREFUL_PASSES):
    """Each candidate's do_bench median (ms) in `passes` interleaved passes, pass p starting
    at candidate p: {name: [ms, ...]}."""
    from gpuenv.integrations.triton.bench import do_bench

    names = list(cands)
    out: dict[str, list[float]] = {n: [] for n in names}
    for p in range(passes):
        for n in names[p % len(names) :] + names[: p % len(names)]:
            ms = do_bench(cands[n], warmup=25, rep=100, return_mode="median")
            out[n].append(float(ms))  # type: ignore[arg-type]  # a float: no quantiles
    return out


def device_times(cands):
    """Each candidate's device time (ms) from CUPTI: the median of 200 calls, each after an
    L2 flush, all queued behind a spin (no launch or event overhead). A few-us kernel's
    events time holds microseconds of the events' own, at one of two levels."""
    from gpuenv.timing.cuda import cupti_median_s

    return {n: cupti_median_s(fn, flush_l2=True) * 1e3 for n, fn in cands.items()}


def problem(op, size, dtype):
    """The function and its inputs."""
    dims = [int(d) for d in size.lower().split("x")]
    want = 4 if op == "bmm" else 3
    if len(dims) != want or min(dims) < 1:
        raise SystemExit(f"{op} takes a size of {want} positive dimensions, got {size}")
    kw = {"device": "cuda", "dtype": getattr(torch, dtype)}
    if op == "bmm":
        b, m, n, k = dims
        return (lambda x, y: torch.bmm(x, y)), (
            torch.randn(b, m, k, **kw),
            torch.randn(b, k, n, **kw),
        )
    m, n, k = dims
    a, w = torch.randn(m, k, **kw), torch.randn(k, n, **kw)
    if op == "mm_relu":
        return (lambda x, y: torch.relu(x @ y)), (a, w)
    return (lambda x, y, z: torch.relu(x @ y + z)), (a, w, torch.randn(n, **kw))


def heavy_load():
    """`load(seconds)`: bf16 8192^3 matmuls back to back on the GPU."""
    from benchmarks._kernels import GpuEnv

    x = torch.randn((8192, 8192), device="cuda", dtype=torch.bfloat16)
    y = torch.randn((8192, 8192), device="cuda", dtype=torch.bfloat16)
    return GpuEnv(torch, lambda: x @ y).load


def clock_benchmarking(select):
    """Time what the tuners spend benchmarking: `select_s`, the max-autotune selections'
    benchmark functions (Inductor's own timing of the choices, or gpuenv's capture and
    ranking); `other_s` and `other_calls`, the benchmarker's calls outside them (the
    runtime tuning of a pointwise kernel, the epilogue-fusion check), which follow from
    the choice made: a Triton template takes the relu as its epilogue, cuBLAS's mm leaves
    a relu kernel of its own to tune; under gpuenv's ranking, `capture_s`, Inductor's own
    pass over the choices that hands each one's work to the ranking. Hot, the load before
    a selection is not counted."""
    from torch._inductor.runtime import benchmarking

    spent = {"select_s": 0.0, "other_s": 0.0, "other_calls": 0}
    inside = []
    cls = select.AlgorithmSelectorCache
    own_make = vars(cls)["make_benchmark_fn"].__func__  # Inductor's, or gpuenv's when patched

    def make_benchmark_fn(c, *args, **kwargs):
        fn = own_make(c, *args, **kwargs)

        def benchmark(choices):
            t0 = time.perf_counter()
            inside.append(True)
            try:
                return fn(choices)
            finally:
                inside.pop()
                spent["select_s"] += time.perf_counter() - t0

        return benchmark

    cls.make_benchmark_fn = classmethod(make_benchmark_fn)
    owner = next(k for k in type(benchmarking.benchmarker).__mro__ if "benchmark" in vars(k))
    own_bench = vars(owner)["benchmark"]

    def bench(self, *args, **kwargs):
        if inside:
            return own_bench(self, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return own_bench(self, *args, **kwargs)
        finally:
            spent["other_s"] += time.perf_counter() - t0
            spent["other_calls"] += 1

    owner.benchmark = bench  # type: ignore[attr-defined]  # a class found at run time
    if inductor.ranking_on():  # of a ranked selection: Inductor's pass handing over the work
        own_capture = inductor._capture_choices

        def capture(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return own_capture(*args, **kwargs)
            finally:
                spent["capture_s"] += time.perf_counter() - t0

        spent["capture_s"] = 0.0
        inductor._capture_choices = capture
    return spent


def heat_before_benchmarking(select, load, seconds):
    """Each selection's choices are benchmarked right after `load(seconds)`: Inductor's
    benchmark function, gpuenv's ranking inside it when patched, runs on a GPU the load
    left hot. Compiling the choices comes before, on an idle GPU, so load before
    torch.compile would have cooled by then."""
    cls = select.AlgorithmSelectorCache
    own = vars(cls)["make_benchmark_fn"].__func__  # Inductor's, or gpuenv's when patched

    def make_benchmark_fn(c, *args, **kwargs):
        fn = own(c, *args, **kwargs)

        def benchmark(choices):
            load(seconds)
            return fn(choices)

        return benchmark

    cls.make_benchmark_fn = classmethod(make_benchmark_fn)


def main(mode, op, size, dtype, state="rested", hot_s="7"):
    import psutil

    started_s = time.time() - psutil.Process().create_time()  # the interpreter, torch
    import torch._inductor.config as config
    import torch._inductor.select_algorithm as select

    if mode not in MODES or op not in OPS or state not in STATES:
        raise SystemExit(f"usage: MODE in {MODES}, OP in {OPS}, STATE in {STATES}")
    if not hasattr(select, "add_feedback_saver"):
        raise SystemExit(f"torch {torch.__version__} has no add_feedback_saver: update torch")
    selections = []

    def saver(timings, name, *rest):  # every selection's timings, as its tuner returned them
        names = inductor.choice_names(list(timings))
        selections.append({"name": name, "ms": {names[c]: t for c, t in timings.items()}})

    select.add_feedback_saver(saver)
    timed = []  # careful: each ranked selection's choices' pass times
    if mode in RANKED:  # gpuenv-nowait: ranked in whatever state it finds (capped, hot)
        inductor.patch_inductor(rank=True, **({"condition": "none"} if "nowait" in mode else {}))
    elif mode == "careful":
        import gpuenv.timing.rank as ranking

        own_rank = ranking.rank

        def careful_rank(cands, **settings):  # each selection's choices, as rank gets them
            timed.append((careful_passes(cands), device_times(cands)))
            return own_rank(cands, **settings)  # what Inductor keeps: not what is reported

        ranking.rank = careful_rank  # type: ignore[assignment]  # the same call, spied on
        inductor.patch_inductor(rank=True)
        config.benchmark_epilogue_fusion = False  # only the selection's own choices matter
    spent = clock_benchmarking(select)  # after the patch: its ranking is timed too
    if state == "hot":  # after the patch: the load runs before gpuenv's ranking too
        heat_before_benchmarking(select, heavy_load(), float(hot_s))
    fn, args = problem(op, size, dtype)
    compiled = torch.compile(fn, mode="max-autotune")
    t0 = time.perf_counter()
    compiled(*args)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    import gpuenv

    inductor.unpatch_inductor()
    t_bench = time.perf_counter()
    e2e = gpuenv.bench(lambda: compiled(*args), name=f"compiled {op} {size}").median_s
    bench_s = time.perf_counter() - t_bench
    tuned = [s for s in selections if len(s["ms"]) > 1]
    if not tuned:
        raise SystemExit(f"no max-autotune selection of more than one choice: {selections}")
    pick = max(tuned, key=lambda s: len(s["ms"]))
    ms = pick["ms"]
    passes: dict[str, list[float]] = {}
    device: dict[str, float] = {}
    if mode == "careful":
        if not timed:
            raise SystemExit("careful: no selection reached gpuenv.rank: nothing timed carefully")
        passes, device = max(timed, key=lambda t: len(t[0]))
        ms = {n: statistics.median(v) for n, v in passes.items()}
    row = {
        "mode": mode,
        "state": state,
        "op": op,
        "size": size,
        "dtype": dtype,
        "selection": pick["name"],
        "winner": min(ms, key=ms.__getitem__),
        "ms": ms,
        "compile_wall_s": wall,
        "compiled_s": e2e,
        "parts_s": {"start": started_s, "compile": wall, "bench": bench_s},
        "select_wall_s": spent["select_s"],
        "other_bench_s": spent["other_s"],
        "other_bench_calls": spent["other_calls"],
        **({"capture_s": spent["capture_s"]} if "capture_s" in spent else {}),
        "torch": torch.__version__,
        "backends": config.max_autotune_gemm_backends,  # TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_...
        "gpu": torch.cuda.get_device_name(),
    }
    if passes:
        row["passes_ms"], row["device_ms"] = passes, device
    if mode in RANKED:
        ranked = inductor.rankings()
        if not ranked:
            raise SystemExit("patch_inductor(rank=True) ranked nothing: Inductor's own timed it")
        r = ranked[-1]["ranking"]
        row.update(tied=list(r.tied), rank_wall_s=sum(d["ranking"].wall_s for d in ranked))
        row["rank_rounds"] = r.rounds
        row["screen_wall_s"] = sum(d["ranking"].screen_wall_s for d in ranked)
        parts = [ranking_parts(d["ranking"]) for d in ranked]  # the rankings' walls, split
        row["rank_parts"] = {k: sum(p[k] for p in parts) for k in parts[0]}
        row["screened"] = len(r.screened)
        # the GPU state the last ranking's calls ran in (SM clock and temperature ranges,
        # findings): whether a ranking with condition="none" ran capped (kept since 11-29)
        row["rank_state"] = r.state.to_dict()
    print(json.dumps(row))


if __name__ == "__main__":
    main(*sys.argv[1:7])
