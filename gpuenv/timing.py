"""GPU timing done right: `bench(fn)` with telemetry on every repetition.

    m = gpuenv.bench(lambda: a @ b, name="gemm")     # -> Measurement
    print(m.stats.median_s, m.extra["ci_s"], m.findings)

What a rep is (mode="events", the default), on the current CUDA stream:

    flush L2 (write 2x the device's L2), synchronize       -- outside the timed window
    _sleep(short)     keeps the GPU busy while the rest is enqueued, so launch latency
                      never lands between the events (checked each rep: see _rep)
    e0, _sleep(probe cycles), e_start, fn(), e_end, synchronize
    time = e_start->e_end; effective SM clock = probe cycles / (e0->e_start)

`torch.cuda._sleep(cycles)` spins for a number of SM cycles, so timing it with
events gives the clock the GPU really ran at just before the rep (NVML's clock is
a coarse sample: GPU_FACTS.md). mode="graph" captures several calls of fn in a
CUDA graph and replays it (tiny kernels: no launch overhead between calls);
mode="profiler" sums each rep's GPU activity (kernels, copies, memsets) from
torch.profiler with CUDA-only activity, which leaves out idle bubbles between
kernels.

The harness around the device is device-agnostic and runs on the simulated GPU
in tests (`SimDevice`, `sim_kernel`): warmup until rep times and clocks stop
trending; optional conditioning (condition="burst": short bursts, each started
from the GPU's uncapped state; condition="sustained": run fn until clock and
temperature reach equilibrium, then measure reps of fn back to back, see
`BackToBack`); the stopping rule of
`gpuenv.stats.StopRule`; telemetry windows per rep from the sampler; findings
and the policy from `gpuenv.verdict`.

torch is imported here lazily, only when a CUDA device is timed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuenv import stats
from gpuenv.backend import (
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    Backend,
)
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.timebase import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

MODES = ("events", "graph", "profiler")
CONDITIONS = ("burst", "sustained")
# reasons that mean the clock is held down by power or heat (burst mode waits them out)
LIMITING_REASONS = REASON_SW_POWER_CAP | REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN

DEFAULT_BUDGET_S = 10.0  # measuring time when no rep count is given
WARMUP_WINDOW = 8  # reps whose times and clocks must not trend for warmup to end
WARMUP_MIN_REPS = 3  # the first call is set-up (cuBLAS handles, lazy loading): never enough
WARMUP_REL_TOL = 0.01  # a trend moving times by less than this across the window is steady
BURST_S = 0.025  # GPU time per burst; the SW power cap engages within 100-300 ms on an H100
BURST_DUTY = 0.2  # rest at least (1 / duty - 1) x the burst between bursts
PRECONDITION_MAX_S = 180.0  # an H100 under a heavy matmul creeps for ~1-2 min from cold
PRECONDITION_CHUNK_S = 0.5
SUSTAINED_REP_S = 0.2  # one rep in sustained mode: this long of fn back to back
PRECONDITION_WINDOW_S = 10.0
PRECONDITION_TOL = 0.005  # predicted drift still to come, relative to the time per call
PRECONDITION_TAU_S = 20.0  # thermal time constant of a data-centre GPU under load
DEFAULT_TEMP_SENSITIVITY = 0.01  # relative time change per C when it cannot be fitted
PROFILER_BATCH = 10  # profiled reps per torch.profiler session
PROFILER_MAX_REPS = 200
CLOCK_PROBE_S = 0.005  # GPU time of the before/after effective-clock probe
REP_PROBE_CYCLES = 100_000  # ~50 us at 2 GHz: the per-rep clock probe and launch cover
PROBE_MAX_S = 2e-3  # past this much spin, fn is host-bound: its launch gaps are its time
COVER_ATTEMPTS = 4  # a rep whose launch the spin did not cover is redone with 2x the spin


@dataclass(frozen=True)
class Rep:
    """One timed repetition: host edges (sampler clock) and the device-measured time."""

    t0: float
    t1: float
    time_s: float
    clock_mhz: float | None = None  # effective SM clock probed just before (or during) the rep


class Device(Protocol):
    """What the harness needs from the thing that runs and times `fn`."""

    kind: str  # Measurement.timer: "cuda_events" | "cuda_graph" | "cuda_profiler" | "sim" | "host"
    clock: Clock  # host clock of Rep.t0/t1: the sampler's

    def prepare(self, fn: Callable[[], Any]) -> None:
        """Once, after warmup and before the measured reps (graph capture happens here)."""

    def rep(self, fn: Callable[[], Any]) -> Rep: ...

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        """n reps in a row (the profiler times a batch in one session)."""
        ...

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        """Call fn back to back for about `seconds` (conditioning); return the mean
        time per call (device-timed where the device can)."""
        ...

    def probe_clock_mhz(self) -> float | None:
        """Effective SM clock now (MHz), or None where it cannot be probed."""
        ...

    def settings(self) -> dict[str, Any]:
        """What the device did, for Measurement.extra (flush size, calls per rep...)."""
        ...


# --- devices on a clock: the simulated GPU, CPU code ---------------------------------


class ClockDevice:
    """Times synchronous work on a Clock: CPU code, or the simulated GPU (whose
    `run_work` advances the clock). No flush, no events: there is no asynchrony."""

    kind = "host"

    def __init__(self, clock: Clock | None = None):
        self.clock: Clock = clock or REAL_CLOCK

    def prepare(self, fn: Callable[[], Any]) -> None:
        return None

    def _rep_probe(self) -> float | None:
        return None

    def rep(self, fn: Callable[[], Any]) -> Rep:
        mhz = self._rep_probe()
        t0 = self.clock.now()
        fn()
        t1 = self.clock.now()
        return Rep(t0, t1, t1 - t0, mhz)

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        return [self.rep(fn) for _ in range(n)]

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        start = self.clock.now()
        end = start + seconds
        calls = 0
        while self.clock.now() < end:
            before = self.clock.now()
            fn()
            calls += 1
            if self.clock.now() == before:  # work that takes no clock time would spin forever
                self.clock.sleep(seconds)
                return 0.0
        return (self.clock.now() - start) / max(calls, 1)

    def probe_clock_mhz(self) -> float | None:
        return None

    def settings(self) -> dict[str, Any]:
        return {"flush_l2": False}


class SimDevice(ClockDevice):
    """The simulated GPU: fn runs `backend.run_work(...)` (see `sim_kernel`); the
    effective-clock probe times a light spin of known cycles, as `_sleep` does on CUDA."""

    kind = "sim"

    def __init__(self, backend: Any, gpu: int, *, rep_probe_cycles: float = REP_PROBE_CYCLES):
        super().__init__(backend.clock)
        self.backend = backend
        self.gpu = gpu
        self.rep_probe_cycles = rep_probe_cycles

    def _spin_mhz(self, cycles: float) -> float | None:
        seconds = self.backend.run_work(self.gpu, cycles, power_intensity=0.05)
        return cycles / seconds / 1e6 if seconds > 0 else None

    def _rep_probe(self) -> float | None:
        return self._spin_mhz(self.rep_probe_cycles) if self.rep_probe_cycles else None

    def probe_clock_mhz(self) -> float | None:
        max_mhz = self.backend.clock_limits(self.gpu).max_sm_mhz
        return self._spin_mhz(CLOCK_PROBE_S * max_mhz * 1e6)

    def settings(self) -> dict[str, Any]:
        return {"flush_l2": False, "device": "sim"}


class BackToBack:
    """Sustained mode's reps: each is `seconds` of fn back to back, timed as
    preconditioning times it (`run_for`: the mean time per call), so measuring keeps
    the GPU at the equilibrium preconditioning brought it to. Flushed, synchronized
    single calls run at a lower duty: the capped clock then moves off that
    equilibrium by an amount that depends on the chip's temperature (on the H100, a
    2048^3 matmul's cold and hot sustained numbers came 7.7% apart). The L2 stays
    warm between calls, as in a long job."""

    def __init__(self, inner: Device, seconds: float = SUSTAINED_REP_S):
        self.inner = inner
        self.seconds = seconds
        self.kind = inner.kind
        self.clock = inner.clock

    def prepare(self, fn: Callable[[], Any]) -> None:
        self.inner.prepare(fn)

    def rep(self, fn: Callable[[], Any]) -> Rep:
        t0 = self.clock.now()
        per_call = self.inner.run_for(fn, self.seconds)
        # No effective-clock probe: a spin after the chunk sees the clock once the load
        # has stopped, and the power controller moves it within milliseconds (on the H100
        # such probes differed by 3-12% between cold and hot chunks whose time per call
        # agreed within 0.3%). The sampler's NVML clock stays in each rep's window.
        return Rep(t0, self.clock.now(), per_call, None)

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        return [self.rep(fn) for _ in range(n)]

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        return self.inner.run_for(fn, seconds)

    def probe_clock_mhz(self) -> float | None:
        return self.inner.probe_clock_mhz()

    def settings(self) -> dict[str, Any]:
        return {**self.inner.settings(), "flush_l2": False, "sustained_rep_s": self.seconds}


def sim_kernel(
    backend: Any, gpu: int = 0, *, seconds: float = 1.4e-3, power_intensity: float = 1.0
) -> Callable[[], float]:
    """A synthetic kernel on the simulated GPU: `seconds` long at the GPU's max SM clock
    (longer when the clock is lower), at `power_intensity` (1.0: a heavy bf16 matmul)."""
    cycles = seconds * backend.clock_limits(gpu).max_sm_mhz * 1e6

    def kernel() -> float:
        return float(backend.run_work(gpu, cycles, power_intensity=power_intensity))

    kernel.__name__ = f"sim_kernel_{seconds * 1e6:.0f}us"
    return kernel


# --- CUDA devices (torch, lazily) ------------------------------------------------------


def _torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise ConfigError(
            "timing a CUDA function needs PyTorch", hint="pip install 'gpuenv[torch]'"
        ) from err
    if not torch.cuda.is_available():
        raise ConfigError(
            "torch sees no CUDA GPU",
            hint="check nvidia-smi and CUDA_VISIBLE_DEVICES, or time the simulated GPU with --sim",
        )
    return torch


class CudaEvents:
    """CUDA events around each rep on the current stream (see the module docstring)."""

    kind = "cuda_events"

    def __init__(
        self,
        *,
        device: Any = None,
        flush_l2: bool = True,
        saturate: bool = True,
        rep_probe_cycles: int = REP_PROBE_CYCLES,
        clock: Clock | None = None,
    ):
        torch = _torch()
        self.torch = torch
        self.clock: Clock = clock or REAL_CLOCK
        if isinstance(device, torch.device):
            self.device = device
        else:
            index = torch.cuda.current_device() if device is None else int(device)
            self.device = torch.device("cuda", index)
        props = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        self.saturate = saturate
        self.flush_l2 = flush_l2
        self._flush_buf = None
        if flush_l2:
            # write twice the L2 so nothing of fn's data survives (50 MiB L2 on an H100)
            size = max(2 * self.l2_bytes, 8 << 20) if self.l2_bytes else 256 << 20
            self._flush_buf = torch.empty(size // 4, dtype=torch.int32, device=self.device)
        self.rep_probe_cycles = int(rep_probe_cycles) if saturate else 0
        self._cover_cycles = 60_000  # ~30 us at 2 GHz: covers enqueueing e0 and the probe
        self._probe_cap_cycles = int(PROBE_MAX_S * 2000e6)
        self.uncovered_reps = 0  # reps redone because fn's launch outlasted the spin
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    # what each rep enqueues before fn; fn's own launch must finish before the probe does
    def _lead_in(self) -> None:
        if self._flush_buf is not None:
            self._flush_buf.zero_()
        self.torch.cuda.current_stream(self.device).synchronize()
        if self.saturate:
            self.torch.cuda._sleep(self._cover_cycles)

    def prepare(self, fn: Callable[[], Any]) -> None:
        # Size the probe spin so it outlasts the host time of enqueueing fn (launch
        # latency then never sits between the events): time fn's enqueue on the host.
        if not self.saturate:
            return
        with self.torch.cuda.device(self.device):
            self._size_probe(fn)

    def _size_probe(self, fn: Callable[[], Any]) -> None:
        samples = []
        for _ in range(3):
            self._lead_in()
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
            self.torch.cuda.current_stream(self.device).synchronize()
        mhz = self.probe_clock_mhz() or 2000.0
        need = int(2 * stats.median(samples) * mhz * 1e6)
        # beyond ~2 ms of spin fn is host-bound: its launch gaps are part of its time
        self._probe_cap_cycles = int(PROBE_MAX_S * mhz * 1e6)
        self.rep_probe_cycles = max(REP_PROBE_CYCLES, min(need, self._probe_cap_cycles))

    def _call(self, fn: Callable[[], Any]) -> None:
        fn()

    def _per_call(self) -> int:
        return 1

    def rep(self, fn: Callable[[], Any]) -> Rep:
        with self.torch.cuda.device(self.device):  # events and spins on fn's device
            return self._rep(fn)

    def _rep(self, fn: Callable[[], Any]) -> Rep:
        # The spin must outlast the host's enqueueing of fn, or the GPU idles between
        # e1 and fn's first kernel and launch latency lands in the rep. Checked, not
        # assumed: the spin began on the GPU no earlier than the host enqueued it (h0),
        # so if the host was done with fn (h1) within the spin's measured length, fn was
        # queued before the spin ended. A slower host (a profiler's callbacks, another
        # thread holding the GIL) makes the rep run again with twice the spin.
        e0, e1, e2 = self._events
        for _ in range(COVER_ATTEMPTS):
            self._lead_in()
            t0 = self.clock.now()
            h0 = time.perf_counter()
            if self.rep_probe_cycles:
                e0.record()
                h0 = time.perf_counter()
                self.torch.cuda._sleep(self.rep_probe_cycles)
            e1.record()
            self._call(fn)
            h1 = time.perf_counter()
            e2.record()
            e2.synchronize()
            t1 = self.clock.now()
            if not self.rep_probe_cycles:
                return Rep(t0, t1, e1.elapsed_time(e2) / 1e3 / self._per_call(), None)
            spin_s = e0.elapsed_time(e1) / 1e3
            mhz = self.rep_probe_cycles / spin_s / 1e6 if spin_s > 0 else None
            if h1 - h0 <= spin_s or self.rep_probe_cycles >= self._probe_cap_cycles:
                break
            self.uncovered_reps += 1
            self.rep_probe_cycles = min(2 * self.rep_probe_cycles, self._probe_cap_cycles)
        return Rep(t0, t1, e1.elapsed_time(e2) / 1e3 / self._per_call(), mhz)

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        return [self.rep(fn) for _ in range(n)]

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        with self.torch.cuda.device(self.device):
            return self._run_for(fn, seconds)

    def _run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        deadline = self.clock.now() + seconds
        calls = 0
        start.record()
        while self.clock.now() < deadline:
            for _ in range(64):  # keep the queue bounded, check the time often
                fn()
            calls += 64
            end.record()
            end.synchronize()
        return start.elapsed_time(end) / 1e3 / max(calls, 1)

    def probe_clock_mhz(self) -> float | None:
        """Time `_sleep(cycles)` with events, behind a lead-in spin; median of 3 (MHz)."""
        with self.torch.cuda.device(self.device):
            return self._probe_clock_mhz()

    def _probe_clock_mhz(self) -> float | None:
        torch = self.torch
        guess = 2000e6
        cycles = int(CLOCK_PROBE_S * guess)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(3):
            torch.cuda.current_stream(self.device).synchronize()
            torch.cuda._sleep(self._cover_cycles)
            e0.record()
            torch.cuda._sleep(cycles)
            e1.record()
            e1.synchronize()
            seconds = e0.elapsed_time(e1) / 1e3
            if seconds > 0:
                out.append(cycles / seconds / 1e6)
        return stats.median(out) if out else None

    def settings(self) -> dict[str, Any]:
        return {
            "flush_l2": self.flush_l2,
            "flush_bytes": int(self._flush_buf.numel() * 4) if self._flush_buf is not None else 0,
            "l2_bytes": self.l2_bytes,
            "saturate": self.saturate,
            "rep_probe_cycles": self.rep_probe_cycles,
            "uncovered_reps": self.uncovered_reps,
            "device": str(self.device),
            "device_name": self.torch.cuda.get_device_name(self.device),
        }


class CudaGraph(CudaEvents):
    """Captures `calls` calls of fn in a CUDA graph; a rep replays it (time per call).

    The flush happens before each replay, so only the first call of a replay
    starts with a cold L2: graph mode measures back-to-back calls.
    """

    kind = "cuda_graph"

    def __init__(self, *, calls: int | str = "auto", target_s: float = 1e-3, **kwargs: Any):
        super().__init__(**kwargs)
        if calls != "auto" and (not isinstance(calls, int) or calls < 1):
            raise ConfigError(
                f"calls per graph must be a positive integer or 'auto', not {calls!r}"
            )
        self.calls_asked = calls
        self.target_s = target_s
        self.calls = 1
        self.graph: Any = None

    def prepare(self, fn: Callable[[], Any]) -> None:
        with self.torch.cuda.device(self.device):
            self._capture(fn)

    def _capture(self, fn: Callable[[], Any]) -> None:
        torch = self.torch
        if self.calls_asked == "auto":
            one = stats.median([CudaEvents.rep(self, fn).time_s for _ in range(5)])
            self.calls = max(1, min(1000, math.ceil(self.target_s / max(one, 1e-7))))
        else:
            self.calls = int(self.calls_asked)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.calls):
                fn()
        torch.cuda.synchronize(self.device)
        self.graph = graph
        self.rep_probe_cycles = REP_PROBE_CYCLES if self.saturate else 0

    def _call(self, fn: Callable[[], Any]) -> None:
        if self.graph is None:
            fn()
        else:
            self.graph.replay()

    def _per_call(self) -> int:
        return self.calls if self.graph is not None else 1

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "calls_per_rep": self.calls}


class CudaProfiler(CudaEvents):
    """Per rep, the sum of device time of fn's GPU activity (kernels, memcpy, memset),
    from torch.profiler with CUDA-only activity. Reps are profiled in batches; in the
    trace each rep is framed by two `_sleep` spin kernels (before the flush, before fn),
    so flush kernels are never counted and each rep's activity is found exactly."""

    kind = "cuda_profiler"
    _ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")

    # rep() stays CudaEvents': warmup and set-up need no profiler session each

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        with self.torch.cuda.device(self.device):
            return self._profiled(fn, n)

    def _profiled(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        edges = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                torch.cuda._sleep(1000)  # marker: the flush follows
                if self._flush_buf is not None:
                    self._flush_buf.zero_()
                torch.cuda.current_stream(self.device).synchronize()
                t0 = self.clock.now()
                torch.cuda._sleep(self.rep_probe_cycles or 1000)  # marker: fn follows
                fn()
                torch.cuda.current_stream(self.device).synchronize()
                edges.append((t0, self.clock.now()))
        times, spins = _profiled_rep_times(_trace_events(prof), n)
        cycles = self.rep_probe_cycles or 1000
        return [
            Rep(t0, t1, t, cycles / s / 1e6 if s and self.rep_probe_cycles else None)
            for (t0, t1), t, s in zip(edges, times, spins, strict=True)
        ]

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "profiled": "kernels+memcpy+memset device time"}


def _trace_events(prof: Any) -> list[dict[str, Any]]:
    """GPU activity from a profiler session, through its Chrome trace (stable across torch
    versions, unlike the in-memory event API)."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="gpuenv-prof-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    finally:
        os.unlink(path)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in CudaProfiler._ACTIVITY]


def _profiled_rep_times(events: list[dict[str, Any]], n: int) -> tuple[list[float], list[float]]:
    """Per-rep device time (s) and the fn-marker spin duration (s) from trace events: in
    device order, spins alternate (before flush, before fn); fn's activity lies between a
    before-fn spin and the next before-flush spin."""
    events = sorted(events, key=lambda e: float(e["ts"]))
    spins = [i for i, e in enumerate(events) if "spin_kernel" in str(e.get("name", ""))]
    if len(spins) != 2 * n:
        raise GpuenvError(
            f"the profiler trace has {len(spins)} marker kernels where {2 * n} were launched",
            hint="does fn call torch.cuda._sleep itself? use mode='events' for it",
        )
    times, spin_s = [], []
    for r in range(n):
        start = spins[2 * r + 1]
        stop = spins[2 * r + 2] if 2 * r + 2 < len(spins) else len(events)
        total_us = sum(float(e.get("dur", 0.0)) for e in events[start + 1 : stop])
        times.append(total_us / 1e6)
        spin_s.append(float(events[start].get("dur", 0.0)) / 1e6)
    return times, spin_s


def cuda_device(mode: str, *, flush_l2: bool = True, saturate: bool = True,
                calls_per_rep: int | str = "auto", device: Any = None,
                clock: Clock | None = None) -> Device:
    """The CUDA device for `mode` ("events", "graph", "profiler")."""
    kwargs: dict[str, Any] = {"flush_l2": flush_l2, "saturate": saturate, "device": device,
                              "clock": clock}
    if mode == "events":
        return CudaEvents(**kwargs)
    if mode == "graph":
        return CudaGraph(calls=calls_per_rep, **kwargs)
    if mode == "profiler":
        return CudaProfiler(**kwargs)
    raise ConfigError(f"unknown timing mode {mode!r}", hint=f"use one of {', '.join(MODES)}")


def nvml_index_of_cuda(backend: Backend, device: Any = None) -> int:
    """The NVML index of a torch CUDA device (by UUID; CUDA and NVML orders differ)."""
    torch = _torch()
    ordinal = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    uuid = getattr(torch.cuda.get_device_properties(ordinal), "uuid", None)
    if uuid is not None:
        text = str(uuid).lower()
        text = text if text.startswith("gpu-") else f"gpu-{text}"
        for i in range(backend.device_count()):
            if backend.device_info(i).uuid.lower() == text:
                return i
    from gpuenv.devices import select_gpus

    return select_gpus(backend, f"cuda:{ordinal}")[0]


# --- conditioning: burst and sustained -------------------------------------------------


def wait_until_ready(
    sampler: Any,
    gpu: int,
    clock: Clock,
    *,
    since: float,
    min_rest_s: float = 0.0,
    max_wait_s: float = 5.0,
    poll_s: float = 0.05,
) -> tuple[float, bool]:
    """Burst mode: rest until the GPU is back in its uncapped state.

    Ready when at least two readings taken one driver refresh after `since` (the
    end of the last burst) show no power-cap or thermal reason. Returns (seconds
    waited, ready). Without a sampler it just rests `min_rest_s`.
    """
    from gpuenv.telemetry import DRIVER_REFRESH_S

    start = clock.now()
    clock.sleep(min_rest_s)
    if sampler is None:
        return clock.now() - start, True
    while True:
        fresh = sampler.samples(since + DRIVER_REFRESH_S, None, gpu)
        if len(fresh) >= 2 and not (fresh[-1].reasons | fresh[-2].reasons) & LIMITING_REASONS:
            return clock.now() - start, True
        if clock.now() - start >= max_wait_s:
            return clock.now() - start, False
        clock.sleep(poll_s)


@dataclass(frozen=True)
class Conditioning:
    """What preconditioning did (mode="sustained")."""

    seconds: float
    steady: bool
    sm_mhz: float | None
    temp_c: float | None
    limited: bool  # a power-cap or thermal reason was seen in the last chunk
    residual: float | None  # predicted drift still to come, relative (tau x slope)

    def to_dict(self) -> dict[str, Any]:
        return {
            "precondition_s": self.seconds,
            "precondition_steady": self.steady,
            "precondition_sm_mhz": self.sm_mhz,
            "precondition_temp_c": self.temp_c,
            "precondition_limited": self.limited,
            "precondition_residual": self.residual,
        }


def precondition(
    device: Device,
    fn: Callable[[], Any],
    sampler: Any,
    gpu: int,
    *,
    max_s: float = PRECONDITION_MAX_S,
    min_s: float | None = None,
    chunk_s: float = PRECONDITION_CHUNK_S,
    window_s: float = PRECONDITION_WINDOW_S,
    tol: float = PRECONDITION_TOL,
    tau_s: float = PRECONDITION_TAU_S,
    progress: Callable[[str], None] | None = None,
) -> Conditioning:
    """Sustained mode: run fn back to back until the GPU reaches equilibrium under it.

    The signal is fn's own mean time per call in each chunk of `chunk_s` (what
    will be measured). A GPU approaching equilibrium relaxes roughly
    exponentially with the thermal time constant `tau_s`, so what is still to
    come is about tau_s x the present rate of change. Two predictions must both
    be below `tol` (relative to the time per call):
      - time: tau_s x the slope of the time per call over the last `window_s`;
      - temperature (leakage grows with temperature and lowers the capped clock,
        in 15 MHz steps that a short window can miss; a kernel not capped on a
        cool GPU may be once it is hot): tau_s x the temperature slope over the
        last three windows x the time's sensitivity to temperature (fitted while
        capped, else 1% per C).
    At least `min_s` (default: one window) runs; `max_s` stops it regardless
    (`steady` False then).
    """
    clock = device.clock
    min_s = window_s if min_s is None else min_s
    start = clock.now()
    pts: list[tuple[float, float, float | None]] = []  # (chunk end, time per call, temp)
    capped_from: int | None = None  # index of the first chunk under a limiting reason
    mhz: float | None = None
    temp: float | None = None
    limited = False
    while True:
        c0 = clock.now()
        per_call = device.run_for(fn, chunk_s)
        c1 = clock.now()
        samples = sampler.samples(c0, c1, gpu) if sampler is not None else []
        temp = None
        if samples:
            mhz = math.fsum(s.sm_mhz for s in samples) / len(samples)
            temp = samples[-1].temp_c
            limited = any(s.reasons & LIMITING_REASONS for s in samples)
            if limited and capped_from is None:
                capped_from = len(pts)
        pts.append((c1, per_call, temp))
        elapsed = c1 - start
        residual = _residual(pts, capped_from, window_s, tau_s)
        if progress is not None:
            progress(
                f"preconditioning {elapsed:5.1f} s: {per_call * 1e3:.4g} ms/call"
                + (f", SM {mhz:.0f} MHz" if mhz is not None else "")
                + (f", {temp:.0f} C" if temp is not None else "")
                + (", capped" if limited else "")
                + (f", still to drift ~{residual:.2%}" if residual is not None else "")
            )
        if elapsed >= min_s and residual is not None and residual <= tol:
            return Conditioning(elapsed, True, mhz, temp, limited, residual)
        if elapsed >= max_s:
            return Conditioning(elapsed, False, mhz, temp, limited, residual)


def _residual(
    pts: list[tuple[float, float, float | None]], capped_from: int | None, window_s: float,
    tau_s: float,
) -> float | None:
    """The relative drift of the time per call still to come (see `precondition`)."""
    end = pts[-1][0]
    recent = [p for p in pts if p[0] >= end - window_s]
    if len(recent) < 4 or recent[-1][0] <= recent[0][0]:
        return None
    step = (recent[-1][0] - recent[0][0]) / (len(recent) - 1)
    level = stats.median([p[1] for p in recent])
    if level <= 0:
        return 0.0
    residual = tau_s * abs(stats.ols_slope([p[1] for p in recent]) / step) / level
    # The temperature must settle too, capped or not: a kernel not capped on a cool GPU
    # may be capped once the chip has heated (leakage grows with temperature). NVML
    # reads whole degrees, so a slow creep shows as 0 or 1 step in a short window: the
    # slope is fitted over 3 windows (an over-estimate while it settles).
    longer = [p for p in pts if p[0] >= end - 3 * window_s]
    temps = [p[2] for p in longer]
    if len(longer) < 4 or any(t is None for t in temps):
        return residual
    long_step = (longer[-1][0] - longer[0][0]) / (len(longer) - 1)
    temp_slope = stats.ols_slope([float(t) for t in temps if t is not None]) / long_step
    since = [(p[2], p[1]) for p in pts[capped_from or 0 :] if p[2] is not None]
    span = max(t for t, _ in since) - min(t for t, _ in since) if since else 0.0
    if capped_from is None or span < 2.0:
        sensitivity = DEFAULT_TEMP_SENSITIVITY  # nothing to fit it from
    else:
        sensitivity = abs(_fit_slope([t for t, _ in since], [v for _, v in since])) / level
    return max(residual, tau_s * abs(temp_slope) * sensitivity)


def _fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    den = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


# --- the harness -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Warmup:
    reps: int
    seconds: float
    steady: bool


def _warmup(
    device: Device,
    fn: Callable[[], Any],
    sampler: Any,
    gpu: int,
    warmup: str | int,
    max_s: float,
    max_reps: int,
) -> _Warmup:
    """Reps until times and clocks stop trending (warmup="auto"), or a fixed count."""
    clock = device.clock
    start = clock.now()
    if warmup != "auto":
        for _ in range(int(warmup)):
            device.rep(fn)
        return _Warmup(int(warmup), clock.now() - start, True)
    times: list[float] = []
    clocks: list[float | None] = []
    while True:
        rep = device.rep(fn)
        times.append(rep.time_s)
        mhz = rep.clock_mhz
        if mhz is None and sampler is not None:
            latest = sampler.latest(gpu)
            mhz = float(latest.sm_mhz) if latest is not None else None
        clocks.append(mhz)
        n = len(times)
        # long reps: a shorter window (4 reps of a 100 ms kernel already span 0.4 s)
        window = max(4, min(WARMUP_WINDOW, int(0.2 / max(stats.median(times[-4:]), 1e-9))))
        if n >= max(WARMUP_MIN_REPS, window):
            last = times[-window:]
            cl = [c for c in clocks[-window:] if c is not None]
            if stats.is_steady(last, rel_tol=WARMUP_REL_TOL) and (
                len(cl) < window or stats.is_steady(cl, rel_tol=WARMUP_REL_TOL)
            ):
                return _Warmup(n, clock.now() - start, True)
        if clock.now() - start >= max_s or n >= max_reps:
            return _Warmup(n, clock.now() - start, False)


def _gpu_facts(backend: Any, gpu: int, lock_range: tuple[int, int] | None) -> Any:
    from gpuenv.verdict import GpuFacts

    def safe(get: Callable[[], Any]) -> Any:
        try:
            return get()
        except Exception:  # facts are best effort: a finding without them is still right
            return None

    return GpuFacts(
        max_sm_mhz=safe(lambda: backend.clock_limits(gpu).max_sm_mhz),
        slowdown_c=safe(lambda: backend.thresholds(gpu).slowdown_c),
        power_limit_w=safe(lambda: backend.power_limits(gpu).limit_w),
        lock_range_mhz=lock_range,
    )


def _trace(sampler: Any, gpu: int, t0: float, t1: float, max_points: int = 1000) -> dict[str, Any]:
    """The telemetry over the whole bench (warmup and conditioning included), downsampled,
    for `gpuenv plot`: times are seconds from t0."""
    samples = sampler.samples(t0, t1, gpu)
    step = max(1, math.ceil(len(samples) / max_points))
    kept = samples[::step]
    return {
        "t0": t0,
        "t_s": [round(s.t - t0, 4) for s in kept],
        "sm_mhz": [s.sm_mhz for s in kept],
        "power_w": [round(s.power_instant_w if s.power_instant_w is not None else s.power_w, 1)
                    for s in kept],
        "temp_c": [s.temp_c for s in kept],
        "reasons": [s.reasons for s in kept],
    }


def bench(
    fn: Callable[[], Any],
    *,
    name: str | None = None,
    session: Any = None,
    backend: Backend | None = None,
    gpu: int | None = None,
    device: Device | None = None,
    mode: str = "events",
    reps: int | None = None,
    budget_s: float | None = None,
    rel_ci: float = 0.01,
    min_reps: int = 10,
    max_reps: int = 10_000,
    confidence: float = 0.95,
    warmup: str | int = "auto",
    warmup_max_s: float = 5.0,
    warmup_max_reps: int = 1000,
    flush_l2: bool = True,
    saturate: bool = True,
    calls_per_rep: int | str = "auto",
    condition: str | None = None,
    burst_s: float = BURST_S,
    precondition_max_s: float = PRECONDITION_MAX_S,
    precondition_kw: dict[str, Any] | None = None,
    policy: str | None = None,
    verdict_config: Any = None,
    probe_clock: bool = True,
    keep_trace: bool = True,
    output: str | os.PathLike[str] | None = None,
    progress: bool | Callable[[str], None] = False,
) -> Any:
    """Time `fn` on the GPU, with telemetry on every rep; returns a `Measurement`.

    Reps continue until the median's `confidence` CI is within `rel_ci` of it, or
    `budget_s` of measuring (default 10 s; unlimited when `reps` fixes the count)
    or `max_reps` run out; `reps=N` takes exactly N. `warmup="auto"` runs reps
    until their times and clocks stop trending (at most `warmup_max_s`); an int
    runs that many. `mode`: "events" (CUDA events per rep), "graph" (a CUDA graph
    of `calls_per_rep` calls, for tiny kernels), "profiler" (summed device time of
    fn's kernels). `condition`: None, "burst" (short bursts from the uncapped
    state), "sustained" (precondition to equilibrium first, at most
    `precondition_max_s`; `precondition_kw` passes more settings to
    `precondition`); default: the session's mode. `policy`: "annotate" |
    "reject" | "retry" (default: the session's, else annotate).

    `device` injects what runs fn (tests: `SimDevice` with `sim_kernel`); by
    default the simulated GPU when the backend is "sim", else CUDA via torch.
    The stats of the kept reps are in `m.stats`; CI, warmup, conditioning,
    effective clocks and settings in `m.extra`.
    """
    from gpuenv import judge as jd
    from gpuenv import verdict as vd
    from gpuenv.results import Measurement

    if mode not in MODES:
        raise ConfigError(f"unknown timing mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    if reps is not None and reps < 1:
        raise ConfigError(f"reps must be at least 1 (got {reps})")
    name = name or getattr(fn, "__name__", None) or "bench"
    if name == "<lambda>":
        name = "bench"
    say = _progress_fn(progress)

    # -- where: backend, GPU, sampler, device ------------------------------------------
    own_sampler = None
    lock_range = None
    if session is not None:
        backend = session.backend
        sampler = session.sampler
        policy = policy or getattr(session, "policy", "annotate")
        condition = condition if condition is not None else getattr(session, "mode", None)
        verdict_config = verdict_config or getattr(session, "config", None)
        gpus = list(getattr(session, "gpus", []) or sampler.gpus)
    else:
        if backend is None:
            backend = _open_backend_quietly()
        sampler = None
        gpus = []
    policy = jd.check_policy(policy or "annotate")
    if condition is not None and condition not in CONDITIONS:
        raise ConfigError(
            f"unknown condition {condition!r}", hint="use 'burst', 'sustained' or None"
        )
    if device is None:
        if backend is not None and backend.workload is not None:
            gpu = gpus[0] if gpu is None and gpus else (gpu or 0)
            device = SimDevice(backend, gpu)
        else:
            device = cuda_device(mode, flush_l2=flush_l2, saturate=saturate,
                                 calls_per_rep=calls_per_rep,
                                 clock=sampler.clock if sampler is not None else None)
    if gpu is None and backend is not None and device.kind.startswith("cuda"):
        cuda_dev = getattr(device, "device", None)
        gpu = _safe(lambda: nvml_index_of_cuda(backend, cuda_dev))
    if gpu is None:
        gpu = gpus[0] if gpus else 0
    if sampler is None and backend is not None:
        from gpuenv.telemetry import Sampler

        own_sampler = sampler = Sampler(backend, [gpu], clock=device.clock)
        sampler.start()
    if session is not None:
        lock_range = getattr(sampler, "lock_ranges", {}).get(gpu)
        if gpu not in sampler.gpus:
            raise ConfigError(
                f"GPU {gpu} is not sampled by this session (it covers {sampler.gpus})",
                hint="open the session with gpus= including the GPU fn runs on",
            )
    clock = device.clock
    rule = stats.StopRule(
        rel_ci=0.0 if reps is not None else rel_ci,
        budget_s=budget_s if budget_s is not None else (math.inf if reps else DEFAULT_BUDGET_S),
        min_reps=reps if reps is not None else min(min_reps, max_reps),
        max_reps=reps if reps is not None else max_reps,
        confidence=confidence,
    ) if (budget_s is None or budget_s > 0) else stats.StopRule()
    config = verdict_config or vd.DEFAULT_CONFIG

    try:
        t_begin = sampler.mark() if sampler is not None else clock.now()
        started_at = clock.wall()
        extra: dict[str, Any] = {"mode": mode, "condition": condition, "policy": policy}
        # -- warmup, effective clock, conditioning --------------------------------------
        warm = _warmup(device, fn, sampler, gpu, warmup, warmup_max_s, warmup_max_reps)
        extra.update(warmup_reps=warm.reps, warmup_s=warm.seconds, warmup_steady=warm.steady)
        if not warm.steady:
            say(f"{name}: warmup did not settle in {warm.seconds:.1f} s ({warm.reps} reps)")
        device.prepare(fn)
        clock_before = device.probe_clock_mhz() if probe_clock else None
        if condition == "sustained":
            cond = precondition(device, fn, sampler, gpu, max_s=precondition_max_s,
                                progress=say if progress else None, **(precondition_kw or {}))
            extra.update(cond.to_dict())
        elif condition == "burst":
            if session is not None and hasattr(session, "wait_until_recovered"):
                # the session's own "cool and uncapped" (temperature near its idle one)
                t_wait = clock.now()
                session.wait_until_recovered()
                waited, ready = clock.now() - t_wait, True
            else:
                waited, ready = wait_until_ready(sampler, gpu, clock, since=clock.now())
            extra.update(burst_first_wait_s=waited, burst_first_ready=ready)

        # -- measure ---------------------------------------------------------------------
        t_measure = sampler.mark() if sampler is not None else clock.now()
        if condition == "sustained":
            device = BackToBack(device)
        all_reps, stop, rests = _measure(device, fn, rule, condition, burst_s, sampler, gpu,
                                         batch=PROFILER_BATCH if mode == "profiler" else 1,
                                         max_reps=PROFILER_MAX_REPS if mode == "profiler" else None)
        # -- findings and the policy (retry re-runs affected reps) ---------------------
        facts = {}
        if session is not None and gpu in getattr(session, "facts", {}):
            facts = {gpu: session.facts[gpu]}
        elif backend is not None:
            facts = {gpu: _gpu_facts(backend, gpu, lock_range)}
        findings, windows = _assess(vd, sampler, gpu, all_reps, config, facts)
        retried: list[int] = []
        if policy == "retry":
            for delay in jd.retry_delays(config):
                affected = jd.affected_reps(findings, config)
                if not affected:
                    break
                say(f"{name}: retrying {len(affected)} reps after {delay:.1f} s")
                clock.sleep(delay)
                if condition == "burst":
                    wait_until_ready(sampler, gpu, clock, since=clock.now())
                for i in affected:
                    all_reps[i] = device.reps(fn, 1)[0]
                retried = sorted(set(retried) | set(affected))
                findings, windows = _assess(vd, sampler, gpu, all_reps, config, facts)
        t_end = sampler.mark() if sampler is not None else clock.now()
        clock_after = device.probe_clock_mhz() if probe_clock else None
        result = jd.apply_policy(findings, len(all_reps), policy, config=config, name=name)

        times = [r.time_s for r in all_reps]
        kept = [t for i, t in enumerate(times) if i not in set(result.rejected_reps)]
        summary = stats.summarize(kept, confidence) if kept else None
        rep_clocks = [r.clock_mhz for r in all_reps if r.clock_mhz is not None]
        ref_mhz = facts[gpu].max_sm_mhz if facts and facts[gpu].max_sm_mhz else None
        extra.update(
            stop_reason=stop,
            measure_s=t_end - t_measure,
            burst_rests=rests,
            confidence=confidence,
            rel_ci_target=rule.rel_ci,
            clock_mhz_before=clock_before,
            clock_mhz_after=clock_after,
            rep_clock_mhz=[r.clock_mhz for r in all_reps] if rep_clocks else None,
            **device.settings(),
        )
        if summary is not None:
            extra["summary"] = summary.to_dict()
            extra["ci_s"] = [summary.ci_lo, summary.ci_hi]
            extra["rel_ci"] = summary.rel_ci
            if rep_clocks:
                extra["rep_clock_mhz_median"] = stats.median(rep_clocks)
            if rep_clocks and len(rep_clocks) == len(all_reps) and ref_mhz:
                # time x effective clock / reference clock: what the rep would take at the
                # reference clock. Meaningful for compute-bound kernels only.
                norm = [r.time_s * r.clock_mhz / ref_mhz for i, r in enumerate(all_reps)  # type: ignore[operator]
                        if i not in set(result.rejected_reps)]
                extra["time_at_ref_clock_s"] = stats.median(norm)
                extra["ref_clock_mhz"] = ref_mhz
            warnings_ = []
            if summary.high_spread:
                warnings_.append(
                    f"high spread: IQR is {summary.rel_iqr:.1%} of the median "
                    f"(over {stats.HIGH_SPREAD_REL_IQR:.0%})"
                )
            if rule.rel_ci > 0 and stop != "converged" and summary.rel_ci > rule.rel_ci:
                warnings_.append(
                    f"the median's CI is +-{summary.rel_ci:.2%}, not within the "
                    f"{rule.rel_ci:.2%} target ({stop})"
                )
            elif rule.rel_ci > 0 and stop != "converged":
                warnings_.append(
                    f"only {summary.n} reps before the {stop} ran out (min_reps is "
                    f"{rule.min_reps}): the CI of +-{summary.rel_ci:.2%} rests on few reps"
                )
            if warnings_:
                extra["warnings"] = warnings_
                for w in warnings_:
                    log.warning("%s: %s", name, w)
        if keep_trace and sampler is not None:
            extra["trace"] = _trace(sampler, gpu, t_begin, t_end)
        summary_windows = (sampler.window(t_measure, t_end, gpu),) if sampler is not None else ()
        m = Measurement.build(
            name,
            times,
            rejected_reps=result.rejected_reps,
            windows=tuple(windows),
            findings=tuple(findings),
            verdict=result.verdict,
            policy=policy,
            retried_reps=tuple(retried),
            summary_windows=summary_windows,
            gpus=(gpu,),
            timer=device.kind,
            started_at=started_at,
            extra=extra,
        )
    finally:
        if own_sampler is not None:
            own_sampler.stop()
    _record(session, m, output, backend, gpu, clock)
    return m


def _measure(
    device: Device,
    fn: Callable[[], Any],
    rule: stats.StopRule,
    condition: str | None,
    burst_s: float,
    sampler: Any,
    gpu: int,
    *,
    batch: int = 1,
    max_reps: int | None = None,
) -> tuple[list[Rep], str, int]:
    """Reps until the stopping rule says stop; in burst mode, rests between bursts."""
    clock = device.clock
    start = clock.now()
    out: list[Rep] = []
    rests = 0
    burst_start = start
    while True:
        out.extend(device.reps(fn, batch) if batch > 1 else [device.rep(fn)])
        reason = rule.check([r.time_s for r in out], clock.now() - start)
        if reason is None and max_reps is not None and len(out) >= max_reps:
            reason = "max_reps"
        if reason is not None:
            return out, reason, rests
        if condition == "burst" and clock.now() - burst_start >= burst_s:
            burst = clock.now() - burst_start
            wait_until_ready(sampler, gpu, clock, since=clock.now(),
                             min_rest_s=burst * (1 / BURST_DUTY - 1))
            rests += 1
            burst_start = clock.now()


def _assess(vd: Any, sampler: Any, gpu: int, reps: Sequence[Rep], config: Any,
            facts: dict[int, Any]) -> tuple[list[Any], list[Any]]:
    if sampler is None:
        return [], []
    windows = sampler.windows([(r.t0, r.t1) for r in reps], gpu)
    findings = vd.assess(windows, [r.time_s for r in reps], config=config, facts=facts)
    return findings, windows


def _record(session: Any, m: Any, output: Any, backend: Any, gpu: int, clock: Clock) -> None:
    if session is not None:
        keep = getattr(session, "_keep", None)  # results + the session's JSONL store
        if keep is not None:
            keep(m)
        else:
            session.results.add(m)
    if output is not None and session is None:
        from gpuenv.results import ResultStore, environment_metadata

        meta = environment_metadata(backend, [gpu], clock=clock) if backend is not None else {}
        with ResultStore(output, meta) as store:
            store.append(m)


def _open_backend_quietly() -> Backend | None:
    """The default backend, or None (timing without telemetry) when NVML is unavailable."""
    from gpuenv.backend import open_backend
    from gpuenv.errors import BackendError

    try:
        return open_backend()
    except BackendError as err:
        log.warning("timing without telemetry: %s", err)
        return None


def _safe(get: Callable[[], int]) -> int | None:
    try:
        return get()
    except GpuenvError as err:
        log.warning("cannot map the CUDA device to an NVML GPU (%s); using GPU 0", err)
        return None


def _progress_fn(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda text: print(text, file=sys.stderr, flush=True)
    return lambda text: log.info(text)


__all__ = [
    "CONDITIONS",
    "MODES",
    "ClockDevice",
    "Conditioning",
    "CudaEvents",
    "CudaGraph",
    "CudaProfiler",
    "Device",
    "Rep",
    "SimDevice",
    "bench",
    "cuda_device",
    "nvml_index_of_cuda",
    "precondition",
    "sim_kernel",
    "wait_until_ready",
]
