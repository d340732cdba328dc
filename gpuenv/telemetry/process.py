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
ends (it exits if its parent is then gone: a finished thread of a live parent does
not stop it). A forked copy of the parent can keep the pipe open; the signal still
comes. The parent wakes it through the same pipe when `mark()` asks for an edge read.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
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
_PR_SET_PDEATHSIG = 1
_WAKE = b"e"


class SamplerError(Exception):
    """The sampler process could not start: the caller samples on a thread instead."""


class SamplerProcess:
    """The parent's handle: start it, wake it for edge reads, pull what it wrote, stop it."""

    def __init__(self, proc: subprocess.Popen[bytes], shared: Shared, wake_fd: int,
                 gpus: Sequence[int]):
        self.proc = proc
        self.pid = proc.pid
        self.shared: Shared | None = shared
        self.gpus = list(gpus)
        self._wake_fd: int | None = wake_fd
        self._next = {"gaps": 0, **{f"f{k}": 0 for k in range(len(gpus))},
                      **{f"s{k}": 0 for k in range(len(gpus))}}
        self.died: str | None = None  # why it ended, when not stopped by us
        self.died_at: float | None = None

    @classmethod
    def start(
        cls, spec: dict[str, Any], gpus: Sequence[int], *, capacity: int, options: dict[str, Any],
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
        config = {"spec": spec, "gpus": list(gpus), "parent": os.getpid(), "shm_fd": shm_fd,
                  "wake_fd": read_fd, **options}
        cmd = [sys.executable, "-m", "gpuenv.telemetry.child", json.dumps(config)]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    pass_fds=(shm_fd, read_fd), env=env)
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
            raise SamplerError(f"the sampler process could not read the GPU: "
                               f"{self.shared.error}")

    # -- the parent's side -----------------------------------------------------------
    def request_edge(self) -> None:
        """Ask for an edge read: a counter in shared memory, and one wake-up byte if none
        was pending (a tight loop of marks costs a memory write each)."""
        shared, fd = self.shared, self._wake_fd
        if shared is None or fd is None or self.died is not None:
            return
        if shared.request_edge():
            with contextlib.suppress(OSError):  # it died: the next pull says so
                os.write(fd, _WAKE)

    def pull(self, sink: Sink) -> None:
        """Move what the sampler process wrote since the last pull into `sink`."""
        shared = self.shared
        if shared is None:
            return
        for k, g in enumerate(self.gpus):
            recs, self._next[f"f{k}"] = shared.fast[k].since(self._next[f"f{k}"])
            for rec in recs:
                sink.fast(unpack_fast(rec, g))
            recs, self._next[f"s{k}"] = shared.slow[k].since(self._next[f"s{k}"])
            for rec in recs:
                sink.slow(*_at_gpu(unpack_slow(rec), g))
        recs, self._next["gaps"] = shared.gaps.since(self._next["gaps"])
        for rec in recs:
            sink.gap(unpack_gap(rec))
        if self.died is None and self.proc.poll() is not None:
            code = self.proc.returncode
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.died = f"the sampler process (pid {self.pid}) {how}"
            self.died_at = shared.alive_t or time.monotonic()

    def no_slow_counters(self, gpu: int) -> bool:
        shared = self.shared
        return shared is not None and bool(
            shared.flags(self.gpus.index(gpu)) & FLAG_NO_SLOW
        )

    @property
    def ticks(self) -> int:
        return self.shared.ticks if self.shared is not None else 0

    @property
    def cpu_time_s(self) -> float:
        return self.shared.cpu_time_s if self.shared is not None else 0.0

    def stop(self, sink: Sink | None = None) -> None:
        """End it (EOF on its pipe), pull what is left into `sink`, unmap. Safe twice."""
        if self._wake_fd is not None:
            os.close(self._wake_fd)
            self._wake_fd = None
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.shared is not None:
            if sink is not None:
                died = self.died
                self.pull(sink)
                self.died = died  # stopped by us: not a death
            self.shared.close()
            self.shared = None


def _at_gpu(
    values: tuple[float, SlowReading | None, frozenset[int] | None, bool, float | None], gpu: int
) -> tuple[Any, ...]:
    t, reading, pids, edge, value_t = values
    return t, gpu, reading, pids, edge, value_t
