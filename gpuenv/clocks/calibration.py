"""Find the clock a sustained heavy load holds: the value `gpuenv lock --sm sustained` uses.

    results = calibrate(backend, [0], duration_s=120)
    print(results[0].summary())

A heavy reference load (a bf16 matmul through torch on a real GPU; the
simulated GPU's own heavy work on the simulator) runs until the GPU reaches
equilibrium under it: the same criterion as `gpuenv.bench(condition="sustained")`
(the load's time per call stops drifting, and the temperature has settled when
the power cap holds the clock). From the final window of telemetry it reports
the sustained clock under the power cap (the median SM clock) and the highest
supported clock that held for the whole window (at or below its lowest
reading, after dropping the 5% lowest), less one supported step when the cap
was holding the clock down (margin for the creep left after equilibrium).
Locked there, the GPU draws less than the cap at its hottest and keeps the clock.

A simulated GPU on real time (`gpuenv --sim calibrate`) is calibrated on a copy of
its model (`Workload.virtual_copy`): the driver settings in force now, but a fresh
GPU at its idle temperature, on virtual time. It takes seconds instead of minutes,
and gives the same answer every time, whatever earlier commands did to the
simulated GPU's temperature (which the copy leaves as it was). A simulated GPU
already on virtual time is calibrated as it stands: its caller set its state up.

Read-only on the GPU: it only runs work and reads telemetry. The result is saved
on the host with `gpuenv.clocks.calibration_store.save_calibration` (per GPU UUID).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

from gpuenv import conditioning, stats, timing
from gpuenv.backend import Backend, ReadOnlyBackend
from gpuenv.conditioning import ConditionConfig
from gpuenv.errors import ConfigError
from gpuenv.progress import Progress, enabled, quiet
from gpuenv.reasons import HELD_DOWN

# the longest calibration: it ends at equilibrium (CALIBRATE_TOL), which an H100 from cold
# reaches in ~1-1.5 min under a 700 W matmul and an H200 in seconds
DEFAULT_DURATION_S = 180.0
MATMUL_SIZE = 8192
HOLD_QUANTILE = 0.05  # the clock that held: this quantile of the final window's readings
CALIBRATE_TOL = 0.002  # equilibrium: predicted drift still to come (gpuenv.conditioning)
MARGIN_STEPS = 1  # under the power cap, lock this many supported steps below what held
FRESH_NOTE = " (virtual time, from a fresh GPU at idle)"  # the simulator's calibrations


@dataclass(frozen=True)
class CalibrationResult:
    gpu: int
    uuid: str
    name: str
    sustained_mhz: float | None  # median SM clock over the final window
    lock_mhz: int | None  # highest supported clock at or below the clock that held
    min_mhz: float | None  # lowest reading in the final window
    max_supported_mhz: int | None
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    capped: bool  # the SW power cap (or a thermal reason) held the clock down
    steady: bool  # equilibrium reached before the duration ran out
    seconds: float
    load: str  # what the reference load was
    saved_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        head = f"GPU {self.gpu} ({self.name})"
        if self.sustained_mhz is None:
            return f"{head}: no telemetry during the load"
        state = "reached equilibrium" if self.steady else "did NOT reach equilibrium"
        limit = (
            f" under the {self.power_limit_w:.0f} W power cap"
            if self.capped and self.power_limit_w
            else (" (never power capped)" if not self.capped else "")
        )
        text = (
            f"{head}: {state} after {self.seconds:.0f} s of {self.load}; sustained SM clock "
            f"{self.sustained_mhz:.0f} MHz{limit} (lowest {self.min_mhz:.0f}), "
            f"{self.temp_c:.0f} C, {self.power_w:.0f} W"
        )
        if self.lock_mhz is not None:
            text += f"; highest supported clock that held: {self.lock_mhz} MHz"
        if self.saved_to:
            text += f" (saved: 'gpuenv lock --sm sustained' locks {self.lock_mhz} MHz)"
        return text


Load = tuple[Callable[[], Any], str, int | None]  # (fn, what it is, CUDA ordinal or None)


def reference_load(backend: Backend, gpu: int, *, size: int = MATMUL_SIZE) -> Load:
    """The heavy load for `gpu`: the simulator's own heavy work, or a bf16 matmul on the
    CUDA device with the same UUID."""
    if backend.workload is not None:
        fn = timing.sim_kernel(backend, gpu, seconds=0.05, power_intensity=1.0)
        return fn, "the simulated GPU's heavy load", None
    torch = timing._torch()
    uuid = backend.device_info(gpu).uuid.lower()
    ordinal = None
    for i in range(torch.cuda.device_count()):
        u = str(getattr(torch.cuda.get_device_properties(i), "uuid", "")).lower()
        if u and uuid.endswith(u.removeprefix("gpu-")):
            ordinal = i
    if ordinal is None:
        raise ConfigError(
            f"torch cannot see GPU {gpu} ({uuid})",
            hint="check CUDA_VISIBLE_DEVICES, or select a GPU torch sees with -i cuda:N",
        )
    dev = torch.device("cuda", ordinal)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)

    def matmul() -> Any:
        return torch.matmul(a, b)

    return matmul, f"{size}x{size}x{size} bf16 matmuls", ordinal


def calibrate(
    backend: Backend,
    gpus: Sequence[int],
    *,
    duration_s: float = DEFAULT_DURATION_S,
    load: Callable[[int], Load] | None = None,
    save: bool = True,
    state_dir: str | None = None,
    progress: IO[str] | None = None,
) -> list[CalibrationResult]:
    """Calibrate each GPU in turn (see the module docstring). `load(gpu)` overrides the
    reference load (and runs on `backend` as given); results are saved only for GPUs that
    reached equilibrium."""
    if duration_s <= 0:
        raise ConfigError(f"duration must be positive (got {duration_s} s)")
    model = _virtual_model(backend) if load is None else None
    try:
        return [
            _calibrate_one(
                model or backend,
                g,
                duration_s=duration_s,
                load=load,
                fresh=model is not None,
                save=save,
                state_dir=state_dir,
                progress=progress,
            )
            for g in gpus
        ]
    finally:
        if model is not None:
            model.close()


def _virtual_model(backend: Backend) -> Backend | None:
    """A simulated GPU on real time is calibrated on a fresh copy of its model on virtual
    time (`Workload.virtual_copy`): seconds instead of minutes, and the same answer
    whatever earlier commands did to its temperature. None: calibrate `backend` itself (a
    real GPU; a simulated one already on virtual time, in the state its caller set up)."""
    if backend.workload is None or backend.clock.virtual:
        return None
    model = backend.workload.virtual_copy()
    return ReadOnlyBackend(model, reason="calibrate only reads") if backend.readonly else model


def _calibrate_one(
    backend: Backend,
    g: int,
    *,
    duration_s: float,
    load: Callable[[int], Load] | None,
    fresh: bool,
    save: bool,
    state_dir: str | None,
    progress: IO[str] | None,
) -> CalibrationResult:
    from gpuenv.telemetry import Sampler

    fn, what, ordinal = (load or (lambda gpu: reference_load(backend, gpu)))(g)
    if fresh:
        what += FRESH_NOTE
    device: timing.Device
    if backend.workload is not None:
        device = timing.SimDevice(backend, g, rep_probe_cycles=0)
    else:
        device = timing.CudaEvents(flush_l2=False, saturate=False, device=ordinal)
    sampler = Sampler(backend, [g], clock=device.clock)
    sampler.start()
    line = Progress(stream=progress, delay_s=0) if progress is not None else None
    try:
        cc = ConditionConfig(sustained_timeout_s=duration_s, sustained_tol=CALIBRATE_TOL)
        cond = conditioning.precondition(
            _runner(device, fn),
            sampler,
            [g],
            device.clock,
            config=cc,
            progress=_progress(progress, g, line, duration_s),
        )
        end = device.clock.now()
        final = sampler.samples(end - cc.sustained_window_s, end, g)
    finally:
        sampler.stop()
        if line is not None:
            line.clear()
    return _result(backend, g, final, cond, what, save=save, state_dir=state_dir)


def _result(
    backend: Backend,
    g: int,
    final: list[Any],
    cond: conditioning.Conditioning,
    what: str,
    *,
    save: bool,
    state_dir: str | None,
) -> CalibrationResult:
    info = backend.device_info(g)
    limits = backend.clock_limits(g)
    try:
        limit_w: float | None = backend.power_limits(g).limit_w
    except Exception:
        limit_w = None
    if not final:
        return CalibrationResult(
            g,
            info.uuid,
            info.name,
            None,
            None,
            None,
            limits.max_sm_mhz,
            None,
            None,
            limit_w,
            False,
            cond.steady,
            cond.seconds,
            what,
        )
    clocks = [float(s.sm_mhz) for s in final]
    held = stats.quantile(clocks, HOLD_QUANTILE)
    supported = sorted({c for cs in limits.supported_sm_mhz.values() for c in cs})
    candidates = [c for c in supported if c <= held]
    capped = any(s.reasons & HELD_DOWN for s in final)
    if capped and len(candidates) > MARGIN_STEPS:
        candidates = candidates[: len(candidates) - MARGIN_STEPS]
    lock_mhz = candidates[-1] if candidates else (int(held) if not supported else None)
    power = [s.power_instant_w if s.power_instant_w is not None else s.power_w for s in final]
    result = CalibrationResult(
        gpu=g,
        uuid=info.uuid,
        name=info.name,
        sustained_mhz=stats.median(clocks),
        lock_mhz=lock_mhz,
        min_mhz=min(clocks),
        max_supported_mhz=limits.max_sm_mhz,
        temp_c=final[-1].temp_c,
        power_w=stats.median(power),
        power_limit_w=limit_w,
        capped=capped,
        steady=cond.steady,
        seconds=cond.seconds,
        load=what,
    )
    if save and cond.steady and lock_mhz is not None:
        from gpuenv.clocks.calibration_store import save_calibration

        path = save_calibration(
            info.uuid,
            lock_mhz,
            power_limit_w=limit_w,
            gpu_name=info.name,
            details={
                "sustained_mhz": result.sustained_mhz,
                "min_mhz": result.min_mhz,
                "temp_c": result.temp_c,
                "seconds": result.seconds,
                "load": what,
            },
            state_dir=state_dir,
        )
        result = CalibrationResult(**{**result.to_dict(), "saved_to": str(path)})
    return result


def _runner(device: timing.Device, fn: Callable[[], Any]) -> Callable[[float], float]:
    return lambda seconds: device.run_for(fn, seconds)


def _progress(
    out: IO[str] | None, gpu: int, line: Progress | None, duration_s: float
) -> Callable[[str, bool], None] | None:
    """Each chunk's line, redrawn in place on a terminal (gpuenv.progress); elsewhere (a
    log, a pipe) one line as the load starts, saying what runs and for at most how long:
    a line a chunk would fill a log with what the result then says (20 for a calibration)."""
    if out is None:
        return None
    said = [False]

    def show(text: str, settled: bool = False) -> None:
        # "preconditioning  12.3 s: ..." -> "gpuenv calibrate GPU 0: load 12.3 s: ..."
        text = f"gpuenv calibrate GPU {gpu}: " + text.replace("preconditioning", "load").strip()
        if line is not None and line.on:
            line.update(text)
        elif not enabled(out) and not said[0] and not quiet():
            said[0] = True
            out.write(
                f"gpuenv calibrate GPU {gpu}: load until clock and temperature reach "
                f"equilibrium (at most {duration_s:g} s)\n"
            )
            out.flush()

    return show


def default_progress() -> IO[str]:
    return sys.stderr


__all__ = ["CalibrationResult", "calibrate", "reference_load"]
