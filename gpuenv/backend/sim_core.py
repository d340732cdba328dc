"""The simulated driver's core: its GPUs, their lock, faults, permissions and shared state.

`SimCore` is what every part of `SimBackend` stands on (reads in `sim_reads.py`,
writes in `sim_writes.py`, the synthetic workload in `sim_workload.py`): it holds
the `GpuModel`s, advances them to `clock.now()` on every call (`_get`), checks
injected faults and the permission model, and keeps the driver state in the
state file shared by every process that opens it (`sim_state.py`): settings are
committed as a locked read-modify-write, and the state reverts to defaults when
the last process without persistence mode leaves, as a real driver's does.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuenv.backend.nvml_codes import GPU_IS_LOST, NO_PERMISSION
from gpuenv.backend.sim_faults import Fault, raise_if_faulted
from gpuenv.backend.sim_gpu import GpuModel, Settings
from gpuenv.backend.sim_profiles import SimProfile, get_profile
from gpuenv.backend.sim_state import StateFile
from gpuenv.errors import ConfigError, DeviceNotFound, GpuLost, PermissionDenied
from gpuenv.timebase import Clock, RealClock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SimCore:
    """The simulated driver's core (see the module docstring); `SimBackend` is the whole."""

    def __init__(
        self,
        profile: str | SimProfile = "h100",
        *,
        n_gpus: int = 1,
        clock: Clock | None = None,
        root: bool = True,
        state_file: str | os.PathLike[str] | None = None,
        seed: int = 0,
    ):
        self.profile = get_profile(profile)
        if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or not 1 <= n_gpus <= 64:
            raise ConfigError(
                f"a simulated machine needs 1 to 64 GPUs, not {n_gpus!r}",
                hint="set GPUENV_SIM_GPUS=1..64",
            )
        self.clock: Clock = clock if clock is not None else RealClock()
        self.root = bool(root)
        self.seed = int(seed)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._token = uuidlib.uuid4().hex[:12]  # this backend's published work (a pid may hold two)
        now = self._now_ns()
        self._gpus = [GpuModel(self.profile, i, now) for i in range(n_gpus)]
        self._faults: dict[int, list[Fault]] = {}
        self._closed = False
        self._thermal_saved_at = -math.inf
        # this process's work per GPU as others see it: index -> (utilization, until s)
        self._published: dict[int, tuple[float, float]] = {}
        self._work_account: dict[int, tuple[float, float]] = {}  # index -> (since s, busy s)
        self._state = StateFile(state_file) if state_file is not None else None
        if self._state is not None:
            self._register()

    # -- plumbing ------------------------------------------------------------------
    def _now_ns(self) -> int:
        return round(self.clock.now() * 1e9)

    def _get(self, index: int, op: str) -> GpuModel:
        """The GPU at `index`, advanced to now, after sync with the state file and faults."""
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self._gpus)
        ):
            raise DeviceNotFound(str(index), len(self._gpus))
        self._sync()
        g = self._gpus[index]
        g.advance(self._now_ns())
        self._check_faults(index, op)
        if g.lost:
            raise GpuLost(
                f"GPU is lost: {g.lost}",
                op=op,
                gpu=index,
                code=GPU_IS_LOST,
                hint="the simulated GPU needs a reset: clear_faults() or a new SimBackend",
            )
        return g

    def _check_faults(self, index: int, op: str) -> None:
        raise_if_faulted(self._faults.get(index), index, op)

    def _need_root(self, index: int, op: str, what: str) -> None:
        if not self.root:
            raise PermissionDenied(
                f"permission denied: cannot {what} (NVML_ERROR_NO_PERMISSION)",
                op=op,
                gpu=index,
                code=NO_PERMISSION,
                hint="run as root, or start 'gpuenv daemon' as root and retry "
                "(simulated GPU: this process acts unprivileged, GPUENV_SIM_ROOT=0)",
            )

    # -- state file ----------------------------------------------------------------
    def _clock_domain(self) -> str:
        return "virtual" if getattr(self.clock, "virtual", False) else "real"

    def _matches(self, data: dict[str, Any]) -> bool:
        return (
            data.get("profile") == self.profile.key
            and data.get("n_gpus") == len(self._gpus)
            and data.get("seed") == self.seed
            and isinstance(data.get("gpus"), list)
            and len(data["gpus"]) == len(self._gpus)
        )

    def _load(self, data: dict[str, Any]) -> None:
        """Take settings (and the temperature of GPUs this backend is not running) from the file."""
        now = self._now_ns()
        for g, entry in zip(self._gpus, data["gpus"], strict=True):
            g.advance(now)  # the old settings govern the time before this change
            try:
                g.settings = Settings.from_json(entry)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            temp, t_s = entry.get("temp_c"), entry.get("temp_t")
            if (
                not g.active_here
                and isinstance(temp, (int, float))
                and isinstance(t_s, (int, float))
            ):
                elapsed = (
                    self.clock.now() - t_s if entry.get("clock") == self._clock_domain() else 0.0
                )
                settle = g.idle_temp_c()
                g.set_temperature(
                    settle + (temp - settle) * math.exp(-max(0.0, elapsed) / g.p.tau_s)
                )
            remote = self._others_work(entry, now)
            if remote != g.remote:
                g.remote = remote
                g.load_changed()
            g.relatch_clock()

    def _others_work(self, entry: dict[str, Any], now_ns: int) -> dict[str, tuple[float, int]]:
        """The work other backends (processes) published on a GPU (their token -> utilization,
        until ns), as a real driver sees every process's kernels: still running, on this clock."""
        out: dict[str, tuple[float, int]] = {}
        for item in entry.get("loads") or ():
            try:
                token, util, until, domain = str(item[0]), float(item[1]), float(item[2]), item[3]
            except (TypeError, ValueError, IndexError):
                continue
            end = round(until * 1e9) if math.isfinite(until) else 0
            if token != self._token and domain == self._clock_domain() and end > now_ns:
                out[token] = (min(max(util, 0.0), 1.0), end) if util == util else (0.0, end)
        return out

    def _loads_entry(self, index: int, prev: dict[str, Any] | None) -> list[list[Any]]:
        """A GPU's published work in the state file: the others' still running, and ours."""
        now = self._now_ns()
        mine = self._published.get(index)
        kept = [
            [token, u, end * 1e-9, self._clock_domain()]
            for token, (u, end) in self._others_work(prev or {}, now).items()
        ]
        if mine is not None and mine[1] * 1e9 > now:
            kept.append([self._token, mine[0], mine[1], self._clock_domain()])
        return kept

    def _dump(self, clients: list[int], old: dict[str, Any] | None) -> dict[str, Any]:
        gpus = []
        for i, g in enumerate(self._gpus):
            entry = g.settings.to_json()
            entry["uuid"] = self._uuid(i)
            prev = old["gpus"][i] if old is not None and self._matches(old) else None
            loads = self._loads_entry(i, prev)
            if loads:
                entry["loads"] = loads
            if g.active_here or prev is None or "temp_c" not in prev:
                entry.update(
                    temp_c=round(g.temp_c, 4), temp_t=self.clock.now(), clock=self._clock_domain()
                )
            else:
                entry.update(
                    temp_c=prev["temp_c"], temp_t=prev.get("temp_t"), clock=prev.get("clock")
                )
            gpus.append(entry)
        return {
            "profile": self.profile.key,
            "n_gpus": len(self._gpus),
            "seed": self.seed,
            "clients": clients,
            "gpus": gpus,
        }

    def _revert_unpersisted(self) -> None:
        """The driver de-initialises a GPU without persistence mode when its last client leaves."""
        for g in self._gpus:
            if not g.settings.persistence:
                g.settings = Settings.defaults(self.profile, persistence=False)
                g.relatch_clock()

    def _register(self) -> None:
        assert self._state is not None
        with self._state.locked():
            data = self._state.read()
            clients: list[int] = []
            if data is not None and self._matches(data):
                self._load(data)
                clients = [int(pid) for pid in data.get("clients", []) if _pid_alive(int(pid))]
            else:
                data = None
            if not clients:
                self._revert_unpersisted()
            clients.append(self._pid)
            self._state.write(self._dump(clients, data))

    def _sync(self) -> None:
        if self._state is not None and self._state.changed():
            data = self._state.read()
            if data is not None and self._matches(data):
                self._load(data)

    def _commit(self, index: int, change: Callable[[Settings], None]) -> None:
        """Apply a settings change; with a state file, as a locked read-modify-write."""
        g = self._gpus[index]

        def apply() -> None:
            change(g.settings)
            g.relatch_clock()

        if self._state is None:
            apply()
            return
        with self._state.locked():
            self._rewrite_state(apply)

    def _rewrite_state(self, change: Callable[[], None] = lambda: None) -> None:
        """Read the state file, apply `change` to this backend, write it back. Under lock."""
        assert self._state is not None
        data = self._state.read()
        if data is not None and self._matches(data):
            self._load(data)
            clients = [int(pid) for pid in data.get("clients", [])]
        else:
            data, clients = None, [self._pid]
        change()
        self._state.write(self._dump(clients, data))

    def close(self) -> None:
        """Leave the simulated driver: this process's contexts end; maybe the GPU de-initialises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._published.clear()  # our work leaves the GPU with us
            now = self._now_ns()
            for g in self._gpus:
                g.advance(now)
                g.contexts.clear()
                g.background.clear()
                g.job = None
                g.load_changed()
            if self._state is None:
                self._revert_unpersisted()
                return
            with self._state.locked():
                data = self._state.read()
                clients: list[int] = []
                if data is not None and self._matches(data):
                    self._load(data)
                    clients = [int(pid) for pid in data.get("clients", [])]
                else:
                    data = None
                if self._pid in clients:
                    clients.remove(self._pid)
                clients = [pid for pid in clients if _pid_alive(pid)]
                if not clients:
                    self._revert_unpersisted()
                self._state.write(self._dump(clients, data))

    def _save_thermal(self) -> None:
        """Leave this backend's temperature in the state file for other processes.

        At most once a second of simulated time: a loop of short kernels must not
        turn into a loop of file writes.
        """
        if self._state is None:
            return
        now = self.clock.now()
        if now - self._thermal_saved_at < 1.0:
            return
        self._thermal_saved_at = now
        with self._state.locked():
            self._rewrite_state()

    def _uuid(self, index: int) -> str:
        digest = hashlib.sha256(
            f"gpuenv-sim/{self.profile.key}/{self.seed}/{index}".encode()
        ).digest()
        return f"{self.profile.uuid_prefix}-{uuidlib.UUID(bytes=digest[:16], version=4)}"

    @property
    def state_file(self) -> Path | None:
        """The simulated driver's state file, or None when state lives in memory."""
        return self._state.path if self._state is not None else None


__all__ = ["SimCore"]
