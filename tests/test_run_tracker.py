"""The parent's side of regions: pairing edges into regions (in-process, synthetic edges).

tests/test_run_runner.py runs `gpuenv run` itself.
"""

from __future__ import annotations

from gpuenv.run.region import Edge
from gpuenv.run.tracker import RegionTracker


def test_tracker_pairs_edges_by_process_and_id_and_closes_what_is_open():
    tr = RegionTracker()
    tr.feed(Edge("b", 10, 1, 1.0, "a"))
    tr.feed(Edge("b", 11, 1, 1.5, "a"))  # another process, same id
    tr.feed(Edge("e", 10, 1, 2.0, None))
    tr.feed(Edge("e", 99, 7, 2.5, None))  # an end without a begin
    tr.close_all(3.0)
    assert [(r.pid, r.t0, r.t1, r.complete) for r in tr.finished] == [
        (10, 1.0, 2.0, True),
        (11, 1.5, 3.0, False),
    ]
    assert tr.ignored == 1 and tr.names == ["a"]


def test_a_discarded_region_is_counted_not_measured():
    tr = RegionTracker()
    tr.feed(Edge("b", 10, 1, 1.0, "do_bench x.py:3"))
    tr.feed(Edge("x", 10, 1, 2.0, None))
    tr.feed(Edge("b", 10, 2, 3.0, "do_bench x.py:3"))
    tr.feed(Edge("e", 10, 2, 4.0, None))
    assert [(r.t0, r.t1) for r in tr.finished] == [(3.0, 4.0)]
    assert tr.discarded == {"do_bench x.py:3": 1} and not tr.open and tr.ignored == 0
