"""Clock locking on the simulated GPU: planning, exact restore, sharing, conflicts, rollback."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv import clocks
from gpuenv.backend import ReadOnlyBackend
from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import (
    LockRequest,
    lock,
    lock_status,
    plan_lock,
    read_state,
    restore,
    save_calibration,
    standing_lock,
)
from gpuenv.errors import (
    ConfigError,
    GpuenvError,
    LockConflict,
    NotSupported,
    PermissionDenied,
    ReadOnlyError,
)
from gpuenv.journal import Journal, Owner, process_start_time
from gpuenv.timebase import VirtualClock

H100 = "GPU 0 (NVIDIA H100 80GB HBM3)"


@pytest.fixture
def sim() -> SimBackend:
    return SimBackend(n_gpus=2, clock=VirtualClock())


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal")


def settings(sim: SimBackend, index: int = 0) -> tuple[object, ...]:
    t = sim.truth(index)
    return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w, t.persistence)


def all_settings(sim: SimBackend) -> list[tuple[object, ...]]:
    return [settings(sim, i) for i in range(sim.device_count())]


def dead_owner(kind: str = "process") -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(proc.pid)
    proc.wait()
    return replace(
        Owner.current(kind=kind, command="python crashed.py"), pid=proc.pid, pid_start=start
    )


# -- reading and planning ----------------------------------------------------------------------


def test_read_state_is_honest_about_locked_clocks(sim: SimBackend, journal: Journal) -> None:
    st = read_state(sim, 0, journal=journal)
    assert st.uuid == sim.device_info(0).uuid
    assert (st.app_sm_mhz, st.app_mem_mhz, st.power_limit_w, st.persistence) == (
        1980,
        2619,
        700.0,
        True,
    )
    assert st.locked_sm is None and not st.locked_known  # NVML has no getter, no journal says
    with lock(1350, backend=sim, journal=journal):
        st = read_state(sim, 0, journal=journal)
        assert st.locked_sm == (1350, 1350) and st.locked_known


def test_out_of_range_names_the_valid_range(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(ConfigError) as err:
        lock(99999, backend=sim, journal=journal)
    assert f"{H100} supports 345-1980 MHz in 15 MHz steps" in str(err.value)
    with pytest.raises(ConfigError, match="345-1980 MHz"):
        lock(100, backend=sim, journal=journal)
    assert journal.entries() == [] and settings(sim)[0] is None


def test_snaps_to_supported_clock_and_says_so(sim: SimBackend, journal: Journal) -> None:
    with lock(1352, backend=sim, journal=journal, gpus=0) as lk:
        assert sim.truth(0).locked_sm == (1350, 1350)
        assert any("1352 MHz is not a supported clock; using 1350 MHz" in n for n in lk.notes)
    with lock(1200, sm_max=1507, backend=sim, journal=journal, gpus=0):
        assert sim.truth(0).locked_sm == (1200, 1500)


@pytest.mark.parametrize(
    ("sm", "expected"),
    [
        ("max", (1980, 1980)),
        ("base", (1590, 1590)),
        ("1500", (1500, 1500)),
        ("1200,1500", (1200, 1500)),
    ],
)
def test_named_and_text_targets(
    sim: SimBackend, journal: Journal, sm: str, expected: tuple[int, int]
) -> None:
    with lock(sm, backend=sim, journal=journal, gpus=0):
        assert sim.truth(0).locked_sm == expected


def test_sustained_needs_calibration(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(
        ConfigError, match=r"no calibrated clock for GPU 0 .*run 'gpuenv calibrate' first"
    ):
        lock("sustained", backend=sim, journal=journal, gpus=0)
    save_calibration(sim.device_info(0).uuid, 1383, power_limit_w=700.0, state_dir=journal.path)
    cal = clocks.load_calibration(sim.device_info(0).uuid, state_dir=journal.path)
    assert cal is not None and cal.sustained_mhz == 1383 and cal.power_limit_w == 700.0
    with lock("sustained", backend=sim, journal=journal, gpus=0):
        assert sim.truth(0).locked_sm == (1380, 1380)  # snapped to the 15 MHz grid


def test_base_on_a_gpu_that_does_not_report_it_locks_with_tdp(journal: Journal) -> None:
    """NVML reports no base clock: lock it symbolically (CLOCK_LIMIT_TDP), like -lgc base."""
    from gpuenv.backend import CLOCK_LIMIT_TDP

    sim = SimBackend(n_gpus=1, clock=VirtualClock())
    limits = replace(sim.clock_limits(0), base_sm_mhz=None)
    sim.clock_limits = lambda index: limits  # type: ignore[method-assign]
    plan = plan_lock(sim, LockRequest(sm="base"), journal=journal)
    assert plan.gpus[0].applied.locked_sm == (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP)
    assert "base clock (TDP)" in plan.lines()[0]


def test_memory_lock_on_hopper_is_unsupported_now(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(NotSupported, match=r"Hopper.*next GPU initialisation.*drop --mem"):
        lock(1350, mem=2619, backend=sim, journal=journal)
    assert journal.entries() == [] and settings(sim)[0] is None


def test_memory_lock_where_supported(journal: Journal) -> None:
    sim = SimBackend("rtx4090", clock=VirtualClock())
    before = settings(sim)
    with lock(2000, mem=10501, backend=sim, journal=journal) as lk:
        assert sim.truth(0).locked_mem == (10501, 10501)
        assert any("persistence mode is off" in n for n in lk.notes)  # this card's default
    assert settings(sim) == before


def test_power_limit_validated(sim: SimBackend, journal: Journal) -> None:
    with pytest.raises(ConfigError, match="accepts 200-700 W"):
        lock(power_limit_w=900, backend=sim, journal=journal)
    with pytest.raises(ConfigError, match="nothing to lock"):
        lock(backend=sim, journal=journal)
    with pytest.raises(ConfigError, match="--sm-max needs --sm"):
        lock("max", sm_max=1500, backend=sim, journal=journal)
    with pytest.raises(ConfigError, match="not understood"):
        lock("fast", backend=sim, journal=journal)


def test_plan_reads_only(sim: SimBackend, journal: Journal) -> None:
    before = all_settings(sim)
    plan = plan_lock(sim, LockRequest(sm=1350, power_limit_w=500), journal=journal)
    assert [gp.index for gp in plan.gpus] == [0, 1]
    assert (
        plan.lines()[0]
        == f"{H100}: set power limit to 500 W (now 700 W), lock SM clock to 1350 MHz"
    )
    assert all_settings(sim) == before and journal.entries() == []


# -- application clocks fallback ---------------------------------------------------------------


def test_legacy_gpu_uses_application_clocks_and_restores_them(journal: Journal) -> None:
    sim = SimBackend("legacy", clock=VirtualClock())
    before = settings(sim)
    with lock(1000, backend=sim, journal=journal) as lk:
        t = sim.truth(0)
        assert t.locked_sm is None
        assert (
            t.app_sm_mhz in sim.clock_limits(0).supported_sm_mhz[715]
            and abs(t.app_sm_mhz - 1000) < 15
        )
        assert any("application clocks" in n for n in lk.notes)
    assert settings(sim) == before
    with pytest.raises(ConfigError, match="only application clocks: give one SM clock"):
        lock(900, sm_max=1100, backend=sim, journal=journal)


def test_legacy_restores_non_default_application_clocks(journal: Journal) -> None:
    sim = SimBackend("legacy", clock=VirtualClock())
    sm = sorted(sim.clock_limits(0).supported_sm_mhz[715])[10]
    sim.set_app_clocks(0, 715, sm)
    before = settings(sim)
    with lock(1189, backend=sim, journal=journal):
        assert sim.truth(0).app_sm_mhz == 1189
    assert settings(sim) == before


# -- exact restore for every combination of prior states ---------------------------------------

PRIOR = list(
    itertools.product(
        [False, True],  # application clocks set to a non-default value
        [700.0, 550.0],  # power limit
        ["none", "same", "other"],  # a standing lock already there, that the journal knows
    )
)


@pytest.mark.parametrize(("app_set", "power_w", "prior_lock"), PRIOR)
@pytest.mark.parametrize("request_power", [None, 450.0])
def test_restore_is_exact(
    journal: Journal, app_set: bool, power_w: float, prior_lock: str, request_power: float | None
) -> None:
    sim = SimBackend(n_gpus=2, clock=VirtualClock())
    if app_set:
        sim.set_app_clocks(0, 1593, 1755)
    if power_w != 700.0:
        sim.set_power_limit(1, power_w)
    pristine = all_settings(sim)
    other = None
    if prior_lock == "same":
        other = standing_lock(1350, power_limit_w=request_power, backend=sim, journal=journal)
    elif prior_lock == "other":
        other = standing_lock(1605, power_limit_w=300.0, backend=sim, journal=journal)
    before = all_settings(sim)

    if prior_lock == "other":
        with pytest.raises(LockConflict):
            lock(1350, power_limit_w=request_power, backend=sim, journal=journal)
        assert all_settings(sim) == before
        lk = lock(1350, power_limit_w=request_power, backend=sim, journal=journal, force=True)
    else:
        lk = lock(1350, power_limit_w=request_power, backend=sim, journal=journal)
    assert [sim.truth(i).locked_sm for i in (0, 1)] == [(1350, 1350)] * 2
    if request_power is not None:
        assert sim.truth(1).power_limit_w == request_power
    lk.release()

    if prior_lock == "same":
        assert all_settings(sim) == before  # the other owner's lock stays, exactly
        assert other is not None
        other.release()
    elif prior_lock == "other":
        # --force took the lock over: the ORIGINAL state comes back, not the other owner's
        assert all_settings(sim) == pristine
        assert restore(backend=sim, journal=journal) == []  # nothing left journaled
    assert all_settings(sim) == pristine
    assert journal.entries() == []


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
        assert err.value.exit_code == 3
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


def test_restore_restores_stale_and_standing_but_not_live_locks(
    sim: SimBackend, journal: Journal
) -> None:
    before = all_settings(sim)
    standing_lock(1350, gpus=0, backend=sim, journal=journal)
    live = lock(1500, gpus=1, backend=sim, journal=journal)
    with pytest.raises(LockConflict, match=f"pid {live.owner.pid}.*--all"):
        restore(backend=sim, journal=journal)
    assert settings(sim, 0) == before[0]  # the standing lock was restored before refusing
    assert sim.truth(1).locked_sm == (1500, 1500)
    assert restore(backend=sim, journal=journal, all_owners=True) == [1]
    assert all_settings(sim) == before
    assert restore(backend=sim, journal=journal) == []  # idempotent
    assert live.release() == []  # it was restored from outside: nothing left to do


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


# -- does it hold? -----------------------------------------------------------------------------


def test_lock_status_says_when_the_power_cap_pulls_below_the_lock(journal: Journal) -> None:
    sim = SimBackend(n_gpus=1, clock=VirtualClock())
    assert lock_status(sim, 0, journal).locked is None  # no gpuenv lock; NVML cannot tell more
    with lock("max", power_limit_w=300, backend=sim, journal=journal) as lk:
        for _ in range(20):
            sim.run_work(0, 2e8, power_intensity=1.0)  # a heavy load meets the 300 W cap
        st = lock_status(sim, 0, journal)
        assert st.locked and st.range == (1980, 1980) and st.holds is False
        assert "power cap" in (st.reason_if_not_held or "")
        assert lk.holds() == {0: False}
        assert "NOT held" in st.describe() and f"pid {lk.owner.pid}" in st.describe()
    with lock(900, backend=sim, journal=journal) as lk:
        sim.run_work(0, 2e8, power_intensity=1.0)
        assert lk.holds() == {0: True} and lock_status(sim, 0, journal).holds is True


# -- the real GPU, read-only (the lent device: nothing may be written) ---------------------


@pytest.mark.gpu
def test_real_gpu_plans_and_refuses_to_write(tmp_path: Path) -> None:
    from gpuenv.backend import open_backend

    gpu = open_backend("nvml", readonly=True)
    try:
        journal = Journal(tmp_path / "journal")
        st = read_state(gpu, 0, journal=journal)
        assert st.power_limit_w > 0 and st.locked_sm is None and not st.locked_known
        name = gpu.device_info(0).name
        with pytest.raises(ConfigError, match=rf"{re.escape(name)}\) supports \d+-\d+ MHz"):
            plan_lock(gpu, LockRequest(sm=99999), 0, journal=journal)
        top = max(clocks._sm_clocks(gpu.clock_limits(0)))
        plan = plan_lock(gpu, LockRequest(sm="max"), 0, journal=journal)
        assert plan.gpus[0].applied.locked_sm == (top, top)
        base = plan_lock(gpu, LockRequest(sm="base"), 0, journal=journal)
        assert base.gpus[0].applied.locked_sm is not None
        with pytest.raises(ReadOnlyError):
            lock("max", gpus=0, backend=gpu, journal=journal)
        assert journal.entries() == []
        status = lock_status(gpu, 0, journal)
        assert status.locked is None and status.holds is None
    finally:
        gpu.close()
