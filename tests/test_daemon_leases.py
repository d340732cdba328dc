"""gpuenvd's leases in-process: sharing, the queue, the journal's owners, standing leases,
and which connections are closed for idling."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from server_harness import (
    ALICE,
    BOB,
    CONFIG,
    EVE,
    ME,
    OPS,
    HandClock,
    Harness,
    h,
    serving,
    wait_for,
)

from gpuenv.clocks.journal import process_start_time
from gpuenv.daemon import holds
from gpuenv.daemon.leases import WAIT_POLL_S
from gpuenv.errors import LockConflict, PermissionDenied
from gpuenv.timebase import VirtualClock

__all__ = ["h"]  # the fixture, imported

# -- leases ---------------------------------------------------------------------------------------


def test_lease_locks_and_release_restores(h: Harness) -> None:
    with h.client(ALICE) as c:
        assert c.info["peer"]["user"] == "alice" and c.info["may_lock"] == [0, 1]
        lease = c.lock(sm=1350, gpus=[0])
        assert h.locked_sm(0) == (1350, 1350)
        assert h.locked_sm(1) is None
        status = c.status()
        assert status["gpus"][0]["leases"] == [lease.id]
        assert "alice" in status["gpus"][0]["lock"]
        lease.release()
        assert h.truth(0) == h.original[0]
        assert c.status()["leases"] == []


def test_closing_the_connection_ends_its_leases(h: Harness) -> None:
    c = h.client(ALICE)
    c.lock(sm=(1200, 1500), power_limit_w=500, gpus="0,1")
    assert h.locked_sm(0) == (1200, 1500) and h.backend.truth(1).power_limit_w == 500
    c.close()
    assert wait_for(lambda: h.truth(0) == h.original[0] and h.truth(1) == h.original[1])
    assert wait_for(lambda: h.journal.entries() == [])  # cleared right after the restore


def test_identical_requests_share_and_the_last_one_out_restores(h: Harness) -> None:
    a, b = h.client(ALICE), h.client(BOB)
    la = a.lock(sm=1350, gpus=[0])
    lb = b.lock(sm=1350, gpus=[0])
    assert lb.info["shared"] == [0]
    la.release()
    assert h.locked_sm(0) == (1350, 1350)  # bob still holds it
    lb.release()
    assert h.truth(0) == h.original[0]
    a.close()
    b.close()


def test_conflict_is_refused_naming_the_holder(h: Harness) -> None:
    with h.client(ALICE) as a, h.client(BOB) as b:
        a.lock(sm=1350, gpus=[0], label="nightly gemm")
        with pytest.raises(LockConflict) as err:
            b.lock(sm=1500, gpus=[0])
        assert "alice" in str(err.value) and "nightly gemm" in str(err.value)
        assert err.value.gpu == 0 and err.value.exit_code == 5
        assert h.locked_sm(0) == (1350, 1350)
        assert b.status()["daemon"]["refusals"] == 1


def test_wait_gets_the_lock_when_the_holder_lets_go(h: Harness) -> None:
    a, b = h.client(ALICE), h.client(BOB)
    a.lock(sm=1350, gpus=[0])
    got: list = []
    t = threading.Thread(target=lambda: got.append(b.lock(sm=1500, gpus=[0], wait=20)))
    t.start()
    assert wait_for(lambda: len(h.server.leases.waiting()) == 1)  # queued, not a fixed sleep
    assert not got and h.locked_sm(0) == (1350, 1350)
    a.close()  # alice's process ends: her lease ends, bob's wait is granted
    t.join(timeout=20)
    assert got and h.locked_sm(0) == (1500, 1500)
    b.close()
    assert wait_for(lambda: h.truth(0) == h.original[0])


def test_a_waiting_request_is_not_starved_by_newcomers_sharing_the_lock(h: Harness) -> None:
    a, b, c = h.client(ALICE), h.client(BOB), h.client(OPS)
    a.lock(sm=1350, gpus=[0])
    got: list = []
    t = threading.Thread(target=lambda: got.append(b.lock(sm=1500, gpus=[0], wait=20)))
    t.start()
    assert wait_for(lambda: len(h.server.leases.waiting()) == 1)
    # an identical request would share alice's lock, but bob asked first for another state
    with pytest.raises(LockConflict, match=r"bob \(pid \d+\), waiting since .* for SM 1500 MHz"):
        c.lock(sm=1350, gpus=[0])
    c.lock(sm=1350, gpus=[1]).release()  # other GPUs are not held up
    a.close()
    t.join(timeout=20)
    assert got and h.locked_sm(0) == (1500, 1500)
    b.close()
    c.close()
    assert wait_for(lambda: h.truth(0) == h.original[0])


def test_sharing_writes_the_journal_once_not_once_per_sharer(h: Harness) -> None:
    """Lock and release cost O(1) in the number of sharers: the journal entry is written when
    the first lease takes the GPU, and not again until the last one lets it go."""
    clients = [h.client(ALICE) for _ in range(12)]
    try:
        clients[0].lock(sm=1350, gpus=[0])
        record = h.journal.path / f"{h.backend.device_info(0).uuid}.json"
        before = os.stat(record)
        leases = [c.lock(sm=1350, gpus=[0]) for c in clients[1:]]
        assert all(lease.info["shared"] == [0] for lease in leases)
        for lease in leases[:6]:
            lease.release()
        after = os.stat(record)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        entry = h.journal.get(h.backend.device_info(0).uuid)
        assert entry is not None and len(entry.owners) == 1  # a compact record
        assert len(clients[0].status()["gpus"][0]["leases"]) == 6
    finally:
        for c in clients:
            c.close()
    assert wait_for(lambda: h.truth(0) == h.original[0] and h.journal.entries() == [])


def test_sharers_queued_behind_a_waiting_request_go_as_soon_as_it_ends(h: Harness) -> None:
    a, b, a2 = h.client(ALICE), h.client(BOB), h.client(ALICE)
    first = a.lock(sm=1350, gpus=[0])
    got_b: list = []
    got_a2: list = []
    tb = threading.Thread(target=lambda: got_b.append(b.lock(sm=1500, gpus=[0], wait=20)))
    tb.start()
    assert wait_for(lambda: len(h.server.leases.waiting()) == 1)
    # the held state, asked with a wait: it queues behind bob instead of joining alice
    ta = threading.Thread(target=lambda: got_a2.append(a2.lock(sm=1350, gpus=[0], wait=20)))
    ta.start()
    assert wait_for(lambda: len(h.server.leases.waiting()) == 2)
    assert not got_a2 and not got_b
    first.release()  # bob's turn
    tb.join(timeout=20)
    assert got_b and h.locked_sm(0) == (1500, 1500) and not got_a2
    got_b[0].release()  # and then the sharers' turn
    ta.join(timeout=20)
    assert got_a2 and h.locked_sm(0) == (1350, 1350)
    for c in (a, b, a2):
        c.close()
    assert wait_for(lambda: h.truth(0) == h.original[0])


def test_a_request_that_did_not_wait_keeps_a_turn_for_its_clock(tmp_path: Path) -> None:
    """Requests that never wait would otherwise get no turn while requests for another clock
    keep coming and waiting: a refusal keeps a place in the queue for its clock. The daemon
    runs on the test's time (HandClock): the kept turn ends when the test moves the clock
    past it (it took TURN_KEPT_S of real time, 5 s here, before)."""
    clock = HandClock()
    with serving(tmp_path, clock=clock) as h:
        _keep_a_turn(h, clock)


def _keep_a_turn(h: Harness, clock: HandClock) -> None:
    a, b, c, o = h.client(ALICE), h.client(BOB), h.client(ALICE), h.client(OPS)
    first = a.lock(sm=1350, gpus=[0])
    got_b: list = []
    tb = threading.Thread(target=lambda: got_b.append(b.lock(sm=1500, gpus=[0], wait=20)))
    tb.start()
    assert wait_for(lambda: len(h.server.leases.waiting()) == 1)
    with pytest.raises(LockConflict):  # does not wait: refused (bob is ahead), keeps a turn
        o.lock(sm=1350, gpus=[0])
    first.release()
    tb.join(timeout=20)
    assert got_b and h.locked_sm(0) == (1500, 1500)
    got_c: list = []
    tc = threading.Thread(target=lambda: got_c.append(c.lock(sm=1500, gpus=[0], wait=20)))
    tc.start()  # bob's clock, asked after the kept turn: it queues instead of sharing
    assert wait_for(lambda: len(h.server.leases.waiting()) == 1)
    assert not got_c
    got_b[0].release()
    turn = o.lock(sm=1350, gpus=[0])  # at the kept turn's place, ahead of the later request
    assert h.locked_sm(0) == (1350, 1350) and not got_c
    turn.release()
    # the GPU is free, but the kept turn is not over: the later request waits for its end
    # (a few of its polls; the release woke it at once)
    clock.advance(holds.TURN_KEPT_S * 0.9)
    time.sleep(3 * WAIT_POLL_S)
    assert not got_c and len(h.server.leases.waiting()) == 1
    clock.advance(holds.TURN_KEPT_S * 0.2)
    tc.join(timeout=20)  # and the later request goes when the kept turn is over
    assert got_c and h.locked_sm(0) == (1500, 1500)
    for client in (a, b, c, o):
        client.close()
    assert wait_for(lambda: h.truth(0) == h.original[0])


def test_a_waiting_client_that_goes_away_is_not_granted(h: Harness) -> None:
    with h.client(ALICE) as a:
        a.lock(sm=1350, gpus=[0])
        h.queue.append(BOB)
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(h.sock)
        req = {"v": 1, "id": 1, "op": "lock", "gpus": [0], "sm": 1500, "wait": 60}
        raw.sendall(json.dumps(req).encode() + b"\n")
        assert wait_for(lambda: len(h.server.leases.waiting()) == 1)  # it waits in the queue
        raw.close()
        assert wait_for(lambda: a.status()["daemon"]["refusals"] == 1)
        a.close()
    assert wait_for(lambda: h.truth(0) == h.original[0])
    assert h.server.leases.leases() == []


def test_the_journal_names_the_daemon_for_connection_leases_and_the_client_for_standing(
    h: Harness,
) -> None:
    """Connection leases of one state share one journal owner, the daemon (it is judged by
    the daemon's pid, never the client's); a standing lease, which outlives the daemon, has
    its own owner naming the client."""

    def owners(index: int) -> list:
        entry = h.journal.get(h.backend.device_info(index).uuid)
        return list(entry.owners) if entry is not None else []

    with h.client(ALICE) as c:
        first = c.lock(sm=1350, gpus=[0])
        c.lock(sm=1350, gpus=[0], label="warmup")  # shares: no journal write
        standing = c.lock(sm=1410, gpus=[1], standing=True)
        (daemon,) = owners(0)
        assert daemon.kind == "lease" and daemon.user == "gpuenvd"
        assert (daemon.pid, daemon.pid_start) == (ME, process_start_time(ME))
        assert daemon.watchdog_pid == os.getpid()
        assert daemon.watchdog_start == process_start_time(os.getpid())
        assert daemon.command.endswith("via gpuenvd") and daemon.request == "SM 1350 MHz"
        (own,) = owners(1)
        assert own.token[:12] == standing.id and own.kind == "standing"
        assert (own.pid, own.uid, own.user) == (ME, 50001, "alice")
        assert own.pid_start == process_start_time(ME)
        assert own.command.endswith("via gpuenvd") and own.watchdog_pid is None
        assert abs(own.started_at - time.time()) < 60
        gpu0 = c.status()["gpus"][0]  # the daemon names each lease's client
        assert sorted(o["user"] for o in gpu0["owners"]) == ["alice", "alice"]
        assert any(o["command"].startswith("warmup (") for o in gpu0["owners"])
        first.release()
        assert owners(0) == [daemon]  # one sharer left: nothing rewritten
        assert c.restore([1]) == [1]


def test_standing_lease_outlives_its_connection(h: Harness) -> None:
    with h.client(ALICE) as c:
        lease = c.lock(sm=1410, gpus=[1], standing=True)
    time.sleep(0.1)
    assert h.locked_sm(1) == (1410, 1410)
    with h.client(BOB) as b:  # someone else cannot end it
        with pytest.raises(PermissionDenied, match="belongs to alice"):
            b.release(lease.id)
        assert b.restore([1]) == []
    assert h.locked_sm(1) == (1410, 1410)
    with h.client(ALICE) as c:
        assert c.restore([1]) == [1]
    assert h.truth(1) == h.original[1]


def test_an_idle_connection_is_closed_and_one_holding_a_lease_is_not(tmp_path: Path) -> None:
    harness = Harness(tmp_path, config="[daemon]\nidle_timeout = 1\n" + CONFIG)
    harness.server.start()
    try:
        holder = harness.client(ALICE)
        holder.lock(sm=1350, gpus=[0])
        harness.queue.append(EVE)
        idle = socket.socket(socket.AF_UNIX)
        idle.settimeout(10)
        idle.connect(harness.sock)
        assert idle.recv(4096) == b""  # closed by the daemon, after about a second
        idle.close()
        time.sleep(1.5)
        assert holder.status()["leases"]  # the lease holder is still served
        holder.close()
    finally:
        harness.server.stop()
        harness.backend.close()


def test_two_clocks_asked_for_in_turn_without_waiting_do_not_refuse_each_other_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal by a kept turn alone keeps no turn: before, each refused request kept a
    turn that refused the next request of the other clock, asked for after its own clock's
    turn had run out, with the GPU free throughout (found by benchmarks/daemon.py: 14 of 20
    client-kill trials refused after its load phase). The daemon runs on virtual time: no
    request waits, so only the test moves its clock (the pauses take no real time)."""
    monkeypatch.setattr(holds, "TURN_KEPT_S", 0.5)
    clock = VirtualClock()
    with serving(tmp_path, clock=clock) as h:
        _ask_in_turn(h, clock)


def _ask_in_turn(h: Harness, clock: VirtualClock) -> None:
    a, b = h.client(ALICE), h.client(BOB)
    held = b.lock(sm=1350, gpus=[0])
    with pytest.raises(LockConflict):
        a.lock(sm=1500, gpus=[0])  # refused by bob's lock: keeps a turn for 1500
    held.release()
    outcomes = []
    for k in range(6):  # 1350, 1500, ... each 0.3 s after the last: inside the other's turn
        clock.sleep(0.3)
        sm = 1350 if k % 2 == 0 else 1500
        try:
            (b if sm == 1350 else a).lock(sm=sm, gpus=[0]).release()
            outcomes.append("granted")
        except LockConflict:
            outcomes.append("refused")
    assert "granted" in outcomes, f"the free GPU was refused to both clocks in turn: {outcomes}"
    # on virtual time the turns fall the same way every run: bob's first 1350 inside the
    # turn alice's refusal kept for 1500, then each clock in turn on the free GPU
    assert outcomes == ["refused"] + ["granted"] * 5
    for client in (a, b):
        client.close()
    assert wait_for(lambda: h.truth(0) == h.original[0])


def test_a_request_refused_again_and_again_plans_once(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under mixed load most requests meet a GPU held in another state (issue 31, item 5):
    each planned afresh (reading the GPU and the journal: ~0.4 ms, most of a refusal) until
    the plan is kept while leases hold the GPU; once it is free, a plan older than
    STATE_FRESH_S is made again."""
    from gpuenv.daemon import leases as leases_mod

    made = _count_plans(monkeypatch)
    monkeypatch.setattr(leases_mod, "STATE_FRESH_S", 0.0)  # every plan is old once made
    with h.client(ALICE) as alice, h.client(BOB) as bob:
        held = alice.lock(sm=1350, gpus=[0])
        for _ in range(20):
            with pytest.raises(LockConflict):
                bob.lock(sm=1500, gpus=[0])
        assert len(made) == 2  # alice's, and bob's first
        held.release()
        bob.lock(sm=1500, gpus=[0]).release()  # the GPU was free: planned (read) again
        assert len(made) == 3
        assert h.truth(0) == h.original[0]


def test_clients_that_lock_and_release_a_free_gpu_in_turn_plan_once(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that each lock and release, one after another, find the GPU free each
    time: every grant planned afresh (~0.3 ms of reads, and more on a busy machine). A plan
    is kept for STATE_FRESH_S whatever the GPU's state, and the GPU still comes back to
    exactly its prior state each time (the lock reads it again once the plan's read is
    old, or saw a lock)."""
    from gpuenv.daemon import leases as leases_mod

    made = _count_plans(monkeypatch)
    # no plan ages in this test (raising=False: the name is new with the rule)
    monkeypatch.setattr(leases_mod, "STATE_FRESH_S", 3600.0, raising=False)
    for n in range(10):
        with h.client(ALICE if n % 2 else BOB) as c:
            c.lock(sm=1350, gpus=[0]).release()
            assert h.truth(0) == h.original[0]
        with h.client(ALICE) as c:
            c.lock(sm=1500, gpus=[0]).release()
    assert len(made) == 2  # one plan for each state
    assert h.truth(0) == h.original[0] and h.journal.entries() == []


def test_a_grant_wakes_no_waiting_request_and_a_request_that_gives_up_wakes_them(
    tmp_path: Path,
) -> None:
    """Requests waiting for their turn sleep on the lease manager's condition. Each grant
    woke them all (notify_all as it left the queue): with 20 clients waiting in a batch,
    each woke for every sharer granted before it, found itself still blocked and slept
    again. A request it held up wants another state on one of its GPUs, which its lease
    holds now: a grant wakes no one. A request that leaves the queue without a grant (it
    gave up, or was refused) still wakes those behind it."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks import make_request
    from gpuenv.clocks.journal import Journal
    from gpuenv.daemon.auth import Authorizer, parse_config
    from gpuenv.daemon.leases import LeaseManager
    from gpuenv.timebase import VirtualClock

    clock = VirtualClock()
    sim = SimBackend("h100", n_gpus=2, clock=clock)
    auth = Authorizer(parse_config(CONFIG), [sim.device_info(i).uuid for i in (0, 1)])
    leases = LeaseManager(sim, Journal(tmp_path / "journal"), auth, clock)
    woken: list[int] = []
    notify_all = leases._cond.notify_all

    def counting() -> None:
        woken.append(1)
        notify_all()

    leases._cond.notify_all = counting  # type: ignore[method-assign]
    bob = leases.grant(BOB, 1, [0], make_request(1350))  # written: its GPU freed, a wake-up
    woken.clear()
    alice = leases.grant(ALICE, 2, [0], make_request(1350))  # shares: nothing written
    assert alice.shared == (0,) and woken == []
    with pytest.raises(LockConflict):  # waited 1 s on the daemon's clock, then gave up
        leases.grant(ALICE, 3, [0], make_request(1500), wait=1.0)
    assert woken == [1]
    for lease, peer in ((alice, ALICE), (bob, BOB)):
        leases.release(peer, lease.id)
    assert sim.truth(0).locked_sm is None


def _count_plans(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The requests gpuenvd plans from now on (leases.plan_lock, counted)."""
    from gpuenv.daemon import leases as leases_mod

    made: list[object] = []
    real = leases_mod.plan_lock

    def counting(*args: object, **kwargs: object) -> object:
        made.append(args[1])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(leases_mod, "plan_lock", counting)
    return made


def test_lease_waits_and_kept_turns_run_on_the_daemons_clock(tmp_path: Path) -> None:
    """The queue's waits and the turn a refusal keeps are read on the clock gpuenvd is
    given: on virtual time a 30 s wait and a kept turn's end take no real time."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks import make_request
    from gpuenv.clocks.journal import Journal
    from gpuenv.daemon.auth import Authorizer, parse_config
    from gpuenv.daemon.leases import LeaseManager
    from gpuenv.timebase import VirtualClock

    clock = VirtualClock()
    sim = SimBackend("h100", n_gpus=2, clock=clock)
    auth = Authorizer(parse_config(CONFIG), [sim.device_info(i).uuid for i in (0, 1)])
    leases = LeaseManager(sim, Journal(tmp_path / "journal"), auth, clock)
    held = leases.grant(BOB, 1, [0], make_request(1350))
    t0, real0 = clock.now(), time.monotonic()
    with pytest.raises(LockConflict):  # waited its 30 s for bob's lease, on the clock
        leases.grant(ALICE, 2, [0], make_request(1500), wait=30.0)
    assert clock.now() - t0 >= 30.0
    with pytest.raises(LockConflict):  # did not wait: keeps a turn for 1500
        leases.grant(ALICE, 2, [0], make_request(1500))
    leases.release(BOB, held.id)
    with pytest.raises(LockConflict):  # the free GPU's next turn is alice's clock
        leases.grant(BOB, 1, [0], make_request(1350))
    clock.sleep(holds.TURN_KEPT_S)  # the kept turn ends
    leases.release(BOB, leases.grant(BOB, 1, [0], make_request(1350)).id)
    assert time.monotonic() - real0 < 5.0  # 31 s of the daemon's time, no real sleep
    assert sim.truth(0).locked_sm is None
