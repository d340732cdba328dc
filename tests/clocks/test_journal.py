"""The journal: crash-safe per-GPU records, a cross-process lock, honest owner liveness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.clocks.journal import (
    Applied,
    ClockState,
    Journal,
    JournalEntry,
    Owner,
    default_state_dir,
    process_alive,
    process_start_time,
)
from gpuenv.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _state(uuid: str = "GPU-aaaa") -> ClockState:
    return ClockState(uuid, None, None, False, 1980, 2619, 700.0, True)


def _entry(uuid: str = "GPU-aaaa", owners: tuple[Owner, ...] = ()) -> JournalEntry:
    return JournalEntry(
        uuid=uuid,
        index=0,
        name="GPU 0 (NVIDIA H100 80GB HBM3)",
        backend="sim",
        original=_state(uuid),
        applied=Applied(locked_sm=(1350, 1350), power_limit_w=500.0),
        owners=owners,
    )


def _dead_pid() -> tuple[int, float | None]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(proc.pid)
    proc.wait()
    return proc.pid, start


def test_state_dir_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "x"))
    assert default_state_dir() == tmp_path / "x"
    assert Journal().path == tmp_path / "x"


def test_state_dir_per_user_or_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUENV_STATE_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "gpuenv"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path.home() / ".local" / "state" / "gpuenv"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_state_dir() == Path("/var/lib/gpuenv")


def test_put_get_round_trip_one_file_per_uuid(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    owner = Owner.current(request="SM 1350 MHz")
    e = _entry(owners=(owner,))
    j.put(e)
    j.put(_entry("GPU-bbbb"))
    assert j.get("GPU-aaaa") == e
    assert {x.uuid for x in j.entries()} == {"GPU-aaaa", "GPU-bbbb"}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "GPU-aaaa.json",
        "GPU-aaaa.json.bak",  # the second copy, kept until the restore is confirmed
        "GPU-bbbb.json",
        "GPU-bbbb.json.bak",
        "original",  # the third copy: the state before the lock, kept apart
    ]
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == [
        "GPU-aaaa.json",
        "GPU-bbbb.json",
    ]
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    data = json.loads((tmp_path / "GPU-aaaa.json").read_text())
    assert data["owners"][0]["pid"] == os.getpid()
    assert data["original"]["power_limit_w"] == 700.0


def test_remove_is_idempotent_and_get_missing_is_none(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.put(_entry())
    j.remove("GPU-aaaa")
    j.remove("GPU-aaaa")
    assert j.get("GPU-aaaa") is None
    assert j.entries() == []
    assert Journal(tmp_path / "never-made").entries() == []


def test_damaged_file_says_which_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "GPU-aaaa.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"GPU-aaaa\.json is damaged.*restore --defaults"):
        Journal(tmp_path).get("GPU-aaaa")


def test_bad_uuid_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Journal(tmp_path).get("../etc/passwd")


def test_clean_tmp_removes_only_dead_writers_files(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.put(_entry())
    dead, _ = _dead_pid()
    stale = tmp_path / f".GPU-aaaa.json.{dead}.tmp"
    mine = tmp_path / f".GPU-bbbb.json.{os.getpid()}.tmp"
    stale.write_text("half")
    mine.write_text("in progress")
    assert j.clean_tmp() == 1
    assert not stale.exists() and mine.exists()
    assert j.get("GPU-aaaa") is not None  # a half-written tmp never shadows the record


def test_owner_liveness(tmp_path: Path) -> None:
    me = Owner.current()
    assert me.alive() and me.owner_alive()
    pid, start = _dead_pid()
    dead = replace(me, pid=pid, pid_start=start)
    assert not dead.alive()
    reused = replace(me, pid_start=(me.pid_start or 0) - 100.0)  # same pid, another start time
    assert not reused.owner_alive()
    standing = replace(dead, kind="standing")
    assert standing.alive()  # lasts until 'gpuenv restore'
    with_watchdog = replace(dead, watchdog_pid=os.getpid(), watchdog_start=me.pid_start)
    assert with_watchdog.alive() and not with_watchdog.owner_alive()


def test_zombie_counts_as_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(proc.pid)
    import time

    deadline = time.monotonic() + 10
    while process_alive(proc.pid, start) and time.monotonic() < deadline:
        time.sleep(0.01)  # exited but not reaped: a zombie
    assert not process_alive(proc.pid, start)
    proc.wait()


def test_owner_describe_names_pid_user_command_since() -> None:
    o = Owner.current(command="python bench.py")
    text = o.describe()
    assert (
        f"pid {o.pid}" in text and o.user in text and "python bench.py" in text and "since" in text
    )
    assert "gpuenv restore" in replace(o, kind="standing").describe()
    with pytest.raises(ConfigError):
        Owner.current(kind="borrowed")


def test_lock_is_reentrant_across_instances_in_one_process(tmp_path: Path) -> None:
    a, b = Journal(tmp_path), Journal(tmp_path)
    with a.locked(), b.locked():  # two fds of one process would deadlock without sharing
        b.put(_entry())
    assert a.get("GPU-aaaa") is not None


def test_concurrent_processes_never_lose_an_update(tmp_path: Path) -> None:
    """Each process appends owners read-modify-write under the lock; none may be lost."""
    Journal(tmp_path).put(_entry())
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from gpuenv.clocks.journal import Journal, Owner
        j = Journal({str(tmp_path)!r})
        for _ in range(15):
            with j.locked():
                e = j.get("GPU-aaaa")
                j.put(e.with_owners([*e.owners, Owner.current()]))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    entry = Journal(tmp_path).get("GPU-aaaa")
    assert entry is not None and len(entry.owners) == 45


def test_entry_helpers() -> None:
    a, b = Owner.current(), Owner.current()
    e = _entry(owners=(a, b))
    assert e.owner(b.token) == b and e.owner("nope") is None
    assert e.with_owners([a]).owners == (a,)
    assert e.live_owners() == [a, b]
    assert JournalEntry.from_dict(e.to_dict()) == e
    assert Applied().empty() and not e.applied.empty()


def test_a_state_dir_swapped_for_a_link_after_use_is_refused(tmp_path: Path) -> None:
    """The checked directory is kept open between writes (a walk from / each time cost
    gpuenvd ~20 walks a lease that changes a GPU): a path that no longer names that same
    directory is walked and checked again, never written through the kept descriptor."""
    from gpuenv._files import UnsafePath

    state = tmp_path / "state"
    j = Journal(state)
    j.put(_entry())
    j.remove("GPU-aaaa")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state.rename(tmp_path / "old-state")
    state.symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match="symbolic link"):
        j.put(_entry())
    with pytest.raises(UnsafePath, match="symbolic link"):
        j.get("GPU-aaaa")
    assert list(elsewhere.iterdir()) == [] and list((tmp_path / "old-state").glob("GPU-*")) == []
