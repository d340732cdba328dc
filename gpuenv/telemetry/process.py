"""The sampler process: NVML read in another process, so the benchmark's thread never waits.

In a thread, every NVML call hands Python's GIL over and back, and the thread that
launches kernels waits its turn: +2% on a launch-bound loop on the lent H100. The
sampler process (`python -m gpuenv.telemetry.child`, child.py) reopens the parent's backend
from its `spec()`, runs the same `Reader` (cheap values every period, counters,
energy and processes on their grids and at edges) and writes what it reads into
shared memory (`ring.py`). The parent reads the ring only when asked (`Sampler`
queries): no thread in the parent, nothing on a timer.

It dies with its parent, however the parent ends: the parent holds the only write
end of a pipe (the kernel closes it when the parent dies: EOF wakes the child's
select), and PR_SET_PDEATHSIG sends it a signal when the thread that started it
ends (SIGKILL when that is the main thread; else a signal on which it exits if its
parent is gone: a finished thread of a live parent does not stop it). A forked copy
of the parent can keep the pipe open; the signal still comes. The parent wakes it
through the same pipe when `mark()` asks for an edge read.

Starting one costs a fresh interpreter, its imports and NVML's init (a few hundred ms),
too much to pay per `bench()` call: one process serves every `Sampler` of this process
that samples the same way the same GPUs or some of them (`attach`: a `gpuenv.bench` call
inside a `stable()` session of every GPU joins the session's), each reading the ring of
its own GPUs from where it started, and it lingers LINGER_S after the last one stops, for
the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuenv.backend import SlowReading
from gpuenv.telemetry.reader import Sink
from gpuenv.telemetry.ring import (
    FAILED,
    FLAG_NO_SLOW,
    STARTING,
    Shared,
    unpack_fast,
    unpack_gap,
    unpack_slow,
)

READY_TIMEOUT_S = 20.0  # interpreter, imports and nvmlInit; seconds on a cold machine
STOP_TIMEOUT_S = 2.0
# How long a sampler process no Sampler uses waits for the next one (a loop of bench()
# calls, an autotuner's do_bench calls, bench() calls between a training loop's seconds)
# before it ends. Waiting, it reads at its period (0.1 s by default): little CPU. On an
# H100 host gpuenv.bench calls 7-20 s apart each started one, 0.26-0.42 s a call, while
# do_bench's whole call took 0.11-0.13 s.
LINGER_S = 60.0
# Records read before a Sampler's start: the sample in force when it starts, and the
# counter reads a window interpolates from (filtered by time: `Cursor.since_t`).
BACKLOG = 64
_PR_SET_PDEATHSIG = 1
_WAKE = b"e"


class SamplerError(Exception):
    """The sampler process could not start: the caller samples on a thread instead."""


class SamplerProcess:
    """The parent's handle on one sampler process: start it, wake it for edge reads, see
    whether it died, stop it. `Cursor`s read its rings."""

    def __init__(
        self, proc: subprocess.Popen[bytes], shared: Shared, wake_fd: int, gpus: Sequence[int]
    ):
        self.proc = proc
        self.pid = proc.pid
        self.owner = os.getpid()  # a forked copy of the parent does not own it
        self.shared: Shared | None = shared
        self.gpus = list(gpus)
        self.way = ""  # how it samples (attach): the spec, capacity and options, as JSON
        self.users = 0  # Samplers attached (see attach)
        self.attaches = 0  # Samplers ever attached: more than one, it was reused
        self._wake_fd: int | None = wake_fd
        self._edge_lock = threading.Lock()
        self._linger: threading.Timer | None = None
        self.died: str | None = None  # why it ended, when not stopped by us
        self.died_at: float | None = None

    @classmethod
    def start(
        cls,
        spec: dict[str, Any],
        gpus: Sequence[int],
        *,
        capacity: int,
        options: dict[str, Any],
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> SamplerProcess:
        """Spawn it and wait until its first reading is in the ring; SamplerError if not."""
        import gpuenv

        try:
            shared, shm_fd = Shared.create(len(gpus), capacity)
        except (OSError, ValueError) as err:
            raise SamplerError(str(err)) from err
        read_fd, write_fd = os.pipe()  # O_CLOEXEC: exec'd children never hold the write end
        root = str(Path(gpuenv.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        config = {
            "spec": spec,
            "gpus": list(gpus),
            "parent": os.getpid(),
            "shm_fd": shm_fd,
            "wake_fd": read_fd,
            **options,
            "main_thread": threading.current_thread() is threading.main_thread(),
        }
        cmd = [sys.executable, "-m", "gpuenv.telemetry.child", json.dumps(config)]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(shm_fd, read_fd),
                env=env,
            )
        except OSError as err:
            os.close(write_fd)
            shared.close()
            raise SamplerError(f"could not start the sampler process ({err})") from err
        finally:
            os.close(read_fd)
            os.close(shm_fd)
        handle = cls(proc, shared, write_fd, gpus)
        try:
            handle._wait_ready(ready_timeout_s)
        except BaseException:
            handle.stop()
            raise
        return handle

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.shared is not None
        deadline = time.monotonic() + timeout_s
        while self.shared.status == STARTING:
            if self.proc.poll() is not None:
                raise SamplerError(
                    f"the sampler process exited with code {self.proc.returncode} at start"
                )
            if time.monotonic() > deadline:
                raise SamplerError(f"the sampler process did not start within {timeout_s:.0f} s")
            time.sleep(0.002)
        if self.shared.status == FAILED:
            raise SamplerError(f"the sampler process could not read the GPU: {self.shared.error}")

    def request_edge(self) -> None:
        """Ask for an edge read: a counter in shared memory, and one wake-up byte if none
        was pending (a tight loop of marks costs a memory write each)."""
        shared, fd = self.shared, self._wake_fd
        if shared is None or fd is None or self.died is not None:
            return
        with self._edge_lock:
            wake = shared.request_edge()
        if wake:
            with contextlib.suppress(OSError):  # it died: the next look says so
                os.write(fd, _WAKE)

    def hurry(self, on: bool) -> None:
        """One attached Sampler begins (`on`) or ends hurrying: a count in shared memory that
        the sampler process reads each time it wakes, and a wake-up byte when one begins."""
        shared, fd = self.shared, self._wake_fd
        if shared is None or fd is None or self.died is not None:
            return
        with self._edge_lock:
            shared.add_hurry(1 if on else -1)
        if on:
            with contextlib.suppress(OSError):
                os.write(fd, _WAKE)

    def check(self) -> bool:
        """True while it runs; else `died` says why it ended."""
        if self.died is None and self.proc.poll() is not None:
            code = self.proc.returncode
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.died = f"the sampler process (pid {self.pid}) {how}"
            alive_t = self.shared.alive_t if self.shared is not None else 0.0
            self.died_at = alive_t or time.monotonic()
        return self.died is None

    def no_slow_counters(self, gpu: int) -> bool:
        shared = self.shared
        return shared is not None and bool(shared.flags(self.gpus.index(gpu)) & FLAG_NO_SLOW)

    @property
    def ticks(self) -> int:
        return self.shared.ticks if self.shared is not None else 0

    @property
    def cpu_time_s(self) -> float:
        return self.shared.cpu_time_s if self.shared is not None else 0.0

    def stop(self) -> None:
        """End it (EOF on its pipe) and unmap its memory. Safe twice."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._wake_fd is not None:
            os.close(self._wake_fd)
            self._wake_fd = None
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.shared is not None:
            self.shared.close()
            self.shared = None


class Cursor:
    """One Sampler's reading position in a sampler process's rings."""

    def __init__(self, proc: SamplerProcess, since_t: float, gpus: Sequence[int] | None = None):
        assert proc.shared is not None
        self.proc = proc
        self.since_t = since_t  # records before this are older than the Sampler's interest
        # the Sampler's GPUs (a process that samples more serves some of them)
        self.gpus = frozenset(proc.gpus if gpus is None else gpus)
        shared = proc.shared
        self._fast = [max(0, r.head() - BACKLOG) for r in shared.fast]
        self._slow = [max(0, r.head() - BACKLOG) for r in shared.slow]
        self._gaps = shared.gaps.head()  # earlier gaps were another Sampler's
        self._lock = threading.Lock()  # two threads asking at once must not both take a record

    def pull(self, sink: Sink) -> None:
        """Move what the sampler process wrote since the last pull into `sink`."""
        with self._lock:
            self._pull(sink)

    def _pull(self, sink: Sink) -> None:
        shared = self.proc.shared
        if shared is None:
            return
        since = self.since_t
        for k, g in enumerate(self.proc.gpus):
            if g not in self.gpus:
                continue
            recs, self._fast[k] = shared.fast[k].since(self._fast[k])
            for rec in recs:
                if rec[0] >= since:
                    sink.fast(unpack_fast(rec, g))
            recs, self._slow[k] = shared.slow[k].since(self._slow[k])
            for rec in recs:
                if rec[0] >= since:
                    sink.slow(*_at_gpu(unpack_slow(rec), g))
        recs, self._gaps = shared.gaps.since(self._gaps)
        for rec in recs:
            gap = unpack_gap(rec)
            if gap.gpu in self.gpus:
                sink.gap(gap)


# -- one sampler process per way of sampling, shared by this process's Samplers ------------

# Keyed by everything that decides what a sampler process reads (the backend's spec, the
# GPUs, the options): a Sampler that joins one reads the same samples a new process would,
# so sharing it changes no number, only the cost of starting one.
_pool: dict[str, SamplerProcess] = {}
_pool_lock = threading.Lock()


def attach(
    spec: dict[str, Any], gpus: Sequence[int], *, capacity: int, options: dict[str, Any]
) -> SamplerProcess:
    """The running sampler process for these GPUs and options, or one that samples them
    among others the same way, else a new one."""
    way = json.dumps([spec, capacity, options], sort_keys=True)
    key = json.dumps([spec, list(gpus), capacity, options], sort_keys=True)
    with _pool_lock:
        proc = _pool.get(key)
        if proc is not None and (proc.owner != os.getpid() or not proc.check()):
            del _pool[key]
            if proc.owner == os.getpid():
                proc.stop()
            proc = None
        if proc is None:
            proc = next(
                (
                    p
                    for p in _pool.values()
                    if p.way == way and set(gpus) <= set(p.gpus)
                    if p.owner == os.getpid() and p.check()
                ),
                None,
            )
        if proc is None:
            proc = SamplerProcess.start(spec, gpus, capacity=capacity, options=options)
            proc.way = way
            _pool[key] = proc
        if proc._linger is not None:
            proc._linger.cancel()
            proc._linger = None
        proc.users += 1
        proc.attaches += 1
        return proc


def detach(proc: SamplerProcess) -> None:
    """A Sampler is done with it: it ends LINGER_S after the last one, unless reused."""
    with _pool_lock:
        proc.users -= 1
        if proc.users > 0:
            return
        if not proc.check() or proc not in _pool.values():
            _forget(proc)
            proc.stop()
            return
        timer = threading.Timer(LINGER_S, _end_if_idle, (proc,))
        timer.daemon = True
        proc._linger = timer
        timer.start()


def _end_if_idle(proc: SamplerProcess) -> None:
    with _pool_lock:
        if proc.users > 0:
            return
        _forget(proc)
    proc.stop()


def _forget(proc: SamplerProcess) -> None:
    for key, known in list(_pool.items()):
        if known is proc:
            del _pool[key]


def close_idle() -> int:
    """End every sampler process that no Sampler uses now (instead of LINGER_S later)."""
    with _pool_lock:
        idle = [p for p in _pool.values() if p.users == 0 and p.owner == os.getpid()]
        for proc in idle:
            _forget(proc)
    for proc in idle:
        proc.stop()
    return len(idle)


def _at_gpu(
    values: tuple[
        float, SlowReading | None, dict[int, int | None] | frozenset[int] | None, bool, float | None
    ],
    gpu: int,
) -> tuple[Any, ...]:
    t, reading, pids, edge, value_t = values
    return t, gpu, reading, pids, edge, value_t
