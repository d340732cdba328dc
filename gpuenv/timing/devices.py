"""What runs and times `fn` for the harness: the `Device` protocol, `Rep`, and the
devices on a clock (CPU code, the simulated GPU: `SimDevice`, `sim_kernel`), plus
`BackToBack`, sustained mode's reps. No torch here: CUDA devices are in `cuda/`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuenv.errors import ConfigError
from gpuenv.timebase import REAL_CLOCK, Clock

if TYPE_CHECKING:
    from gpuenv.backend import Backend, Workload

MODES = ("events", "graph", "profiler")
SUSTAINED_REP_S = 0.2  # one rep in sustained mode: this long of fn back to back
CLOCK_PROBE_S = 0.005  # GPU time of the before/after effective-clock probe (x3 each)
REP_PROBE_CYCLES = 100_000  # ~50 us at 2 GHz: the per-rep clock probe and launch cover


@dataclass(frozen=True)
class Rep:
    """One timed repetition: host edges (sampler clock) and the device-measured time."""

    t0: float
    t1: float
    time_s: float
    clock_mhz: float | None = None  # effective SM clock probed just before (or during) the rep


# each Device kind in words, for `Measurement.extra["method"]` (mode "auto" says its own)
KIND_WORDS = {
    "cuda_events": "CUDA events around each call",
    "cuda_graph": "calls captured in a CUDA graph, each replay between CUDA events",
    "cuda_profiler": "each call's device time from CUPTI (torch.profiler)",
    "sim": "the simulated GPU's clock",
    "host": "the host clock around each call",
}


class Device(Protocol):
    """What the harness needs from the thing that runs and times `fn`."""

    kind: str  # Measurement.timer: "cuda_events" | "cuda_graph" | "cuda_profiler" | "sim" | "host"
    rep_batch: int  # reps to ask for at once (`reps`); above 1 where each ask has a fixed cost
    clock: Clock  # host clock of Rep.t0/t1: the sampler's

    @property
    def batch(self) -> int:
        """Calls of fn in one rep, its time shared among them (1: a call per timed span;
        with CUDA events, what makes a tiny kernel's number hold their overhead)."""
        ...

    @property
    def flush_l2(self) -> bool | None:
        """The L2 state each call starts in: flushed (True) or warm (False), said in
        `extra["l2"]`; None for a device with no cache to flush."""
        ...

    @property
    def device(self) -> object:
        """The torch device fn runs on (which GPU this is, for CUDA devices); None off CUDA."""
        ...

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

    def for_auto(self, fn: Callable[[], Any]) -> tuple[Device, str]:
        """mode "auto": the device that times fn's own time per call (on CUDA its device
        time from CUPTI, at every size), prepared for fn, and how it times in words."""
        ...


# --- devices on a clock: the simulated GPU, CPU code ---------------------------------


class ClockDevice:
    """Times synchronous work on a Clock: CPU code, or the simulated GPU (whose
    `run_work` advances the clock). No flush, no events: there is no asynchrony."""

    kind = "host"
    rep_batch = 1
    flush_l2: bool | None = None  # no cache (the simulated GPU's flush is `flush_bytes`)
    device: object = None  # no torch device

    def __init__(self, clock: Clock | None = None, *, batch: int = 1):
        self.clock: Clock = clock or REAL_CLOCK
        self.batch = batch  # calls of fn a rep

    def prepare(self, fn: Callable[[], Any]) -> None:
        return None

    def _rep_probe(self) -> float | None:
        return None

    def rep(self, fn: Callable[[], Any]) -> Rep:
        mhz = self._rep_probe()
        t0 = self.clock.now()
        for _ in range(self.batch):
            fn()
        t1 = self.clock.now()
        return Rep(t0, t1, (t1 - t0) / self.batch, mhz)

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
        return {"flush_l2": False, "calls_per_rep": self.batch}

    how = "the host's clock around each call"

    def for_auto(self, fn: Callable[[], Any]) -> tuple[Device, str]:
        self.prepare(fn)
        return self, self.how


class SimDevice(ClockDevice):
    """The simulated GPU: fn runs `backend.run_work(...)` (see `sim_kernel`); the
    effective-clock probe times a light spin of known cycles, as `_sleep` does on CUDA.

    What a CUDA rep costs besides fn can be modelled, outside the timed window as on
    CUDA: `flush_bytes` of L2 flush (memory-bound work, as long as that GPU's memory bus
    takes to write them: `Workload.memory_system`) and `rep_overhead_s` of host
    time (launches, the synchronize) before each rep. `batch`: calls of fn a rep, timed
    per call (a CUDA graph's replay)."""

    kind = "sim"
    how = "the simulated GPU's time of each call"

    def __init__(
        self,
        backend: Backend,
        gpu: int,
        *,
        rep_probe_cycles: float = REP_PROBE_CYCLES,
        flush_bytes: int = 0,
        rep_overhead_s: float = 0.0,
        batch: int = 1,
    ):
        super().__init__(backend.clock, batch=batch)
        self.backend = backend
        self.work = _workload(backend)
        self.gpu = gpu
        self.rep_probe_cycles = rep_probe_cycles
        self.flush_bytes = int(flush_bytes)
        self.rep_overhead_s = float(rep_overhead_s)
        # the flush's memory cycles: its bytes over what this GPU's bus moves a cycle
        self.flush_mem_cycles = (
            self.flush_bytes / self.work.memory_system(gpu).bytes_per_mem_cycle
            if self.flush_bytes
            else 0.0
        )

    def rep(self, fn: Callable[[], Any]) -> Rep:
        if self.flush_bytes:
            self.work.run_work(
                self.gpu,
                0,
                power_intensity=0.3,
                mem_cycles=self.flush_mem_cycles,
            )
        if self.rep_overhead_s:
            self.clock.sleep(self.rep_overhead_s)
        return super().rep(fn)

    def _spin_mhz(self, cycles: float) -> float | None:
        seconds = self.work.run_work(self.gpu, cycles, power_intensity=0.05)
        return cycles / seconds / 1e6 if seconds > 0 else None

    def _rep_probe(self) -> float | None:
        return self._spin_mhz(self.rep_probe_cycles) if self.rep_probe_cycles else None

    def probe_clock_mhz(self) -> float | None:
        max_mhz = self.backend.clock_limits(self.gpu).max_sm_mhz
        return self._spin_mhz(CLOCK_PROBE_S * max_mhz * 1e6)

    def settings(self) -> dict[str, Any]:
        flush = {"flush_l2": True, "flush_bytes": self.flush_bytes} if self.flush_bytes else {}
        return {**super().settings(), "device": "sim", **flush}


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
        self.rep_batch = 1  # each rep is its own chunk of calls
        self.clock = inner.clock
        self.flush_l2: bool | None = None if inner.flush_l2 is None else False  # warm: above
        self.device = inner.device
        # A rep is many calls, but the harness's tiny-call check has always read it as one
        # (1 here keeps its findings as they were; whether that check should skip
        # sustained reps is its own question)
        self.batch = 1

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

    def for_auto(self, fn: Callable[[], Any]) -> tuple[Device, str]:
        inner, how = self.inner.for_auto(fn)
        self.inner = inner
        return self, how  # a sustained rep is many calls back to back


def _workload(backend: Backend) -> Workload:
    """The simulated GPU's synthetic load, which SimDevice and sim_kernel run."""
    work = backend.workload
    if work is None:
        raise ConfigError(
            "SimDevice and sim_kernel run on the simulated GPU, and this backend is a real one",
            hint="open the simulated GPU (GPUENV_BACKEND=sim, or backend='sim'); on a real GPU "
            "time a CUDA function with gpuenv.bench",
        )
    return work


def sim_kernel(
    backend: Backend, gpu: int = 0, *, seconds: float = 1.4e-3, power_intensity: float = 1.0
) -> Callable[[], float]:
    """A synthetic kernel on the simulated GPU: `seconds` long at the GPU's max SM clock
    (longer when the clock is lower), at `power_intensity` (1.0: a heavy bf16 matmul)."""
    work = _workload(backend)
    cycles = seconds * work.clock_limits(gpu).max_sm_mhz * 1e6

    def kernel() -> float:
        return float(work.run_work(gpu, cycles, power_intensity=power_intensity))

    kernel.__name__ = f"sim_kernel_{seconds * 1e6:.0f}us"
    return kernel


if TYPE_CHECKING:

    def _each_is_a_device(a: ClockDevice, b: SimDevice, c: BackToBack) -> list[Device]:
        return [a, b, c]  # mypy: each keeps every member Device names
