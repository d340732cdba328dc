"""gpuenvd's hold table under concurrent grants, releases, hangups and restores: every GPU is
either free at its prior state or held by a lease, whatever order the writes land in.

The writes to the simulated GPU wait at gates (race_harness.py), so each test picks the
interleaving it wants, deterministically, with no sleeps standing in for an order."""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, metrics_port, stress
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from race_harness import ALICE, BOB, OPS, Race

from gpuenv.clocks import make_request
from gpuenv.daemon import holds
from gpuenv.daemon.client import Client
from gpuenv.errors import GpuenvError


@pytest.fixture
def race(tmp_path: Path) -> Iterator[Race]:
    r = Race(tmp_path)
    try:
        yield r
    finally:
        r.close()


def test_a_release_while_a_grant_that_shares_its_gpu_is_writing_another_leaves_no_stuck_hold(
    race: Race,
) -> None:
    """Issue 31: bob asks for GPUs 0 and 1 in the state alice holds on 0: he shares 0 and
    writes 1. Alice lets go of 0 while his write on 1 is in flight. Before, her release put
    GPU 0 back and forgot its hold, then bob's grant failed inside the daemon (KeyError: 0),
    GPU 1 stayed locked with no lease, and every request for it was refused for ever with
    "writing this GPU's lock now"."""
    m = race.manager
    alice = m.grant(ALICE, 1, [0], make_request(1350))  # not gated: written at once
    race.start("bob-grant", lambda: m.grant(BOB, 2, [0, 1], make_request(1350)))
    # bob has written GPU 1 and is about to record his grant
    assert race.advance(
        "bob-grant",
        until=lambda gate: gate.op == "acquire" and race.sim.truth(1).locked_sm is not None,
    )
    race.start("alice-release", lambda: m.release(ALICE, alice.id))
    race.advance("alice-release")  # her release ends, or waits for bob's grant to be recorded
    race.drain()
    assert not race.errors, race.errors
    bob = race.results["bob-grant"]
    # bob holds both GPUs, in his state, and the GPUs say so
    assert [lease.id for lease in m.leases()] == [bob.id]
    assert race.sim.truth(0).locked_sm == (1350, 1350)
    assert race.sim.truth(1).locked_sm == (1350, 1350)
    for gpu in (0, 1):
        assert m.gpu_status(gpu)["leases"] == [bob.id]
    m.release(BOB, bob.id)
    assert [race.truth(i) for i in (0, 1)] == race.original
    assert race.journal.entries() == []
    # and the GPUs are free for anyone, in any state
    m.release(ALICE, m.grant(ALICE, 1, [0, 1], make_request(1500)).id)
    assert [race.truth(i) for i in (0, 1)] == race.original


def test_a_failed_write_frees_every_gpu_of_the_grant(race: Race) -> None:
    """A grant whose write fails on its second GPU puts the first back and frees both: the
    next request is served, never refused as "writing this GPU's lock now"."""
    m = race.manager
    race.sim.inject_fault(1, "timeout", op="set_locked_sm_clocks", count=1)
    with pytest.raises(GpuenvError):
        m.grant(ALICE, 1, [0, 1], make_request(1350))
    assert [race.truth(i) for i in (0, 1)] == race.original
    assert race.journal.entries() == [] and m.leases() == []
    lease = m.grant(BOB, 2, [0, 1], make_request(1410))
    assert race.sim.truth(1).locked_sm == (1410, 1410)
    m.release(BOB, lease.id)
    assert [race.truth(i) for i in (0, 1)] == race.original


def test_a_restore_of_every_owner_while_a_grant_is_writing_leaves_the_gpu_free_or_held(
    race: Race,
) -> None:
    """An admin's 'restore all' lands while a lease is being written. Before, it put the GPU
    back under the grant, which then recorded a lease on a GPU at its prior state with no
    journal record; now it waits for the grant, ends it, and restores."""
    m = race.manager
    race.start("alice-grant", lambda: m.grant(ALICE, 1, [0], make_request(1350)))
    assert race.advance("alice-grant", until=lambda gate: gate.op == "set_locked_sm_clocks")
    race.start("restore-all", lambda: m.restore(OPS, [0, 1], all_owners=True))
    race.advance("restore-all")
    race.drain()
    assert not race.errors, race.errors
    held = m.leases()
    if held:  # the grant went first and is still held: the GPU is in its state, journaled
        assert race.sim.truth(0).locked_sm == (1350, 1350)
        assert race.journal.entries()
        m.release(ALICE, held[0].id)
    assert race.truth(0) == race.original[0] and race.journal.entries() == []


# -- any interleaving --------------------------------------------------------------------------

PEERS = {1: ALICE, 2: BOB, 3: ALICE}  # connection -> who is on it
OWNERS = {ALICE.uid: ALICE, BOB.uid: BOB}

_grant = st.tuples(
    st.just("grant"),
    st.sampled_from(sorted(PEERS)),
    st.sampled_from([(0,), (1,), (0, 1), (0, 1)]),
    st.sampled_from([1350, 1350, 1350, 1500]),  # mostly one state: sharing is where it breaks
    st.sampled_from(["connection", "connection", "connection", "standing", "wait"]),
)
_action = st.one_of(
    _grant,
    st.tuples(st.just("release"), st.integers(0, 3)),
    st.tuples(st.just("hangup"), st.sampled_from(sorted(PEERS))),
    st.tuples(st.just("restore-all")),
    st.tuples(st.just("metrics")),
    st.tuples(st.just("step"), st.integers(0, 7)),
    st.tuples(st.just("step"), st.integers(0, 7)),
    st.tuples(st.just("step"), st.integers(0, 7)),
)


def _start(race: Race, n: int, step: tuple) -> None:
    """Start the operation `step` names on a thread of its own."""
    m = race.manager
    kind = step[0]
    name = f"{n}-{kind}"
    if kind == "grant":
        _, conn, gpus, sm, how = step
        race.start(
            name,
            lambda: m.grant(
                PEERS[conn],
                conn,
                list(gpus),
                make_request(sm),
                standing=how == "standing",
                wait=30.0 if how == "wait" else 0.0,
            ),
        )
    elif kind == "release":
        leases = m.leases()
        if leases:
            lease = leases[step[1] % len(leases)]
            race.start(name, lambda: m.release(OWNERS[lease.uid], lease.id))
    elif kind == "hangup":
        race.start(name, lambda: m.drop(step[1]))
    elif kind == "restore-all":
        race.start(name, lambda: m.restore(OPS, [0, 1], all_owners=True))
    elif kind == "metrics":  # what a scrape reads
        race.start(
            name,
            lambda: [(m.gpu_status(i), m.lock_range(i), m.counters(), m.summary()) for i in (0, 1)],
        )
    else:
        race.step(step[1])


def _check(race: Race) -> None:
    """Every GPU no operation is changing right now is either free at its prior state, with
    no journal record, or held in its lease's state by a lease the manager knows."""
    m = race.manager
    with race.cond:
        changing = m._table.changing()
        holds = dict(m._table.holds)
        leases = {lease.id: lease for lease in m.leases()}
        for gpu in range(race.n_gpus):
            if gpu in changing:
                continue
            hold = holds.get(gpu)
            if hold is None:
                assert race.truth(gpu) == race.original[gpu], f"GPU {gpu} free but changed"
                assert race.journal.get(race.sim.device_info(gpu).uuid) is None
                continue
            assert hold.leases, f"GPU {gpu} held with no lease: {hold.describe()}"
            assert set(hold.leases) <= set(leases), f"GPU {gpu} held by a forgotten lease"
            assert race.sim.truth(gpu).locked_sm == hold.applied.locked_sm, f"GPU {gpu}"
        for lease in leases.values():
            for gpu in lease.gpus:
                if gpu not in changing:
                    assert lease.id in holds[gpu].leases, f"{lease.describe()} not on GPU {gpu}"
    internal = {k: e for k, e in race.errors.items() if not isinstance(e, GpuenvError)}
    assert not internal, f"failed inside the manager: {internal}"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_interleaving_leaves_every_gpu_free_at_its_prior_state_or_held_by_a_lease(
    data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grants (connection, standing, waiting), releases, hangups, an admin's restore of
    every owner and a scrape's reads, started in any order, each stopped before every write
    to the GPU and every turn at the hold table, and let go in any order: after every step
    each GPU is free at its prior state or held by a lease."""
    monkeypatch.setattr(holds, "TURN_KEPT_S", 0.0)  # no kept turns: the order alone decides
    with tempfile.TemporaryDirectory() as tmp:
        race = Race(Path(tmp))
        try:
            for n in range(data.draw(st.integers(0, 30), label="actions")):
                _start(race, n, data.draw(_action))
                race.settle()
                _check(race)
            while race.live():  # the rest, still in an order of the test's choosing
                if not race.step(data.draw(st.integers(0, 7), label="step")):
                    for conn in PEERS:  # only waiting requests left: end what they wait for
                        race.manager.drop(conn)
                    race.settle()
                _check(race)
            _check(race)
            for conn in PEERS:  # and at the end, everything goes back
                race.manager.drop(conn)
            race.manager.restore(OPS, [0, 1], all_owners=True)
            _check(race)
            assert race.manager.leases() == [] and race.manager._table.holds == {}
            assert [race.truth(i) for i in (0, 1)] == race.original
            assert race.journal.entries() == []
        finally:
            race.close()


# -- the stress it was found with ------------------------------------------------------------


def test_a_scrape_flood_while_clients_lock_and_release_in_a_loop_fails_no_request(
    tmp_path: Path,
) -> None:
    """Issue 31's stress, bounded: a real gpuenvd, its metrics endpoint scraped in a loop
    while three clients lock and release in a loop, on GPUs 0 and 1, on 0, and on 1, all in
    one state (so a grant often shares one GPU while it writes the other). No request fails
    inside the daemon, no GPU is left held, and scrapes are served throughout. (On this
    2-core box it did not hit the race on the old code in 3 runs: the gated tests above are
    the ones that show it. Timings are measured by benchmarks/daemon_race.py, never
    asserted here.)"""
    user = pwd.getpwuid(os.getuid()).pw_name
    d = DaemonProcess(
        tmp_path / "d", config=f"[daemon]\nmetrics = 127.0.0.1:0\n[lock]\nuser:{user} = all\n"
    )
    d.start()
    try:
        out = stress(d.socket, metrics_port(d), cycles=60, scrapers=2, lockers=((0, 1), (0,), (1,)))
        assert out.internal == [], out.internal
        assert out.failed == [], out.failed
        assert out.cycles == 3 * 60 and out.scrapes > 0
        assert d.wait_pristine(timeout=10.0) is not None, "a GPU was left changed"
        with Client(d.socket) as c:
            assert c.status()["leases"] == []
            assert c.lock(sm=1500, gpus=[0, 1]).release() is None  # both free, any state
        assert "failed" not in d.log.read_text()
    finally:
        d.close()
