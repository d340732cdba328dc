"""Putting back what a lock changed (gpuenv/clocks/restoring.py): exact, every prior state."""

from __future__ import annotations

import itertools

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import (
    local_lock as lock,
)
from gpuenv.clocks import (
    restore,
    standing_lock,
)
from gpuenv.clocks.journal import Journal
from gpuenv.errors import (
    ConfigError,
    LockConflict,
)
from gpuenv.timebase import VirtualClock

from .helpers import all_settings, settings

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


# -- what a release reads ----------------------------------------------------------------------


def test_a_release_reads_only_its_own_gpus_records(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock's owner token is in the records of its own GPUs only: its release reads
    those, under the journal's lock, and neither lists the state directory nor reads the
    other GPUs' records (gpuenvd releases one GPU at a time, with every GPU's record on
    disk: each release read them all). The other GPU's lock is left as it is."""
    sim = SimBackend("h100", n_gpus=2, clock=VirtualClock())
    uuids = [sim.device_info(i).uuid for i in (0, 1)]
    before = settings(sim)
    other = lock(1500, gpus=[1], backend=sim, journal=journal, supervise=False)
    mine = lock(1350, gpus=[0], backend=sim, journal=journal, supervise=False)
    read: list[str] = []
    listed: list[int] = []
    lookup, list_uuids = Journal.lookup, Journal.uuids
    monkeypatch.setattr(Journal, "lookup", lambda j, u: read.append(u) or lookup(j, u))
    monkeypatch.setattr(Journal, "uuids", lambda j: listed.append(1) or list_uuids(j))
    mine.release()
    assert read == [uuids[0]] and listed == []
    assert sim.truth(0).locked_sm is None and sim.truth(1).locked_sm == (1500, 1500)
    assert [e.uuid for e in journal.entries()] == [uuids[1]]
    other.release()
    assert settings(sim) == before and journal.entries() == []
