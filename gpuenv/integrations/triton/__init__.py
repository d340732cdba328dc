"""Drop-ins for `triton.testing`: do_bench, do_bench_cudagraph and set_gpu_clock, measured
by gpuenv (telemetry on every rep, findings, a verdict) at triton's pace.

    from gpuenv.integrations.triton import do_bench, last_measurement
    ms = do_bench(lambda: a @ b)                       # same call, same return value
    ms, lo, hi = do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    m = last_measurement()                             # the gpuenv Measurement behind it
    print(m.telemetry, m.findings, m.verdict)

    gpuenv.integrations.triton.patch_autotuner()       # @triton.autotune measures with it
    gpuenv.integrations.triton.patch_autotuner(rank=True)  # ...and chooses by gpuenv.rank

`warmup` and `rep` are time budgets in ms, as in triton, and everything a rep costs
counts in them: the L2 flush, the synchronize, the launch-cover spin and the host's
own time. After a first call (set-up, as triton's) a few reps are timed on the host
clock; their median cost gives the counts: warmup reps until their times and clocks
stop trending, at most `warmup` ms worth (triton's warmup calls skip the flush, so for
a small kernel its warmup takes a fraction of `warmup` ms: a steady kernel stops here
after 8 reps), and `rep` ms of measured reps (the budget is also a hard limit on
measuring, so a slower GPU cannot overrun it). Each measured rep gets its telemetry
window, and gpuenv.bench's judge turns them into the Measurement.

The L2 flush writes twice the device's own L2 before each rep (torch's `L2_cache_size`,
the simulated GPU's model: 100 MiB on an H100, 50 us less per rep than triton's 256 MiB;
120 MiB on an H200); `flush_bytes=256 * 2**20` flushes as triton does.

The condition is gpuenv's safe default ("auto"): as it is when gpuenv's clock lock
holds, else burst, with gpuenv.bench's schedule (`gpuenv.conditioning.Bursts`): the call
starts on a cool, uncapped GPU (the check reads the samples taken while it warms up:
nothing to wait for on a GPU that is not held down; when it is, it waits until the power
cap clears, as the GPU's readings show it (~0.5 s on an H100: docs/explanation/what-gpus-do.md),
at most WAIT_MAX_S;
a call begun on an idle GPU waits for samples taken a driver refresh after its warmup,
as heavy work started from idle can set the cap off in its first ~50 ms), then measures
in bursts of DROPIN_BURST_S, shorter than the 100-300 ms in which the cap
engages under heavy load on an H100 (127-178 ms on an H200; where a GPU's cap meets a
burst sooner, the onset is learned for the function and the GPU), with rests that keep a
model of the power the cap acts on (a
DROPIN_POWER_TAU_S filter of the instant power) under DROPIN_POWER_TARGET of the limit:
a heavy kernel rests just enough to stay off the cap whatever the budget, a light one
not at all once a reading has shown its power (the driver refreshes the reading every
~0.1 s: until one falls inside its work, a kernel counts as heavy, so a light one may
rest once, ~20 ms). A rep whose
probed clock fell ends its burst and is measured again once the GPU recovered. The
`rep` budget counts the reps' time inside bursts (triton's reps, none capped), the
rests come on top. `condition="none"` measures as triton does.

The package: bench.py (do_bench, do_bench_cudagraph), clock.py (set_gpu_clock),
autotuner.py (patch_autotuner).
"""

from __future__ import annotations

from gpuenv.integrations.triton.autotuner import patch_autotuner, rankings, unpatch_autotuner
from gpuenv.integrations.triton.bench import (
    CUDAGRAPH_REPLAYS,
    DROPIN_BURST_S,
    DROPIN_CONDITIONING,
    DROPIN_DUTY,
    DROPIN_POWER_TARGET,
    DROPIN_POWER_TAU_S,
    SIM_REP_OVERHEAD_S,
    TRITON_FLUSH_BYTES,
    WAIT_MAX_S,
    do_bench,
    do_bench_cudagraph,
    last_measurement,
    measurements,
)
from gpuenv.integrations.triton.clock import ClockRef, set_gpu_clock

__all__ = [
    "CUDAGRAPH_REPLAYS",
    "DROPIN_BURST_S",
    "DROPIN_CONDITIONING",
    "DROPIN_DUTY",
    "DROPIN_POWER_TARGET",
    "DROPIN_POWER_TAU_S",
    "SIM_REP_OVERHEAD_S",
    "TRITON_FLUSH_BYTES",
    "WAIT_MAX_S",
    "ClockRef",
    "do_bench",
    "do_bench_cudagraph",
    "last_measurement",
    "measurements",
    "patch_autotuner",
    "rankings",
    "set_gpu_clock",
    "unpatch_autotuner",
]
