"""The parent's side of regions in `gpuenv run`: pair the edges, summarise them.

`RegionReader` reads the edges the command writes (gpuenv/run/region.py) from the
pipe and `RegionTracker` pairs them into `Region`s. `Summariser` turns each
region into one `Window` per GPU as the run goes: the sampler keeps a bounded
buffer, so long regions are summarised in chunks and the chunks merged
(`gpuenv.telemetry.merge_windows`). Its `SampleLog` (gpuenv.telemetry.trace) keeps
the samples `gpuenv plot` draws. Measurements and the table are in report.py.
"""

from __future__ import annotations

import contextlib
import os
import select
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.run.region import ENV_FD, ENV_PATH, ENV_PIPE, Edge, parse_line, pipe_identity
from gpuenv.telemetry import (
    SampleLog,
    Sampler,
    Window,
    merge_windows,
    summarize_many,
)

FLUSH_S = 30.0  # summarise finished regions and chunks of open ones this often
MARK_MIN_S = 0.05  # at most one edge read of the slow counters per 50 ms of region edges
MAX_REGION_LIST = 10_000  # region spans listed for plotting


@dataclass
class Region:
    """One time a region was entered (or the whole run), and its summary so far."""

    name: str
    pid: int
    t0: float
    t1: float | None = None
    complete: bool = True  # False: the command ended inside it
    covered_to: float = 0.0  # windows exist up to here
    chunks: dict[int, list[Window]] = field(default_factory=dict)
    windows: dict[int, Window] | None = None  # per GPU, once summarised
    meta: dict[str, Any] | None = None  # its "l" facts (region.py); with "site": one call

    def __post_init__(self) -> None:
        self.covered_to = self.t0


class RegionTracker:
    """Pairs begin and end edges (by pid and id) into Regions; thread-safe."""

    def __init__(self) -> None:
        self.open: dict[tuple[int, int], Region] = {}
        self.finished: list[Region] = []
        self.names: list[str] = []  # in order of first appearance
        self.ignored = 0  # ends without a begin, repeated begins
        self.discarded: dict[str, int] = {}  # per name, regions that ended in an error ("x")
        self.procs: dict[int, dict[str, Any]] = {}  # per pid, its "p" facts (rank variables)
        self.lock = threading.Lock()

    def feed(self, edge: Edge) -> None:
        key = (edge.pid, edge.id)
        with self.lock:
            if edge.kind == "p":
                self.procs.setdefault(edge.pid, {}).update(edge.meta or {})
                return
            if edge.kind == "l":
                open_region = self.open.get(key)
                if open_region is None or edge.meta is None:
                    self.ignored += 1
                elif open_region.meta is None:
                    open_region.meta = dict(edge.meta)
                else:
                    open_region.meta.update(edge.meta)
                return
            if edge.kind == "b":
                if key in self.open or edge.name is None:
                    self.ignored += 1
                    return
                self.open[key] = Region(edge.name, edge.pid, edge.t)
                if edge.name not in self.names:
                    self.names.append(edge.name)
            else:
                region = self.open.pop(key, None)
                if region is None:
                    self.ignored += 1
                    return
                if edge.kind == "x":
                    self.discarded[region.name] = self.discarded.get(region.name, 0) + 1
                    return
                region.t1 = max(edge.t, region.t0)
                self.finished.append(region)

    def close_all(self, t_end: float) -> None:
        """Regions still open when the command ended end with it, marked incomplete."""
        with self.lock:
            for region in self.open.values():
                region.t1 = max(t_end, region.t0)
                region.complete = False
                self.finished.append(region)
            self.open.clear()


class RegionPipe:
    """The pipe region edges come through: a named pipe in a private directory (0700, an
    unpredictable name), so that a launcher's workers, which inherit the environment but
    not the fd, can open it by its path (region.py). `r_fd` is opened read-write: it never
    reads EOF, however many writers come and go; `w_fd` is the end the command inherits."""

    def __init__(self) -> None:
        self.dir: str | None = tempfile.mkdtemp(prefix="gpuenv-run-")
        self.path: str | None = os.path.join(self.dir, "regions")
        self.r_fd = self.w_fd = -1
        try:
            os.mkfifo(self.path, 0o600)
            self.r_fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            self.w_fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:  # a temp directory that holds no FIFO: heirs of the fd only
            self.close()
            self.dir = self.path = None
            self.r_fd, self.w_fd = os.pipe()
        self.identity = pipe_identity(self.r_fd)

    def env(self) -> dict[str, str]:
        """The variables that lead the command (and its workers) to it; w_fd made inheritable."""
        os.set_inheritable(self.w_fd, True)
        env = {ENV_FD: str(self.w_fd), ENV_PIPE: self.identity}
        if self.path is not None:
            env[ENV_PATH] = self.path
        return env

    def close_writer(self) -> None:
        """Once the command holds its end: a worker opens its own by the path."""
        if self.w_fd >= 0:
            os.close(self.w_fd)
            self.w_fd = -1

    def close(self) -> None:
        """Remove the path (no new writer can come) and close both ends: a writer still
        holding one gets EPIPE, as from an anonymous pipe's closed reader."""
        if self.path is not None and self.dir is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)
        self.close_writer()
        if self.r_fd >= 0:
            os.close(self.r_fd)
            self.r_fd = -1


class RegionReader:
    """Reads region edges from the pipe's read end on a small thread."""

    def __init__(self, fd: int, tracker: RegionTracker, sampler: Sampler | None):
        self.fd = fd
        self.tracker = tracker
        self.sampler = sampler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuenv-regions", daemon=True)
        self._last_mark = float("-inf")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Read what is already in the pipe, then stop (a grandchild may keep it open)."""
        self._stop.set()
        # A named pipe opened read-write never reads EOF: an empty line (ignored) wakes
        # the poll; on a read-only fd the write fails and the poll's timeout does it.
        with contextlib.suppress(OSError):
            os.write(self.fd, b"\n")
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP)
        pending = b""
        while True:
            try:  # once stopping, only what is in the pipe already
                ready = poller.poll(0 if self._stop.is_set() else 100)
            except InterruptedError:
                continue
            if not ready:
                if self._stop.is_set():
                    return
                continue
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return  # every writer closed it
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                edge = parse_line(raw.decode("utf-8", "replace"))
                if edge is not None:
                    self.tracker.feed(edge)
            self._mark()

    def _mark(self) -> None:
        # Region edges are where the slow counters (energy, time under reasons) matter; on
        # the sampler's clock, whose time the regions' edges and its reads are in
        if self.sampler is None:
            return
        now = self.sampler.clock.now()
        if now - self._last_mark >= MARK_MIN_S:
            self._last_mark = now
            self.sampler.mark()


class Summariser:
    """Turns regions into per-GPU Windows as the run goes (chunked: see the module doc).

    `windows()` summarises each interval from the few samples around it (the
    sampler's own `windows()` scans its whole buffer per interval, which is slow
    for a command that enters a region many thousand times).
    """

    def __init__(self, sampler: Sampler, gpus: Sequence[int], *, chunk_s: float = FLUSH_S):
        self.sampler = sampler
        self.gpus = list(gpus)
        self.chunk_s = chunk_s
        self.log = SampleLog(gpus)

    def windows(self, intervals: Sequence[tuple[float, float]], g: int) -> list[Window]:
        sampler = self.sampler
        if not intervals:
            return []
        # waits (briefly) for the counter read at the last edge, as sampler.window does
        sampler.window(max(b for _, b in intervals), max(b for _, b in intervals), g)
        # from the first interval on (the ring holds minutes): the sample in force at its
        # start and the counter reads SLOW_LOOKBACK_S before it included
        fast, slow, gaps, truncated, power = sampler.window_inputs(min(a for a, _ in intervals), g)
        # one preparation of the samples for every interval (a few bisects each): a
        # command that ends 10,000 regions at once pays it once, not 10,000 times
        return summarize_many(
            fast,
            slow,
            gaps,
            intervals,
            power=power,
            gpu=g,
            lock_range=sampler.lock_ranges.get(g),
            lock_tolerance_mhz=sampler.lock_tolerance_mhz,
            own_pids=sampler.own_pids,
            period=sampler.period,
            truncated=truncated,
        )

    def flush(self, safe_t: float, regions: Sequence[Region], *, final: bool = False) -> None:
        """Summarise finished regions that end before `safe_t` (all when final) and chunk
        long open ones up to `safe_t`."""
        jobs: list[tuple[Region, float, float, bool]] = []
        for r in regions:
            if r.windows is not None:
                continue
            if r.t1 is not None and (final or r.t1 <= safe_t):
                jobs.append((r, r.covered_to, r.t1, True))
            elif safe_t - r.covered_to >= self.chunk_s:
                end = safe_t if r.t1 is None else min(safe_t, r.t1)
                jobs.append((r, r.covered_to, end, False))
        if jobs:
            for g in self.gpus:
                windows = self.windows([(a, b) for _, a, b, _ in jobs], g)
                for (r, _, _, _), w in zip(jobs, windows, strict=True):
                    r.chunks.setdefault(g, []).append(w)
            for r, _, b, done in jobs:
                r.covered_to = b
                if done:
                    r.windows = {g: merge_windows(r.chunks.pop(g)) for g in self.gpus}
        self.log.pull(self.sampler)


__all__ = [
    "FLUSH_S",
    "MAX_REGION_LIST",
    "Region",
    "RegionPipe",
    "RegionReader",
    "RegionTracker",
    "Summariser",
]
