"""A simulated GPU: a small model of the physics that make benchmark numbers lie.

`SimBackend` implements the `Backend` protocol (plus `power_samples` and
`nvml_version`, as `NvmlBackend` has them) and adds a synthetic workload API
(`open_context`, `run_work`, `set_background_load`, `idle`: its `workload`),
conditions (`set_ambient`), fault injection and `truth()` for tests. It is
assembled from one module per concept: `sim_core` (the GPUs, their lock, faults,
permissions, the shared state file), `sim_reads`, `sim_writes`, `sim_workload`
and `sim_faults`; the GPU model itself is `sim_gpu.GpuModel`, profiles are data
in `sim_profiles.py`. What it models, per GPU:

  - the clock governor: parked at the idle clock with reason GpuIdle until a
    CUDA context exists, then boost (the application clock, or the top of a
    locked range); application clocks take effect at context creation;
  - power: static + temperature-dependent leakage + dynamic power growing with
    the clock and the load (`sim_profiles.py` gives the formula);
  - the SW power cap: every driver update period (100 ms) the driver compares
    its filtered power with the limit and moves a clock ceiling in supported
    steps (down at most `max_step_down` steps a period, up as far as the
    headroom allows), so a heavy load meets the 700 W cap within 100-300 ms and
    the capped clock creeps down as the chip heats;
  - temperature: first order (ambient + R * power, time constant tau), and the
    hotter chip leaks more, which is what pulls the capped clock down;
  - SW thermal slowdown above the max operating temperature, HW slowdown
    (0x40 | 0x8, clock halved) at the slowdown threshold, and a shutdown that
    loses the GPU;
  - readings as NVML gives them: clocks, reasons, power (a 1 s average, which
    never reads over the limit without SwPowerCap; the instant power may for the
    cap's onset),
    energy and the time-under-reason counters refresh at driver updates
    (100 ms), temperature every 200 ms, as integers where NVML's are.

Physics advance lazily to `clock.now()` on every call, in fixed 10 ms steps on
an integer-nanosecond timeline (100 ms steps once nothing has changed for 2 s),
so there is no background thread, virtual time is exact and a read costs
microseconds. With a `VirtualClock`, `run_work` and `idle` advance time
themselves; with the real clock they sleep.

With a state file (`from_env`: the host's, /tmp/gpuenv-sim.json) the simulated
machine is one for every process and account of the host, as a real GPU is: the
driver settings (locked clocks, application clocks, power limit, persistence mode)
are root's to write and everyone's to read (`sim_state.py`), and what runs on it
(each process's contexts and loads, each GPU's temperature, controllers, counters
and readings) is shared by every process on real time (`sim_host.py`). A backend on
a virtual clock shares the settings and its heat but runs its own physics.
Persistence mode off: when the last process using the GPU leaves (or dies), the
locked clocks, application clocks and power limit revert to defaults, as a real
driver's do when it de-initialises the GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv.backend.base import Capabilities, Workload
from gpuenv.backend.sim_details import SimDetails
from gpuenv.backend.sim_faults import BACKEND_OPS, FAULT_KINDS, WORKLOAD_OPS, Fault
from gpuenv.backend.sim_profiles import PROFILES, SimProfile
from gpuenv.backend.sim_state import check_place, default_state_path
from gpuenv.backend.sim_workload import SimWorkload
from gpuenv.backend.sim_writes import SimWrites
from gpuenv.errors import ConfigError, DeviceNotFound


@dataclass(frozen=True)
class SimTruth:
    """What the simulated GPU is really doing, including what NVML cannot read."""

    locked_sm: tuple[int, int] | None
    locked_mem: tuple[int, int] | None
    app_sm_mhz: int  # the application clocks set now (they apply at the next context creation)
    app_mem_mhz: int
    power_limit_w: float
    persistence: bool
    sm_mhz: int  # the clock kernels run at now (not the 100 ms-old reading)
    mem_mhz: int
    temp_c: float  # exact, not rounded
    power_w: float  # instant
    reasons: int
    energy_mj: float  # exact, not the 100 ms-old counter
    reason_ns: dict[str, int]
    contexts: tuple[int, ...]  # pids holding a context (this SimBackend's view)
    t: float  # the simulated time these values belong to (clock seconds)


class SimBackend(SimDetails, SimWrites, SimWorkload):
    """A simulated machine of `n_gpus` identical GPUs (see the module docstring).

    `profile`: a key of `PROFILES` ("h100", the default, an H100 as measured; "h200",
    "a100", "l40s", "b200", "rtx4090", "legacy"), or a `SimProfile`; `profile_for_gpu(name)`
    finds the one that models a real GPU.
    `clock`: `RealClock` (default) or a `VirtualClock` for tests.
    `root`: whether this process may write settings (else PermissionDenied, as NVML's).
    `state_file`: where the driver state lives across processes; None keeps it in memory.
    `seed`: makes UUIDs and serial numbers differ between simulated machines.
    """

    name = "sim"
    readonly = False

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(simulated=True, privileged=self.root)

    @property
    def workload(self) -> Workload:
        """The simulated GPU runs its own synthetic load (`run_work` and the rest)."""
        return self

    def spec(self) -> dict[str, Any] | None:
        """JSON that opens this simulated machine in another process (`open_backend(spec=)`).

        None when its state lives in memory or its profile is not a named one: no other
        process can see the same GPUs then. The other process runs on real time.
        """
        if self._state is None or PROFILES.get(self.profile.key) != self.profile:
            return None
        return {
            "kind": "sim",
            "profile": self.profile.key,
            "n_gpus": self.device_count(),
            "seed": self.seed,
            "root": self.root,
            "state_file": str(self._state.path),
        }

    def virtual_copy(self) -> SimBackend:
        """These GPUs as a fresh machine has them, on a virtual clock of their own.

        In memory (no state file): the driver settings in force now (locked clocks,
        application clocks, power limit, persistence) and the air each GPU's cooler sees,
        but each GPU fresh, with no context and no load, at its idle temperature. Work on
        it takes no wall time and reaches no other process, and what it does depends only
        on those settings, not on what ran before (`gpuenv calibrate` runs on one). Faults
        injected here are not copied.
        """
        from gpuenv.timebase import VirtualClock

        copy = SimBackend(
            self.profile,
            n_gpus=len(self._gpus),
            root=self.root,
            seed=self.seed,
            clock=VirtualClock(epoch=self.clock.wall()),
        )
        with self._lock:
            self._sync()
            for mine, fresh in zip(self._gpus, copy._gpus, strict=True):
                fresh.settings = dataclasses.replace(mine.settings)
                fresh.ambient_c = mine.ambient_c
                fresh.relatch_clock()
                fresh.settle()
        return copy

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> SimBackend:
        """The simulated machine a `spec()` describes, on real time."""
        try:
            return cls(
                str(spec["profile"]),
                n_gpus=int(spec["n_gpus"]),
                root=bool(spec["root"]),
                seed=int(spec["seed"]),
                state_file=str(spec["state_file"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"a simulated backend spec needs profile, n_gpus, root, seed and state_file "
                f"({err!r} in {dict(spec)!r})",
                hint="pass what SimBackend.spec() returned",
            ) from None

    @classmethod
    def from_env(cls) -> SimBackend:
        """The simulator as the environment describes it (real time).

        GPUENV_SIM_STATE: the settings file (default: the host's, /tmp/gpuenv-sim.json,
        shared by every process and account; 'none' keeps state in memory),
        GPUENV_SIM_PROFILE (h100; any key of PROFILES), GPUENV_SIM_GPUS (1),
        GPUENV_SIM_ROOT (default: whether
        this process runs as root, as on a real GPU; 0 acts unprivileged; 1 acts as root,
        which an ordinary account may do only on a simulated machine of its own),
        GPUENV_SIM_SEED (0): which machine it is; its GPUs' UUIDs derive from it, so
        simulated nodes of one cluster, each its own seed, have GPUs of their own UUIDs (as
        real GPUs do) where their indices repeat. Every process of one machine uses its seed.
        """
        from gpuenv import validate

        env = os.environ
        profile = env.get("GPUENV_SIM_PROFILE", "").strip() or "h100"
        gpus_text = env.get("GPUENV_SIM_GPUS", "").strip() or "1"
        try:
            n_gpus = int(gpus_text)
        except ValueError:
            raise ConfigError(
                f"GPUENV_SIM_GPUS={gpus_text!r} is not a number", hint="use 1 to 64"
            ) from None
        state_text = env.get("GPUENV_SIM_STATE", "").strip()
        state: str | os.PathLike[str] | None
        if state_text.lower() in ("none", "memory"):
            state = None
        else:
            state = state_text or default_state_path()
        root = _root_from_env(env.get("GPUENV_SIM_ROOT", ""), state)
        seed = validate.env_number("GPUENV_SIM_SEED", 0, lo=0, hi=2**31, environ=env)
        if seed != int(seed):
            raise ConfigError(
                f"GPUENV_SIM_SEED={env['GPUENV_SIM_SEED']!r} is not a whole number",
                hint="use 0, 1, 2 ...",
            )
        return cls(profile, n_gpus=n_gpus, root=root, seed=int(seed), state_file=state)

    def __enter__(self) -> SimBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults and ground truth -----------------------------------------------------
    def inject_fault(
        self, index: int, kind: str, *, op: str | None = None, count: int | None = None
    ) -> None:
        """Make calls fail as NVML would: "gpu_lost" | "timeout" | "not_supported" | "permission".

        `op`: a backend method name (or workload method) or None for every NVML call
        (gpu_lost also fails the workload); `count`: how many calls fail (None: until cleared).
        """
        if kind not in FAULT_KINDS:
            raise ConfigError(
                f"unknown fault kind {kind!r}", hint=f"use one of: {', '.join(FAULT_KINDS)}"
            )
        if op is not None and op not in BACKEND_OPS + WORKLOAD_OPS:
            raise ConfigError(
                f"unknown operation {op!r} for a fault",
                hint="use a SimBackend method name, or None for all",
            )
        if count is not None and count < 1:
            raise ConfigError(f"fault count {count!r} must be >= 1 (or None for no end)")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self._gpus)
        ):
            raise DeviceNotFound(str(index), len(self._gpus))
        with self._lock:
            self._faults.setdefault(index, []).append(Fault(kind, op, count))

    def clear_faults(self, index: int | None = None) -> None:
        """Remove injected faults (and revive a GPU lost to overheating) on one GPU or all."""
        with self._lock:
            for i in range(len(self._gpus)) if index is None else [index]:
                self._faults.pop(i, None)
                g = self._gpus[i]
                g.advance(self._now_ns())
                g.revive()

    def truth(self, index: int) -> SimTruth:
        """Ground truth now, for tests. Ignores faults."""
        with self._lock:
            if not 0 <= index < len(self._gpus):
                raise DeviceNotFound(str(index), len(self._gpus))
            self._sync()
            g = self._gpus[index]
            g.advance(self._now_ns())
            s = g.settings
            return SimTruth(
                locked_sm=s.locked_sm,
                locked_mem=s.locked_mem,
                app_sm_mhz=s.app_sm,
                app_mem_mhz=s.app_mem,
                power_limit_w=s.power_limit_w,
                persistence=s.persistence,
                sm_mhz=g.sm_mhz,
                mem_mhz=g.mem_mhz,
                temp_c=g.temp_c,
                power_w=g.power_w,
                reasons=g.reasons,
                energy_mj=g.energy_mj,
                reason_ns=dict(g.reason_ns),
                contexts=tuple(g.contexts),
                t=g.t_ns * 1e-9,
            )


def _root_from_env(text: str, state: str | os.PathLike[str] | None) -> bool:
    """May this process write the simulated GPU's settings (GPUENV_SIM_ROOT, see from_env)?

    An ordinary account acting as root on the host's machine would bypass gpuenvd, as no
    account can on a real GPU: it may do so only where the settings are its own (in
    memory, or a state file in a directory it owns, which no other account believes).
    """
    text = text.strip().lower()
    if not text:
        return os.geteuid() == 0
    if text not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ConfigError(f"GPUENV_SIM_ROOT={text!r} is not understood", hint="use 1 or 0")
    wanted = text in ("1", "true", "yes", "on")
    if wanted and os.geteuid() != 0 and state is not None:
        folder = Path(os.path.abspath(state)).parent
        with contextlib.suppress(OSError):
            if folder.stat().st_uid == os.geteuid():
                return True
        check_place(state)  # a device or a missing directory is said before whose it is
        raise ConfigError(
            f"GPUENV_SIM_ROOT=1 cannot make this account root on the simulated machine "
            f"{state}: it is the host's, and an ordinary account changes its settings only "
            f"through gpuenvd, as on a real GPU",
            hint="lock through gpuenvd (root starts 'gpuenv --sim daemon'), or give yourself "
            "a simulated machine of your own: GPUENV_SIM_STATE=PATH in a directory you own",
        )
    return wanted


__all__ = ["FAULT_KINDS", "PROFILES", "SimBackend", "SimProfile", "SimTruth"]
