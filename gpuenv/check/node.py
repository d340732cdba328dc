"""`gpuenv check`'s phases, and which GPU it names (see the package docstring).

Each GPU in turn, the others idle, then all at once: each kernel warmed for WARM_S and
timed (the median of its reps), then the matmul sustained for `sustain_s`; the second
half of that is the window whose clock, power, temperature and time under the power cap
and thermal slowdown are kept (the first half takes the GPU to the cap, which an H100
meets within 100-300 ms). A GPU is named when one of its times is more than TOLERANCE
slower than the median of the other GPUs' (tiny calls carry microseconds of launch
overhead that moves by itself: TINY_TOLERANCE and TINY_FLOOR_S), or its sustained clock is more than
TOLERANCE below theirs; then what explains it is read from the same telemetry. The
matmul's short reps are shown, not compared; all at once, only the sustained matmul's
time and clock are (ALONE_KEYS says why).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import IO, Any

from gpuenv.backend import Backend, ReadOnlyBackend
from gpuenv.check.kernels import (
    KERNELS,
    WHAT,
    GpuKernels,
    Steps,
    at_once,
    close_kernels,
    finish,
    kernels_for,
)
from gpuenv.check.report import GpuCheck, NodeCheck, PhaseResult
from gpuenv.errors import ConfigError
from gpuenv.progress import Progress
from gpuenv.telemetry import Sampler
from gpuenv.units import fmt_s

BUDGET_S = 60.0  # the whole check, up to 8 GPUs
TOLERANCE = 0.02  # slower than the others' median by more than this: named
TINY_TOLERANCE = 0.05
TINY_FLOOR_S = 0.5e-6  # and by more than this: a launch-bound call's host jitter (4 H100s of
# one host: the 1k add read 4.9-5.1 us per GPU in one check, 4.9-5.4 us in the next)
WARM_S = 0.1  # each kernel back to back before its reps
CHUNK_S = 0.1  # GPUs at once on the simulator take turns at most this long
# compared alone: the copy, the tiny kernel and the sustained matmul. Not the matmul's own
# short reps: they run in the 100-300 ms the power cap takes to engage, so on GPUs that all
# meet the cap they land either side of it (4 H100s sustaining 1.61-1.62 ms read 1.42-1.61
# ms there one day, 1.60-1.64 and 1.44-1.63 ms the next); the sustained matmul is the fair
# comparison of a heavy kernel. All at once only the sustained matmul (every kernel's short
# reps start together, in that onset, where a few ms of start-up between GPUs moves them by
# percents)
ALONE_KEYS = ("copy", "tiny", "sustained")
REPS = {"heavy": 20, "copy": 40, "tiny": 200}
PHASE_OVERHEAD_S = 0.6  # warm-ups and reps of one phase
SETUP_PER_GPU_S = 0.5  # a CUDA context and the kernels' tensors, per GPU
SUSTAIN_S = (1.0, 6.0)  # the sustained matmul's bounds, per GPU and phase
FRESH_NOTE = " (a fresh copy of the simulated GPUs, on virtual time)"


def sustain_for(budget_s: float, n_gpus: int, *, together: bool = True) -> float:
    """The sustained matmul's length that keeps every phase within `budget_s`."""
    phases = n_gpus + (1 if together and n_gpus > 1 else 0)
    lo, hi = SUSTAIN_S
    per_phase = (budget_s - SETUP_PER_GPU_S * n_gpus) / phases
    return max(lo, min(hi, per_phase - PHASE_OVERHEAD_S))


def check_node(
    backend: Backend,
    gpus: Sequence[int],
    *,
    budget_s: float = BUDGET_S,
    together: bool = True,
    progress: IO[str] | None = None,
) -> NodeCheck:
    """Run the kernels on each of `gpus` alone, then on all at once, and name any GPU that
    is slower than the others (see the module docstring). Read-only: work and reads only.
    A simulated GPU on real time is checked on a fresh copy of its model on virtual time,
    with the settings in force now (power limits, locks): seconds, not a minute."""
    if not gpus:
        raise ConfigError("no GPU to check", hint="select GPUs with -i (-i all: every GPU)")
    if budget_s <= 0:
        raise ConfigError(f"the time budget must be positive (got {budget_s} s)")
    model = _virtual_model(backend)
    b = model or backend
    sustain_s = sustain_for(budget_s, len(gpus), together=together)
    line = Progress("gpuenv check: starting", stream=progress, show=None if progress else False)
    try:
        alone, joint, seconds = _phases(b, gpus, sustain_s, together, line)
        return NodeCheck(
            tuple(_judged(b, gpus, alone, joint)),
            sustain_s,
            seconds,
            {"time": TOLERANCE, "tiny": TINY_TOLERANCE, "clock": TOLERANCE},
            FRESH_NOTE if model is not None else "",
        )
    finally:
        line.clear()
        if model is not None:
            model.close()


def _phases(
    b: Backend, gpus: Sequence[int], sustain_s: float, together: bool, line: Progress
) -> tuple[dict[int, PhaseResult], dict[int, PhaseResult], float]:
    """Each GPU alone, then (`together`, several GPUs) all at once; and the seconds it took."""
    t0 = b.clock.now()
    sampler = Sampler(b, list(gpus), clock=b.clock)
    kernels: list[GpuKernels] = []
    try:
        sampler.start()
        kernels = [kernels_for(b, g) for g in gpus]
        alone = {}
        for n, k in enumerate(kernels, 1):
            line.update(f"gpuenv check: GPU {k.gpu} alone ({n}/{len(kernels)})")
            alone[k.gpu] = finish(_phase(k, sampler, sustain_s))
        seconds = b.clock.now() - t0
        joint: dict[int, PhaseResult] = {}
        if together and len(kernels) > 1:
            line.update(f"gpuenv check: {len(kernels)} GPUs at once")
            jobs = {k.gpu: _phase(k, sampler, sustain_s) for k in kernels}
            joint, took = at_once(b, jobs)
            seconds += took
        return alone, joint, seconds
    finally:
        sampler.stop()
        close_kernels(b, kernels)


def _virtual_model(backend: Backend) -> Backend | None:
    if backend.workload is None or backend.clock.virtual:
        return None
    model = backend.workload.virtual_copy()
    return ReadOnlyBackend(model, reason="gpuenv check only reads") if backend.readonly else model


def _phase(k: GpuKernels, sampler: Sampler, sustain_s: float) -> Steps:
    """One GPU's kernels timed, then its sustained matmul and the telemetry of its second
    half; a step at most every CHUNK_S of work (kernels.at_once interleaves GPUs by them)."""
    times = {}
    for name in KERNELS:
        fn = k.kernels[name]
        k.device.run_for(fn, WARM_S)
        k.device.prepare(fn)  # on CUDA: the spin that covers fn's launch, sized
        yield
        times[name] = statistics.median(r.time_s for r in k.device.reps(fn, REPS[name]))
        yield
    heavy = k.kernels["heavy"]
    yield from _run_for(k, heavy, sustain_s / 2)  # to the cap
    t0 = sampler.mark()
    per_call = yield from _run_for(k, heavy, sustain_s / 2)
    t1 = sampler.mark()
    w = sampler.window(t0, t1, k.gpu)
    return PhaseResult(
        k.gpu,
        times,
        per_call,
        w.sm_mhz_busy_mean if w.sm_mhz_busy_mean is not None else w.sm_mhz_mean,
        w.sm_mhz_min,
        w.power_w_mean,
        w.temp_c_max,
        w.reason_s.get("power", 0.0),
        w.reason_s.get("thermal", 0.0),
        t1 - t0,
        tuple(w.other_pids),
    )


def _run_for(k: GpuKernels, fn: Callable[[], Any], seconds: float) -> Generator[None, None, float]:
    """fn back to back for `seconds`, in chunks; the mean time per call."""
    chunks = max(1, round(seconds / CHUNK_S))
    means = []
    for _ in range(chunks):
        means.append(k.device.run_for(fn, seconds / chunks))
        yield
    return statistics.fmean(means)


def _others(values: Mapping[int, float | None], g: int) -> float | None:
    rest = [v for h, v in values.items() if h != g and v is not None]
    return statistics.median(rest) if rest else None


def _value(p: PhaseResult, key: str) -> float | None:
    return p.sustained_s if key == "sustained" else p.times_s.get(key)


def _slower(
    phases: Mapping[int, PhaseResult], g: int, label: str, keys: Sequence[str]
) -> list[str]:
    """What GPU `g` is slower in than the median of the others in one phase (`keys`: the
    kernels and "sustained"), and whether it holds a lower sustained clock."""
    out = []
    for key in keys:
        tol = TINY_TOLERANCE if key == "tiny" else TOLERANCE
        what = f"sustained {WHAT['heavy']}" if key == "sustained" else WHAT[key]
        mine = _value(phases[g], key)
        rest = _others({h: _value(p, key) for h, p in phases.items()}, g)
        floor = TINY_FLOOR_S if key == "tiny" else 0.0
        if mine is not None and rest and mine > rest * (1 + tol) and mine - rest > floor:
            out.append(
                f"{what} {100 * (mine / rest - 1):.1f}% slower {label} "
                f"({fmt_s(mine, 'table')}; the others' median {fmt_s(rest, 'table')})"
            )
    mine, rest = phases[g].sm_mhz, _others({h: p.sm_mhz for h, p in phases.items()}, g)
    if mine is not None and rest and mine < rest * (1 - TOLERANCE):
        out.append(
            f"holds {mine:.0f} MHz under the sustained matmul {label} "
            f"(the others' median {rest:.0f} MHz)"
        )
    return out


def _why(
    limits: Mapping[int, float | None], phases: Mapping[int, PhaseResult], g: int
) -> list[str]:
    """The telemetry that explains GPU `g`'s lower numbers, compared with the others'."""
    out = []
    p = phases[g]
    limit, rest_limit = limits.get(g), _others(limits, g)
    if limit is not None and rest_limit is not None and limit < rest_limit - 1:
        out.append(f"its power limit is {limit:.0f} W (the others' {rest_limit:.0f} W)")
    rest_cap = _others({h: q.cap_share for h, q in phases.items()}, g) or 0.0
    # under the cap as much as the others: no explanation, unless its limit is lower
    if p.cap_share >= 0.05 and (out or p.cap_share > rest_cap + 0.05):
        at = f" at {p.sm_mhz:.0f} MHz" if p.sm_mhz is not None else ""
        watts = f", {p.power_w:.0f} W" if p.power_w is not None else ""
        out.append(
            f"power-capped {100 * p.cap_share:.0f}% of the sustained matmul{at}{watts} "
            f"(the others {100 * rest_cap:.0f}%)"
        )
    rest_temp = _others({h: q.temp_c_max for h, q in phases.items()}, g)
    if p.thermal_s > 0 or (p.temp_c_max or 0) > (rest_temp or 1e9) + 5:
        out.append(
            f"thermal: {fmt_s(p.thermal_s, 'table')} under thermal slowdown, up to "
            f"{p.temp_c_max:.0f} C (the others {rest_temp:.0f} C)"
        )
    if p.other_pids:
        out.append(f"another process on it (pid {', '.join(map(str, p.other_pids))})")
    if not out:
        out.append(
            "nothing in its clocks, power or temperature explains it: look at its PCIe link "
            "and memory errors (nvidia-smi -q)"
        )
    return out


def _judged(
    backend: Backend,
    gpus: Sequence[int],
    alone: Mapping[int, PhaseResult],
    together: Mapping[int, PhaseResult],
) -> list[GpuCheck]:
    limits: dict[int, float | None] = {}
    for g in gpus:
        try:
            limits[g] = backend.power_limits(g).limit_w
        except Exception:  # an unsupported read: no limit to compare
            limits[g] = None
    order = sorted(gpus, key=lambda g: (alone[g].sustained_s or 0.0, -(alone[g].sm_mhz or 0.0)))
    out = []
    for g in gpus:
        slower = _slower(alone, g, "alone", ALONE_KEYS) if len(gpus) > 1 else []
        joint = _slower(together, g, "with all GPUs at once", ("sustained",)) if together else []
        worst = together if joint and not slower else alone
        slower += joint
        info = backend.device_info(g)
        out.append(
            GpuCheck(
                g,
                info.uuid,
                info.name,
                limits[g],
                alone[g],
                together.get(g),
                order.index(g) + 1,
                tuple(slower),
                tuple(_why(limits, worst, g)) if slower else (),
            )
        )
    return out


__all__ = ["BUDGET_S", "TOLERANCE", "check_node", "sustain_for"]
