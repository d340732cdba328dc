"""patch_inductor against a fake `torch._inductor.runtime.benchmarking` shaped like torch
2.x's (its benchmarker classes, their benchmark_gpu), on the simulated GPU; and
patch_inductor(rank=True) through CPU torch's own `AlgorithmSelectorCache` (its
make_benchmark_fn, benchmark_choices and benchmark_choice, their error handling) with
choices whose GPU work is the simulated GPU's. CPU torch cannot run Inductor's GPU
benchmarking itself (max-autotune on CPU times choices with `benchmark_cpu`); the real one
is for the device (benchmarks/workloads/inductor_mm.py)."""

from __future__ import annotations

import logging
import math
import re
import sys
import types

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.integrations import inductor
from gpuenv.integrations import triton as gtriton
from gpuenv.timing import sim_kernel


def fake_benchmarking(monkeypatch: pytest.MonkeyPatch, sim: SimBackend) -> types.ModuleType:
    mod = types.ModuleType(inductor.MODULE)

    class Benchmarker:
        def benchmark_gpu(self, *args, **kwargs):
            raise NotImplementedError

    class TritonBenchmarker(Benchmarker):
        def benchmark_gpu(self, _callable, is_vetted_benchmarking=False, **kwargs):
            return gtriton.do_bench(_callable, backend=sim, condition="none", **kwargs)

    class InductorBenchmarker(TritonBenchmarker):
        def benchmark_gpu(self, _callable, estimation_iters=5, return_mode="min", **kwargs):
            # its own, in kind: events around calls back to back, in the state they find
            return gtriton.do_bench(_callable, backend=sim, condition="none")

    mod.Benchmarker, mod.TritonBenchmarker = Benchmarker, TritonBenchmarker
    mod.InductorBenchmarker = InductorBenchmarker
    mod.benchmarker = InductorBenchmarker()
    monkeypatch.setitem(sys.modules, inductor.MODULE, mod)
    return mod


def choices(sim: SimBackend) -> dict[str, object]:
    """max-autotune's choices for one mm, heavy; the best last."""
    hz = sim.clock_limits(0).max_sm_mhz * 1e6

    def k(seconds: float):
        return lambda: sim.run_work(0, seconds * hz, power_intensity=1.0)

    return {
        "triton_mm_1": k(0.202e-3),
        "triton_mm_2": k(0.204e-3),
        "triton_mm_3": k(0.206e-3),
        "cublas": k(0.200e-3),
    }


def select(mod: types.ModuleType, cands: dict[str, object]) -> str:
    """AlgorithmSelectorCache's way: each choice timed in turn, the least kept."""
    timings = {
        name: mod.benchmarker.benchmark_gpu(fn, estimation_iters=5) for name, fn in cands.items()
    }
    return min(timings, key=timings.__getitem__)


@pytest.fixture
def unpatched(monkeypatch):  # unpatched before monkeypatch puts back what it changed
    yield
    inductor.unpatch_inductor()


@pytest.mark.usefixtures("unpatched")
def test_patch_inductor_times_each_choice_from_the_same_state(gpu, monkeypatch):
    mod = fake_benchmarking(monkeypatch, gpu)
    own = mod.InductorBenchmarker.benchmark_gpu
    assert select(mod, choices(gpu)) != "cublas"  # the cap its first choices brought on
    gpu.idle(10.0)
    inductor.patch_inductor(backend=gpu)
    n = len(gtriton.measurements())
    assert select(mod, choices(gpu)) == "cublas"
    ms = gtriton.measurements()[n:]
    assert len(ms) == 4 and {m.extra["condition"] for m in ms} == {"burst"}
    assert all(m.name == "inductor autotune" for m in ms)
    every = mod.benchmarker.benchmark_gpu(choices(gpu)["cublas"], return_mode="all")
    assert isinstance(every, list) and len(every) == len(gtriton.last_measurement().times_s)
    inductor.unpatch_inductor()
    inductor.unpatch_inductor()  # twice is fine
    assert mod.InductorBenchmarker.benchmark_gpu is own


@pytest.mark.usefixtures("unpatched")
def test_under_rank_the_other_callers_calls_wait_for_no_counter_read(gpu, monkeypatch):
    # a ranking's calls judge with the reason-counter reads already in; under rank=True
    # benchmark_gpu's other callers' calls (pointwise tuning, the epilogue-fusion check)
    # are the same kind of call; without rank each call is judged as any do_bench
    import gpuenv.timing as timing

    mod = fake_benchmarking(monkeypatch, gpu)
    seen: list[bool] = []
    own_bench = timing.bench

    def spy(fn, cfg, **kw):
        seen.append(cfg.wait_counters)
        return own_bench(fn, cfg, **kw)

    monkeypatch.setattr(timing, "bench", spy)
    inductor.patch_inductor(backend=gpu)
    assert mod.benchmarker.benchmark_gpu(choices(gpu)["cublas"]) > 0
    # the benchmarkers alone (a fake Inductor has no AlgorithmSelectorCache to rank in)
    monkeypatch.setattr(inductor, "_import", lambda name: sys.modules.get(name, types))
    monkeypatch.setattr(inductor, "_selector_class", lambda module: None)
    inductor.patch_inductor(rank=True, backend=gpu)
    assert mod.benchmarker.benchmark_gpu(choices(gpu)["cublas"], rep=100) > 0
    assert seen == [True, False]
    with pytest.raises(ConfigError, match="wait_counters"):
        gtriton.do_bench(choices(gpu)["cublas"], backend=gpu, wait_counters="no")


def test_patch_inductor_refuses_unknown_settings_and_a_missing_inductor(monkeypatch):
    with pytest.raises(ValueError, match="unknown settings: colour"):
        inductor.patch_inductor(colour="red")
    monkeypatch.setitem(sys.modules, inductor.MODULE, None)
    with pytest.raises(ValueError, match="needs torch with Inductor"):
        inductor.patch_inductor()
    monkeypatch.setitem(sys.modules, inductor.MODULE, types.ModuleType(inductor.MODULE))
    with pytest.raises(ValueError, match="an Inductor gpuenv does not know"):
        inductor.patch_inductor()


# -- rank=True through CPU torch's AlgorithmSelectorCache ---------------------------------


class Request:
    """A Triton template's benchmark request, in kind: its module is loaded for each
    benchmark and unloaded by `cleanup_run_fn` (torch 2.10 and later), after which its
    kernel cannot run."""

    def __init__(self, kernel):
        self.kernel, self.loaded, self.cleanups = kernel, False, 0

    def run(self):
        if not self.loaded:
            raise RuntimeError("the kernel's module was unloaded")
        self.kernel()

    def cleanup_run_fn(self):
        self.loaded = False
        self.cleanups += 1


class Choice:
    """A max-autotune choice, as benchmark_choice calls it: `benchmark(*inputs, out=)` hands
    its GPU work to the benchmarker and returns the ms it says."""

    def __init__(self, name, kernel, description="", fails=False):
        self.name, self.description, self.fails = name, description, fails
        self.bmreq = Request(kernel)

    def benchmark(self, *inputs, out):
        from torch._inductor.runtime.benchmarking import benchmarker

        if self.fails:
            raise RuntimeError("invalid argument")
        self.bmreq.loaded = True
        try:
            return benchmarker.benchmark_gpu(self.bmreq.run)
        finally:
            self.bmreq.cleanup_run_fn()


class ExternKernelCaller(Choice):
    """cuBLAS through ATen: Inductor names it by the op."""


class Node:
    def __init__(self, *size):
        self.size = size

    def get_size(self):
        return list(self.size)

    def get_dtype(self):
        import torch

        return torch.float16


@pytest.fixture
def selector(monkeypatch, sim):
    """CPU torch's AlgorithmSelectorCache, its inputs made on the CPU, and its benchmarker
    timing in kind with Inductor's own (each choice in the state it finds)."""
    sa = pytest.importorskip("torch._inductor.select_algorithm")
    bm = pytest.importorskip("torch._inductor.runtime.benchmarking")
    import torch

    if not isinstance(vars(sa.AlgorithmSelectorCache).get("make_benchmark_fn"), classmethod):
        pytest.skip("this torch has no make_benchmark_fn classmethod")
    x = torch.zeros(2, 2)
    args = sa.AutotuneArgs.from_choice_args([x], [x], x, x, None)
    monkeypatch.setattr(sa.AlgorithmSelectorCache, "get_inputs", classmethod(lambda *a, **k: args))

    def own(self, _callable, **kwargs):
        return gtriton.do_bench(_callable, backend=sim, condition="none")

    monkeypatch.setattr(bm.TritonBenchmarker, "benchmark_gpu", own)
    monkeypatch.setattr(bm, "benchmarker", bm.TritonBenchmarker())
    return sa.AlgorithmSelectorCache


def mm_choices(sim) -> list[Choice]:
    """One mm's choices in Inductor's order, heavy; cuBLAS the best, timed last."""
    return [
        Choice(name, fn, description="BLOCK_M=128, BLOCK_N=128, num_stages=3, num_warps=8")
        for name, fn in choices(sim).items()
        if name != "cublas"
    ] + [ExternKernelCaller("mm", choices(sim)["cublas"])]


def autotune(selector, choices) -> dict:
    """AlgorithmSelectorCache.benchmark's way: make the benchmark function, call it with all
    the choices; Inductor then keeps the least."""
    fn = selector.make_benchmark_fn(choices, [Node(4096, 4096), Node(4096, 4096)], None, None)
    return fn(choices)


def chosen(timings: dict) -> str:
    return min(timings, key=timings.__getitem__).name


@pytest.mark.usefixtures("unpatched")
def test_rank_makes_inductor_keep_gpuenv_s_choice_on_the_record(gpu, selector):
    assert chosen(autotune(selector, mm_choices(gpu))) != "mm"  # plain: the cap decided
    gpu.idle(10.0)
    inductor.patch_inductor(rank=True, backend=gpu)
    assert inductor.ranking_on()
    choices = mm_choices(gpu)
    timings = autotune(selector, choices)
    assert list(timings) == choices and chosen(timings) == "mm"
    decision = inductor.rankings()[-1]
    r = decision["ranking"]
    assert decision["kernel"] == "inductor mm"
    assert decision["key"] == ["4096x4096 float16", "4096x4096 float16"]
    assert r.winner == "mm" and r.order[0] == (
        "triton_mm_1 BLOCK_M=128 BLOCK_N=128 num_stages=3 num_warps=8"
    )
    assert timings[choices[-1]] == pytest.approx(r["mm"].median_s * 1e3)
    # benchmark_gpu's other callers (pointwise autotuning): gpuenv's do_bench, on rank's GPU
    from torch._inductor.runtime.benchmarking import benchmarker

    n = len(gtriton.measurements())
    assert benchmarker.benchmark_gpu(choices[0].bmreq.kernel) > 0
    # ...as long as a ranking's call at most, whatever rep Inductor's benchmark() hands it
    assert benchmarker.benchmark_gpu(choices[0].bmreq.kernel, warmup=25, rep=100) > 0
    ms = gtriton.measurements()[n:]
    assert [m.name for m in ms] == ["inductor autotune"] * 2
    plans = [m.extra["dropin"] for m in ms]
    assert [(p["warmup_ms"], p["rep_ms"]) for p in plans] == [(25, 10.0), (25, 10.0)]
    # each template's module stayed loaded while ranked (the kernel ran), unloaded once after
    assert [c.bmreq.cleanups for c in choices] == [1, 1, 1, 1]
    assert not any(c.bmreq.loaded for c in choices)
    inductor.unpatch_inductor()
    assert not inductor.ranking_on()
    assert "__gpuenv_rank__" not in vars(vars(selector)["make_benchmark_fn"].__func__)


@pytest.mark.usefixtures("unpatched")
def test_a_tie_goes_to_the_first_in_inductor_s_order_and_a_failed_choice_stays_inf(gpu, selector):
    k = {s: sim_kernel(gpu, 0, seconds=s) for s in (0.2000e-3, 0.2006e-3, 0.2200e-3)}
    inductor.patch_inductor(rank=True, backend=gpu)
    for _ in range(3):
        choices = [
            Choice("triton_mm_0", k[0.2200e-3]),
            Choice("triton_mm_1", k[0.2006e-3]),  # within 0.3% of the fastest: a tie
            Choice("triton_mm_2", k[0.2000e-3]),
            Choice("triton_mm_3", k[0.2000e-3], fails=True),
        ]
        timings = autotune(selector, choices)
        assert chosen(timings) == "triton_mm_1"
        assert math.isinf(timings[choices[3]])
        r = inductor.rankings()[-1]["ranking"]
        assert r.tied == ("triton_mm_1", "triton_mm_2") and len(r.candidates) == 3
        assert inductor.rankings()[-1]["kernel"] == "inductor triton_mm"


@pytest.mark.usefixtures("unpatched")
def test_rank_starts_the_sampler_while_inductor_benchmarks_each_choice_once(
    gpu, selector, monkeypatch
):
    from gpuenv.timing import rank as ranking

    events: list[str] = []
    own_capture, own_rank = inductor._capture_choices, ranking.rank
    inductor.patch_inductor(rank=True, backend=gpu, budget_s=2.0)
    settings: list[dict] = []

    def prepare(**given):
        settings.append(given)
        events.append("prepare")
        return lambda: events.append("opened")

    def capture(fn, choices):
        events.append("capture")
        return own_capture(fn, choices)

    def rank(cands, **given):
        events.append("rank")
        return own_rank(cands, **given)

    monkeypatch.setattr(ranking, "prepare", prepare)
    monkeypatch.setattr(ranking, "rank", rank)
    monkeypatch.setattr(inductor, "_capture_choices", capture)
    assert chosen(autotune(selector, mm_choices(gpu))) == "mm"
    assert events == ["prepare", "capture", "opened", "rank"]
    assert settings == [{"backend": gpu, "budget_s": 2.0}]


@pytest.mark.usefixtures("unpatched")
def test_rank_opens_ahead_when_switched_on_where_a_gpu_is_present(gpu, selector, monkeypatch):
    """The first selection's opening (NVML, the sampler process: 0.45 s of an H200's
    0.86 s selection) begins at the switch, during Inductor's tracing and compiling; CPU
    torch, with no GPU, opens nothing."""
    import torch

    from gpuenv.timing import rank as ranking

    opened: list[dict] = []
    monkeypatch.setattr(ranking, "prepare", lambda **given: opened.append(given))
    inductor.patch_inductor(rank=True, backend=gpu, budget_s=2.0)
    assert opened == []  # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    inductor.patch_inductor(rank=True, backend=gpu, budget_s=2.0)
    assert opened == [{"backend": gpu, "budget_s": 2.0}]
    inductor.patch_inductor()  # each choice timed, no ranking: nothing to open
    assert len(opened) == 1


@pytest.mark.usefixtures("unpatched")
def test_the_choices_work_is_kept_in_one_pass_of_inductor_s_or_one_choice_at_a_time(
    gpu, selector, monkeypatch
):
    """One call of Inductor's benchmark function hands over every choice's work (one set of
    example inputs: an mm of 4096^3 in fp16 held ~100 MB a choice until the ranking ended);
    where the calls kept cannot be matched to the choices that way (a choice whose timing
    is not benchmark_gpu's own), each choice is benchmarked alone, as before."""
    own_inputs = selector.get_inputs
    made: list[int] = []

    def get_inputs(cls, choices, *args, **kwargs):
        made.append(len(choices))
        return own_inputs(choices, *args, **kwargs)

    monkeypatch.setattr(selector, "get_inputs", classmethod(get_inputs))
    inductor.patch_inductor(rank=True, backend=gpu)
    assert chosen(autotune(selector, mm_choices(gpu))) == "mm"
    assert made == [4]  # one pass over the four choices

    class Offset(Choice):  # a torch that adds to what benchmark_gpu returned
        def benchmark(self, *inputs, out):
            return super().benchmark(*inputs, out=out) + 1e-6

    made.clear()
    k = {s: sim_kernel(gpu, 0, seconds=s) for s in (0.2000e-3, 0.2200e-3)}
    choices = [Offset("triton_mm_1", k[0.2200e-3]), Offset("triton_mm_2", k[0.2000e-3])]
    timings = autotune(selector, choices)
    assert chosen(timings) == "triton_mm_2" and made == [2, 1, 1]  # then one at a time
    assert inductor.rankings()[-1]["choices"] == ["triton_mm_1", "triton_mm_2"]


@pytest.mark.usefixtures("unpatched")
def test_choices_not_timed_through_benchmark_gpu_are_left_to_inductor(gpu, selector):
    class CpuChoice(Choice):
        def benchmark(self, *inputs, out):  # what benchmark_cpu returns: not handed over
            return 0.05 if self.name == "mm" else 0.04

    inductor.patch_inductor(rank=True, backend=gpu)
    n = len(inductor.rankings())
    choices = [CpuChoice("cpp_gemm_0", None), CpuChoice("mm", None)]
    assert autotune(selector, choices) == {choices[0]: 0.04, choices[1]: 0.05}
    one = [Choice("triton_mm_0", sim_kernel(gpu, 0, seconds=1e-4))]  # nothing to rank
    assert autotune(selector, one)[one[0]] > 0
    assert len(inductor.rankings()) == n


def test_rank_refuses_unknown_settings_and_an_inductor_without_the_hook(monkeypatch):
    with pytest.raises(ValueError, match=r"patch_inductor\(rank=True\) got unknown settings: x"):
        inductor.patch_inductor(rank=True, x=1)
    pytest.importorskip("torch._inductor.select_algorithm")
    import torch

    old = types.ModuleType(inductor.SELECT_MODULE)
    old.AlgorithmSelectorCache = type("AlgorithmSelectorCache", (), {})
    monkeypatch.setitem(sys.modules, inductor.SELECT_MODULE, old)
    with pytest.raises(ValueError, match=f"torch {re.escape(torch.__version__)}: .*no Alg"):
        inductor.patch_inductor(rank=True)
    assert not inductor.ranking_on()


@pytest.mark.usefixtures("unpatched")
def test_the_run_switch_on_an_inductor_without_the_hook_still_times_with_gpuenv(monkeypatch):
    from gpuenv.run import autoregions

    bm = pytest.importorskip(inductor.MODULE)
    old = types.ModuleType(inductor.SELECT_MODULE)
    old.AlgorithmSelectorCache = type("AlgorithmSelectorCache", (), {})
    monkeypatch.setitem(sys.modules, inductor.SELECT_MODULE, old)
    autoregions._switch_autotuner(inductor.MODULE)  # select_algorithm's switch does it
    assert getattr(bm.TritonBenchmarker.benchmark_gpu, "__gpuenv__", False) is False
    with pytest.raises(ValueError, match=r"no AlgorithmSelectorCache\.make_benchmark_fn"):
        autoregions._switch_autotuner(inductor.SELECT_MODULE)
    assert bm.TritonBenchmarker.benchmark_gpu.__gpuenv__ and not inductor.ranking_on()


@pytest.mark.slow
@pytest.mark.usefixtures("unpatched")
def test_a_real_cpu_max_autotune_compiles_under_rank_and_is_left_to_inductor(
    tmp_path, monkeypatch, caplog
):
    """CPU max-autotune (a frozen Linear+ReLU: its CPP GEMM template against MKL) times its
    choices with benchmark_cpu: the switch sees the selection and leaves it to Inductor."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._inductor.select_algorithm")
    import torch._inductor.config as config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "freezing", True)
    monkeypatch.setattr(config, "max_autotune_gemm_backends", "CPP,ATEN")
    inductor.patch_inductor(rank=True)
    n = len(inductor.rankings())
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()
    x = torch.randn(32, 64)
    caplog.set_level(logging.INFO, logger=inductor.__name__)
    with torch.no_grad():
        got = torch.compile(model, mode="max-autotune")(x)
        assert torch.allclose(got, model(x))
    torch._dynamo.reset()
    assert "not timed through benchmark_gpu: not ranked" in caplog.text
    assert len(inductor.rankings()) == n
