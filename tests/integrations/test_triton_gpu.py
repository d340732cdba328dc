"""The do_bench drop-ins on a real GPU against triton's own (read-only: GPUENV_READONLY=1
is fine). The wall time of a call is compared on a rested GPU, where the burst check has
nothing to wait for; benchmarks/dropin.py measures more kernels, cold and hot.

No `from __future__ import annotations` here: triton.jit reads `BLOCK: tl.constexpr`."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - NVML sees a GPU but torch does not
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")
tt = pytest.importorskip("triton.testing")

from gpuenv.integrations import triton as gtriton  # noqa: E402

IDLE_S = (
    1.0  # the power cap of a previous test clears within ~0.5 s (docs/explanation/what-gpus-do.md)
)


def wall_s(call: Callable[[], Any], n: int = 3) -> float:
    """Median wall time of `call` over n calls, each after IDLE_S of idle (a warm call
    first: library set-up and gpuenv's NVML start-up are not a call's cost)."""
    call()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        time.sleep(IDLE_S)
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernels() -> dict[str, Callable[[], Any]]:
    x = torch.randn(1 << 20, device="cuda")
    a2, b2 = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    a4, b4 = (torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {"relu_1m": lambda: torch.relu(x), "mm2048": lambda: a2 @ b2, "mm4096": lambda: a4 @ b4}


@pytest.mark.parametrize("name", ["relu_1m", "mm2048", "mm4096"])
def test_do_bench_starts_at_once_when_cold_and_agrees_with_triton(name):
    # The wall time against triton's (issue 18's 1.5x cold, 3x hot) is a figure, measured
    # side by side by benchmarks/dropin.py (docs/benchmarks/dropin.md), not a test's bound.
    fn = kernels()[name]
    wall_s(lambda: gtriton.do_bench(fn))
    m = gtriton.last_measurement()
    assert m.extra.get("burst_first_wait_s", 0.0) < 0.05 and len(m.windows) == len(m.times_s)
    # the same kernel, flushed the same way, measures the same within a few percent; a
    # tiny one reads lower: the drop-in's spin keeps launch latency out of its events,
    # triton's does not (3-5 us on the H100, measured 2026-11-24)
    same = gtriton.do_bench(fn, flush_bytes=gtriton.TRITON_FLUSH_BYTES, return_mode="median")
    theirs = tt.do_bench(fn, return_mode="median")
    if name == "relu_1m":
        assert theirs - 6e-3 <= same <= 1.15 * theirs
    else:
        assert same == pytest.approx(theirs, rel=0.15)


def test_do_bench_cudagraph_times_a_graph_and_agrees_with_triton():
    # its wall time against triton's is a figure (benchmarks/dropin.py), not a bound here:
    # on the H100 it read 1.0-1.5x in one run of this test and 1.99x in the next
    fn = kernels()["relu_1m"]
    with torch.cuda.stream(torch.cuda.Stream()):
        theirs = tt.do_bench_cudagraph(fn)
    ours = gtriton.do_bench_cudagraph(fn)
    assert gtriton.last_measurement().timer == "cuda_graph"
    assert ours == pytest.approx(theirs, rel=0.15)  # both a graph of ~20 ms of calls


def test_patch_autotuner_makes_triton_autotune_measure_with_the_drop_in():
    import triton.language as tl

    @triton.autotune(
        configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"]
    )
    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)

    n = 1 << 22
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    before = len(gtriton.measurements())
    gtriton.patch_autotuner()
    try:
        add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    finally:
        gtriton.unpatch_autotuner()
    torch.cuda.synchronize()
    assert len(gtriton.measurements()) == before + 2  # one measurement per config
    assert torch.equal(out, x + y)
    assert tt.do_bench.__module__ == "triton.testing"


def test_an_mlp_block_reads_the_same_cold_and_hot_and_its_reps_hold_one_level():
    """The MLP block of issue 18 (2.9 ms at 700 W): back to back, triton's budget runs it
    into the power cap (2.89 -> 3.0-3.2 ms); in bursts it is measured uncapped, whether the
    GPU was rested or just came off heavy work."""
    x, w1, w2 = (
        torch.randn(*s, device="cuda", dtype=torch.bfloat16)
        for s in ((8192, 4096), (4096, 16384), (16384, 4096))
    )
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def mlp() -> Any:
        return torch.nn.functional.gelu(x @ w1) @ w2

    gtriton.do_bench(mlp)  # set-up
    torch.cuda.synchronize()
    time.sleep(3.0)
    cold = gtriton.do_bench(mlp, return_mode="median")
    m_cold = gtriton.last_measurement()
    end = time.monotonic() + 3.0
    while time.monotonic() < end:  # heavy load: capped and hot
        for _ in range(8):
            _ = a @ b
        torch.cuda.synchronize()
    hot = gtriton.do_bench(mlp, return_mode="median")
    m_hot = gtriton.last_measurement()
    for m in (m_cold, m_hot):
        kinds = {f.kind for f in m.findings}
        assert not kinds & {"drift", "bimodal", "power_cap"}, m.findings
        assert m.extra["burst_max_s"] < 0.1  # under the cap's onset
    assert hot == pytest.approx(cold, rel=0.01)
