"""patch_inductor against a fake `torch._inductor.runtime.benchmarking` shaped like torch
2.x's (its benchmarker classes, their benchmark_gpu), on the simulated GPU. CPU torch
cannot run Inductor's GPU benchmarking at all (max-autotune on CPU times choices with
`benchmark_cpu`); the real one is for the device (benchmarks/autotune_rank.py)."""

from __future__ import annotations

import sys
import types

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.integrations import inductor
from gpuenv.integrations import triton as gtriton


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
def unpatched():
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


def test_patch_inductor_refuses_unknown_settings_and_a_missing_inductor(monkeypatch):
    with pytest.raises(ValueError, match="unknown settings: colour"):
        inductor.patch_inductor(colour="red")
    monkeypatch.setitem(sys.modules, inductor.MODULE, None)
    with pytest.raises(ValueError, match="needs torch with Inductor"):
        inductor.patch_inductor()
    monkeypatch.setitem(sys.modules, inductor.MODULE, types.ModuleType(inductor.MODULE))
    with pytest.raises(ValueError, match="an Inductor gpuenv does not know"):
        inductor.patch_inductor()
