"""A helper, not a benchmark: the GPU side the benchmarks that time torch kernels on a CUDA
GPU share: a wall clock, idling, heavy load (`GpuEnv`; `SimGpuEnv` on a simulated GPU for
their --sim runs, with `sim_do_bench`, a model of triton's do_bench there), issue 18/22's
ten kernels (`kernels`: benchmarks.speed and benchmarks.dropin measure the same set, each
under its own names), and the more processes a run-to-run figure asks for
(`child_values`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def kernels(torch: Any) -> dict[str, Callable[[], Any]]:
    """The ten kernels on the current CUDA device, by benchmarks.speed's names, set up (each
    called once: library set-up and lazy loading happen here, not in a tool)."""
    F = torch.nn.functional

    def randn(*shape: int, dtype: Any = torch.bfloat16) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    a2, b2 = randn(2048, 2048), randn(2048, 2048)
    a4, b4 = randn(4096, 4096), randn(4096, 4096)
    a8, b8 = randn(8192, 8192), randn(8192, 8192)
    q, k, v = (randn(8, 16, 2048, 128) for _ in range(3))
    sm = randn(8192, 8192, dtype=torch.float32)
    ln = randn(16384, 8192, dtype=torch.float16)
    img = randn(64, 128, 56, 56, dtype=torch.float16).to(memory_format=torch.channels_last)
    wconv = randn(128, 128, 3, 3, dtype=torch.float16).to(memory_format=torch.channels_last)
    x, w1, w2 = randn(8192, 4096), randn(4096, 16384), randn(16384, 4096)
    h5a, h5b = randn(512, 512, dtype=torch.float16), randn(512, 512, dtype=torch.float16)
    r1 = randn(1 << 20, dtype=torch.float32)
    out: dict[str, Callable[[], Any]] = {
        "mm2048": lambda: a2 @ b2,
        "mm4096": lambda: a4 @ b4,
        "mm8192": lambda: a8 @ b8,
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "softmax": lambda: sm.softmax(-1),
        "layernorm": lambda: F.layer_norm(ln, (8192,)),
        "conv": lambda: F.conv2d(img, wconv),
        "mlp": lambda: F.gelu(x @ w1) @ w2,
        "mm512": lambda: h5a @ h5b,
        "relu1m": lambda: F.relu(r1),
    }
    for fn in out.values():
        fn()
    torch.cuda.synchronize()
    return out


class GpuEnv:
    """Idle, heavy load (`heavy` back to back, `load_calls` between synchronizations) and a
    wall clock, on a CUDA GPU."""

    load_calls = 8
    now = staticmethod(time.monotonic)

    def __init__(self, torch: Any, heavy: Callable[[], Any]):
        self.torch, self._heavy = torch, heavy

    def idle(self, seconds: float) -> None:
        self.torch.cuda.synchronize()
        time.sleep(seconds)

    def load(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(self.load_calls):
                self._heavy()
            self.torch.cuda.synchronize()


class SimGpuEnv:
    """A simulated GPU with a context, on virtual time: its clock, idle, and heavy load
    (`seconds` of work at the top clock, power intensity 1: longer under the cap).
    `profile`: which GPU (a key of gpuenv.backend.sim_profiles.PROFILES; the H100 unless
    asked)."""

    name = "sim"

    def __init__(self, profile: str = "h100") -> None:
        from gpuenv.backend.sim import SimBackend
        from gpuenv.timebase import VirtualClock

        self.backend = SimBackend(profile, clock=VirtualClock())
        self.backend.open_context(0)

    def now(self) -> float:
        return self.backend.clock.now()

    def idle(self, seconds: float) -> None:
        self.backend.idle(seconds)

    def load(self, seconds: float) -> None:
        from gpuenv import timing

        timing.sim_kernel(self.backend, 0, seconds=seconds, power_intensity=1.0)()


def sim_do_bench(backend: Any, fn: Callable[[], Any]) -> float:
    """triton.testing.do_bench's schedule on the simulated GPU (triton cannot run there), in
    ms: a first call, 5 timed calls to estimate one, ~25 ms of warm-up calls, then ~100 ms of
    timed calls, each after a flush of triton's 256 MiB (not timed); their mean."""
    import statistics

    from gpuenv import timing
    from gpuenv.integrations.triton import TRITON_FLUSH_BYTES

    dev = timing.SimDevice(backend, 0, rep_probe_cycles=0, flush_bytes=TRITON_FLUSH_BYTES)
    flush_s = dev.flush_mem_cycles / (backend.clock_limits(0).max_mem_mhz * 1e6)
    fn()
    est = statistics.mean(dev.rep(fn).time_s + flush_s for _ in range(5))
    for _ in range(max(1, int(0.025 / est))):
        fn()
    times = [dev.rep(fn).time_s for _ in range(max(1, int(0.100 / est)))]
    return statistics.mean(times) * 1e3


def child_values(module: str, n: int, args: list[str], timeout: float) -> list[dict[str, float]]:
    """`n` processes of `python -m module --child --out - ARGS`, one after the other: what
    each printed on its last `CHILD {json}` line (a process that failed or ran past
    `timeout` seconds is said on stderr and left out)."""
    got = []
    for _ in range(n):
        cmd = [sys.executable, "-m", module, "--child", "--out", "-", *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"# a child process ran past {timeout} s", file=sys.stderr)
            continue
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")]
        if lines:
            got.append(json.loads(lines[-1][6:]))
        else:
            print(f"# a child process failed: {proc.stderr[-2000:]}", file=sys.stderr)
    return got
