"""The sampler's buffers in this process: records kept as plain tuples that the garbage
collector does not track, handed back as the same Sample, SlowSample and Gap objects, in
the same order, after the rings wrapped."""

from __future__ import annotations

import gc
from dataclasses import astuple

from gpuenv.backend import SlowReading
from gpuenv.backend.sim import SimBackend
from gpuenv.telemetry import Gap, Sample, Sampler, SlowSample
from gpuenv.telemetry.buffers import Buffers
from gpuenv.timebase import VirtualClock

OWN = 4242


def _fill(buf: Buffers, n: int) -> tuple[list[Sample], list[SlowSample], list[Gap]]:
    """n records of each kind on GPU 0, varied as reads are; what readers must get back."""
    fast, slow, gaps = [], [], []
    for k in range(n):
        t = 100.0 + k * 0.025
        s = Sample(
            t,
            0,
            1980 - k,
            2619,
            300.0 + k,
            40.0 + k / 8,
            k & 0x7,
            None if k % 3 else 1_790_000_000_000_000 + k,
            None if k % 2 else 650.5 + k,
        )
        buf.fast(astuple(s))
        fast.append(s)
        if k % 2:  # a process check alone: other processes, and ours among them
            buf.slow(t, 0, None, frozenset({OWN, 77, 9}), False, None)
            slow.append(SlowSample(t, 0, None, {}, None, (9, 77), False, own_present=True))
        else:
            reading = SlowReading(5_000 * k, {"power": 10 * k, "thermal": k}, 71.0 - k)
            buf.slow(t, 0, reading, None if k % 4 else frozenset({12}), k % 8 == 0, t - 0.05)
            slow.append(
                SlowSample(
                    t,
                    0,
                    5_000 * k,
                    {"power": 10 * k, "thermal": k},
                    71.0 - k,
                    () if k % 4 else (12,),
                    k % 8 == 0,
                    t - 0.05,
                    None if k % 4 else False,
                )
            )
        gap = Gap(t, 0, "read_fast", f"timeout {k}")
        buf.gap(gap)
        gaps.append(gap)
    return fast, slow, gaps


def test_readers_get_the_newest_records_in_order_after_the_rings_wrap():
    buf = Buffers([0, 1], 16, {OWN})
    fast, slow, gaps = _fill(buf, 50)
    everything = (float("-inf"), float("inf"))
    assert buf.samples([0], *everything, recent=False) == fast[-16:]
    assert buf.slow_samples([0], *everything) == slow[-16:]
    assert buf.gaps() == gaps[-16:]
    assert buf.latest(0) == fast[-1] and buf.latest(1) is None
    assert buf.last_slow_t(0) == slow[-1].t and buf.last_slow_t(1) is None
    lo = fast[40].t
    # from a time on: the records from then, walking back from the newest
    assert buf.samples([0], lo, fast[45].t, recent=True) == fast[40:46]
    got = buf.window_inputs(0, lo, 0.06, 1.0)
    assert got.fast == fast[39:] and got.truncated  # the one in force at lo, then the rest
    assert got.slow == slow[38 - 3 :]  # 0.06 s back is from read 38 on, and three more
    assert got.gaps == [g for g in gaps[-16:] if g.t >= lo - 1.0]


def test_a_full_ring_leaves_nothing_for_the_garbage_collector_to_walk():
    buf = Buffers([0], 64, {OWN})
    _fill(buf, 200)
    gc.collect()
    gc.collect()  # a tuple is untracked once a collection saw its items untracked
    records = [*buf.fast_q[0], *buf.slow_q[0], *buf.gap_q]
    assert len(records) == 3 * 64
    assert not [r for r in records if gc.is_tracked(r)]


def test_a_sampler_hands_out_equal_objects_each_time_and_fresh_ones():
    """Readers may keep or change what they got: each call makes its own objects."""
    sim = SimBackend(clock=VirtualClock())
    with Sampler(sim, [0], capacity=32) as sampler:
        sim.idle(3.0)
        first, again = sampler.slow_samples(), sampler.slow_samples()
        assert first == again and first[-1] is not again[-1]
        first[-1].reason_ns.clear()
        assert sampler.slow_samples()[-1] == again[-1]
        assert sampler.samples()[-1] == sampler.latest()


def test_edge_reads_kept_apart_read_back_the_same_in_time_order():
    """gpuenvd's split (issue 31, item 4): reads closer than `spacing` to the ring's newest go
    to an edge ring of their own; readers see every record, merged in time order."""
    whole = Buffers([0], 1000, {OWN})
    fast, slow, _ = _fill(whole, 60)
    split = Buffers([0], 1000, {OWN}, edge_capacity=1000, spacing=0.04)
    _fill(split, 60)
    assert split.edge_fast_q is not None and len(split.edge_fast_q[0]) > 10  # it did split
    everything = (float("-inf"), float("inf"))
    assert split.samples([0], *everything, recent=False) == fast
    assert split.slow_samples([0], *everything) == slow
    assert split.latest(0) == fast[-1] and split.last_slow_t(0) == slow[-1].t
    lo = fast[40].t
    assert split.samples([0], lo, fast[45].t, recent=True) == fast[40:46]
    got, want = split.window_inputs(0, lo, 0.06, 1.0), whole.window_inputs(0, lo, 0.06, 1.0)
    assert got.fast == want.fast and got.slow == want.slow


def test_a_flood_of_edge_reads_keeps_the_history_and_a_bounded_edge_ring():
    buf = Buffers([0], 100, {OWN}, edge_capacity=16, spacing=0.05)
    for k in range(20):  # the time history: a read every 0.1 s
        buf.fast((float(k) * 0.1, 0, 1980, 2619, 300.0, 40.0, 0, None, None))
    for k in range(5000):  # then edge reads 1 ms apart, within 0.05 s of the newest kept
        buf.fast((1.9 + 0.04 * (k / 5000), 0, 1980, 2619, 300.0, 40.0, 0, None, None))
    assert buf.edge_fast_q is not None and len(buf.edge_fast_q[0]) == 16
    assert len(buf.fast_q[0]) == 20 and buf.fast_q[0][0][0] == 0.0  # nothing pushed out
