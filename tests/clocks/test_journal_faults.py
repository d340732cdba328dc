"""The journal under faults: a write cut at every byte, fields garbled, records deleted,
one GPU's record damaged, the state directory turning read-only. After each, every
GPU's original state is put back exactly, or gpuenv says which record is lost and
'restore --defaults' resets that GPU (tests/journal_fault_harness.py)."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest
from journal_fault_harness import (
    BOTH_COPIES,
    KINDS,
    CutJournal,
    ReadOnlyJournal,
    machine,
    record_size,
    run_trial,
    settings,
    spoil_both,
    trial_both_copies,
)

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import local_lock as lock
from gpuenv.clocks import standing_lock
from gpuenv.clocks.journal import BACKUP, KEPT, Journal, JournalDamaged, encode
from gpuenv.clocks.restoring import JournalNotUpdated, restore, restore_defaults
from gpuenv.errors import FileError


def test_a_write_cut_at_every_byte_of_a_record_changes_nothing(tmp_path: Path) -> None:
    """Every offset of the first record, then a sweep over the other three copies."""
    sim = machine()
    journal = Journal(tmp_path / "size")
    standing_lock(sm=1350, power_limit_w=500.0, gpus="0", backend=sim, journal=journal)
    record = journal.get(sim.device_info(0).uuid)
    assert record is not None
    first = len(encode(record))
    total = record_size()
    budgets = [*range(first + 1), *range(first + 1, total + 40, 29)]
    outcomes = {run_trial("cut", tmp_path / "j", random.Random(b), b) for b in budgets}
    assert outcomes == {"exact"}


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "cut"])
def test_each_fault_restores_exactly_or_offers_defaults(kind: str, tmp_path: Path) -> None:
    rng = random.Random(13)
    n = 150 if kind == "garble" else 25
    outcomes = [run_trial(kind, tmp_path / "j", rng) for _ in range(n)]
    assert "lost" not in outcomes
    if kind in ("one_damaged_release", "readonly"):
        assert set(outcomes) == {"exact"}


# -- the cases of the issue, one by one ------------------------------------------------------


def test_a_cut_journal_fails_the_lock_before_any_setting_changes(tmp_path: Path) -> None:
    sim = machine()
    before = settings(sim)
    with pytest.raises(FileError, match=r"size limit.*GPUENV_STATE_DIR"):
        lock(
            sm=1350,
            power_limit_w=500.0,
            gpus="0,1",
            backend=sim,
            journal=CutJournal(tmp_path, 700),
            supervise=False,
        )
    assert settings(sim) == before
    # no half record, no .tmp (nor in the kept originals' directory): at most the lock file
    left = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_dir()]
    assert left in ([], [".lock-private"])


def _edit_power(path: Path, watts: float) -> None:
    doc = json.loads(path.read_text())
    doc["original"]["power_limit_w"] = watts
    path.write_text(json.dumps(doc))


def test_an_edited_value_is_detected_not_put_back(tmp_path: Path) -> None:
    """Both copies edited alike: the kept original (issue 31) is what goes back, not 300 W."""
    sim = machine()
    journal = Journal(tmp_path)
    standing_lock(power_limit_w=500.0, gpus="1", backend=sim, journal=journal)
    uuid = sim.device_info(1).uuid
    for name in (f"{uuid}.json", f"{uuid}.json{BACKUP}"):  # both copies edited alike
        _edit_power(tmp_path / name, 300.0)  # was 650
    found = journal.lookup(uuid)
    assert found.kept is not None and "checksum does not match" in found.kept
    assert restore(backend=sim, journal=journal) == [1]
    assert sim.truth(1).power_limit_w == 650.0  # the original, not the edited 300 W
    assert journal.uuids() == []


def test_all_three_copies_edited_is_damage_not_put_back(tmp_path: Path) -> None:
    sim = machine()
    journal = Journal(tmp_path)
    standing_lock(power_limit_w=500.0, gpus="1", backend=sim, journal=journal)
    uuid = sim.device_info(1).uuid
    for path in (tmp_path / f"{uuid}.json", tmp_path / f"{uuid}.json{BACKUP}"):
        _edit_power(path, 300.0)
    _edit_power(tmp_path / KEPT / f"{uuid}.json", 300.0)
    with pytest.raises(JournalDamaged, match=r"checksum does not match.*restore --defaults"):
        restore(backend=sim, journal=journal)
    assert sim.truth(1).power_limit_w == 500.0  # not the edited 300 W


def test_an_edited_main_copy_falls_back_to_the_backup(tmp_path: Path) -> None:
    sim = machine()
    journal = Journal(tmp_path)
    before = settings(sim)
    standing_lock(power_limit_w=500.0, gpus="1", backend=sim, journal=journal)
    main = tmp_path / f"{sim.device_info(1).uuid}.json"
    main.write_text(main.read_text().replace("650", "300"))
    assert restore(backend=sim, journal=journal) == [1]
    assert settings(sim) == before


def test_a_damaged_gpu_1_never_blocks_restoring_gpu_0(tmp_path: Path) -> None:
    sim = machine()
    journal = Journal(tmp_path)
    before = settings(sim)
    standing_lock(sm=1350, power_limit_w=500.0, gpus="0,1", backend=sim, journal=journal)
    uuid1 = sim.device_info(1).uuid
    for name in (f"{uuid1}.json", f"{uuid1}.json{BACKUP}", f"{KEPT}/{uuid1}.json"):
        (tmp_path / name).write_text('{"version": 2, "orig')  # all three copies
    assert restore(gpus="0", backend=sim, journal=journal) == [0]
    assert settings(sim)[0] == before[0]
    with pytest.raises(JournalDamaged) as err:
        restore(gpus="1", backend=sim, journal=journal)
    assert err.value.uuid == uuid1
    lines = restore_defaults(sim, [1], journal)
    assert "not necessarily what was there" in lines[0]
    assert sim.truth(1).locked_sm is None and sim.truth(1).power_limit_w == 700.0
    assert journal.entries() == [] and journal.scan()[1] == []


def test_a_library_release_with_one_damaged_record_restores_both(tmp_path: Path) -> None:
    sim = machine()
    journal = Journal(tmp_path)
    before = settings(sim)
    held = lock(
        sm=1350, power_limit_w=500.0, gpus="0,1", backend=sim, journal=journal, supervise=False
    )
    uuid1 = sim.device_info(1).uuid
    for name in (f"{uuid1}.json", f"{uuid1}.json{BACKUP}"):
        (tmp_path / name).write_bytes(b"\xff\x00garbage")
    held.release()
    assert settings(sim) == before
    assert journal.scan() == ([], [])


def test_release_on_a_read_only_state_dir_still_restores(tmp_path: Path) -> None:
    sim = machine()
    journal = ReadOnlyJournal(tmp_path)
    before = settings(sim)
    held = lock(sm=1350, gpus="0,1", backend=sim, journal=journal, supervise=False)
    journal.read_only = True
    with pytest.warns(UserWarning, match="restored, but the journal could not be updated"):
        held.release()
    assert settings(sim) == before
    journal.read_only = False
    # the leftover records still name this (live) process: --all clears them
    assert restore(backend=sim, journal=journal, all_owners=True) == [0, 1]
    assert settings(sim) == before and journal.entries() == []


def test_the_watchdog_is_told_only_after_the_restore(tmp_path: Path) -> None:
    sim = SimBackend(n_gpus=2, state_file=tmp_path / "sim.json")
    journal = Journal(tmp_path / "journal")
    try:
        held = lock(sm=1350, gpus="0", backend=sim, journal=journal)
        dog = held._watchdog
        assert dog is not None and dog.alive()
        sim.inject_fault(0, "timeout", op="reset_locked_sm_clocks")
        with pytest.raises(Exception, match=r"(?i)timeout|timed out"):
            held.release()
        assert dog.alive()  # not restored: it still watches, and restores when we end
        sim.clear_faults()
        restore(backend=sim, journal=journal, all_owners=True)
        dog.stop()
    finally:
        sim.close()


def test_a_journal_not_updated_is_a_warning_not_a_stranded_lock(tmp_path: Path) -> None:
    sim = machine()
    journal = ReadOnlyJournal(tmp_path)
    held = lock(power_limit_w=500.0, gpus="1", backend=sim, journal=journal, supervise=False)
    journal.read_only = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lines = held.release()
    assert lines == ["GPU 1 (NVIDIA H100 80GB HBM3): restored"]
    assert any(issubclass(w.category, UserWarning) for w in caught)
    assert sim.truth(1).power_limit_w == 650.0
    assert issubclass(JournalNotUpdated, Exception)


# -- both copies damaged (issue 31, item 3): the original kept at lock time ----------------------


@pytest.mark.parametrize("scenario", BOTH_COPIES)
def test_both_copies_damaged_still_puts_the_original_back(scenario: str, tmp_path: Path) -> None:
    """Before the kept original, 6 of these 8 reset GPU 1 to the driver's defaults (its 650 W
    lost), a directory in the records' place stranded it, and gpuenvd restarted left it
    locked."""
    assert trial_both_copies(tmp_path / "j", scenario) == "exact"


def test_a_release_says_it_used_the_kept_original(tmp_path: Path) -> None:
    """What the owner's release and the watchdog (the same lines) print when both copies of
    a record were deleted: the GPU is put back, and the line says from where."""
    sim = machine()
    try:
        prior = settings(sim)
        held = lock(sm=1350, gpus="0,1", backend=sim, journal=Journal(tmp_path), supervise=False)
        spoil_both(tmp_path, sim.device_info(1).uuid, "deleted")
        lines = held.release()
        assert settings(sim) == prior
        (gpu1,) = [ln for ln in lines if "both copies" in ln]
        assert gpu1.endswith(
            ": restored (both copies of its record were deleted; "
            "put back from the copy kept at lock time)"
        ), lines
        assert len(lines) == 2 and "kept at lock time" not in "".join(set(lines) - {gpu1})
    finally:
        sim.close()


def test_restore_says_it_used_the_kept_original(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuenv.cli import cli

    env = {
        "GPUENV_STATE_DIR": str(tmp_path / "state"),
        "GPUENV_SIM_STATE": str(tmp_path / "sim.json"),
        "GPUENV_SIM_GPUS": "2",
    }
    runner = CliRunner()
    lock_cli = ["--sim", "lock", "--sm", "1350", "--power-limit", "500"]
    assert runner.invoke(cli, lock_cli, env=env).exit_code == 0
    uuid1 = SimBackend(n_gpus=2, state_file=tmp_path / "sim.json").device_info(1).uuid
    spoil_both(tmp_path / "state", uuid1, "cut")
    doctor = runner.invoke(cli, ["--sim", "doctor"], env=env)
    assert "GPU 1's journal record: both copies of its record are damaged" in doctor.output
    assert "known only from the copy kept at lock time" in doctor.output
    result = runner.invoke(cli, ["--sim", "restore"], env=env)
    assert result.exit_code == 0, result.output
    assert "restored GPU 1" in result.output and "both copies of its record are damaged" in (
        result.output
    )
    assert "put back from the copy kept at lock time" in result.output
    again = runner.invoke(cli, ["--sim", "restore"], env=env)
    assert again.exit_code == 0 and "nothing to restore" in again.output
