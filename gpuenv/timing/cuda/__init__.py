"""CUDA devices through torch: with integrations/, the only code of gpuenv that imports
torch (lazily, in `_torch()`, when a CUDA device is made).

mode="auto" (bench's default) times each call's device time from CUPTI, one call a rep,
at every size (CudaProfiler: the rep below, its time the summed duration of fn's
kernels, copies and memsets in the profiler's trace, not the events). What a rep is with
mode="events", on the current CUDA stream:

    flush L2 (write 2x the device's L2), synchronize       -- outside the timed window
    _sleep(short)     keeps the GPU busy while the rest is enqueued, so launch latency
                      never lands between the events (checked each rep: see _rep)
    e0, _sleep(probe cycles), e_start, fn(), e_end, synchronize
    time = e_start->e_end; effective SM clock = probe cycles / (e0->e_start)

`torch.cuda._sleep(cycles)` spins for a number of SM cycles, so timing it with
events gives the clock the GPU really ran at just before the rep. NVML's clock is
a coarse sample, not that clock: on an H100 under the power cap, an in-kernel
measurement (cycles over globaltimer, as NVBench does) read ~1360 MHz while NVML
reported ~1500 MHz. mode="graph" captures several calls of fn in a CUDA graph and
replays it (tiny kernels: no launch overhead between calls); mode="profiler" sums
each rep's GPU activity (kernels, copies, memsets) from torch.profiler with
CUDA-only activity, which leaves out idle bubbles between kernels.

The package:
    events.py     the devices: CudaEvents (a rep between events behind the clock-probe
                  spin), CudaGraph (a graph's replay), CudaProfiler (each rep's device
                  time from CUPTI), what mode "auto" times with (for_auto), cuda_device(mode),
                  a torch device's NVML index, RegionEvents (the events around a
                  region of the caller's code: env.measure's one CUDA timer)
    profiler.py   torch (imported lazily) and its profiler: a session of CUDA activity,
                  its trace, each rep's device time in it; cupti_median_s, the reference
                  a number is checked against (L2 warm or flushed)

The devices and the choice mode "auto" makes live together: a CudaEvents device answers
for_auto() with a CudaProfiler (a CudaEvents device too) or, where CUPTI is held, itself.
"""

from gpuenv.timing.cuda.events import (
    COVER_ATTEMPTS,
    EVENTS_FALLBACK_HOW,
    PROBE_MAX_S,
    PROFILED_HOW,
    CudaEvents,
    CudaGraph,
    CudaProfiler,
    RegionEvents,
    cuda_device,
    nvml_index_of_cuda,
)
from gpuenv.timing.cuda.profiler import (
    PROFILER_BATCH,
    PROFILER_MAX_REPS,
    _profiled_rep_times,
    _torch,
    cupti_median_s,
)

__all__ = [
    "COVER_ATTEMPTS",
    "EVENTS_FALLBACK_HOW",
    "PROBE_MAX_S",
    "PROFILED_HOW",
    "PROFILER_BATCH",
    "PROFILER_MAX_REPS",
    "CudaEvents",
    "CudaGraph",
    "CudaProfiler",
    "RegionEvents",
    "_profiled_rep_times",
    "_torch",
    "cuda_device",
    "cupti_median_s",
    "nvml_index_of_cuda",
]
