"""Taking a lock (gpuenv/clocks/locks.py): share, conflict, stale owners, all or nothing."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.backend import ReadOnlyBackend
from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import (
    Lock,
    LockPlan,
    lock_status,
    make_request,
    plan_lock,
    restore,
    standing_lock,
)
from gpuenv.clocks import (
    local_lock as lock,
)
from gpuenv.clocks.journal import Journal, Owner
from gpuenv.clocks.locks import DYING_WAIT_S, STATE_FRESH_S
from gpuenv.clocks.supervisor import Watchdog
from gpuenv.errors import (
    ConfigError,
    GpuenvError,
    LockConflict,
    NotSupported,
    PermissionDenied,
    ReadOnlyError,
)
from gpuenv.timebase import VirtualClock

from .helpers import all_settings, dead_owner

# -- sharing, conflicts, stale owners ----------------------------------------------------------


def test_identical_requests_share_and_the_last_one_out_restores(
    sim: SimBackend, journal: Journal
) -> None:
    before = all_settings(sim)
    a = lock(1350, backend=sim, journal=journal)
    b = lock(1350, backend=sim, journal=journal)
    assert b.shared == [0, 1] and a.shared == []
    entry = journal.get(sim.device_info(0).uuid)
    assert entry is not None and len(entry.owners) == 2
    a.release()
    assert sim.truth(0).locked_sm == (1350, 1350)  # b still holds it
    b.release()
    assert all_settings(sim) == before and journal.entries() == []


def test_conflict_names_the_owner(sim: SimBackend, journal: Journal) -> None:
    with lock(1350, backend=sim, journal=journal, command="python train.py") as held:
        with pytest.raises(LockConflict) as err:
            lock(1500, backend=sim, journal=journal)
        text = str(err.value)
        assert f"pid {held.owner.pid}" in text and held.owner.user in text
        assert "python train.py" in text and "since" in text and "SM 1350 MHz" in text
        assert err.value.exit_code == 5
        assert sim.truth(0).locked_sm == (1350, 1350)


def test_multi_gpu_conflict_changes_nothing(sim: SimBackend, journal: Journal) -> None:
    with lock(1350, gpus=1, backend=sim, journal=journal):
        with pytest.raises(LockConflict):
            lock(1500, gpus="0,1", backend=sim, journal=journal)
        assert sim.truth(0).locked_sm is None  # GPU 0 was free, but all or nothing
        assert journal.get(sim.device_info(0).uuid) is None


def test_stale_owner_is_cleaned_up_with_exact_restore(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    lk = lock(1500, power_limit_w=400, backend=sim, journal=journal, supervise=False)
    dead = dead_owner()
    for e in journal.entries():  # the owner was SIGKILLed and had no watchdog
        journal.put(e.with_owners([dead]))
    lk._released = True  # forget it in this process: it "died"
    st = lock_status(sim, 0, journal)
    assert st.locked and st.stale and "has ended" in (st.owner or "")
    with lock(1350, backend=sim, journal=journal):
        assert sim.truth(0).locked_sm == (1350, 1350)
        # the stale lock's power limit was put back first
        assert sim.truth(0).power_limit_w == 700.0
    assert all_settings(sim) == before and journal.entries() == []


def test_a_dying_owners_watchdog_is_waited_for_on_the_gpus_clock(
    sim: SimBackend, journal: Journal
) -> None:
    # the wait for a dead owner's watchdog slept on the wall clock (3 s a test); it is on
    # the GPU's clock now: a simulated GPU's virtual one waits no real time
    before = all_settings(sim)
    lk = lock(1500, power_limit_w=400, backend=sim, journal=journal, supervise=False)
    me = Owner.current()  # a watchdog that stays alive: this very process
    dying = replace(dead_owner(), watchdog_pid=me.pid, watchdog_start=me.pid_start)
    for e in journal.entries():  # the owner died; its watchdog never finishes restoring
        journal.put(e.with_owners([dying]))
    lk._released = True
    t0, real0 = sim.clock.now(), time.monotonic()
    with lock(1350, backend=sim, journal=journal, supervise=False):
        assert sim.clock.now() - t0 >= DYING_WAIT_S  # waited, then cleaned up itself
        assert time.monotonic() - real0 < DYING_WAIT_S
        assert sim.truth(0).locked_sm == (1350, 1350) and sim.truth(0).power_limit_w == 700.0
    assert all_settings(sim) == before and journal.entries() == []


def test_force_takes_over_a_live_lock(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    a = lock(1500, power_limit_w=400, backend=sim, journal=journal)
    b = lock(1350, backend=sim, journal=journal, force=True)
    assert any("took over from" in n for n in b.notes)
    assert sim.truth(0).power_limit_w == 700.0  # a's power limit was put back
    a.release()  # a no longer owns anything: touches nothing
    assert sim.truth(0).locked_sm == (1350, 1350)
    b.release()
    assert all_settings(sim) == before


# -- one read of the GPU's state and one conflict check per lock ---------------------------------


def test_a_lock_taken_between_planning_and_applying_is_refused(
    sim: SimBackend, journal: Journal
) -> None:
    plan = plan_lock(sim, make_request(1500), journal=journal)  # both GPUs free now
    with lock(1350, gpus=1, backend=sim, journal=journal, command="python other.py") as other:
        with pytest.raises(LockConflict) as err:
            Lock(sim, plan, journal, supervise=False)
        assert f"pid {other.owner.pid}" in str(err.value) and "python other.py" in str(err.value)
        assert sim.truth(0).locked_sm is None and sim.truth(1).locked_sm == (1350, 1350)
        assert journal.get(sim.device_info(0).uuid) is None  # all or nothing
        entry = journal.get(sim.device_info(1).uuid)
        assert entry is not None and [o.token for o in entry.owners] == [other.token]


def test_the_same_lock_taken_meanwhile_is_shared_and_its_original_kept(
    sim: SimBackend, journal: Journal
) -> None:
    before = all_settings(sim)
    plan = plan_lock(sim, make_request(1350, power_limit_w=500), journal=journal)
    with lock(1350, power_limit_w=500, backend=sim, journal=journal):
        late = Lock(sim, plan, journal, supervise=False)
        assert late.shared == [0, 1]
        late.release()
        assert sim.truth(0).power_limit_w == 500.0  # the first still holds it
    assert all_settings(sim) == before


def test_a_refused_lock_starts_no_watchdog(
    tmp_path: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend(n_gpus=1, clock=VirtualClock(), state_file=tmp_path / "sim.json")
    started: list[int] = []
    real_start = Watchdog.start.__func__  # type: ignore[attr-defined]

    def start(cls: type[Watchdog], *args: object, **kw: object) -> Watchdog:
        dog = real_start(cls, *args, **kw)
        started.append(dog.pid)
        return dog

    monkeypatch.setattr(Watchdog, "start", classmethod(start))
    with lock(1350, backend=sim, journal=journal) as held:  # a process lock: watched
        assert started == [held.owner.watchdog_pid]
        with pytest.raises(LockConflict):
            lock(1500, backend=sim, journal=journal)
        assert len(started) == 1
    sim.close()


def test_a_lock_journals_the_state_its_plan_read(
    sim: SimBackend, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    persistence = sim.persistence_mode
    monkeypatch.setattr(sim, "persistence_mode", lambda i: reads.append(i) or persistence(i))
    looks: list[str] = []
    get = journal.get
    monkeypatch.setattr(journal, "get", lambda uuid: looks.append(uuid) or get(uuid))
    held = lock(1350, power_limit_w=500, backend=sim, journal=journal, supervise=False)
    assert sorted(reads) == [0, 1]  # once per GPU: the plan's read is the one journaled
    uuids = [sim.device_info(i).uuid for i in (0, 1)]
    assert looks == uuids * 2  # the plan's read, then the one check, under the journal's lock
    assert [r.original for r in held.records] == [gp.current for gp in held.plan.gpus]
    held.release()


def test_an_old_plan_reads_the_state_again_under_the_journal_lock(
    sim: SimBackend, journal: Journal
) -> None:
    plan = plan_lock(sim, make_request(1350, power_limit_w=500), gpus=0, journal=journal)
    sim.set_power_limit(0, 650)  # changed outside gpuenv (nvidia-smi -pl) after planning
    old = sim.clock.now() - STATE_FRESH_S - 1  # read on the GPU's clock, as the plan does
    plan = LockPlan(plan.request, tuple(replace(gp, unlocked_at=old) for gp in plan.gpus))
    held = Lock(sim, plan, journal, supervise=False)
    assert held.records[0].original.power_limit_w == 650.0
    held.release()
    assert sim.truth(0).power_limit_w == 650.0  # what was there when the lock was taken


# -- all or nothing ----------------------------------------------------------------------------


def test_failure_on_gpu1_rolls_back_gpu0(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    sim.inject_fault(1, "not_supported", op="set_locked_sm_clocks")
    with pytest.raises(NotSupported):
        lock(1350, power_limit_w=500, backend=sim, journal=journal)
    assert all_settings(sim) == before and journal.entries() == []


def test_failed_rollback_keeps_the_journal_for_restore(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    sim.inject_fault(1, "not_supported", op="set_locked_sm_clocks")
    sim.inject_fault(0, "timeout", op="reset_locked_sm_clocks", count=1)
    with pytest.raises(GpuenvError, match=r"rolling back also failed.*gpuenv restore"):
        lock(1350, backend=sim, journal=journal)
    assert sim.truth(0).locked_sm == (1350, 1350)
    entry = journal.get(sim.device_info(0).uuid)
    assert entry is not None and entry.owners == ()
    sim.clear_faults()
    assert restore(backend=sim, journal=journal) == [0]
    assert all_settings(sim) == before and journal.entries() == []


def test_no_permission_changes_nothing_and_says_what_to_do(journal: Journal) -> None:
    sim = SimBackend(n_gpus=2, clock=VirtualClock(), root=False)
    with pytest.raises(PermissionDenied, match=r"run as root.*gpuenv daemon"):
        lock(1350, backend=sim, journal=journal)
    assert journal.entries() == []


# -- the Lock object ---------------------------------------------------------------------------


def test_exception_in_body_restores(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    with (
        pytest.raises(KeyboardInterrupt),
        lock(1350, power_limit_w=500, backend=sim, journal=journal),
    ):
        raise KeyboardInterrupt
    assert all_settings(sim) == before and journal.entries() == []


def test_no_reentry_and_release_idempotent(sim: SimBackend, journal: Journal) -> None:
    lk = lock(1350, backend=sim, journal=journal)
    with lk, pytest.raises(ConfigError, match="not re-entrant"), lk:
        pass
    assert lk.released and lk.release() == []
    with pytest.raises(ConfigError, match="released"), lk:
        pass


# -- read-only ------------------------------------------------------------------------


def test_read_only_changes_nothing_not_even_the_journal(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    ro = ReadOnlyBackend(sim, reason="--dry-run")
    with pytest.raises(ReadOnlyError, match=r"lock SM clock to 1350 MHz.*--dry-run"):
        lock(1350, backend=ro, journal=journal)
    assert all_settings(sim) == before and journal.entries() == []
    standing_lock(1350, backend=sim, journal=journal)
    with pytest.raises(ReadOnlyError, match="reset locked SM clocks"):
        restore(backend=ro, journal=journal)
    assert sim.truth(0).locked_sm == (1350, 1350) and len(journal.entries()) == 2
