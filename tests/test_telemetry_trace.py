"""gpuenv.telemetry.trace: the bounded log of samples, a session's pieces, the record shape."""

from __future__ import annotations

import itertools
import math

import pytest

from gpuenv.telemetry import Sample, Sampler
from gpuenv.telemetry.trace import SampleLog, TracePieces, trace_record, written_bound


def sample(t: float, gpu: int = 0, sm: int = 1980) -> Sample:
    return Sample(t, gpu, sm, 2619, 300.0, 40.0, 0, power_instant_w=310.04)


class Ring:
    """What TracePieces reads of a Sampler: samples(t0, t1, gpu), the ring's last `keep`."""

    def __init__(self, keep: int = 64):
        self.buf: list[Sample] = []
        self.keep = keep

    def put(self, s: Sample) -> None:
        self.buf = [*self.buf[-(self.keep - 1) :], s]

    def samples(self, t0: float | None, t1: float | None, gpu: int) -> list[Sample]:
        lo = -math.inf if t0 is None else t0
        return [s for s in self.buf if s.gpu == gpu and s.t >= lo]


def test_the_record_is_one_gpus_samples_as_parallel_lists_from_t_ref():
    rec = trace_record([sample(10.0), sample(10.025, sm=1965)], 9.5)
    assert rec == {
        "t0": 9.5,
        "t_s": [0.5, 0.525],
        "sm_mhz": [1980, 1965],
        "mem_mhz": [2619] * 2,
        "power_w": [310.0, 310.0],
        "temp_c": [40.0, 40.0],
        "reasons": [0, 0],
    }


def test_the_log_holds_at_most_max_points_and_thins_evenly():
    log = SampleLog([0], max_points=100)
    log.add([sample(k * 0.025) for k in range(1000)])
    pts = log.points[0]
    assert len(pts) <= 100
    gaps = {round(b.t - a.t, 6) for a, b in itertools.pairwise(pts)}
    assert max(gaps) <= 2 * min(gaps)  # even: no stretch left dense while another is sparse
    assert pts[0].t == 0.0 and pts[-1].t >= 1000 * 0.025 - 2 * max(gaps)


def test_each_gpus_log_thins_evenly_on_its_own():
    """Two GPUs sampled at the same times, added GPU after GPU as pull() does: one GPU's
    thinning must not make the other's newer samples sparser than its older ones."""
    log = SampleLog([0, 1], max_points=100)
    for chunk in range(200):
        times = [(chunk * 40 + k) * 0.025 for k in range(40)]
        log.add([sample(t, gpu=0) for t in times])
        log.add([sample(t, gpu=1) for t in times])
    for g in (0, 1):
        gaps = {round(b.t - a.t, 6) for a, b in itertools.pairwise(log.points[g])}
        assert max(gaps) <= 2 * min(gaps), g
        assert len(log.points[g]) > 50, g


def test_pieces_join_into_every_sample_without_repeating_one():
    ring, t = Ring(), 100.0
    pieces = TracePieces(ring, [0], t_ref=t)
    got: list[float] = []
    for n in (3, 1, 0, 40, 7):
        for _ in range(n):
            t += 0.025
            ring.put(sample(t))
        piece = pieces.piece()
        assert (piece == {}) == (n == 0)  # nothing new: no piece
        if piece:
            assert piece["trace"]["t0"] == 100.0
            got += [100.0 + x for x in piece["trace"]["t_s"]]
    assert got == pytest.approx([100.0 + 0.025 * k for k in range(1, 52)])


def test_several_gpus_give_every_gpus_piece_under_traces():
    ring = Ring()
    for k in range(5):
        ring.put(sample(1.0 + k, gpu=0))
        ring.put(sample(1.0 + k, gpu=3, sm=1500))
    piece = TracePieces(ring, [0, 3], t_ref=0.0).piece()
    assert piece["trace"] == piece["traces"]["0"]
    assert piece["traces"]["3"]["sm_mhz"] == [1500] * 5


def test_a_piece_without_the_first_gpu_loses_no_other_gpus_samples():
    """GPU 0 unread for a while (a gap) while GPU 3 goes on: GPU 3's samples of that time
    come with the next piece instead of being skipped."""
    ring = Ring()
    pieces = TracePieces(ring, [0, 3], t_ref=0.0)
    ring.put(sample(1.0, gpu=3))
    assert pieces.piece() == {}  # nothing of the first GPU: no piece
    ring.put(sample(2.0, gpu=0))
    ring.put(sample(2.0, gpu=3))
    piece = pieces.piece()
    assert piece["traces"]["3"]["t_s"] == [1.0, 2.0]
    assert piece["trace"]["t_s"] == [2.0]


@pytest.mark.parametrize("every", [1, 37, 400])
def test_what_a_long_session_writes_stays_under_the_stated_bound(every):
    """Pieces taken every `every` samples for 2**10 times the log's fill: the samples written
    add up to no more than written_bound, and the log in memory to max_points."""
    max_points, period = 50, 1.0
    ring = Ring(keep=every + 8)
    pieces = TracePieces(ring, [0], t_ref=0.0, max_points=max_points)
    written, t = 0, 0.0
    for k in range(1, max_points * 2**10):
        t = k * period
        ring.put(sample(t))
        if k % every == 0:
            piece = pieces.piece()
            written += len(piece["trace"]["t_s"]) if piece else 0
            assert written <= written_bound(t, period, max_points)
            assert len(pieces.log.points[0]) <= max_points
    assert written > written_bound(t, period, max_points) / 2  # the bound is not loose


def test_the_bound_for_a_day_at_the_default_period():
    assert written_bound(60.0) == 2 * 20_000 + 1  # under 500 s: the log never thinned
    assert written_bound(86_400) < 115_000


def test_a_real_sampler_feeds_the_pieces(sim):
    sim.open_context(0)
    with Sampler(sim, [0], clock=sim.clock, period=0.025) as sampler:
        pieces = TracePieces(sampler, [0], t_ref=sim.clock.now())
        sim.idle(1.0)
        first = pieces.piece()["trace"]
        sim.idle(1.0)
        second = pieces.piece()["trace"]
    assert 35 <= len(first["t_s"]) <= 45 and 35 <= len(second["t_s"]) <= 45
    assert first["t_s"][-1] < second["t_s"][0] <= first["t_s"][-1] + 0.03
