"""Faults injected into the journal, and whether each GPU's original state survives
(shared by tests/clocks/test_journal_faults.py and benchmarks/journal_faults.py).

Each trial starts a simulated 2-GPU machine in a state that is not the driver's
default (application clocks on GPU 0, a 650 W power limit on GPU 1), locks both
GPUs (SM 1350 MHz, 500 W), injects one fault, and then does what a user would:
release, or 'gpuenv restore', and 'gpuenv restore --defaults' where gpuenv says
the record is lost. The outcome is one of:
  "exact"     every GPU is back in its original state;
  "defaults"  gpuenv said which GPU's record is lost (JournalDamaged, or a clock
              that looks pinned with no record) and --defaults reset it to the
              driver's defaults; every other GPU is back exactly;
  "lost"      anything else: a GPU left locked, or put back to a wrong state
              without a word (the goal is none).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks import local_lock as lock
from gpuenv.clocks import standing_lock
from gpuenv.clocks.journal import BACKUP, Journal, JournalDamaged
from gpuenv.clocks.restoring import restore, restore_defaults
from gpuenv.clocks.status import looks_pinned
from gpuenv.errors import FileError, GpuenvError
from gpuenv.timebase import VirtualClock

N_GPUS = 2
KINDS = ("cut", "garble", "delete", "one_damaged_release", "one_damaged_restore", "readonly")


def machine() -> SimBackend:
    sim = SimBackend(n_gpus=N_GPUS, clock=VirtualClock())
    sim.set_app_clocks(0, 2619, 1500)
    sim.set_power_limit(1, 650.0)
    return sim


def settings(sim: SimBackend) -> list[tuple[Any, ...]]:
    out = []
    for i in range(N_GPUS):
        t = sim.truth(i)
        out.append((t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w))
    return out


def defaults(index: int) -> tuple[Any, ...]:
    fresh = SimBackend(n_gpus=N_GPUS, clock=VirtualClock())
    try:
        return settings(fresh)[index]
    finally:
        fresh.close()


class CutJournal(Journal):
    """A journal whose writes stop after `budget` bytes in all: the last write is short,
    the next fails with EFBIG, as under RLIMIT_FSIZE or on a disk that fills."""

    def __init__(self, path: Path, budget: int):
        super().__init__(path)
        self.budget = budget
        self.written = 0

    def _os_write(self, fd: int, data: Any) -> int:  # type: ignore[override]
        n = min(len(data), self.budget - self.written)
        if n <= 0:
            raise OSError(errno.EFBIG, "File too large")
        self.written += n
        return os.write(fd, bytes(data[:n]))


class ReadOnlyJournal(Journal):
    """A journal whose directory turned read-only after the lock was taken."""

    read_only = False

    def put(self, entry: Any) -> None:
        if self.read_only:
            raise self._file_error(OSError(errno.EROFS, "Read-only file system"), self.path)
        super().put(entry)

    def remove(self, uuid: str) -> None:
        if self.read_only:
            raise self._file_error(OSError(errno.EROFS, "Read-only file system"), self.path)
        super().remove(uuid)


def _lock_both(sim: SimBackend, journal: Journal, *, standing: bool) -> Any:
    take = standing_lock if standing else lock
    kwargs = {} if standing else {"supervise": False}
    return take(sm=1350, power_limit_w=500.0, gpus="0,1", backend=sim, journal=journal, **kwargs)


def _leftovers(path: Path) -> list[str]:
    """Every file left in the state directory (the kept originals' included), its lock aside."""
    if not path.is_dir():
        return []
    return sorted(
        str(p.relative_to(path))
        for p in path.rglob("*")
        if not p.is_dir() and p.name not in (".lock", ".lock-private")
    )


def _finish(sim: SimBackend, journal: Journal, prior: list[tuple[Any, ...]]) -> str:
    """What a user does next: 'gpuenv restore'; where it names a lost record (or a
    clock looks pinned with none), 'gpuenv restore --defaults' on that GPU."""
    lost: set[int] = set()
    for _ in range(N_GPUS + 1):
        try:
            restore(backend=sim, journal=journal, all_owners=True)
            break
        except JournalDamaged as err:
            index = next(i for i in range(N_GPUS) if sim.device_info(i).uuid == err.uuid)
            lost.add(index)
            restore_defaults(sim, [index], journal)
    for i in range(N_GPUS):
        if i not in lost and settings(sim)[i] != prior[i] and looks_pinned(sim, i):
            lost.add(i)
            restore_defaults(sim, [i], journal)
    now = settings(sim)
    for i in range(N_GPUS):
        want = defaults(i) if i in lost else prior[i]
        if now[i] != want:
            return "lost"
    if _leftovers(journal.path):
        return "lost"
    return "defaults" if lost else "exact"


# -- the faults ----------------------------------------------------------------------------


def trial_cut(tmp: Path, budget: int) -> str:
    """Every write of the lock's records stops after `budget` bytes."""
    sim = machine()
    prior = settings(sim)
    journal = CutJournal(tmp, budget)
    try:
        held = _lock_both(sim, journal, standing=False)
    except FileError:
        # refused before any setting changed, and nothing half-written is left
        clean = settings(sim) == prior and not _leftovers(tmp)
        return "exact" if clean else "lost"
    held.release()
    return _finish(sim, journal, prior)


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))] or [path]
    return [path]


def garble(data: bytes, rng: random.Random) -> bytes:
    """One random edit: a field's value changed, a key removed, the file cut or a byte flipped."""
    how = rng.choice(("value", "value", "value", "drop", "cut", "flip", "non_utf8"))
    if how == "cut":
        return data[: rng.randrange(len(data))]
    if how == "flip":
        i = rng.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
    if how == "non_utf8":
        i = rng.randrange(len(data))
        return data[:i] + b"\xff\xfe" + data[i:]
    doc = json.loads(data)
    path = rng.choice(_leaves(doc))
    if not path:
        return b"[]"
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if how == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        old = parent[path[-1]]
        parent[path[-1]] = rng.choice(_replacements(old, rng))
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def _replacements(old: Any, rng: random.Random) -> list[Any]:
    out: list[Any] = [None, "x", [], {}, [1350], ["x"], True, -1, 0]
    if isinstance(old, bool):
        out.append(not old)
    elif isinstance(old, int | float):
        out += [old + 1, old - 1, old * 10, str(old), float(old) + 0.5]
    elif isinstance(old, str):
        out += [old[:-1], old + "0", old.upper()]
    return out


def _standing(tmp: Path, rng: random.Random) -> tuple[SimBackend, Any, Journal, Path]:
    """A standing lock of both GPUs; returns the machine, its prior state, the journal and
    the main copy of a random GPU's record."""
    sim = machine()
    prior = settings(sim)
    journal = Journal(tmp)
    _lock_both(sim, journal, standing=True)
    return sim, prior, journal, tmp / f"{sim.device_info(rng.randrange(N_GPUS)).uuid}.json"


def trial_garble(tmp: Path, rng: random.Random) -> str:
    """One GPU's record edited: the main copy, the backup, or both the same way."""
    sim, prior, journal, main = _standing(tmp, rng)
    copies = rng.choices(("main", "backup", "both"), weights=(45, 45, 10))[0]
    edited = garble(main.read_bytes(), rng)
    if copies in ("main", "both"):
        main.write_bytes(edited)
    if copies in ("backup", "both"):
        main.with_name(main.name + BACKUP).write_bytes(edited)
    return _finish(sim, journal, prior)


def trial_delete(tmp: Path, rng: random.Random) -> str:
    """One GPU's record deleted: the main copy, the backup, or both ('rm' as once advised)."""
    sim, prior, journal, main = _standing(tmp, rng)
    which = rng.choice(
        ((main,), (main.with_name(main.name + BACKUP),), (main, main.with_name(main.name + BACKUP)))
    )
    for path in which:
        path.unlink()
    return _finish(sim, journal, prior)


def _damage_both(tmp: Path, uuid: str) -> None:
    for name in (f"{uuid}.json", f"{uuid}.json{BACKUP}"):
        (tmp / name).write_bytes(b'{"version": 2, "uuid": "' + uuid.encode() + b'", "orig')


def trial_one_damaged_release(tmp: Path, rng: random.Random) -> str:
    """A library lock of 2 GPUs released while one GPU's record is damaged."""
    sim = machine()
    prior = settings(sim)
    journal = Journal(tmp)
    held = _lock_both(sim, journal, standing=False)
    _damage_both(tmp, sim.device_info(rng.randrange(N_GPUS)).uuid)
    held.release()  # the damaged GPU from the lock's own copy of its record
    return "exact" if settings(sim) == prior and not _leftovers(tmp) else "lost"


def trial_one_damaged_restore(tmp: Path, rng: random.Random) -> str:
    """'gpuenv restore -i 0' while GPU 1's record is damaged (and the other way round)."""
    sim = machine()
    prior = settings(sim)
    journal = Journal(tmp)
    _lock_both(sim, journal, standing=True)
    bad = rng.randrange(N_GPUS)
    good = 1 - bad
    _damage_both(tmp, sim.device_info(bad).uuid)
    restore(gpus=[good], backend=sim, journal=journal)  # must not be blocked by the other
    if settings(sim)[good] != prior[good]:
        return "lost"
    return _finish(sim, journal, prior)


def trial_readonly(tmp: Path, rng: random.Random) -> str:
    """The state directory turns read-only while the lock is held; then release."""
    sim = machine()
    prior = settings(sim)
    journal = ReadOnlyJournal(tmp)
    held = _lock_both(sim, journal, standing=False)
    journal.read_only = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        held.release()
    if settings(sim) != prior:
        return "lost"
    journal.read_only = False
    return _finish(sim, journal, prior)  # the leftover records: restore clears them


def run_trial(kind: str, tmp: Path, rng: random.Random, budget: int = 0) -> str:
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "cut":
            return trial_cut(tmp, budget)
        return globals()[f"trial_{kind}"](tmp, rng)  # type: ignore[no-any-return]
    except GpuenvError:
        return "lost"
    finally:
        for p in tmp.iterdir():
            with contextlib.suppress(OSError):
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def record_size() -> int:
    """Bytes the lock of both GPUs writes to the journal (all copies), for the cut sweep."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sim = machine()
        journal = CutJournal(Path(tmp), 10**9)
        _lock_both(sim, journal, standing=False).release()
        return journal.written


# -- both copies of a record damaged (issue 31, item 3) --------------------------------------
# Eight ways both copies of GPU 1's record are lost while its lock is held, each followed by
# what ends the lock: 'gpuenv restore' (a standing lock), the owner's release, the owner
# SIGKILLed (its watchdog restores), or gpuenvd SIGKILLed (its recovery at start restores).
# Each must come out "exact": the original state is put back from the copy kept at lock
# time, never reset to the driver's defaults.

BOTH_COPIES = (
    "restore_deleted",  # both copies deleted ('rm GPU-*'), then 'gpuenv restore'
    "restore_cut",  # both cut short (a disk tool, a crash of an editor)
    "restore_edited",  # the original's power limit edited alike in both
    "restore_not_a_file",  # both replaced by a directory
    "release_cut",  # both cut short, then the library lock released normally
    "killed_cut",  # both cut short, then the owner SIGKILLed: its watchdog restores
    "killed_deleted",  # both deleted, then the owner SIGKILLed
    "daemon_killed_cut",  # a gpuenvd lease's record cut short, gpuenvd SIGKILLed, restarted
)

OWNER = (
    "import time, gpuenv\n"
    "lk = gpuenv.lock(sm=1350, power_limit_w=500, gpus='0,1')\n"
    "print('locked', flush=True)\n"
    "time.sleep(300)\n"
)


def spoil_both(state_dir: Path, uuid: str, how: str) -> None:
    """Damage both copies of one GPU's record: deleted, cut, edited or not a file."""
    for name in (f"{uuid}.json", f"{uuid}.json{BACKUP}"):
        path = state_dir / name
        if how in ("deleted", "not_a_file"):
            path.unlink()
            if how == "not_a_file":
                path.mkdir()
        elif how == "cut":
            path.write_bytes(path.read_bytes()[:40])
        else:
            doc = json.loads(path.read_bytes())
            doc["original"]["power_limit_w"] = 300.0
            path.write_text(json.dumps(doc))


def trial_both_copies(tmp: Path, scenario: str) -> str:
    """One of BOTH_COPIES: "exact" when GPU 1's original came back (see `_finish`) by what
    ends the lock; "late" when the watchdog left it and 'gpuenv restore' put it back."""
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        if scenario.startswith("killed_"):
            return _killed(tmp, scenario.removeprefix("killed_"))
        if scenario.startswith("daemon_killed_"):
            return _daemon_killed(tmp, scenario.removeprefix("daemon_killed_"))
        sim = machine()
        prior = settings(sim)
        journal = Journal(tmp)
        held = _lock_both(sim, journal, standing=scenario.startswith("restore_"))
        spoil_both(tmp, sim.device_info(1).uuid, scenario.split("_", 1)[1])
        if scenario.startswith("release_"):
            held.release()
        return _finish(sim, journal, prior)
    except GpuenvError:
        return "lost"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _killed(tmp: Path, how: str) -> str:
    """A process locks both GPUs (with its watchdog), both copies of GPU 1's record are
    damaged, the process is SIGKILLed; then what its watchdog left is judged."""
    import subprocess
    import sys

    import gpuenv
    from gpuenv.clocks.records import process_alive

    sim = SimBackend(n_gpus=N_GPUS, state_file=tmp / "sim.json")
    try:
        sim.set_app_clocks(0, 2619, 1500)
        sim.set_power_limit(1, 650.0)
        prior = settings(sim)
        journal = Journal(tmp / "journal")
        env = {
            **os.environ,
            "GPUENV_BACKEND": "sim",
            "GPUENV_SIM_STATE": str(tmp / "sim.json"),
            "GPUENV_SIM_GPUS": str(N_GPUS),
            "GPUENV_STATE_DIR": str(journal.path),
        }
        env.pop("GPUENV_READONLY", None)
        # the gpuenv this process runs (a checkout under test), not one from the cwd
        env["PYTHONPATH"] = str(Path(gpuenv.__file__).resolve().parent.parent)
        owner = subprocess.Popen(
            [sys.executable, "-c", OWNER],
            env=env,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert owner.stdout is not None
            if owner.stdout.readline() != b"locked\n":
                return "lost"
            entry = journal.get(sim.device_info(1).uuid)
            dog = entry.owners[0].watchdog_pid if entry is not None else None
            spoil_both(journal.path, sim.device_info(1).uuid, how)
            owner.kill()
            owner.wait(timeout=10)
            deadline = time.monotonic() + 20
            while dog is not None and process_alive(dog, None) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            if owner.poll() is None:
                owner.kill()
            owner.communicate(timeout=10)
        if settings(sim) != prior or _leftovers(journal.path):
            # the watchdog did not put it back: "late" when a user's 'gpuenv restore' did
            outcome = _finish(sim, journal, prior)
            return "late" if outcome == "exact" else outcome
        return "exact"
    finally:
        sim.close()


def _daemon_killed(tmp: Path, how: str) -> str:
    """gpuenvd holds a lease on both GPUs, both copies of GPU 1's record are damaged,
    gpuenvd is SIGKILLed and started again: its recovery must put the original back."""
    from daemon_harness import DaemonProcess, state_tuple

    import gpuenv
    from gpuenv.daemon.client import Client

    d = DaemonProcess(tmp, n_gpus=N_GPUS)
    d.env["PYTHONPATH"] = str(Path(gpuenv.__file__).resolve().parent.parent)  # this gpuenv
    try:
        d.backend.set_app_clocks(0, 2619, 1500)
        d.backend.set_power_limit(1, 650.0)
        prior = [state_tuple(d.backend, i) for i in range(N_GPUS)]
        d.start()
        with Client(d.socket) as c:
            c.lock(sm=1350, power_limit_w=500.0, gpus=[0, 1])
            spoil_both(tmp / "journal", d.backend.device_info(1).uuid, how)
            d.kill()
        d.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if [state_tuple(d.backend, i) for i in range(N_GPUS)] == prior:
                break
            time.sleep(0.02)
        back = [state_tuple(d.backend, i) for i in range(N_GPUS)] == prior
        return "exact" if back and not _leftovers(tmp / "journal") else "lost"
    finally:
        d.close()
