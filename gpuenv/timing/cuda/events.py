"""The CUDA devices: CudaEvents (a rep between CUDA events behind the clock-probe spin),
CudaGraph (a CUDA graph of calls, replayed), CudaProfiler (each rep's device time from
CUPTI, set up as CudaEvents); what mode "auto" times a call with (`for_auto`: its
device time from CUPTI, at every size); `cuda_device(mode)`; a torch device's NVML
index; `RegionEvents`, the events around a region of the caller's code (`env.measure`).
What a rep is: the package's docstring."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpuenv import stats
from gpuenv.backend import Backend
from gpuenv.errors import ConfigError
from gpuenv.timebase import REAL_CLOCK, Clock
from gpuenv.timing import memo
from gpuenv.timing.cuda.profiler import (
    PROFILER_BATCH,
    _profiled_rep_times,
    _profiling,
    _torch,
    _trace_events,
)
from gpuenv.timing.devices import CLOCK_PROBE_S, MODES, REP_PROBE_CYCLES, Device, Rep

log = logging.getLogger(__name__)

PROFILED_HOW = (
    "the device time of each call's kernels, copies and memsets, from CUPTI "
    "(torch.profiler: no launch or event overhead)"
)
EVENTS_FALLBACK_HOW = (
    "CUDA events around each call (~2 us of launch and event overhead included): CUPTI "
    "is held by another profiler in this process"
)
PROBE_MAX_S = 2e-3  # past this much spin, fn is host-bound: its launch gaps are its time
COVER_ATTEMPTS = 4  # a rep whose launch the spin did not cover is redone with 2x the spin
SIZE_PROBE_S = 5e-4  # the clock probe that sizes the launch cover: 3 x 0.5 ms, not 3 x 5 ms


class CudaEvents:
    """CUDA events around each rep on the current stream (see the module docstring)."""

    kind = "cuda_events"
    rep_batch = 1  # reps the harness asks for at a time

    def __init__(
        self,
        *,
        device: Any = None,
        flush_l2: bool = True,
        saturate: bool = True,
        rep_probe_cycles: int = REP_PROBE_CYCLES,
        clock: Clock | None = None,
        flush_bytes: int | None = None,
        batch: int = 1,
    ):
        torch = _torch()
        if batch < 1:
            raise ConfigError(f"calls per rep must be at least 1 (got {batch})")
        self.batch = int(batch)  # calls of fn back to back between one rep's events
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
        self.flush_l2 = flush_l2 and flush_bytes != 0
        self.flush_bytes_asked = flush_bytes
        self._flush_buf = None
        if self.flush_l2:
            # write twice the L2 so nothing of fn's data survives (50 MiB L2 on an H100);
            # `flush_bytes` says otherwise (triton's do_bench writes 256 MiB)
            size = max(2 * self.l2_bytes, 8 << 20) if self.l2_bytes else 256 << 20
            size = size if flush_bytes is None else max(int(flush_bytes), 4)
            self._flush_buf = torch.empty(size // 4, dtype=torch.int32, device=self.device)
        self.rep_probe_cycles = int(rep_probe_cycles) if saturate else 0
        self._cover_cycles = 60_000  # ~30 us at 2 GHz: covers enqueueing e0 and the probe
        self._probe_cap_cycles = int(PROBE_MAX_S * 2000e6)
        self.uncovered_reps = 0  # reps redone because fn's launch outlasted the spin
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    # what each rep enqueues before fn; fn's own launch must finish before the probe does
    def _lead_in(self, stream: Any = None) -> None:
        if self._flush_buf is not None:
            self._flush_buf.zero_()
        (stream or self.torch.cuda.current_stream(self.device)).synchronize()
        if self.saturate:
            self.torch.cuda._sleep(self._cover_cycles)

    def prepare(self, fn: Callable[[], Any]) -> None:
        # Size the probe spin to outlast the host's enqueueing of fn (launch latency then never
        # sits between the events), once a process (memo: an uncovered rep doubles it anyway)
        # kept by the torch device: CUDA reads CUDA_VISIBLE_DEVICES once, so an index
        # names one GPU for the process's life, on the clock every real GPU shares
        key = ("cover", self.batch, str(self.device))
        known = memo.recall(fn, key) if self.saturate else None
        if known is not None:
            self.rep_probe_cycles, self._probe_cap_cycles = known
        elif self.saturate:
            with self.torch.cuda.device(self.device):
                self._size_probe(fn)
            memo.remember(fn, key, (self.rep_probe_cycles, self._probe_cap_cycles))

    def _size_probe(self, fn: Callable[[], Any]) -> None:
        samples = []
        for _ in range(3):
            self._lead_in()
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
            self.torch.cuda.current_stream(self.device).synchronize()
        mhz = self._probe_clock_mhz(SIZE_PROBE_S) or 2000.0  # sizing needs no precision
        need = int(2 * stats.median(samples) * mhz * 1e6)
        # beyond ~2 ms of spin fn is host-bound: its launch gaps are part of its time
        self._probe_cap_cycles = int(PROBE_MAX_S * mhz * 1e6)
        self.rep_probe_cycles = max(REP_PROBE_CYCLES, min(need, self._probe_cap_cycles))

    def _call(self, fn: Callable[[], Any]) -> None:
        for _ in range(self.batch):
            fn()

    def _per_call(self) -> int:
        return self.batch

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
        # the stream fn runs on, looked up once a rep (torch's lookup costs ~10 us a call,
        # and record() without a stream looks it up again)
        stream = self.torch.cuda.current_stream(self.device)
        for _ in range(COVER_ATTEMPTS):
            self._lead_in(stream)
            t0 = self.clock.now()
            h0 = time.perf_counter()
            if self.rep_probe_cycles:
                e0.record(stream)
                h0 = time.perf_counter()
                self.torch.cuda._sleep(self.rep_probe_cycles)
            e1.record(stream)
            self._call(fn)
            h1 = time.perf_counter()
            e2.record(stream)
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

    def for_auto(self, fn: Callable[[], Any]) -> tuple[Device, str]:
        return _device_time(self, fn)

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
        return float(start.elapsed_time(end)) / 1e3 / max(calls, 1)

    def probe_clock_mhz(self) -> float | None:
        """Time 1 ms of `_sleep` with events behind a lead-in spin; median of 3 (MHz): the
        events resolve 0.5 us, 0.05% of it (5 ms each cost every bench 30 ms, issue 22)."""
        with self.torch.cuda.device(self.device):
            return self._probe_clock_mhz(1e-3)

    def _probe_clock_mhz(self, seconds: float = CLOCK_PROBE_S) -> float | None:
        torch = self.torch
        guess = 2000e6
        cycles = int(seconds * guess)
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
            "calls_per_rep": self.batch,
            "device": str(self.device),
            "device_name": self.torch.cuda.get_device_name(self.device),
        }


def _device_time(dev: CudaEvents, fn: Callable[[], Any]) -> tuple[Device, str]:
    """mode "auto": the device that times fn's own device time, one call a rep in the L2
    state `dev` was made for (flushed before each call by default), prepared for fn, and how
    in words. CUPTI (torch.profiler) sums the device time of fn's kernels, copies and
    memsets: no launch or event overhead at any size, so the number means the same for a
    1 us kernel as for a 10 ms one. On an H100 one call per CUDA event pair read 2.1-2.6 us
    over that device time (22.0 us for an add whose flushed device time is 19.6 us), the
    profiler within 0.4% of it from 20 us up (benchmarks/one_meaning.py, its kept results
    in benchmarks/results/one_meaning-sweep.json). Where CUPTI cannot be had (another profiler of
    the process, or a tool attached to it, holds it) the events stay, decided once a
    process and said in the measurement."""
    try:  # CUPTI may be held by another profiler: a trial rep finds out, once a process
        profiled = CudaProfiler(
            flush_l2=dev.flush_l2,
            saturate=dev.saturate,
            device=dev.device,
            clock=dev.clock,
            flush_bytes=dev.flush_bytes_asked,
        )
        profiled.prepare(fn)
        if not memo.cupti_known() or memo.torch_profiler_active(dev.torch):
            profiled.reps(fn, 1)
        memo.cupti_found(True)
        return profiled, PROFILED_HOW
    except Exception as err:
        memo.cupti_found(False)
        log.info("cannot profile fn (%s): timing each call between CUDA events", err)
    dev.prepare(fn)
    return dev, EVENTS_FALLBACK_HOW


class CudaGraph(CudaEvents):
    """Captures `calls` calls of fn in a CUDA graph; a rep replays it (time per call).

    The flush happens before each replay, so only the first call of a replay
    starts with a cold L2: graph mode measures back-to-back calls.
    """

    kind = "cuda_graph"

    def __init__(self, *, calls: int | str = "auto", target_s: float = 1e-3, **kwargs: Any):
        super().__init__(**kwargs)
        if calls != "auto" and (not isinstance(calls, int) or calls < 1):
            raise ConfigError(f"calls per graph must be an integer >= 1 or 'auto', not {calls!r}")
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
    rep_batch = PROFILER_BATCH  # a profiler session costs milliseconds: reps in batches

    # rep() stays CudaEvents': warmup and set-up need no profiler session each

    def reps(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        with self.torch.cuda.device(self.device):
            return self._profiled(fn, n)

    def _profiled(self, fn: Callable[[], Any], n: int) -> list[Rep]:
        torch = self.torch
        edges = []
        with _profiling() as prof:
            for _ in range(n):
                torch.cuda._sleep(1000)  # marker: the flush follows
                if self._flush_buf is not None:
                    self._flush_buf.zero_()
                torch.cuda.current_stream(self.device).synchronize()
                t0 = self.clock.now()
                torch.cuda._sleep(self.rep_probe_cycles or 1000)  # marker: fn follows
                self._call(fn)
                torch.cuda.current_stream(self.device).synchronize()
                edges.append((t0, self.clock.now()))
        times, spins = _profiled_rep_times(_trace_events(prof), n)
        cycles, per_call = self.rep_probe_cycles or 1000, self._per_call()
        return [
            Rep(t0, t1, t / per_call, cycles / s / 1e6 if s and self.rep_probe_cycles else None)
            for (t0, t1), t, s in zip(edges, times, spins, strict=True)
        ]

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "profiled": "kernels+memcpy+memset device time"}


class RegionEvents:
    """Two CUDA events around a region of the caller's own code (`env.measure` with
    `cuda_events=True`): `start()` records the first on the current stream, `stop()` the
    second and returns the device time between them in seconds.

    The caller's region is CUDA work, so torch is imported already: this one looks it up
    and never imports it (a session that times on the host must not load torch).
    """

    def __init__(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            raise ConfigError(
                "cuda_events=True needs torch imported and a CUDA device",
                hint="import torch first, or use the host clock (cuda_events=False)",
            )
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._start.record()

    def stop(self) -> float:
        """The device time since `start()`, in seconds (waits for the region's work)."""
        self._end.record()
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end)) / 1e3


def cuda_device(
    mode: str,
    *,
    flush_l2: bool = True,
    saturate: bool = True,
    calls_per_rep: int | str = "auto",
    device: Any = None,
    clock: Clock | None = None,
    flush_bytes: int | None = None,
) -> Device:
    """The CUDA device for `mode` ("events", "graph", "profiler"); `flush_bytes`: the L2
    flush's size (default twice the device's L2)."""
    kwargs: dict[str, Any] = {
        "flush_l2": flush_l2,
        "saturate": saturate,
        "device": device,
        "clock": clock,
        "flush_bytes": flush_bytes,
    }
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


def cuda_ordinal() -> int | None:
    """torch's current CUDA device where torch has initialized CUDA, else None: what a
    thread that works for this one uses (a thread starts on device 0)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return int(cuda.current_device())


@contextlib.contextmanager
def on_cuda_device(ordinal: int | None) -> Iterator[None]:
    """torch's CUDA device `ordinal` current on this thread while inside (None: as it is)."""
    if ordinal is None:
        yield
        return
    with _torch().cuda.device(ordinal):
        yield
