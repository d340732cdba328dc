"""The measurements behind `gpuenv demo`: one kernel, cold and hot, measured several ways.

A `Rig` runs the kernel, rests the GPU and loads it: `SimRig` on the simulated
GPU (virtual time), `TorchRig` on a CUDA GPU through torch (an 8192x8192 bf16
matmul; torch is imported only when a TorchRig is made). The ways:

  - `naive`: what triton's do_bench does: ~25 ms of warmup, then the mean of
    ~100 ms of back-to-back calls, no telemetry. gpuenv's sampler watches it
    from the side, so the table can say what the naive number missed.
  - `gpuenv_way(condition)`: `gpuenv.bench` in burst mode (short bursts, each
    from the uncapped state), sustained mode (run to equilibrium, then measure)
    or plain (used under a clock lock, which the caller takes).

`cold_and_hot` takes each way cold (after a rest) and hot (right after a
sustained load); `format_table` prints the rows. Nothing here writes a GPU
setting: the demo takes its lock itself, on the simulated GPU only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuenv import timing
from gpuenv.backend import Backend
from gpuenv.judge import Evidence, judge, read_facts
from gpuenv.phases import Conditioning, FirstBurst
from gpuenv.reasons import reason_names
from gpuenv.table import render
from gpuenv.telemetry import Sampler, Window
from gpuenv.timebase import REAL_CLOCK, Clock
from gpuenv.units import fmt_mhz
from gpuenv.units import fmt_s as fmt_time
from gpuenv.verdict import Finding, GpuFacts, VerdictConfig

NAIVE_WARMUP_S = 0.025  # triton.testing.do_bench's defaults: warmup=25, rep=100 (ms)
NAIVE_REP_S = 0.1
NAIVE_ESTIMATE_CALLS = 5  # do_bench times 5 calls to size its loops
MATMUL_SIZE = 8192
# burst mode always waits a driver refresh or two; only a longer wait is worth a word
BURST_WAIT_WORTH_S = 0.5
BATCH_S = 0.02  # simulated back-to-back calls are run in batches this long (virtual time)


class Rig(Protocol):
    """What runs the kernel: the GPU seen through `backend` (NVML index `gpu`)."""

    backend: Backend  # telemetry (read-only on a real GPU)
    gpu: int
    clock: Clock  # the sampler's and the harness's clock
    kernel: Callable[[], Any]
    what: str  # "an 8192x8192 bf16 matmul"

    def time_calls(self, fn: Callable[[], Any], n: int) -> float:
        """Seconds that n back-to-back calls of fn take on the GPU."""
        ...

    def idle(self, seconds: float) -> None: ...

    def load(self, seconds: float) -> None:
        """The kernel back to back for `seconds`."""
        ...

    def device(self) -> timing.Device:
        """What `gpuenv.bench` runs and times the kernel on."""
        ...


class SimRig:
    """The simulated GPU: a kernel of SM cycles plus memory cycles, on virtual time.

    `backend` is what telemetry reads (a ReadOnlyBackend stands in for a real GPU in
    tests); `sim` is the SimBackend that runs the work.
    """

    def __init__(
        self,
        sim: Any,
        gpu: int = 0,
        *,
        sm_cycles: float,
        mem_cycles: float = 0.0,
        backend: Backend | None = None,
        what: str = "a matmul-like kernel",
    ):
        self.sim = sim
        self.backend: Backend = backend if backend is not None else sim
        self.gpu = gpu
        self.clock: Clock = sim.clock
        self.what = what
        self._sm, self._mem = sm_cycles, mem_cycles

        def kernel() -> float:
            return float(sim.run_work(gpu, sm_cycles, mem_cycles=mem_cycles))

        self.kernel = kernel
        for _ in range(3):  # as TorchRig: the first calls make the context (345 -> max MHz)
            kernel()

    def time_calls(self, fn: Callable[[], Any], n: int) -> float:
        t0 = self.clock.now()
        for _ in range(n):
            fn()
        return self.clock.now() - t0

    def idle(self, seconds: float) -> None:
        self.sim.idle(seconds)

    def load(self, seconds: float) -> None:
        self.back_to_back(seconds)

    def back_to_back(self, seconds: float) -> tuple[float, int]:
        """The kernel back to back for about `seconds`: (seconds taken, calls).

        Simulated in batches of ~BATCH_S of the same work (the same cycles at the same
        power: the model integrates through clock changes inside one piece of work),
        so that minutes of load cost no more CPU time than a few thousand calls.
        """
        start = self.clock.now()
        per_call = self.kernel()
        n = max(1, int(BATCH_S / max(per_call, 1e-9)))
        calls = 1
        while self.clock.now() - start < seconds:
            self.sim.run_work(self.gpu, self._sm * n, mem_cycles=self._mem * n)
            calls += n
        return self.clock.now() - start, calls

    def device(self) -> timing.Device:
        return _SimRigDevice(self)


class _SimRigDevice(timing.SimDevice):
    """The harness's simulated device; conditioning (sustained mode) runs the kernel in
    batches (`SimRig.back_to_back`), reps still one call each."""

    def __init__(self, rig: SimRig):
        super().__init__(rig.sim, rig.gpu)
        self.rig = rig

    def run_for(self, fn: Callable[[], Any], seconds: float) -> float:
        if fn is not self.rig.kernel:
            return super().run_for(fn, seconds)
        taken, calls = self.rig.back_to_back(seconds)
        return taken / calls


class TorchRig:
    """An 8192x8192 bf16 matmul on the CUDA device that is NVML GPU `gpu` (same UUID).

    Raises ConfigError without torch or a CUDA device torch can see.
    """

    def __init__(self, backend: Backend, gpu: int):
        from gpuenv.clocks.calibration import reference_load

        torch = timing._torch()  # ConfigError naming `pip install torch`
        fn, _, ordinal = reference_load(backend, gpu, size=MATMUL_SIZE)
        self.torch = torch
        self.backend = backend
        self.gpu = gpu
        self.clock: Clock = REAL_CLOCK
        self.what = f"an {MATMUL_SIZE}x{MATMUL_SIZE} bf16 matmul"
        self.kernel = fn
        self.cuda = torch.device("cuda", ordinal)
        self._device: timing.Device | None = None
        with torch.cuda.device(self.cuda):
            for _ in range(3):  # library set-up (cuBLAS handles: ~150 ms) is not a number
                fn()
            torch.cuda.synchronize()

    def time_calls(self, fn: Callable[[], Any], n: int) -> float:
        torch = self.torch
        with torch.cuda.device(self.cuda):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in ms

    def idle(self, seconds: float) -> None:
        self.torch.cuda.synchronize(self.cuda)
        time.sleep(seconds)

    def load(self, seconds: float) -> None:
        torch = self.torch
        end = time.monotonic() + seconds
        with torch.cuda.device(self.cuda):
            while time.monotonic() < end:
                for _ in range(16):  # a bounded queue: the load stops on time
                    self.kernel()
                torch.cuda.synchronize()

    def device(self) -> timing.Device:
        if self._device is None:
            self._device = timing.cuda_device("events", device=self.cuda)
        return self._device


# -- one measurement, and the ways to take it --------------------------------------------


@dataclass(frozen=True)
class Taken:
    """One measurement of the kernel: its time and what gpuenv saw while it ran."""

    time_s: float
    sm_mhz: float | None  # mean SM clock NVML reported over the measured reps
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()  # short words for the table: "lock held", "not steady"
    telemetry: Window | None = None
    first_burst: FirstBurst | None = None  # how a burst measurement's first burst began
    precondition: Conditioning | None = None  # what a sustained one's precondition did


@dataclass(frozen=True)
class Row:
    """One way, cold and hot. `load` is what the GPU did during the load before `hot`."""

    way: str
    cold: Taken
    hot: Taken
    load: Window | None = None

    @property
    def gap(self) -> float:
        """How much slower hot is than cold (0.176: 17.6% slower)."""
        return self.hot.time_s / self.cold.time_s - 1.0


Way = Callable[[Rig, Sampler], Taken]


def facts(backend: Backend, gpu: int, lock_range: tuple[int, int] | None = None) -> GpuFacts:
    """What findings compare against (gpuenv.judge.read_facts: max clock, power limit...)."""
    return read_facts(backend, [gpu], {gpu: lock_range} if lock_range else None)[gpu]


def rep_clock_mhz(windows: Sequence[Window]) -> float | None:
    """The SM clock NVML reported while the reps ran (time-weighted over their windows)."""
    timed = [(w.duration_s, w.sm_mhz_mean) for w in windows if w.sm_mhz_mean is not None]
    total = math.fsum(d for d, _ in timed)
    if total > 0:
        return math.fsum(d * mhz for d, mhz in timed) / total
    return math.fsum(mhz for _, mhz in timed) / len(timed) if timed else None


def naive(rig: Rig, watch: Sampler) -> Taken:
    """do_bench-like: size the loops on 5 calls, warm up ~25 ms, mean of ~100 ms of calls.

    The timing uses no telemetry; `watch` (gpuenv's sampler) looks on from the side.
    """
    est = rig.time_calls(rig.kernel, NAIVE_ESTIMATE_CALLS) / NAIVE_ESTIMATE_CALLS
    rig.time_calls(rig.kernel, max(1, int(NAIVE_WARMUP_S / max(est, 1e-9))))
    n = max(1, int(NAIVE_REP_S / max(est, 1e-9)))
    t0 = watch.mark()
    seconds = rig.time_calls(rig.kernel, n)
    t1 = watch.mark()
    window = watch.window(t0, t1, rig.gpu)
    m = judge(
        "naive",
        [seconds / n],
        Evidence.given([window], [rig.gpu]),
        facts={rig.gpu: facts(rig.backend, rig.gpu)},
    )
    return Taken(seconds / n, window.sm_mhz_mean, m.findings, (), window)


def gpuenv_way(
    condition: str | None,
    *,
    budget_s: float = 1.0,
    precondition_max_s: float = 180.0,
    lock_range: tuple[int, int] | None = None,
    **bench_kw: Any,
) -> Way:
    """`gpuenv.bench` with `condition` ("burst", "sustained" or None). Under a clock lock
    (`lock_range`), the reps are judged against the lock, as `gpuenv.stable(sm=...)` does.
    `bench_kw` passes more settings to `gpuenv.bench` (warmup_max_s...)."""

    def way(rig: Rig, watch: Sampler) -> Taken:
        m = timing.bench(
            rig.kernel,
            name="demo kernel",
            backend=rig.backend,
            gpu=rig.gpu,
            device=rig.device(),
            condition=condition,
            budget_s=budget_s,
            precondition_max_s=precondition_max_s,
            keep_trace=False,
            **bench_kw,
        )
        first, pre = m.first_burst, m.precondition
        notes = []
        found = tuple(m.findings)
        if condition == "burst" and first is not None and first.wait_s >= BURST_WAIT_WORTH_S:
            notes.append(f"waited {first.wait_s:.1f} s to recover")
        if condition == "sustained" and pre is not None and not pre.steady:
            notes.append("not at equilibrium")
        if lock_range is not None:
            spans = [(w.t0, w.t1) for w in m.windows]
            windows = watch.windows(spans, rig.gpu, lock_range=lock_range)
            found = judge(
                m.name,
                list(m.times_s),
                Evidence.given(windows, [rig.gpu]),
                config=VerdictConfig(stable_clocks=True),
                facts={rig.gpu: facts(rig.backend, rig.gpu, lock_range)},
            ).findings
            if all(w.lock_held for w in windows):
                notes.append("lock held")
        tel = m.telemetry
        mhz = rep_clock_mhz([w for w in m.windows if w.gpu == rig.gpu])
        if mhz is None and tel is not None:
            mhz = tel.sm_mhz_mean
        assert m.stats.median_s is not None, "a bench keeps at least one rep"
        return Taken(m.stats.median_s, mhz, found, tuple(notes), tel, first, pre)

    return way


def cold_and_hot(
    rig: Rig,
    ways: dict[str, Way],
    watch: Sampler,
    *,
    rest_s: float,
    load_s: float,
    shared: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Each way cold (after `rest_s` of rest) and hot (right after `load_s` of load).

    `shared=False`: each way gets its own rest and load. `shared=True` (to save real
    time): one rest, every way cold, one load, every way hot, in the order given.
    """
    say = progress or (lambda text: None)

    def rest() -> None:
        say(f"resting {rest_s:.0f} s")
        rig.idle(rest_s)

    def load() -> Window:
        say(f"{load_s:.0f} s of {rig.what} back to back")
        t0 = watch.mark()
        rig.load(load_s)
        w = watch.window(t0, watch.mark(), rig.gpu)
        say(f"  ... {describe_load(w)}")
        return w

    def take(name: str, state: str) -> Taken:
        taken = ways[name](rig, watch)
        say(f"{name}, {state}: {fmt_time(taken.time_s)}")
        return taken

    rows = []
    if shared:
        rest()
        cold = {name: take(name, "cold") for name in ways}
        w = load()
        for name in ways:
            rows.append(Row(name, cold[name], take(name, "hot"), w))
        return rows
    for name in ways:
        rest()
        c = take(name, "cold")
        w = load()
        rows.append(Row(name, c, take(name, "hot"), w))
    return rows


# -- what a person reads -----------------------------------------------------------------


def describe_load(w: Window) -> str:
    """One line: SM clock, power, temperature and reasons over a load."""
    reasons = ", ".join(reason_names(w.reasons)) or "none"
    power = f"{w.power_w_max:.0f} W max" if w.power_w_max is not None else "power ?"
    temp = (
        f"{w.temp_c_start:.0f} -> {w.temp_c_end:.0f} C"
        if w.temp_c_start is not None and w.temp_c_end is not None
        else "temperature ?"
    )
    return (
        f"SM clock {fmt_mhz(w.sm_mhz_start)} -> {fmt_mhz(w.sm_mhz_end)} MHz "
        f"(min {fmt_mhz(w.sm_mhz_min)}), {power}, {temp}, reasons: {reasons}"
    )


_SHORT = {
    "warmup_ramp": "warmup ramp",
    "thermal": "thermal",
    "hw_slowdown": "HW slowdown",
    "power_brake": "power brake",
    "lock_not_held": "lock NOT held",
    "other_process": "another process",
    "clock_drift": "clock drift",
    "telemetry_gap": "telemetry gap",
}


def saw(taken: Taken) -> str:
    """What gpuenv saw, in a few words: findings, then what it did; "" for nothing."""
    parts: list[str] = []
    for f in taken.findings:
        text = _SHORT.get(f.kind, f.kind)
        if f.kind == "power_cap":
            frac = f.details.get("fraction_under_cap")
            cost, top = f.details.get("clock_cost_mhz"), f.details.get("max_sm_mhz")
            if cost is not None and top and cost < 0.01 * top:
                # the cap's counter runs, but the driver has not lowered the clock yet
                text = "at the cap, clock not cut yet"
            else:
                text = f"capped {frac:.0%}" if frac is not None else "capped"
        if text not in parts:
            parts.append(text)
    parts += taken.notes
    return ", ".join(parts)


def saw_both(row: Row) -> str:
    """The "what gpuenv saw" cell: "nothing", "x (both)", "hot: x", or "cold: x; hot: y"."""
    cold, hot = saw(row.cold), saw(row.hot)
    if cold == hot:
        return f"{cold} (both)" if cold else "nothing"
    if not cold:
        return f"hot: {hot}"
    if not hot:
        return f"cold: {cold}"
    return f"cold: {cold}; hot: {hot}"


def format_table(rows: Sequence[Row]) -> list[str]:
    """way | cold | hot | hot vs cold | SM clock cold / hot | what gpuenv saw."""
    head = ("way", "cold", "hot", "hot vs cold", "SM MHz cold / hot", "what gpuenv saw")
    body = [
        (
            r.way,
            fmt_time(r.cold.time_s),
            fmt_time(r.hot.time_s),
            f"{r.gap:+.1%}",
            f"{fmt_mhz(r.cold.sm_mhz)} / {fmt_mhz(r.hot.sm_mhz)}",
            saw_both(r),
        )
        for r in rows
    ]
    return render(body, header=head, right={1, 2, 3, 4})  # numbers align right


def cause(taken: Taken) -> str | None:
    """What held the clock down, from the findings; None when nothing did."""
    kinds = {f.kind for f in taken.findings}
    if "power_cap" in kinds:
        return "the power cap (SwPowerCap)"
    if "thermal" in kinds or "hw_slowdown" in kinds:
        return "thermal slowdown"
    if "power_brake" in kinds:
        return "the power brake"
    return None


__all__ = [
    "Rig",
    "Row",
    "SimRig",
    "Taken",
    "TorchRig",
    "cause",
    "cold_and_hot",
    "describe_load",
    "facts",
    "fmt_time",
    "format_table",
    "gpuenv_way",
    "naive",
    "rep_clock_mhz",
    "saw",
    "saw_both",
]
