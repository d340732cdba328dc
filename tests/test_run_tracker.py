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


def test_summariser_windows_are_those_of_the_whole_ring(monkeypatch):
    """The summariser copies the ring from its first interval on, not whole: the windows
    are the same as those made from the whole ring (wrapped, so truncated)."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.run.tracker import Summariser
    from gpuenv.telemetry import Sampler
    from gpuenv.telemetry.buffers import WindowInputs
    from gpuenv.timebase import VirtualClock

    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    with Sampler(sim, [0], capacity=512, period=0.025) as sampler:  # 12.8 s
        sim.idle(4.0)
        busy = sim.clock.now() - 0.0125  # between two samples: the one in force is idle
        sim.run_work(0, 3 * 1980e6, power_intensity=0.9)
        idle = sim.clock.now() - 0.0125
        sim.idle(8.0)  # the ring wrapped
        now = sim.clock.now()
        fast = sampler.samples(gpu=0)
        # from between two samples far apart in power
        k = next(
            k
            for k, s in enumerate(fast)
            if s.t > busy and abs(s.power_instant_w - fast[k + 1].power_instant_w) > 100
        )
        step = (fast[k].t + fast[k + 1].t) / 2
        intervals = [
            (fast[0].t - 0.5, fast[3].t),
            (busy, busy + 1.0),
            (step, step + 0.5),
            (idle, idle + 1.5),
            (now - 1.0, now),
        ]
        got = [Summariser(sampler, [0]).windows(intervals, 0)]
        got += [Summariser(sampler, [0]).windows([one], 0) for one in intervals]

        # the driver's power samples the sampler holds, all of them (drained every second
        # as it ran; its ring keeps `capacity` of them too)
        power = sampler.window_inputs(float("-inf"), 0).power

        def whole_ring(t0: float, gpu: int | None = None) -> WindowInputs:
            everything = sampler.samples(gpu=0)
            return WindowInputs(
                everything,
                sampler.slow_samples(gpu=0),
                sampler.gaps,
                len(everything) == sampler.capacity,
                power,
            )

        monkeypatch.setattr(sampler, "window_inputs", whole_ring)
        want = [Summariser(sampler, [0]).windows(intervals, 0)]
        want += [Summariser(sampler, [0]).windows([one], 0) for one in intervals]
        assert got == want
        assert got[0][0].gap and not any(w.gap for w in got[0][1:])  # began before the ring


def test_facts_merge_into_their_open_region_and_stray_ones_are_ignored():
    tr = RegionTracker()
    tr.feed(Edge("b", 10, 1, 1.0, "vadd size=4096"))
    tr.feed(Edge("l", 10, 1, 0.0, None, {"site": "do_bench b.py:3"}))
    tr.feed(Edge("l", 10, 1, 0.0, None, {"returned_s": 0.001}))
    tr.feed(Edge("e", 10, 1, 2.0, None))
    tr.feed(Edge("l", 10, 1, 0.0, None, {"late": True}))  # after its end: no region to take it
    assert tr.finished[0].meta == {"site": "do_bench b.py:3", "returned_s": 0.001}
    assert tr.ignored == 1
