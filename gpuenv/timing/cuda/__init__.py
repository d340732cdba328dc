"""CUDA devices through torch: with integrations/, the only code of gpuenv that imports
torch (lazily, in `_torch()`, when a CUDA device is made).

What a rep is (mode="events", the default), on the current CUDA stream:

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
                  time from CUPTI), what a call too short to time alone is timed with,
                  cuda_device(mode), a torch device's NVML index
    profiler.py   torch (imported lazily) and its profiler: a session of CUDA activity,
                  its trace, each rep's device time in it; cupti_median_s, the reference
                  a tiny kernel's number is checked against

The devices and the choice for a tiny call live together: a CudaEvents device answers
for_tiny() with a CudaProfiler, a CudaGraph or itself batched, and the first two are
CudaEvents devices too.
"""

from gpuenv.timing.cuda.events import (
    COVER_ATTEMPTS,
    GRAPH_HOW,
    PROBE_MAX_S,
    PROFILED_HOW,
    CudaEvents,
    CudaGraph,
    CudaProfiler,
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
    "GRAPH_HOW",
    "PROBE_MAX_S",
    "PROFILED_HOW",
    "PROFILER_BATCH",
    "PROFILER_MAX_REPS",
    "CudaEvents",
    "CudaGraph",
    "CudaProfiler",
    "_profiled_rep_times",
    "_torch",
    "cuda_device",
    "cupti_median_s",
    "nvml_index_of_cuda",
]
