"""The shared memory between the sampler process and its parent: a header and, per GPU,
a ring of cheap samples and a ring of slow reads, plus one ring of gaps.

One writer (the sampler process) and one reader (the parent's `Sampler`), no lock:
each slot carries a write counter, seqlock style. Record n goes to slot n % capacity;
the writer sets the slot's counter to 2n+1, writes the record and its CRC-32, sets
the counter to 2n+2, then the ring's head to n+1. The reader copies a slot and
accepts it only if the counter read before and after the copy is 2n+2 and the CRC
matches: a record being written or overwritten while it is copied is dropped,
never returned torn. (The CRC also guards weakly-ordered CPUs, where a counter
could become visible before the bytes it covers: Python has no memory fences.)

The memory is a file in /dev/shm (else the temporary directory), unlinked as soon as
it is made and passed to the child as an open descriptor, so nothing is left behind
by a crash; its blocks are reserved up front (posix_fallocate) so that a full
/dev/shm fails at start, not as a SIGBUS mid-benchmark.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import tempfile
import zlib
from collections.abc import Collection, Mapping
from typing import Any

from gpuenv.backend import SlowReading
from gpuenv.reasons import COUNTER_NAMES
from gpuenv.telemetry.samples import FastRecord, Gap

MAGIC = b"GPUENVR1"
MAX_GPUS = 64
MAX_PIDS = 24  # processes kept per process check (sorted: the lowest pids)
GAP_CAPACITY = 4096  # gaps kept (a lost GPU makes one per tick)
HEADER_SIZE = 4096

# status of the sampler process (header)
STARTING, READY, FAILED = 0, 1, 2

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
# magic, n_gpus, capacity, gap capacity, status, child pid, edges requested (the parent
# writes it), edges served, ticks, CPU seconds, last time alive (host monotonic); after
# them, Samplers hurrying it (the parent writes it: `Sampler.hurry`)
_HEAD = struct.Struct("<8sIIIIIxxxxQQQdd")
_OFF_STATUS = 20
_OFF_REQUESTED = 32
_OFF_SERVED = 40
_OFF_TICKS = 48
_OFF_CPU = 56
_OFF_ALIVE = 64
_OFF_HURRY = 72
_OFF_ERROR, _ERROR_SIZE = 128, 512
_OFF_FLAGS = 1024  # u32 per GPU: FLAG_NO_SLOW
_OFF_HEADS = 2048  # u64 per ring: records written
FLAG_NO_SLOW = 1  # the GPU has no slow counters (NotSupported): nobody waits for them

_FAST = struct.Struct("<dIIddQqd")  # t, sm, mem, power, temp, reasons, driver ts, instant W
_NC = len(COUNTER_NAMES)
# t, flags, energy mJ, memory temperature, value_t, pid count, counters (-1: absent), pids,
# the GPU memory each pid holds in MiB (_NO_MIB: not known)
_SLOW = struct.Struct(f"<dBqddH{_NC}q{MAX_PIDS}I{MAX_PIDS}I")
_NO_MIB = 0xFFFFFFFF
_GAP = struct.Struct("<dI16s200s")  # t, GPU index, op, error
_S_READING, _S_PIDS, _S_EDGE, _S_ENERGY, _S_MEMT, _S_VALUE_T = 1, 2, 4, 8, 16, 32
_SLOT_HEAD = 12  # u64 write counter, u32 CRC


def _slot_size(fmt: struct.Struct) -> int:
    return (_SLOT_HEAD + fmt.size + 7) // 8 * 8


class Ring:
    """One ring of fixed-size records in `buf` at `base`; `head_off` holds its count."""

    def __init__(self, buf: Any, base: int, capacity: int, fmt: struct.Struct, head_off: int):
        self.buf, self.base, self.capacity, self.fmt = buf, base, capacity, fmt
        self.head_off = head_off
        self.slot = _slot_size(fmt)

    @property
    def nbytes(self) -> int:
        return self.capacity * self.slot

    def head(self) -> int:
        return int(_U64.unpack_from(self.buf, self.head_off)[0])

    def put(self, *values: Any) -> None:
        """Append one record (the single writer only)."""
        n = self.head()
        off = self.base + (n % self.capacity) * self.slot
        payload = self.fmt.pack(*values)
        _U64.pack_into(self.buf, off, 2 * n + 1)
        self.buf[off + _SLOT_HEAD : off + _SLOT_HEAD + len(payload)] = payload
        _U32.pack_into(self.buf, off + 8, zlib.crc32(payload))
        _U64.pack_into(self.buf, off, 2 * n + 2)
        _U64.pack_into(self.buf, self.head_off, n + 1)

    def get(self, n: int) -> tuple[Any, ...] | None:
        """Record n, or None if it is being written, was overwritten, or is not whole."""
        off = self.base + (n % self.capacity) * self.slot
        want = 2 * n + 2
        if _U64.unpack_from(self.buf, off)[0] != want:
            return None
        raw = self.buf[off + 8 : off + _SLOT_HEAD + self.fmt.size]
        if _U64.unpack_from(self.buf, off)[0] != want:
            return None
        payload = raw[4:]
        if zlib.crc32(payload) != _U32.unpack_from(raw, 0)[0]:
            return None
        return self.fmt.unpack(payload)

    def since(self, n: int) -> tuple[list[tuple[Any, ...]], int]:
        """The whole records from number n on (older ones are gone: from the oldest kept),
        and the number to ask for next time."""
        head = self.head()
        out = []
        for k in range(max(n, head - self.capacity), head):
            rec = self.get(k)
            if rec is not None:
                out.append(rec)
        return out, head


class Shared:
    """The header and rings in one mapping (see the module docstring)."""

    def __init__(self, buf: Any, n_gpus: int, capacity: int):
        self.buf = buf
        self.n_gpus, self.capacity = n_gpus, capacity
        # the header's u64 fields as a view: a mark() costs an index, not a struct call
        self._words = memoryview(buf)[:HEADER_SIZE].cast("Q") if buf is not None else None
        base = HEADER_SIZE
        self.fast: list[Ring] = []
        self.slow: list[Ring] = []
        for g in range(n_gpus):
            for kind, fmt, rings in ((0, _FAST, self.fast), (1, _SLOW, self.slow)):
                ring = Ring(buf, base, capacity, fmt, _OFF_HEADS + 8 * (2 * g + kind))
                rings.append(ring)
                base += ring.nbytes
        gap_cap = min(capacity, GAP_CAPACITY)
        self.gaps = Ring(buf, base, gap_cap, _GAP, _OFF_HEADS + 8 * 2 * n_gpus)
        self.size = base + self.gaps.nbytes

    @staticmethod
    def size_for(n_gpus: int, capacity: int) -> int:
        return Shared(None, n_gpus, capacity).size

    @classmethod
    def create(cls, n_gpus: int, capacity: int) -> tuple[Shared, int]:
        """New zeroed shared memory, and its descriptor (to pass to the sampler process)."""
        if not 1 <= n_gpus <= MAX_GPUS:
            raise ValueError(f"the sampler process covers 1 to {MAX_GPUS} GPUs, not {n_gpus}")
        size = cls.size_for(n_gpus, capacity)
        fd = _reserve(size)
        try:
            shared = cls(mmap.mmap(fd, size), n_gpus, capacity)
        except BaseException:
            os.close(fd)
            raise
        _HEAD.pack_into(
            shared.buf,
            0,
            MAGIC,
            n_gpus,
            capacity,
            shared.gaps.capacity,
            STARTING,
            0,
            0,
            0,
            0,
            0.0,
            0.0,
        )
        return shared, fd

    @classmethod
    def attach(cls, fd: int) -> Shared:
        """The sampler process's view of what its parent made."""
        size = os.fstat(fd).st_size
        buf = mmap.mmap(fd, size)
        magic, n_gpus, capacity = _HEAD.unpack_from(buf, 0)[:3]
        if magic != MAGIC:
            raise ValueError("not a gpuenv sampler ring")
        return cls(buf, n_gpus, capacity)

    def close(self) -> None:
        if self._words is not None:
            self._words.release()  # an mmap with views into it cannot close
            self._words = None
        self.buf.close()

    # -- header fields ---------------------------------------------------------------
    def _u64(self, off: int) -> int:
        return int(_U64.unpack_from(self.buf, off)[0])

    @property
    def status(self) -> int:
        return int(_U32.unpack_from(self.buf, _OFF_STATUS)[0])

    def set_status(self, status: int, error: str = "") -> None:
        if error:
            text = error.encode("utf-8", "replace")[: _ERROR_SIZE - 1]
            self.buf[_OFF_ERROR : _OFF_ERROR + _ERROR_SIZE] = text.ljust(_ERROR_SIZE, b"\0")
        _U32.pack_into(self.buf, _OFF_STATUS, status)

    @property
    def error(self) -> str:
        raw = self.buf[_OFF_ERROR : _OFF_ERROR + _ERROR_SIZE]
        return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")

    def edges_requested(self) -> int:
        return self._u64(_OFF_REQUESTED)

    def request_edge(self) -> bool:
        """Count one more edge request (the parent only); True if none was pending."""
        words = self._words
        assert words is not None
        requested = words[_OFF_REQUESTED // 8]
        words[_OFF_REQUESTED // 8] = requested + 1
        return bool(requested <= words[_OFF_SERVED // 8])

    def add_hurry(self, step: int) -> int:
        """Count one more (+1) or one less (-1) hurrying Sampler (the parent only, under its
        lock); the count after."""
        n = max(0, self._u64(_OFF_HURRY) + step)
        _U64.pack_into(self.buf, _OFF_HURRY, n)
        return n

    @property
    def hurrying(self) -> int:
        return self._u64(_OFF_HURRY)

    def served(self, n: int) -> None:
        _U64.pack_into(self.buf, _OFF_SERVED, n)

    def heartbeat(self, ticks: int, cpu_s: float, now: float) -> None:
        _U64.pack_into(self.buf, _OFF_TICKS, ticks)
        _F64.pack_into(self.buf, _OFF_CPU, cpu_s)
        _F64.pack_into(self.buf, _OFF_ALIVE, now)

    @property
    def ticks(self) -> int:
        return self._u64(_OFF_TICKS)

    @property
    def cpu_time_s(self) -> float:
        return float(_F64.unpack_from(self.buf, _OFF_CPU)[0])

    @property
    def alive_t(self) -> float:
        return float(_F64.unpack_from(self.buf, _OFF_ALIVE)[0])

    def set_flag(self, gpu_slot: int, flag: int) -> None:
        off = _OFF_FLAGS + 4 * gpu_slot
        _U32.pack_into(self.buf, off, _U32.unpack_from(self.buf, off)[0] | flag)

    def flags(self, gpu_slot: int) -> int:
        return int(_U32.unpack_from(self.buf, _OFF_FLAGS + 4 * gpu_slot)[0])


def _reserve(size: int) -> int:
    """An unlinked file of `size` reserved bytes: in /dev/shm, else the temporary directory."""
    errors = []
    for folder in ("/dev/shm", tempfile.gettempdir()):
        if not os.path.isdir(folder):
            continue
        try:
            fd, path = tempfile.mkstemp(prefix="gpuenv-sampler-", dir=folder)
        except OSError as err:
            errors.append(f"{folder}: {err}")
            continue
        os.unlink(path)
        try:
            os.posix_fallocate(fd, 0, size)
            return fd
        except OSError as err:
            os.close(fd)
            errors.append(f"{folder}: {err}")
    raise OSError(f"no room for {size / 2**20:.1f} MiB of sampler ring ({'; '.join(errors)})")


# -- records <-> ring tuples -----------------------------------------------------------


def pack_fast(rec: FastRecord) -> tuple[Any, ...]:
    """A cheap reading (a Sample's fields) as a ring record (the GPU is the ring's)."""
    t, _, sm, mem, power, temp, reasons, ts, inst = rec
    return (
        t,
        sm,
        mem,
        power,
        temp,
        reasons,
        -1 if ts is None else ts,
        math.nan if inst is None else inst,
    )


def unpack_fast(rec: tuple[Any, ...], gpu: int) -> FastRecord:
    """`pack_fast` undone: `Sample(*unpack_fast(rec, gpu))` is the Sample."""
    t, sm, mem, power, temp, reasons, ts, inst = rec
    return (
        t,
        gpu,
        sm,
        mem,
        power,
        temp,
        reasons,
        None if ts < 0 else ts,
        None if math.isnan(inst) else inst,
    )


def pack_slow(
    t: float,
    reading: SlowReading | None,
    pids: Mapping[int, int | None] | Collection[int] | None,
    edge: bool,
    value_t: float | None,
) -> tuple[Any, ...]:
    """A slow read as the ring's fields; `pids` maps each pid to its memory in MiB (a plain
    set of pids: memory unknown)."""
    flags = (_S_EDGE if edge else 0) | (_S_VALUE_T if value_t is not None else 0)
    energy, mem_temp = -1, math.nan
    counters = [-1] * _NC
    if reading is not None:
        flags |= _S_READING
        if reading.energy_mj is not None:
            flags, energy = flags | _S_ENERGY, int(reading.energy_mj)
        if reading.mem_temp_c is not None:
            flags, mem_temp = flags | _S_MEMT, float(reading.mem_temp_c)
        for k, name in enumerate(COUNTER_NAMES):
            if name in reading.reason_ns:
                counters[k] = int(reading.reason_ns[name])
    kept = sorted(pids)[:MAX_PIDS] if pids is not None else []
    mibs = [_mib(pids.get(p) if isinstance(pids, Mapping) else None) for p in kept]
    if pids is not None:
        flags |= _S_PIDS
    return (
        t,
        flags,
        energy,
        mem_temp,
        math.nan if value_t is None else value_t,
        len(kept),
        *counters,
        *kept,
        *([0] * (MAX_PIDS - len(kept))),
        *mibs,
        *([_NO_MIB] * (MAX_PIDS - len(mibs))),
    )


def _mib(value: int | None) -> int:
    return _NO_MIB if value is None or not 0 <= value < _NO_MIB else int(value)


def unpack_slow(
    rec: tuple[Any, ...],
) -> tuple[
    float, SlowReading | None, dict[int, int | None] | frozenset[int] | None, bool, float | None
]:
    """(t, reading, pids, edge, value_t): what `Sink.slow` takes."""
    t, flags, energy, mem_temp, value_t, npids = rec[:6]
    counters = rec[6 : 6 + _NC]
    reading = None
    if flags & _S_READING:
        reading = SlowReading(
            energy if flags & _S_ENERGY else None,
            {name: v for name, v in zip(COUNTER_NAMES, counters, strict=True) if v >= 0},
            mem_temp if flags & _S_MEMT else None,
        )
    at = 6 + _NC
    pids: dict[int, int | None] | frozenset[int] | None = None
    if flags & _S_PIDS:
        found = rec[at : at + npids]
        mibs = rec[at + MAX_PIDS : at + MAX_PIDS + npids]
        pids = (
            {int(p): None if m == _NO_MIB else int(m) for p, m in zip(found, mibs, strict=True)}
            if any(m != _NO_MIB for m in mibs)
            else frozenset(found)  # no memory known: the pids alone
        )
    return t, reading, pids, bool(flags & _S_EDGE), value_t if flags & _S_VALUE_T else None


def pack_gap(gap: Gap) -> tuple[Any, ...]:
    return (gap.t, gap.gpu, gap.op.encode()[:16], gap.error.encode("utf-8", "replace")[:200])


def unpack_gap(rec: tuple[Any, ...]) -> Gap:
    t, gpu, op, error = rec
    return Gap(t, gpu, op.rstrip(b"\0").decode(), error.rstrip(b"\0").decode("utf-8", "replace"))
