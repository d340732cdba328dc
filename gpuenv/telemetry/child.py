"""The sampler process itself (`python -m gpuenv.telemetry.child`, started by
`SamplerProcess.start` in `process.py`): reopens the parent's backend from its spec, runs
a `Reader` into the shared-memory rings, and ends when its parent does (see process.py)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import signal
import sys
from collections.abc import Collection, Mapping, Sequence

from gpuenv.backend import SlowReading
from gpuenv.telemetry.reader import Reader
from gpuenv.telemetry.ring import (
    FAILED,
    FLAG_NO_SLOW,
    READY,
    Shared,
    pack_fast,
    pack_gap,
    pack_slow,
)
from gpuenv.telemetry.samples import FastRecord, Gap
from gpuenv.timebase import RealClock

_PR_SET_PDEATHSIG = 1


class _RingSink:
    def __init__(self, shared: Shared, gpus: Sequence[int]):
        self.shared = shared
        self.slot = {g: k for k, g in enumerate(gpus)}

    def fast(self, rec: FastRecord) -> None:
        self.shared.fast[self.slot[rec[1]]].put(*pack_fast(rec))

    def slow(
        self,
        t: float,
        gpu: int,
        reading: SlowReading | None,
        pids: Mapping[int, int | None] | Collection[int] | None,
        edge: bool,
        value_t: float | None,
    ) -> None:
        self.shared.slow[self.slot[gpu]].put(*pack_slow(t, reading, pids, edge, value_t))

    def gap(self, gap: Gap) -> None:
        self.shared.gaps.put(*pack_gap(gap))

    def slow_done(self) -> None:
        pass


class _Child:
    """The sampler process's loop around a `Reader`."""

    def __init__(self, shared: Shared, reader: Reader, wake_fd: int):
        self.shared, self.reader, self.wake_fd = shared, reader, wake_fd
        self.stopped = False
        self._flagged: set[int] = set()

    def requested(self) -> int:
        return self.shared.edges_requested()

    def served(self, n: int) -> None:
        self.shared.served(n)

    def wait(self, seconds: float) -> None:
        reader = self.reader
        self.shared.heartbeat(reader.ticks, reader.cpu_time_s, reader.clock.now())
        for k, g in enumerate(reader.gpus):
            if k not in self._flagged and "read_slow" in reader.unsupported[g]:
                self.shared.set_flag(k, FLAG_NO_SLOW)
                self._flagged.add(k)
        readable = select.select([self.wake_fd], [], [], seconds)[0]
        if readable and not os.read(self.wake_fd, 4096):  # EOF: the parent closed it, or died
            self.stopped = True
        reader.hurrying = self.shared.hurrying  # the period of the next tick (Sampler.hurry)


def _die_with_parent(parent: int, from_main_thread: bool) -> None:
    """PR_SET_PDEATHSIG: a signal when the thread that spawned us ends. Spawned by the
    parent's main thread, that is the parent's end: SIGKILL (it works even while a read
    hangs in the driver). Spawned by another thread: a signal whose handler exits only if
    the parent is gone (a thread of a live parent ending is no reason to stop)."""
    sig = signal.SIGKILL
    if not from_main_thread:

        def on_signal(signum: int, frame: object) -> None:
            if os.getppid() != parent:
                os._exit(0)

        sig = signal.SIGUSR2
        signal.signal(sig, on_signal)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(
        prog="python -m gpuenv.telemetry.child",
        description="gpuenv's sampler process: started by gpuenv.telemetry.Sampler; "
        "not meant to be run by hand.",
    )
    args.add_argument("config", help="JSON from SamplerProcess.start")
    config = json.loads(args.parse_args(argv).config)
    _die_with_parent(int(config["parent"]), bool(config["main_thread"]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the benchmark; it ends us
    shared = Shared.attach(int(config["shm_fd"]))
    try:
        from gpuenv.backend import backend_from_spec

        backend = backend_from_spec(config["spec"])
    except Exception as err:
        shared.set_status(FAILED, " ".join(str(err).split()) or type(err).__name__)
        return 1
    gpus = [int(g) for g in config["gpus"]]
    reader = Reader(
        backend,
        gpus,
        _RingSink(shared, gpus),
        clock=RealClock(),
        period=config["period"],
        hurry_period=config["hurry_period"],
        slow_period=config["slow_period"],
        process_period=config["process_period"],
        energy_period=config["energy_period"],
        watch_processes=config["watch_processes"],
        fast_edges=True,  # off the parent's GIL: an early edge's cheap values at once
    )
    child = _Child(shared, reader, int(config["wake_fd"]))
    try:
        reader.hurrying = shared.hurrying
        reader.periodic_tick()
        shared.heartbeat(reader.ticks, 0.0, reader.clock.now())
        shared.set_status(READY)
        reader.run(lambda: child.stopped, child.wait, child)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
