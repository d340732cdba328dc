"""GPU timing done right: `bench(fn)` with telemetry on every repetition.

    m = gpuenv.bench(lambda: a @ b, name="gemm")     # -> Measurement
    print(m.stats.median_s, m.extra["ci_s"], m.findings)

What a rep is on CUDA (CUDA events around fn behind a clock-probe spin, a CUDA graph
of several calls, or the profiler's summed kernel time) is described in `cuda.py`.

The harness around the device is device-agnostic and runs on the simulated GPU
in tests (`SimDevice`, `sim_kernel`): warmup until rep times and clocks stop
trending; optional conditioning (condition="burst": short bursts, each started
from the GPU's uncapped state; condition="sustained": run fn until clock and
temperature reach equilibrium, then measure reps of fn back to back, see
`BackToBack`); the stopping rule of
`gpuenv.stats.StopRule`; telemetry windows per rep from the sampler; findings
and the policy from `gpuenv.verdict`.

torch is imported here lazily, only when a CUDA device is timed.

The package:
    devices.py           the Device protocol, Rep, ClockDevice, SimDevice, BackToBack, sim_kernel
    cuda.py              CUDA events, graphs, the profiler (the only module importing torch)
    warmup.py            reps until times and clocks stop trending
    conditioning_old.py  burst wait and sustained precondition (gpuenv.conditioning replaces it)
    harness.py           bench(): warmup, conditioning, reps, windows, findings -> Measurement
"""

from __future__ import annotations

from gpuenv.timing.conditioning_old import (
    BURST_DUTY,
    BURST_S,
    DEFAULT_TEMP_SENSITIVITY,
    LIMITING_REASONS,
    PRECONDITION_CHUNK_S,
    PRECONDITION_MAX_S,
    PRECONDITION_TAU_S,
    PRECONDITION_TOL,
    PRECONDITION_WINDOW_S,
    Conditioning,
    precondition,
    wait_until_ready,
)
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
    _trace_events,
    cuda_device,
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
from gpuenv.timing.harness import CONDITIONS, DEFAULT_BUDGET_S, _gpu_facts, bench
from gpuenv.timing.warmup import WARMUP_MIN_REPS, WARMUP_REL_TOL, WARMUP_WINDOW

# the private names above are used by calibrate, demo_measure, integrations and tests
__all__ = [
    "BURST_DUTY",
    "BURST_S",
    "CLOCK_PROBE_S",
    "CONDITIONS",
    "COVER_ATTEMPTS",
    "DEFAULT_BUDGET_S",
    "DEFAULT_TEMP_SENSITIVITY",
    "LIMITING_REASONS",
    "MODES",
    "PRECONDITION_CHUNK_S",
    "PRECONDITION_MAX_S",
    "PRECONDITION_TAU_S",
    "PRECONDITION_TOL",
    "PRECONDITION_WINDOW_S",
    "PROBE_MAX_S",
    "PROFILER_BATCH",
    "PROFILER_MAX_REPS",
    "REP_PROBE_CYCLES",
    "SUSTAINED_REP_S",
    "WARMUP_MIN_REPS",
    "WARMUP_REL_TOL",
    "WARMUP_WINDOW",
    "BackToBack",
    "ClockDevice",
    "Conditioning",
    "CudaEvents",
    "CudaGraph",
    "CudaProfiler",
    "Device",
    "Rep",
    "SimDevice",
    "_gpu_facts",
    "_profiled_rep_times",
    "_torch",
    "_trace_events",
    "bench",
    "cuda_device",
    "nvml_index_of_cuda",
    "precondition",
    "sim_kernel",
    "wait_until_ready",
]
