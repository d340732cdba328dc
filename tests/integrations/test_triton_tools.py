"""set_gpu_clock on the simulated GPU (lock, exact restore, read-only refusal) and
patch_autotuner against fake `triton` modules shaped like triton's releases."""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from gpuenv import timing
from gpuenv.backend import ReadOnlyBackend
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import NotSupported, ReadOnlyError
from gpuenv.integrations import triton as gtriton


def settings(sim: SimBackend, gpu: int = 0) -> dict[str, Any]:
    """Everything a clock lock may touch, as the simulated GPU really has it."""
    t = sim.truth(gpu)
    return {
        k: getattr(t, k)
        for k in (
            "locked_sm",
            "locked_mem",
            "app_sm_mhz",
            "app_mem_mhz",
            "power_limit_w",
            "persistence",
        )
    }


class TestSetGpuClock:
    def test_locks_then_puts_back_what_was_there_not_defaults(self, vclock):
        sim = SimBackend("rtx4090", n_gpus=2, clock=vclock)
        sim.set_power_limit(0, 350.0)  # not the 450 W default
        sim.set_persistence_mode(0, True)  # triton's set_gpu_clock turns it off on exit
        before, other = settings(sim), settings(sim, 1)
        with gtriton.set_gpu_clock(1350, 5001, backend=sim) as ref:
            assert settings(sim) == {
                **before,
                "locked_sm": (1350, 1350),
                "locked_mem": (5001, 5001),
            }
            assert settings(sim, 1) == other  # GPU 0 only, as triton
            tflops, gbps = ref
            assert (tflops, gbps) == gtriton.ClockRef.of(1350, 5001)
            assert gbps == pytest.approx(6401.28)
        assert settings(sim) == before

    def test_restores_when_the_body_raises(self, vclock):
        sim = SimBackend(clock=vclock)
        sim.set_app_clocks(0, 2619, 1590)
        before = settings(sim)
        with (
            pytest.raises(RuntimeError, match="boom"),
            gtriton.set_gpu_clock(1350, None, backend=sim) as ref,
        ):
            assert sim.truth(0).locked_sm == (1350, 1350) and ref.gbps is None
            raise RuntimeError("boom")
        assert settings(sim) == before

    def test_an_unsupported_memory_clock_changes_nothing(self, vclock):
        sim = SimBackend(clock=vclock)  # Hopper: the memory clock cannot be locked now
        before = settings(sim)
        with pytest.raises(NotSupported, match="memory clock"), gtriton.set_gpu_clock(backend=sim):
            pass
        assert settings(sim) == before

    def test_read_only_refuses_before_any_write(self, vclock, monkeypatch):
        sim = SimBackend(clock=vclock)
        before = settings(sim)
        monkeypatch.setenv("GPUENV_READONLY", "1")
        with (
            pytest.raises(ReadOnlyError, match="GPUENV_READONLY") as err,
            gtriton.set_gpu_clock(1350, None, backend=sim),
        ):
            pass
        assert "set_gpu_clock" in str(err.value) and "nothing was changed" in str(err.value)
        monkeypatch.delenv("GPUENV_READONLY")
        with (
            pytest.raises(ReadOnlyError),
            gtriton.set_gpu_clock(1350, None, backend=ReadOnlyBackend(sim)),
        ):
            pass
        assert settings(sim) == before


# -- patch_autotuner -------------------------------------------------------------------

STYLES = ("property", "constructor", "module")  # triton >= 3.3, 3.0-3.2, 2.x
QS = (0.5, 0.2, 0.8)  # what the autotuner asks for


@dataclasses.dataclass
class FakeTriton:
    testing: types.ModuleType
    autotuner: types.ModuleType
    calls: list[str]

    def tuner(self, fn: Callable[[], Any], do_bench: Any = None) -> Any:
        cls = self.autotuner.Autotuner
        return cls(fn) if do_bench is None else cls(fn, do_bench=do_bench)


def fake_triton(monkeypatch: pytest.MonkeyPatch, style: str) -> FakeTriton:
    """triton, triton.testing and triton.runtime.autotuner as the autotuner uses them."""
    mods = {
        n: types.ModuleType(n)
        for n in ("triton", "triton.testing", "triton.runtime", "triton.runtime.autotuner")
    }
    testing, autotuner = mods["triton.testing"], mods["triton.runtime.autotuner"]
    calls: list[str] = []

    def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        calls.append("triton.do_bench")
        fn()
        return [1.0] * len(quantiles) if quantiles else 1.0

    def do_bench_cudagraph(fn, rep=20, grad_to_none=None, quantiles=None, return_mode="mean"):
        calls.append("triton.do_bench_cudagraph")
        return 1.0

    testing.do_bench, testing.do_bench_cudagraph = do_bench, do_bench_cudagraph

    def get_benchmarker() -> Any:  # the CUDA driver's: imports when asked
        from triton.testing import do_bench

        return do_bench

    def bench(self):  # Autotuner._bench's call
        if style == "module":  # the name imported into triton.runtime.autotuner
            return sys.modules["triton.runtime.autotuner"].do_bench(self.fn, quantiles=QS)
        return self.do_bench(self.fn, quantiles=QS)

    if style == "property":

        def init(self, fn, do_bench=None):
            self.fn, self._do_bench = fn, do_bench

        def prop(self):
            return get_benchmarker() if self._do_bench is None else self._do_bench

        body = {"__init__": init, "do_bench": functools.cached_property(prop), "_bench": bench}
        body["do_bench"].__set_name__(None, "do_bench")
    elif style == "constructor":

        def init(self, fn, do_bench=None):
            self.fn = fn
            self.do_bench = get_benchmarker() if do_bench is None else do_bench

        body = {"__init__": init, "_bench": bench}
    else:
        autotuner.do_bench, autotuner.do_bench_cudagraph = do_bench, do_bench_cudagraph

        def init(self, fn):
            self.fn = fn

        body = {"__init__": init, "_bench": bench}
    autotuner.Autotuner = type("Autotuner", (), body)
    mods["triton"].testing, mods["triton"].runtime = testing, mods["triton.runtime"]
    mods["triton.runtime"].autotuner = autotuner
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return FakeTriton(testing, autotuner, calls)


@pytest.fixture
def unpatched():
    yield
    gtriton.unpatch_autotuner()


@pytest.mark.usefixtures("unpatched")
@pytest.mark.parametrize("style", STYLES)
def test_patch_autotuner_routes_every_autotuner_through_the_drop_in(gpu, monkeypatch, style):
    tr = fake_triton(monkeypatch, style)
    original = vars(tr.autotuner.Autotuner).get("do_bench")
    kernel = timing.sim_kernel(gpu, 0, seconds=20e-6, power_intensity=0.2)
    ran_before = tr.tuner(kernel)
    assert ran_before._bench() == [1.0] * 3 and tr.calls == ["triton.do_bench"]
    made_before = tr.tuner(kernel)
    mine: list[str] = []
    own = None if style == "module" else tr.tuner(kernel, lambda fn, quantiles: mine.append("x"))

    gtriton.patch_autotuner(backend=gpu, warmup=1, rep=5)
    made_after = tr.tuner(kernel)
    n = len(gtriton.measurements())
    for tuner in (ran_before, made_before, made_after):
        med, lo, hi = tuner._bench()  # quantiles (0.5, 0.2, 0.8) of the drop-in's reps
        assert lo <= med <= hi and med == pytest.approx(0.020, rel=1e-3)
    assert len(gtriton.measurements()) == n + 3 and tr.calls == ["triton.do_bench"]
    assert tr.testing.do_bench.__name__ == "do_bench"
    if style == "module":
        graph = tr.autotuner.do_bench_cudagraph(kernel, rep=5, return_mode="median")
        assert graph == pytest.approx(0.020, rel=1e-3) and len(gtriton.measurements()) == n + 4
    assert gtriton.last_measurement().extra["dropin"]["rep_ms"] == 5
    if own is not None:
        own._bench()
        assert mine == ["x"]  # an autotuner given its own do_bench keeps it

    gtriton.unpatch_autotuner()
    gtriton.unpatch_autotuner()  # twice is fine
    assert vars(tr.autotuner.Autotuner).get("do_bench") is original
    for tuner in (ran_before, made_before, made_after):
        tuner._bench()
    assert tr.calls == ["triton.do_bench"] * 4
    if style == "module":
        assert tr.autotuner.do_bench_cudagraph is tr.testing.do_bench_cudagraph


@pytest.mark.usefixtures("unpatched")
def test_patch_replaces_cudagraph_and_a_second_patch_replaces_the_first(gpu, monkeypatch):
    tr = fake_triton(monkeypatch, "property")
    theirs = tr.testing.do_bench_cudagraph
    gtriton.patch_autotuner(backend=gpu)
    gtriton.patch_autotuner(backend=gpu, condition="none")
    kernel = timing.sim_kernel(gpu, 0, seconds=1e-3, power_intensity=0.2)
    assert tr.testing.do_bench_cudagraph(kernel, rep=5) == pytest.approx(1.0, rel=1e-3)
    assert gtriton.last_measurement().extra["condition"] == "none"
    gtriton.unpatch_autotuner()
    assert tr.testing.do_bench_cudagraph is theirs


def test_patch_autotuner_refuses_unknown_settings_and_a_missing_triton(monkeypatch):
    with pytest.raises(ValueError, match="unknown settings: colour"):
        gtriton.patch_autotuner(colour="red")
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails
    with pytest.raises(ValueError, match="needs triton"):
        gtriton.patch_autotuner()
    gtriton.unpatch_autotuner()  # nothing was patched: nothing to undo


# -- patch_autotuner(rank=True): the choice is gpuenv.rank's ----------------------------


class Config:
    """triton.Config as the autotuner uses it."""

    def __init__(self, kwargs, num_warps=4, num_stages=3):
        self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages
        self.num_ctas, self.maxnreg, self.pre_hook = 1, None, None

    def all_kwargs(self):
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}


class OutOfResources(Exception):
    pass


def triton3(monkeypatch: pytest.MonkeyPatch, seconds: dict[int, float], sim: SimBackend):
    """triton 3.x's Autotuner.run / _bench (the do_bench property), over a kernel whose
    time is `seconds[BM]` at the max clock (None: out of resources), heavy like a matmul."""
    tr = fake_triton(monkeypatch, "property")
    cls = tr.autotuner.Autotuner
    hz = sim.clock_limits(0).max_sm_mhz * 1e6
    launched: list[int] = []

    class Kernel:
        __name__ = "matmul_kernel"

        def run(self, *args, BM, num_warps, num_stages):
            launched.append(BM)
            if seconds[BM] is None:
                raise OutOfResources("shared memory")
            sim.run_work(0, seconds[BM] * hz, power_intensity=1.0)

    def init(self, configs, key):
        self.fn, self.base_fn, self._do_bench = Kernel(), Kernel(), None
        self.configs, self.keys, self.arg_names, self.cache = configs, key, ["M"], {}

    def _bench(self, *args, config, **meta):  # triton's: build kernel_call, time it
        current = dict(meta, **config.all_kwargs())

        def kernel_call():
            self.fn.run(*args, **current)

        try:
            return self.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))
        except OutOfResources:
            return [float("inf")] * 3

    def prune_configs(self, kwargs):
        return self.configs

    def run(self, *args, **kwargs):  # triton's: each config timed in turn, the least kept
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        key = tuple(args)
        if key not in self.cache:
            pruned = self.prune_configs(kwargs)
            timings = {c: self._bench(*args, config=c, **kwargs) for c in pruned}
            self.cache[key] = min(timings, key=timings.get)
            self.configs_timings = timings
        return self.cache[key]

    for name, fn in dict(
        __init__=init, _bench=_bench, prune_configs=prune_configs, run=run
    ).items():
        setattr(cls, name, fn)
    return tr, launched


@pytest.mark.usefixtures("unpatched")
def test_rank_switch_makes_the_autotuner_choose_the_best_config(gpu, monkeypatch):
    # the best config last, one that cannot run, one far behind: timed in turn as triton
    # does, the cap the first configs bring on makes the best read slower than it is
    seconds = {128: 0.202e-3, 64: 0.204e-3, 32: 0.220e-3, 16: None, 256: 0.200e-3}
    tr, launched = triton3(monkeypatch, seconds, gpu)
    configs = [Config({"BM": bm}, num_stages=3) for bm in seconds]
    gtriton.patch_autotuner(backend=gpu, condition="none", warmup=25, rep=100)
    plain = tr.autotuner.Autotuner(configs, key=["M"]).run(4096)
    assert plain.kwargs["BM"] != 256  # the cap fooled the timing one after the other

    gpu.idle(10.0)
    gtriton.unpatch_autotuner()
    theirs = tr.testing.do_bench
    gtriton.patch_autotuner(rank=True, backend=gpu)
    assert tr.testing.do_bench is theirs  # other callers of do_bench keep triton's
    tuner = tr.autotuner.Autotuner(configs, key=["M"])
    n = len(gtriton.rankings())
    assert tuner.run(4096).kwargs["BM"] == 256
    assert tuner.configs_timings[configs[3]] == [float("inf")] * 3  # out of resources
    decision = gtriton.rankings()[-1]
    assert len(gtriton.rankings()) == n + 1 and decision["kernel"] == "matmul_kernel"
    assert (
        decision["key"] == ["M=4096"]
        and decision["ranking"].winner == "BM=256 num_warps=4 num_stages=3"
    )
    assert decision["ranking"]["BM=32 num_warps=4 num_stages=3"].outcome == "far"
    assert tuner.run(4096).kwargs["BM"] == 256 and len(gtriton.rankings()) == n + 1  # cached
    launched.clear()
    assert tuner.run(2048).kwargs["BM"] == 256 and len(gtriton.rankings()) == n + 2  # new key
    assert 16 in launched  # each sweep finds again what cannot run

    gtriton.unpatch_autotuner()
    assert "_bench" in vars(tr.autotuner.Autotuner)  # triton's own again
    assert not getattr(tr.autotuner.Autotuner._bench, "__gpuenv_rank__", False)


@pytest.mark.usefixtures("unpatched")
def test_rank_switch_starts_the_sampler_while_the_configs_compile(gpu, monkeypatch):
    # a fresh process's first call spent ~0.4 s starting the sampler process on an H200:
    # the sweep begins it before it compiles the configs, and waits for it after
    from gpuenv.timing import rank as ranking

    tr, launched = triton3(monkeypatch, {128: 0.210e-3, 256: 0.200e-3}, gpu)
    events: list[tuple[str, object, list[int]]] = []
    own_rank = ranking.rank

    def prepare(**settings):
        events.append(("prepare", settings, list(launched)))
        return lambda: events.append(("opened", None, list(launched)))

    def rank(cands, **settings):
        events.append(("rank", None, list(launched)))
        return own_rank(cands, **settings)

    gtriton.patch_autotuner(rank=True, backend=gpu, tolerance=0.01)
    monkeypatch.setattr(ranking, "prepare", prepare)
    monkeypatch.setattr(ranking, "rank", rank)
    configs = [Config({"BM": bm}) for bm in (128, 256)]
    assert tr.autotuner.Autotuner(configs, key=["M"]).run(4096).kwargs["BM"] == 256
    assert [e[0] for e in events] == ["prepare", "opened", "rank"]
    assert events[0][1] == {"backend": gpu, "tolerance": 0.01} and events[0][2] == []
    assert events[1][2] == [128, 256]  # waited for once every config had run once


@pytest.mark.usefixtures("unpatched")
def test_rank_switch_leaves_an_autotuners_own_benchmarker_and_refuses_unknown_settings(
    gpu, monkeypatch
):
    tr, _ = triton3(monkeypatch, {64: 0.1e-3, 128: 0.2e-3}, gpu)
    with pytest.raises(ValueError, match=r"rank=True\) got unknown settings: colour"):
        gtriton.patch_autotuner(rank=True, colour="red")
    gtriton.patch_autotuner(rank=True, backend=gpu)
    tuner = tr.autotuner.Autotuner([Config({"BM": 64}), Config({"BM": 128})], key=["M"])
    tuner._do_bench = lambda fn, quantiles: [2.0, 2.0, 2.0] if fn() is None else None
    n = len(gtriton.rankings())
    assert tuner.run(1).kwargs["BM"] == 64 and len(gtriton.rankings()) == n  # its own timing
