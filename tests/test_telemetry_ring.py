"""The shared-memory rings between the sampler process and its parent: records round-trip,
and a record being written, overwritten or damaged is never returned torn."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from dataclasses import astuple

import pytest

from gpuenv.backend import SlowReading
from gpuenv.telemetry import Gap, Sample
from gpuenv.telemetry.ring import (
    MAX_PIDS,
    Ring,
    Shared,
    pack_fast,
    pack_gap,
    pack_slow,
    unpack_fast,
    unpack_gap,
    unpack_slow,
)


@pytest.fixture
def shared():
    shm, fd = Shared.create(2, 16)
    os.close(fd)
    yield shm
    shm.close()


def test_records_round_trip_through_the_rings(shared):
    full = Sample(1.5, 1, 1980, 2619, 512.25, 61.0, 0x4, 1_790_000_000_123_456, 699.5)
    bare = Sample(2.5, 1, 345, 1593, 70.0, 30.0, 0x1)
    shared.fast[1].put(*pack_fast(astuple(full)))
    shared.fast[1].put(*pack_fast(astuple(bare)))
    recs, nxt = shared.fast[1].since(0)
    assert [Sample(*unpack_fast(r, 1)) for r in recs] == [full, bare] and nxt == 2

    reading = SlowReading(123_456_789, {"power": 5_000_000, "thermal": 0}, 71.0)
    shared.slow[0].put(*pack_slow(3.0, reading, frozenset({42, 7}), True, 2.95))
    shared.slow[0].put(*pack_slow(3.1, None, frozenset(), False, None))
    shared.slow[0].put(*pack_slow(3.2, SlowReading(None, {}), None, False, None))
    (a, b, c), _ = shared.slow[0].since(0)
    assert unpack_slow(a) == (3.0, reading, frozenset({7, 42}), True, 2.95)
    assert unpack_slow(b) == (3.1, None, frozenset(), False, None)  # a process check alone
    assert unpack_slow(c) == (3.2, SlowReading(None, {}), None, False, None)

    gap = Gap(4.0, 1, "read_fast", "GPU is lost: it fell off the bus")
    shared.gaps.put(*pack_gap(gap))
    assert [unpack_gap(r) for r in shared.gaps.since(0)[0]] == [gap]


def test_a_process_check_keeps_the_lowest_pids_when_there_are_too_many(shared):
    pids = frozenset(range(1000, 1000 + MAX_PIDS + 10))
    shared.slow[0].put(*pack_slow(1.0, None, pids, False, None))
    _, _, kept, _, _ = unpack_slow(shared.slow[0].since(0)[0][0])
    assert kept == frozenset(sorted(pids)[:MAX_PIDS])


def test_the_ring_keeps_the_newest_records_and_resumes_where_it_stopped(shared):
    ring = shared.fast[0]
    for n in range(40):
        ring.put(*pack_fast(astuple(Sample(float(n), 0, n, 0, 0.0, 0.0, 0))))
    recs, nxt = ring.since(0)
    assert [r[0] for r in recs] == [float(n) for n in range(24, 40)]  # the last 16
    ring.put(*pack_fast(astuple(Sample(40.0, 0, 40, 0, 0.0, 0.0, 0))))
    assert [r[0] for r in ring.since(nxt)[0]] == [40.0]


def test_a_record_being_written_is_not_returned(shared):
    ring = shared.fast[0]
    ring.put(*pack_fast(astuple(Sample(1.0, 0, 1, 0, 0.0, 0.0, 0))))
    ring.put(*pack_fast(astuple(Sample(2.0, 0, 2, 0, 0.0, 0.0, 0))))
    # the writer has begun record 1 again (counter odd) and not finished
    struct.pack_into("<Q", shared.buf, ring.base + ring.slot, 2 * 1 + 1)
    assert [r[0] for r in ring.since(0)[0]] == [1.0]
    assert ring.get(1) is None


def test_a_record_whose_bytes_do_not_match_its_crc_is_not_returned(shared):
    ring = shared.fast[0]
    ring.put(*pack_fast(astuple(Sample(1.0, 0, 1, 0, 0.0, 0.0, 0))))
    # a weakly ordered CPU could show the counter before the bytes it covers
    shared.buf[ring.base + 20] ^= 0xFF
    assert ring.get(0) is None


class _LappedWhileCopied(bytearray):
    """Memory where the writer starts the next lap on a slot while the reader copies it."""

    slot_off = 0
    lap_counter: int | None = None

    def __getitem__(self, key):
        out = super().__getitem__(key)
        if isinstance(key, slice) and self.lap_counter is not None:
            struct.pack_into("<Q", self, self.slot_off, self.lap_counter)
        return out


def test_a_record_overwritten_during_the_copy_is_not_returned(shared):
    fmt = shared.fast[0].fmt
    buf = _LappedWhileCopied(64 + Ring(None, 64, 1, fmt, 0).nbytes)
    ring = Ring(buf, 64, 1, fmt, 0)  # one slot at 64; the count at 0
    ring.put(*pack_fast(astuple(Sample(1.0, 0, 1, 0, 0.0, 0.0, 0))))
    assert ring.get(0) is not None
    buf.slot_off, buf.lap_counter = 64, 2 * 1 + 1  # record 1 begins in the same slot
    assert ring.get(0) is None  # the counter moved between the two looks


_WRITER = """
import os, sys
from gpuenv.telemetry.ring import Shared
shared = Shared.attach(int(sys.argv[1]))
ring = shared.fast[0]
print("go", flush=True)
for n in range(int(sys.argv[2])):
    ring.put(float(n), n & 0xFFFFFFFF, (n * 7) & 0xFFFFFFFF, 2.0 * n, float(n % 1000), n, n,
             -float(n))
"""


def _consistent(rec: tuple) -> bool:
    n = int(rec[0])
    return rec == (float(n), n, n * 7, 2.0 * n, float(n % 1000), n, n, -float(n))


def test_a_reader_racing_a_fast_writer_never_sees_a_torn_record():
    shm, fd = Shared.create(1, 16)  # a small ring: the writer laps the reader constantly
    writes = 300_000
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(fd), str(writes)],
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"go\n"
        seen = bad = 0
        nxt = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = proc.poll() is not None
            recs, nxt = shm.fast[0].since(nxt)
            seen += len(recs)
            bad += sum(not _consistent(r) for r in recs)
            if done:
                break
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        shm.close()
        os.close(fd)
    assert bad == 0
    assert seen >= 16  # it read while the writer wrote
    assert nxt == writes
