"""GPU timing done right: `bench(fn)` with telemetry on every repetition.

    m = gpuenv.bench(lambda: a @ b, name="gemm")     # -> Measurement
    print(m.stats.median_s, m.stats.ci_s, m.findings)

What a rep is on CUDA (CUDA events around fn behind a clock-probe spin, a CUDA graph
of several calls, or the profiler's summed kernel time) is described in `cuda/`.

The harness around the device is device-agnostic and runs on the simulated GPU
in tests (`SimDevice`, `sim_kernel`): warmup until rep times and clocks stop
trending; conditioning (gpuenv.conditioning: condition="burst": short bursts,
each started from the GPU's cool, uncapped state -- the default unless gpuenv's
clock lock holds; condition="sustained": run fn until it reaches equilibrium,
then measure reps of fn back to back, see `BackToBack`); the stopping rule of
`gpuenv.stats.StopRule`; then gpuenv.judge turns the reps and their telemetry
windows into findings, a verdict and a Measurement.

torch is imported here lazily, only when a CUDA device is timed.

The package:
    devices.py           the Device protocol, Rep, ClockDevice, SimDevice, BackToBack, sim_kernel
    cuda/events.py       CUDA events, graphs, the profiler's device; what a tiny call gets
    cuda/profiler.py     torch and its profiler: traces, CUPTI device time (cupti_median_s)
    config.py            BenchConfig: every setting of bench(), the safe defaults
    harness.py           bench(): warmup (until times and clocks stop trending), conditioning,
                         reps, windows, findings -> Measurement
    pair.py              bench_pair(a, b): calls of the two alternating, the ratio of each pair
    rank.py              rank(candidates): interleaved rounds, far ones stopped, close ones paired
    decision.py          an autotuner's choice on the record: Decision, its record and lines
"""

from __future__ import annotations

from gpuenv.conditioning import Conditioning, precondition, wait_until_ready
from gpuenv.timing.config import CONDITIONS, DEFAULT_BUDGET_S, BenchConfig
from gpuenv.timing.cuda import (
    COVER_ATTEMPTS,
    PROBE_MAX_S,
    PROFILER_BATCH,
    PROFILER_MAX_REPS,
    CudaEvents,
    CudaGraph,
    CudaProfiler,
    _profiled_rep_times,
    _torch,
    cuda_device,
    cupti_median_s,
    nvml_index_of_cuda,
)
from gpuenv.timing.devices import (
    CLOCK_PROBE_S,
    MODES,
    REP_PROBE_CYCLES,
    SUSTAINED_REP_S,
    BackToBack,
    ClockDevice,
    Device,
    Rep,
    SimDevice,
    sim_kernel,
)
from gpuenv.timing.harness import WARMUP_MIN_REPS, WARMUP_REL_TOL, WARMUP_WINDOW, bench
from gpuenv.timing.pair import Pair, bench_pair, pair_ratio

# _torch is used by clocks.calibration and demo.measure, _profiled_rep_times by tests
__all__ = [
    "CLOCK_PROBE_S",
    "CONDITIONS",
    "COVER_ATTEMPTS",
    "DEFAULT_BUDGET_S",
    "MODES",
    "PROBE_MAX_S",
    "PROFILER_BATCH",
    "PROFILER_MAX_REPS",
    "REP_PROBE_CYCLES",
    "SUSTAINED_REP_S",
    "WARMUP_MIN_REPS",
    "WARMUP_REL_TOL",
    "WARMUP_WINDOW",
    "BackToBack",
    "BenchConfig",
    "ClockDevice",
    "Conditioning",
    "CudaEvents",
    "CudaGraph",
    "CudaProfiler",
    "Device",
    "Pair",
    "Rep",
    "SimDevice",
    "_profiled_rep_times",
    "_torch",
    "bench",
    "bench_pair",
    "cuda_device",
    "cupti_median_s",
    "nvml_index_of_cuda",
    "pair_ratio",
    "precondition",
    "sim_kernel",
    "wait_until_ready",
]
