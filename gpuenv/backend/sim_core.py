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

import contextlib
import hashlib
import os
import secrets
import threading
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuenv.backend.nvml_codes import GPU_IS_LOST, NO_PERMISSION
from gpuenv.backend.sim_faults import Fault, raise_if_faulted
from gpuenv.backend.sim_gpu import GpuModel, Presence, Settings
from gpuenv.backend.sim_host import RunFile, live_procs, presence_json, presences, process_start
from gpuenv.backend.sim_profiles import SimProfile, get_profile
from gpuenv.backend.sim_state import StateFile
from gpuenv.errors import ConfigError, DeviceNotFound, GpuLost, PermissionDenied
from gpuenv.timebase import Clock, RealClock

_SHARE_NS = 100_000_000  # how often a process writes the running GPU back: a driver update


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
        now = self._now_ns()
        self._key = f"{self._pid}:{secrets.token_hex(4)}"  # this backend among the host's
        self._gpus = [
            GpuModel(self.profile, i, now, own_pid=self._pid, own_key=self._key)
            for i in range(n_gpus)
        ]
        self._faults: dict[int, list[Fault]] = {}
        self._closed = False
        self._state = StateFile(state_file) if state_file is not None else None
        self._run = RunFile(self._state.path) if self._state is not None else None
        self._start = process_start(self._pid)
        self._file_settings: dict[str, Any] | None = None
        self._generation = 0  # of the settings file: counted up at every change
        self._deinit: int | None = None  # the generation a GPU was de-initialised at
        self._lease: dict[int, tuple[float, int | None]] = {}  # our kernels' load, until
        self._written_ns = -(1 << 62)
        if self._state is not None:
            self._register()

    # -- plumbing ------------------------------------------------------------------
    def _now_ns(self) -> int:
        return round(self.clock.now() * 1e9)

    def _get(self, index: int, op: str, *, share: bool = True) -> GpuModel:
        """The GPU at `index`, advanced to now, after sync with the state file and faults
        (`share=False`: root's settings only, not the running GPU other processes wrote:
        see `_sync`)."""
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self._gpus)
        ):
            raise DeviceNotFound(str(index), len(self._gpus))
        self._sync(share=share)
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
                "(the simulated GPU, as a real one, lets only root change its settings)",
            )

    # -- the shared machine: settings (root's) and what runs (anyone's) ----------------
    @property
    def _shares_physics(self) -> bool:
        """Processes on real time run one GPU together; a virtual clock is a test's own."""
        return self._run is not None and not getattr(self.clock, "virtual", False)

    def _matches(self, data: dict[str, Any]) -> bool:
        return (
            data.get("profile") == self.profile.key
            and data.get("n_gpus") == len(self._gpus)
            and data.get("seed") == self.seed
            and isinstance(data.get("gpus"), list)
            and len(data["gpus"]) == len(self._gpus)
        )

    def _read_settings(self) -> None:
        assert self._state is not None
        data = self._state.read()
        self._file_settings = data if data is not None and self._matches(data) else None
        generation = (self._file_settings or {}).get("generation", 0)
        self._generation = generation if isinstance(generation, int) else 0

    def _apply_settings(self) -> None:
        """The settings in force: the file's, or defaults where the driver de-initialised a
        GPU without persistence mode since they were written (`deinit`)."""
        now = self._now_ns()
        entries = (self._file_settings or {}).get("gpus") or [None] * len(self._gpus)
        for g, entry in zip(self._gpus, entries, strict=True):
            try:
                new = (
                    Settings.from_json(entry)
                    if entry is not None
                    else Settings.defaults(self.profile)
                )
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if self._deinit == self._generation and not new.persistence:
                new = Settings.defaults(self.profile, persistence=False)
            if new != g.settings:
                g.advance(now)  # the old settings govern the time before this change
                g.settings = new
                g.relatch_clock()

    def _dump_settings(self) -> dict[str, Any]:
        gpus = []
        for i, g in enumerate(self._gpus):
            entry = g.settings.to_json()
            entry["uuid"] = self._uuid(i)
            gpus.append(entry)
        return {
            "profile": self.profile.key,
            "n_gpus": len(self._gpus),
            "seed": self.seed,
            "generation": self._generation,
            "gpus": gpus,
        }

    def _presence(self, index: int) -> Presence:
        """What this process runs on GPU `index`, as other processes see it."""
        g = self._gpus[index]
        work, until = self._lease.get(index, (0.0, None))
        return Presence(len(g.contexts), max(g.background.values(), default=0.0), work, until)

    def _entry(self) -> dict[str, Any]:
        return {
            "pid": self._pid,
            "uid": os.geteuid(),
            "start": self._start,
            "gpus": {str(i): presence_json(self._presence(i)) for i in range(len(self._gpus))},
        }

    def _presence_changed(self, index: int) -> None:
        """This process's contexts or load changed: every other process sees it now (this
        process may run nothing more for hours: a monitor's scenario, a blocked script)."""
        if self._shares_physics and not self._closed:
            self._exchange()

    def _exchange(self, *, register: bool = False, leave: bool = False, write: bool = True) -> None:
        """Read the running machine, take over its newer state, write ours back (`write`:
        False only takes over, for a process whose driver update is not due). Under lock."""
        assert self._run is not None
        real = self._shares_physics
        with self._run.locked() as fd:
            doc = self._run.read(
                fd, profile=self.profile.key, n_gpus=len(self._gpus), seed=self.seed
            )
            procs = live_procs(doc["procs"]) if (register or leave or real) else doc["procs"]
            procs.pop(self._key, None)
            deinit = doc.get("deinit")
            if (
                (register or leave)
                and not procs
                and not all(g.settings.persistence for g in self._gpus)
            ):
                deinit = self._generation  # the last client left: the driver de-initialises
            if not leave:
                procs[self._key] = self._entry()
            self._deinit = deinit if isinstance(deinit, int) else None
            self._apply_settings()
            now = self._now_ns()
            shared = doc.get("gpus")
            if not (isinstance(shared, list) and len(shared) == len(self._gpus)):
                shared = [None] * len(self._gpus)  # none yet, or not one: a fresh GPU
            for i, g in enumerate(self._gpus):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    if real:
                        g.adopt(shared[i], now, fresh=register)
                    elif register:
                        self._find_heat(g, shared[i])
                if real:  # (virtual time: the others' loads are on another timeline)
                    g.set_others({**presences(procs, i, self._key), self._key: self._presence(i)})
                g.advance(now)
            if not (write or register or leave):
                return
            if real:
                shared = [g.physics() for g in self._gpus]
            elif leave:
                shared = [self._heat_left(g) for g in self._gpus]
            self._run.write(
                fd,
                {
                    "profile": self.profile.key,
                    "n_gpus": len(self._gpus),
                    "seed": self.seed,
                    "procs": procs,
                    "deinit": self._deinit,
                    "gpus": shared,
                },
            )
        self._written_ns = now

    def _heat_left(self, g: GpuModel) -> dict[str, Any]:
        """What a backend on a virtual clock leaves the host's GPU when it closes: its heat
        (a benchmark that ran on virtual time still warmed the chip the next command finds),
        on the real timeline, where its clocks and counters mean nothing."""
        real = GpuModel(self.profile, g.index, round(RealClock().now() * 1e9))
        real.ambient_c = g.ambient_c
        real.settle()
        real.set_temperature(g.temp_c)
        return real.physics()

    def _find_heat(self, g: GpuModel, state: Any) -> None:
        """A backend on a virtual clock starts from the host GPU's temperature as it is now
        (what earlier work left in the chip), the rest of it fresh."""
        now = round(RealClock().now() * 1e9)
        real = GpuModel(self.profile, g.index, 0)
        real.adopt(state, now, fresh=True)
        real.advance(now)
        g.set_temperature(real.temp_c)

    def _register(self) -> None:
        assert self._state is not None
        self._read_settings()
        self._exchange(register=True)

    def _sync(self, *, share: bool = True) -> None:
        """Catch up with the other processes of the host: settings when root changed them
        (a stat), the running GPU when another process wrote it or ours is due (every
        100 ms: a locked read and write of the run file, most of a millisecond, which
        `share=False` leaves to a later call). Another's write is taken over without
        writing back until ours is due: written back at once, each write made the other
        process's next call read and write too, so `gpuenv run`'s sampler (an edge read at
        each region's start) and the wrapped process wrote it in turn, twice as often as
        a process alone, each write a millisecond of CPU on both sides."""
        if self._state is None:
            return
        if self._state.changed():
            self._read_settings()
            self._apply_settings()
        if not share or not self._shares_physics or self._closed:
            return
        assert self._run is not None
        now = self._now_ns()
        due = now - self._written_ns >= _SHARE_NS
        if due or self._run.changed():
            self._exchange(write=due)

    def _commit(self, index: int, change: Callable[[Settings], None]) -> None:
        """Apply a settings change; with a state file, as a locked read-modify-write."""
        g = self._gpus[index]
        if self._state is None:
            change(g.settings)
            g.relatch_clock()
            return
        with self._state.locked():
            self._read_settings()
            self._apply_settings()  # what is in force now, a de-initialised GPU's defaults
            g.advance(self._now_ns())
            change(g.settings)
            g.relatch_clock()
            self._generation += 1
            self._state.write(self._dump_settings())
            self._file_settings = self._dump_settings()

    def close(self) -> None:
        """Leave the simulated driver: this process's contexts end; maybe the GPU de-initialises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self._now_ns()
            for g in self._gpus:
                g.advance(now)
                g.contexts.clear()
                g.background.clear()
                g.job = None
                g.load_changed()
            self._lease.clear()
            if self._state is None or self._run is None:
                self._revert_unpersisted()
                return
            self._exchange(leave=True)
            self._run.close()

    def _revert_unpersisted(self) -> None:
        """The driver de-initialises a GPU without persistence mode when its last client leaves."""
        for g in self._gpus:
            if not g.settings.persistence:
                g.settings = Settings.defaults(self.profile, persistence=False)
                g.relatch_clock()

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


def kept_machine(
    state: str | os.PathLike[str], profile: str, seed: int
) -> tuple[int, list[int]] | None:
    """The simulated machine its state file keeps: its GPU count and the GPUs whose settings
    differ from the card's defaults (locked, a power limit). None: no file yet, or one of
    another machine (profile, seed). A machine keeps its GPUs, as a real one does: a command
    that names no count (GPUENV_SIM_GPUS) sees the count the settings were written with."""
    try:
        data = StateFile(state).read()
        p = get_profile(profile)
    except (ConfigError, OSError):
        return None  # opening the backend says what is wrong with the place, as before
    if not data or data.get("profile") != p.key or data.get("seed") != seed:
        return None
    entries = data.get("gpus")
    n = data.get("n_gpus")
    if not isinstance(n, int) or not isinstance(entries, list) or len(entries) != n:
        return None
    changed = []
    for i, entry in enumerate(entries):
        with contextlib.suppress(KeyError, TypeError, ValueError, IndexError):
            if Settings.from_json(entry) != Settings.defaults(p):
                changed.append(i)
    return n, changed
