"""`gpuenv monitor`'s model: what makes a GPU's numbers lie, read live.

nvitop and nvidia-smi show processes and memory well; none of them shows why a
clock is where it is. This module reads both: per GPU the SM clock against its
maximum and the locked range with its history (up to ten minutes), device
memory used and total, power against the limit, temperature against the
slowdown threshold, the active clock-event reasons in words with how long each
has been active, who holds the lock, and the processes on the GPU (pid, user,
memory, SM share, command: processes.py). `MonitorModel.update()` reads the
backend and returns one immutable `GpuView` per GPU (a failed read becomes
`GpuView.error`, never an exception).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv import reasons
from gpuenv.backend import Backend
from gpuenv.backend.details import COMPUTE_MODES
from gpuenv.errors import GpuenvError
from gpuenv.monitor.host import HostView, read_host
from gpuenv.monitor.processes import ProcessReader, ProcView, process_reader
from gpuenv.timebase import REAL_CLOCK, Clock

# the one vocabulary (gpuenv.reasons): short forms and masks as the view uses them
REASON_SHORT: dict[int, str] = {bit: reasons.info(bit).short for bit in reasons.REASON_NAMES}
BAD_REASONS = int(reasons.BAD)  # the clock is cut because of heat or power delivery
WARN_REASONS = int(reasons.WARN)


@dataclass(frozen=True)
class ReasonView:
    bit: int
    name: str  # NVML's name, e.g. "SwPowerCap"
    words: str
    active_s: float | None  # how long it has been active without a break, as observed
    at_least: bool  # active since the monitor started: it may have been active longer
    share: float | None  # fraction of the last `counter_s` under it, from the cumulative counter


@dataclass(frozen=True)
class LockView:
    locked_sm: tuple[int, int] | None
    known: bool  # False: nothing gpuenv knows of (NVML cannot read locked clocks)
    owner: str | None  # who holds it, in words
    holds: bool | None  # SM clock inside the range now (None: cannot tell, or unlocked)
    why: str | None = None  # why it does not hold


@dataclass(frozen=True)
class GpuView:
    """One GPU at one instant, everything the monitor shows."""

    index: int
    t: float  # clock.now()
    wall: float  # seconds since the epoch
    name: str = ""
    uuid: str = ""
    sm_mhz: int | None = None
    max_sm_mhz: int | None = None
    mem_mhz: int | None = None
    max_mem_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    slowdown_c: float | None = None
    reasons: int = 0
    active: tuple[ReasonView, ...] = ()
    below_max_share: float | None = None  # share of counter_span_s below app/max clocks (counter)
    counter_span_s: float | None = None  # the span the counter shares cover (up to counter_s)
    util_gpu: int | None = None
    util_mem: int | None = None
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    lock: LockView | None = None
    processes: tuple[ProcView, ...] = ()
    processes_error: str | None = None  # why the processes could not be read
    history: tuple[tuple[float, int], ...] = ()  # (t, SM MHz) over the last history_s
    # the board, as nvitop's device panel shows it (None: the GPU does not say)
    bus_id: str | None = None
    pstate: int | None = None
    fan_pct: int | None = None
    ecc_errors: int | None = None  # uncorrected, volatile (since the driver loaded)
    persistence: bool | None = None
    compute_mode: str | None = None  # Default, Exclusive_Process, Prohibited
    mig_mode: bool | None = None
    error: str | None = None


LockLookup = Callable[[Backend, int], "LockView | None"]


def clocks_lock_view(backend: Backend, index: int, journal: Any = None) -> LockView:
    """The lock on one GPU as gpuenv's journal knows it (NVML has no getter for locked clocks).
    `journal`: a `Journal` to read (default: a new one on the default state directory)."""
    from gpuenv.clocks import lock_status

    st = lock_status(backend, index, journal)
    return LockView(
        locked_sm=st.range if st.locked else None,
        known=st.locked is not None,
        owner=(st.owner + ("; stale: run 'gpuenv restore'" if st.stale else ""))
        if st.owner
        else None,
        holds=st.holds,
        why=st.reason_if_not_held,
    )


class _JournalLocks:
    """`clocks_lock_view` reading one `Journal` for the model's life, made on first use
    (a Journal a read was most of what a lock lookup cost)."""

    def __init__(self) -> None:
        self.journal: Any = None

    def __call__(self, backend: Backend, index: int) -> LockView:
        if self.journal is None:
            from gpuenv.clocks.journal import Journal

            self.journal = Journal()
        return clocks_lock_view(backend, index, self.journal)


def _every(
    cache: dict[int, tuple[float, Any]], i: int, t: float, period: float, read: Callable[[], Any]
) -> tuple[float, Any]:
    """GPU i's (time read, value) in `cache`, read again once it is `period` old."""
    cached = cache.get(i)
    if cached is None or t - cached[0] >= period:
        cache[i] = cached = (t, read())
    return cached


class MonitorModel:
    """Reads the GPUs and keeps a short history; `update()` returns one GpuView per GPU.

    Reads, per GPU: the cheap values (clocks, power, temperature, reasons), P-state,
    utilization, memory and the process list's pids every update; the cumulative reason
    counters (without the ~3 ms energy counter, which the monitor does not show) and the
    power limit at most every `slow_period`; the lock from the journal at most every
    `lock_period` (whether it holds is checked against every update's clock); the board
    (fan, ECC, compute mode: Backend.details, a few dozen NVML calls; persistence) at
    most every `board_period`; the name, bus id, MIG mode and limits once. The processes'
    snapshots (user, command, %CPU, %MEM, TIME: psutil per process, nvitop's on a real
    GPU) when the list's pids change or at most every `process_period`; between them the
    rows keep their snapshot and take each update's GPU memory (and SM share, where the
    list has it). The host (CPU, memory, load: host.py) once per update, into `host`.
    """

    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int],
        *,
        clock: Clock | None = None,
        history_s: float = 600.0,
        counter_s: float = 60.0,
        slow_period: float = 2.0,
        lock_period: float = 2.0,
        board_period: float = 10.0,
        process_period: float = 2.0,
        processes: bool | ProcessReader = True,
        lock_lookup: LockLookup | None = clocks_lock_view,
    ):
        self.backend = backend
        self.gpus = list(gpus)
        self.clock = clock or REAL_CLOCK
        self.history_s = history_s
        self.counter_s = min(counter_s, history_s)
        self.slow_period = slow_period
        self.board_period = board_period
        self.process_period = process_period
        self._procs: ProcessReader | None = (
            (process_reader(backend) if processes is True else processes) if processes else None
        )
        self.lock_lookup = _JournalLocks() if lock_lookup is clocks_lock_view else lock_lookup
        self.lock_period = lock_period
        self._locks: dict[int, tuple[float, LockView | None]] = {}
        self._static: dict[int, dict[str, Any]] = {}
        self._history: dict[int, collections.deque[tuple[float, int]]] = {
            i: collections.deque() for i in self.gpus
        }
        self._counters: dict[int, collections.deque[tuple[float, dict[str, int]]]] = {
            i: collections.deque() for i in self.gpus
        }
        self._last_slow: dict[int, float] = {}
        self._since: dict[int, dict[int, tuple[float, bool]]] = {i: {} for i in self.gpus}
        self._updates = 0
        self._board: dict[int, tuple[float, dict[str, Any]]] = {}
        self._power_limit: dict[int, tuple[float, float | None]] = {}
        # GPU -> (time, pids, rows) of the last process snapshot
        self._snaps: dict[int, tuple[float, frozenset[int], tuple[ProcView, ...]]] = {}
        self.host: HostView | None = None  # the host at the last update

    def _static_of(self, i: int) -> dict[str, Any]:
        st = self._static.get(i)
        if st is None:
            info = self.backend.device_info(i)
            limits = self.backend.clock_limits(i)
            thresholds = self.backend.thresholds(i)
            st = {
                "name": info.name,
                "uuid": info.uuid,
                "bus_id": info.pci_bus_id,
                "mig_mode": info.mig_mode,
                "max_sm": limits.max_sm_mhz,
                "max_mem": limits.max_mem_mhz,
                "slowdown": thresholds.slowdown_c,
            }
            self._static[i] = st
        return st

    def update(self) -> list[GpuView]:
        views = [self._read(i) for i in self.gpus]
        self.host = read_host()
        self._updates += 1
        return views

    def _board_of(self, i: int, t: float) -> dict[str, Any]:
        """P-state each update; fan, ECC, compute mode (Backend.details) and persistence
        at most every board_period. Each read on its own: one missing costs only itself."""
        out: dict[str, Any] = {}
        with contextlib.suppress(GpuenvError):
            out["pstate"] = self.backend.performance_state(i)

        def board() -> dict[str, Any]:
            slow: dict[str, Any] = {}
            with contextlib.suppress(GpuenvError):
                slow["persistence"] = self.backend.persistence_mode(i)
            with contextlib.suppress(GpuenvError):
                d = self.backend.details(i)
                mode = d.compute_mode
                slow.update(
                    fan_pct=d.fan_pct,
                    ecc_errors=d.ecc_total(),
                    compute_mode=None if mode is None else COMPUTE_MODES.get(mode, "?"),
                )
            return slow

        return {**out, **_every(self._board, i, t, self.board_period, board)[1]}

    def _limit_of(self, i: int, t: float) -> float | None:
        """The enforced power limit, read at most every slow_period."""

        def limit() -> float | None:
            try:
                return self.backend.power_limits(i).limit_w
            except GpuenvError:
                return None

        return _every(self._power_limit, i, t, self.slow_period, limit)[1]

    def _processes_of(self, i: int, t: float, reader: ProcessReader) -> tuple[ProcView, ...]:
        """The rows: a fresh snapshot when the pids on the GPU changed or the last one is
        process_period old; otherwise the last one with this update's GPU memory."""
        try:
            listed = {p.pid: p for p in self.backend.processes(i)}
        except GpuenvError:
            listed = None  # the reader says why, if it cannot read them either
        cached = self._snaps.get(i)
        if (
            listed is not None
            and cached is not None
            and t - cached[0] < self.process_period
            and cached[1] == frozenset(listed)
        ):
            return tuple(_fresh(row, listed.get(row.pid)) for row in cached[2])
        rows = reader(i)
        if listed is not None:
            self._snaps[i] = (t, frozenset(listed), rows)
        return rows

    def _read(self, i: int) -> GpuView:
        t = self.clock.now()
        wall = self.clock.wall()
        try:
            st = self._static_of(i)
            fast = self.backend.read_fast(i)
        except GpuenvError as err:
            return GpuView(index=i, t=t, wall=wall, error=str(err))
        hist = self._history[i]
        hist.append((t, fast.sm_mhz))
        while hist and hist[0][0] < t - self.history_s:
            hist.popleft()
        shares, below, span = self._counter_shares(i, t)
        active = self._active_reasons(i, t, fast.reasons, shares)
        view = GpuView(
            index=i,
            t=t,
            wall=wall,
            name=st["name"],
            uuid=st["uuid"],
            sm_mhz=fast.sm_mhz,
            max_sm_mhz=st["max_sm"],
            mem_mhz=fast.mem_mhz,
            max_mem_mhz=st["max_mem"],
            power_w=fast.power_w,
            temp_c=fast.temp_c,
            slowdown_c=st["slowdown"],
            reasons=fast.reasons,
            active=active,
            below_max_share=below,
            counter_span_s=span,
            history=tuple(hist),
            bus_id=st["bus_id"],
            mig_mode=st["mig_mode"],
        )
        extras: dict[str, Any] = self._board_of(i, t)
        # Each optional read on its own: one failing (not supported, no permission)
        # must not hide the others.
        limit = self._limit_of(i, t)
        if limit is not None:
            extras["power_limit_w"] = limit
        with contextlib.suppress(GpuenvError):
            util = self.backend.utilization(i)
            if util is not None:
                extras["util_gpu"], extras["util_mem"] = util
        with contextlib.suppress(GpuenvError):
            mem = self.backend.memory(i)
            if mem is not None:
                extras["mem_used_mib"], extras["mem_total_mib"] = mem.used_mib, mem.total_mib
        if self._procs is not None:
            try:
                extras["processes"] = self._processes_of(i, t, self._procs)
            except GpuenvError as err:
                extras["processes_error"] = str(err)
        if self.lock_lookup is not None:
            extras["lock"] = self._lock(i, t, fast.sm_mhz)
        return _replace(view, **extras)

    def _lock(self, i: int, t: float, sm_mhz: int) -> LockView | None:
        lookup = self.lock_lookup
        assert lookup is not None

        def read() -> LockView | None:
            try:
                return lookup(self.backend, i)
            except GpuenvError:
                return None

        read_at, lk = _every(self._locks, i, t, self.lock_period, read)
        if lk is None or lk.locked_sm is None or t == read_at:
            return lk
        from gpuenv.clocks.status import lock_holds

        holds = lock_holds(sm_mhz, lk.locked_sm)  # between journal reads: at this update's clock
        return dataclasses.replace(lk, holds=holds, why=None if holds else lk.why)

    def _counter_shares(
        self, i: int, t: float
    ) -> tuple[dict[str, float], float | None, float | None]:
        """Share of the last counter_s under each cumulative counter."""
        ring = self._counters[i]
        if t - self._last_slow.get(i, -1e18) >= self.slow_period:
            try:
                slow = self.backend.read_slow(i, energy=False)
            except GpuenvError:
                slow = None
            if slow is not None and slow.reason_ns:
                ring.append((t, dict(slow.reason_ns)))
                self._last_slow[i] = t
        while len(ring) > 2 and ring[1][0] <= t - self.counter_s:
            ring.popleft()
        if len(ring) < 2 or ring[-1][0] - ring[0][0] <= 0:
            return {}, None, None
        (t0, c0), (t1, c1) = ring[0], ring[-1]
        span_ns = (t1 - t0) * 1e9
        shares = {k: min(1.0, max(0.0, (c1[k] - c0.get(k, c1[k])) / span_ns)) for k in c1}
        return shares, shares.get("total_app_clocks"), t1 - t0

    def _active_reasons(
        self, i: int, t: float, mask: int, shares: dict[str, float]
    ) -> tuple[ReasonView, ...]:
        since = self._since[i]
        first = self._updates == 0
        for bit in list(since):
            if not mask & bit:
                del since[bit]
        out = []
        for bit in reasons.bits(mask):
            if bit not in since:
                since[bit] = (t, first)
            t0, at_least = since[bit]
            about = reasons.info(bit)
            out.append(
                ReasonView(
                    bit=bit,
                    name=about.name,
                    words=about.words,
                    active_s=t - t0,
                    at_least=at_least,
                    share=shares.get(about.counter) if about.counter else None,
                )
            )
        return tuple(out)


def _fresh(row: ProcView, listed: Any) -> ProcView:
    """`row` with the GPU memory (and SM share) that this update's process list gives."""
    if listed is None:
        return row
    sm = row.sm_pct if listed.sm_pct is None else listed.sm_pct
    if (listed.used_memory_mib, sm) == (row.used_memory_mib, row.sm_pct):
        return row
    return dataclasses.replace(row, used_memory_mib=listed.used_memory_mib, sm_pct=sm)


def _replace(view: GpuView, **changes: Any) -> GpuView:
    return dataclasses.replace(view, **changes) if changes else view


__all__ = [
    "BAD_REASONS",
    "REASON_SHORT",
    "WARN_REASONS",
    "GpuView",
    "LockView",
    "MonitorModel",
    "ProcView",
    "ReasonView",
    "clocks_lock_view",
]
