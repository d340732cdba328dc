"""The sampler's schedule: one read per driver refresh (DEFAULT_PERIOD_S) while nobody
waits on it, every HURRY_PERIOD_S while a caller hurries it (`Sampler.hurry`: the
conditioning waits), on virtual time, on its thread and in its process. No timing is
asserted: ticks are counted on virtual time, and on real time only whether they come."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
from server_harness import wait_for

from gpuenv.backend.sim import SimBackend
from gpuenv.conditioning import wait_until_ready
from gpuenv.reasons import HELD_DOWN
from gpuenv.telemetry import (
    DEFAULT_PERIOD_S,
    DRIVER_REFRESH_S,
    HURRY_PERIOD_S,
    Sampler,
    process,
)
from gpuenv.telemetry.reader import Reader
from gpuenv.timebase import RealClock, VirtualClock

H100_HZ = 1980e6


def make_sim() -> SimBackend:
    return SimBackend("h100", clock=VirtualClock())


def _tick_times(sampler: Sampler) -> list[float]:
    return [s.t for s in sampler.samples()]


# -- virtual time ----------------------------------------------------------------------


def test_an_idle_sampler_reads_once_per_driver_refresh():
    assert DEFAULT_PERIOD_S == DRIVER_REFRESH_S
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(1.0)
        # the start's and 10 (virtual time's sums of 0.1 may land the tenth just past 1 s)
        assert sampler.ticks == pytest.approx(1 + 1.0 / DRIVER_REFRESH_S, abs=1)


def test_a_hurried_sampler_reads_every_hurry_period_and_slows_down_after():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.5)
        before = sampler.ticks
        with sampler.hurry():
            sim.idle(1.0)
        hurried = sampler.ticks - before
        sim.idle(1.0)
        after = sampler.ticks - before - hurried
    assert hurried == pytest.approx(1.0 / HURRY_PERIOD_S, abs=1)
    assert after == pytest.approx(1.0 / DEFAULT_PERIOD_S, abs=1)


@pytest.mark.parametrize("offset", [0.0, 0.01, 0.03, 0.07, 0.099])
def test_ticks_stay_at_least_a_hurried_period_apart_across_a_hurry(offset: float):
    # a hurry that begins soon after a tick waits the rest of a hurried period; one that
    # begins later ticks at once; a hurry that ends leaves the next tick a period after
    # the last: never two reads back to back, never a gap longer than a period
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        sim.idle(0.3 + offset)
        with sampler.hurry():
            sim.idle(0.2)
        sim.idle(0.3 + offset)
    times = _tick_times(sampler)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= HURRY_PERIOD_S - 1e-9
    assert max(gaps) <= DEFAULT_PERIOD_S + 1e-9
    hurried = [g for g in gaps if g < DEFAULT_PERIOD_S - 1e-9]
    assert len(hurried) >= round(0.2 / HURRY_PERIOD_S) - 1


def test_hurries_nest_and_the_sampler_slows_only_when_the_last_one_ends():
    sim = make_sim()
    with Sampler(sim, [0]) as sampler:
        outer = sampler.hurry()
        outer.__enter__()
        with sampler.hurry():
            sim.idle(0.5)
        n = sampler.ticks
        sim.idle(0.5)  # the outer hurry still holds
        assert sampler.ticks - n == pytest.approx(0.5 / HURRY_PERIOD_S, abs=1)
        outer.__exit__(None, None, None)
        n = sampler.ticks
        sim.idle(0.5)
        assert sampler.ticks - n == pytest.approx(0.5 / DEFAULT_PERIOD_S, abs=1)


def test_a_hurry_asked_for_before_start_holds_from_the_start():
    sim = make_sim()
    sampler = Sampler(sim, [0])
    with sampler.hurry():
        sampler.start()
        sim.idle(0.5)
        sampler.stop()
    assert sampler.ticks == pytest.approx(1 + 0.5 / HURRY_PERIOD_S, abs=1)


def test_an_explicit_period_shorter_than_the_hurry_is_never_slowed():
    sim = make_sim()
    with Sampler(sim, [0], period=0.01) as sampler:
        assert sampler.hurry_period == 0.01
        with sampler.hurry():
            sim.idle(0.5)
    assert sampler.ticks == pytest.approx(1 + 50, abs=1)


def _recovery_wait(
    period: float | None, hurry_period: float = HURRY_PERIOD_S
) -> tuple[float, list[float]]:
    """A conditioning wait after 3 s of heavy load (the power cap on, then held ~0.5 s):
    seconds waited, and the sampler's tick times from the wait's start."""
    sim = make_sim()
    sim.open_context(0)
    with Sampler(sim, [0], period=period, hurry_period=hurry_period) as sampler:
        sim.idle(1.0)
        t = sim.clock.now()
        while sim.clock.now() - t < 3.0:
            sim.run_work(0, 0.05 * H100_HZ)
        end = sim.clock.now()
        assert sampler.latest().reasons & HELD_DOWN  # the wait has something to wait for
        waited, ready, _ = wait_until_ready(sampler, [0], sim.clock, since=end)
        assert ready
        return waited, [s.t - end for s in sampler.samples(end)]


def test_a_conditioning_wait_takes_as_long_as_with_the_old_25_ms_tick():
    # the old schedule ticked every 25 ms all the time: a wait hurries the new one to that
    hurried, ticks = _recovery_wait(None)
    always_fast, _ = _recovery_wait(HURRY_PERIOD_S)
    assert hurried == pytest.approx(always_fast, abs=1e-9)
    assert max(b - a for a, b in itertools.pairwise(ticks)) <= HURRY_PERIOD_S + 1e-9
    # not hurried, the wait sees the driver-refresh tick's samples only, and ends later
    slow_only, _ = _recovery_wait(None, hurry_period=DEFAULT_PERIOD_S)
    assert slow_only > hurried


# -- the Reader's loop on a virtual clock (the thread's and the process's loop) ----------


class _NoEdges:
    def requested(self) -> int:
        return 0

    def served(self, n: int) -> None:
        pass


class _Sink:
    def __init__(self) -> None:
        self.times: list[float] = []

    def fast(self, rec: tuple) -> None:  # type: ignore[type-arg]
        self.times.append(rec[0])

    def slow(self, *args: object) -> None:
        pass

    def gap(self, gap: object) -> None:
        raise AssertionError(gap)

    def slow_done(self) -> None:
        pass


def test_the_reader_loop_follows_a_hurry_that_begins_and_ends_while_it_sleeps():
    sim = make_sim()
    clock = sim.clock
    sink = _Sink()
    reader = Reader(
        sim,
        [0],
        sink,
        clock=clock,
        period=DEFAULT_PERIOD_S,
        hurry_period=HURRY_PERIOD_S,
        watch_processes=False,
    )
    start = clock.now()
    # a hurry from 0.33 s to 0.83 s: wait() returns early when it begins (a wake-up)
    events = [(start + 0.33, 1), (start + 0.83, 0)]

    def wait(seconds: float) -> None:
        target = clock.now() + seconds
        if events and events[0][0] <= target:
            at, hurrying = events.pop(0)
            clock.advance(at - clock.now())
            reader.hurrying = hurrying
            return
        clock.advance(seconds)

    reader.run(lambda: clock.now() - start >= 1.5, wait, _NoEdges())
    gaps = [b - a for a, b in zip(sink.times, sink.times[1:], strict=False)]
    assert min(gaps) >= HURRY_PERIOD_S - 1e-9 and max(gaps) <= DEFAULT_PERIOD_S + 1e-9
    inside = [t for t in sink.times if start + 0.33 <= t <= start + 0.83]
    outside = [t for t in sink.times if t > start + 0.83 + DEFAULT_PERIOD_S]
    assert len(inside) == 1 + round(0.5 / HURRY_PERIOD_S)
    assert sink.times[len(sink.times) - len(outside) - 1] <= start + 0.83 + DEFAULT_PERIOD_S
    assert all(b - a == pytest.approx(DEFAULT_PERIOD_S) for a, b in itertools.pairwise(outside))


# -- real time: the thread and the process wake for a hurry ------------------------------


@pytest.fixture
def spec_sim(tmp_path: Path):
    sim = SimBackend("h100", state_file=tmp_path / "sim.json", clock=RealClock())
    yield sim
    sim.close()
    process.close_idle()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_hurry_wakes_a_sampler_that_sleeps_a_long_period(spec_sim, mode: str):
    # a 30 s period: without the wake-up the next tick would be 30 s away
    with Sampler(spec_sim, [0], mode=mode, period=30.0, hurry_period=0.01) as sampler:
        assert sampler.mode == mode
        n = sampler.ticks
        with sampler.hurry():
            assert wait_for(lambda: sampler.ticks >= n + 3, timeout=10.0)
        n = sampler.ticks
        time.sleep(0.3)
        assert sampler.ticks <= n + 1  # slow again (one tick may have been under way)


def test_a_process_sampler_left_hurrying_at_stop_does_not_hurry_the_next_one(spec_sim):
    first = Sampler(spec_sim, [0], mode="process", period=30.0, hurry_period=0.01)
    hurry = first.hurry()
    first.start()
    hurry.__enter__()
    first.stop()  # the sampler process lingers for the next Sampler of these options
    hurry.__exit__(None, None, None)
    with Sampler(spec_sim, [0], mode="process", period=30.0, hurry_period=0.01) as second:
        assert second._proc is not None and second._proc.shared is not None
        assert second._proc.attaches == 2  # the same process
        assert second._proc.shared.hurrying == 0
        n = second.ticks
        time.sleep(0.3)
        assert second.ticks <= n + 1


def test_hurries_from_several_threads_count_once_each():
    sim = make_sim()
    sampler = Sampler(sim, [0])
    hurries = [sampler.hurry() for _ in range(8)]
    threads = [threading.Thread(target=h.__enter__) for h in hurries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sampler.hurrying == 8
    for h in hurries:
        h.__exit__(None, None, None)
    assert sampler.hurrying == 0


class _Script:
    """Edges asked for at scripted times of a virtual clock, and the wait that moves the
    clock to the next event (Reader.run's pacing, without a thread)."""

    def __init__(self, clock: VirtualClock, asks: list[float], until: float):
        self.clock, self.asks, self.until = clock, sorted(asks), until
        self.n = self.done = self.waits = 0

    def requested(self) -> int:
        return self.n

    def served(self, n: int) -> None:
        self.done = n

    def wait(self, seconds: float) -> None:
        self.waits += 1
        now = self.clock.now()
        ahead = [t for t in self.asks if t > now + 1e-9]
        self.clock.advance(max(1e-6, min([now + seconds, *ahead[:1]]) - now))
        self.n = sum(1 for t in self.asks if t <= self.clock.now() + 1e-9)

    def stopped(self) -> bool:
        return self.clock.now() >= self.until


class _Kept:
    def __init__(self) -> None:
        self.fast_t: list[float] = []
        self.edge_t: list[float] = []

    def fast(self, rec) -> None:
        self.fast_t.append(rec[0])

    def slow(self, t, gpu, reading, pids, edge, value_t) -> None:
        if edge:
            self.edge_t.append(t)

    def gap(self, gap) -> None:
        raise AssertionError(gap)

    def slow_done(self) -> None:
        pass


@pytest.mark.parametrize("second_ask", [0.0005, 0.002, 0.009])
def test_an_edge_asked_for_before_its_turn_gets_the_cheap_values_at_once(second_ask: float):
    """Edge reads (counters) come at most every EDGE_MIN_INTERVAL_S; a second edge asked
    for sooner gets a read of the cheap values within FAST_EDGE_MIN_INTERVAL_S of the last
    cheap read, and its counters on their turn: a bench call's check for two fresh samples
    after it began (its warmup's two edges) need not wait for the counters."""
    from gpuenv.telemetry.reader import EDGE_MIN_INTERVAL_S, FAST_EDGE_MIN_INTERVAL_S

    clock = VirtualClock()
    t0 = clock.now()
    first_ask = t0 + 0.05
    script = _Script(clock, [first_ask, first_ask + second_ask], until=t0 + 0.2)
    kept = _Kept()
    backend = SimBackend("h100", clock=clock)
    reader = Reader(backend, [0], kept, clock=clock, period=0.1, fast_edges=True)
    reader.run(script.stopped, script.wait, script)
    first, second = (t for t in kept.edge_t if t >= first_ask)
    assert first == pytest.approx(first_ask, abs=1e-5)
    assert second == pytest.approx(first + EDGE_MIN_INTERVAL_S, abs=1e-5)
    between = [t for t in kept.fast_t if first < t < second]
    due = max(first + FAST_EDGE_MIN_INTERVAL_S, first_ask + second_ask)
    assert between == [pytest.approx(due, abs=1e-5)]  # one cheap read, as soon as allowed
    assert script.done == 2
    # while the counters' read is pending it looks for new edges every fast interval, and
    # never spins (a wake time already past, each wait a microsecond here)
    assert script.waits < 0.15 / FAST_EDGE_MIN_INTERVAL_S + 20


def test_a_sampler_thread_reads_no_cheap_values_between_its_edge_reads():
    """On a thread (fast_edges False, Sampler's own), an early edge waits for its turn:
    each wake of a thread under a launch-bound loop costs the loop the GIL."""
    clock = VirtualClock()
    t0 = clock.now()
    script = _Script(clock, [t0 + 0.05, t0 + 0.052], until=t0 + 0.2)
    kept = _Kept()
    Reader(SimBackend("h100", clock=clock), [0], kept, clock=clock, period=0.1).run(
        script.stopped, script.wait, script
    )
    first, second = (t for t in kept.edge_t if t >= t0 + 0.05)
    assert [t for t in kept.fast_t if first < t < second] == []
    assert script.done == 2
