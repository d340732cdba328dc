"""No local user can stall, starve, take over or crash gpuenvd (issue 12, problems 1-4 and 6).

Each test reproduces one attack as a real second local account (made with
`useradd --system` when the suite runs as root, as CI does; skipped otherwise)
against gpuenvd started as root on a socket in a temp dir, on the simulated GPU.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import (
    DaemonProcess,
    client_process,
    first_line,
    kill,
    local_users,
    run_as,
    shared_workdir,
    start_as,
)

from gpuenv import ops
from gpuenv.daemon.client import Client


@pytest.fixture
def work() -> Iterator[Path]:
    path = shared_workdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _daemon(work: Path, *may_lock: pwd.struct_passwd) -> DaemonProcess:
    """gpuenvd started as root on one simulated GPU; `may_lock` may lock it."""
    config = "[lock]\n" + "".join(f"user:{u.pw_name} = all\n" for u in may_lock)
    d = DaemonProcess(work, n_gpus=1, config=config)
    d.start()
    return d


@pytest.fixture
def alice_daemon(work: Path) -> Iterator[tuple[pwd.struct_passwd, DaemonProcess]]:
    """A second local account, and gpuenvd (as root) that lets it lock."""
    (alice,) = local_users(1)
    d = _daemon(work, alice)
    try:
        yield alice, d
    finally:
        d.close()


# -- 1. the journal's lock file --------------------------------------------------------------------

FLOCK = (
    "import fcntl, os, sys, time\n"
    "try:\n"
    "    fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "except OSError as err:\n"
    "    print('refused', err.strerror, flush=True)\n"
    "    sys.exit(0)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


def test_no_local_user_can_stall_the_daemon_through_the_journal_lock(work: Path) -> None:
    (mallory,) = local_users(1)
    d = DaemonProcess(work, n_gpus=1)  # root may lock
    # the state directory as an older gpuenv (and systemd's StateDirectory=) left it
    journal = work / "journal"
    journal.mkdir()
    journal.chmod(0o755)
    lock = journal / ".lock"
    lock.touch()
    lock.chmod(0o644)
    attacker = start_as(mallory, FLOCK, str(lock), env=d.env)
    try:
        assert first_line(attacker) == "held"  # it could open it, and flock it forever
        d.start(timeout=15)  # recovery takes the journal lock before the socket answers
        client = client_process(d.socket, 1350, gpus="0", env=d.env)
        try:
            assert first_line(client).startswith("locked")
            assert d.truth(0)[0] == (1350, 1350)
        finally:
            kill(client)  # SIGKILL: the daemon must restore the GPU at once
        assert d.wait_pristine(timeout=5.0) is not None
        out = subprocess.run(  # root's own restore does not hang either
            [sys.executable, "-m", "gpuenv", "restore"],
            env=d.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert stat.S_IMODE(journal.stat().st_mode) == 0o700
        private = journal / ".lock-private"  # the lock now taken: nobody else could open it
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        for path in (lock, private):
            again = run_as(mallory, FLOCK, str(path), env=d.env, timeout=30)
            assert again.stdout.startswith("refused"), again.stdout + again.stderr
    finally:
        kill(attacker)
        d.close()


def test_the_journal_is_private_and_trusts_no_lock_file_another_could_open(tmp_path: Path) -> None:
    from gpuenv.clocks.journal import Journal
    from gpuenv.errors import ConfigError

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    private = state / ".lock-private"
    private.touch()
    private.chmod(0o644)  # not ours to trust: someone may have it open
    before = private.stat().st_ino
    with Journal(state).locked():
        pass
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and private.stat().st_ino != before
    (mallory,) = local_users(1)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, mallory.pw_uid, mallory.pw_gid)
    # named as the client names a fake gpuenvd's socket owner (_files.account: one lookup)
    who = rf"belongs to {mallory.pw_name} \(uid {mallory.pw_uid}\), not to root \(uid 0\)"
    with pytest.raises(ConfigError, match=who), Journal(theirs).locked():
        pass


# -- 2. connection exhaustion ------------------------------------------------------------------

HOG = (
    "import socket, sys, time\n"
    "held = []\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    s.connect(sys.argv[1])\n"
    "    held.append(s)\n"
    "time.sleep(1.0)\n"
    "refused = 0\n"
    "for s in held:\n"
    "    s.setblocking(False)\n"
    "    try:\n"
    "        s.recv(4096)\n"
    "    except BlockingIOError:\n"
    "        continue\n"
    "    refused += 1\n"
    "print('kept', len(held) - refused, flush=True)\n"
    "time.sleep(120)\n"
)

HELLO = (
    "import sys\n"
    "from gpuenv.daemon.client import Client\n"
    "print(Client(sys.argv[1]).info['peer']['user'])\n"
)


def test_one_user_cannot_take_every_connection(work: Path) -> None:
    mallory, bob = local_users(2)
    d = _daemon(work, bob)
    hog = start_as(mallory, HOG, d.socket, "300", env=d.env)  # mallory may not even lock
    try:
        kept = int(first_line(hog).split()[1])
        assert kept == 32  # the default per-user cap
        with Client(d.socket) as root:  # root is never refused
            assert root.info["peer"]["admin"] is True
        other = run_as(bob, HELLO, d.socket, env=d.env)  # nor is another user
        assert other.stdout.strip() == bob.pw_name, other.stderr
        assert f"{mallory.pw_name} already has 32 connections" in d.log.read_text()
    finally:
        kill(hog)
        d.close()


# -- 3. a lease is owned by its connection, not by a pid -----------------------------------------

FORK_AND_EXIT = (
    "import os, sys, time\n"
    "from gpuenv.daemon.client import Client\n"
    "lease = Client(sys.argv[1]).lock(sm=1350, gpus=[0])\n"
    "child = os.fork()\n"
    "if child == 0:\n"
    "    time.sleep(120)\n"  # the child keeps the connection open
    "    os._exit(0)\n"
    "print('locked', lease.id, child, flush=True)\n"
    "os._exit(0)\n"
)

TAKE = (
    "import sys\n"
    "from gpuenv.daemon.client import Client\n"
    "from gpuenv.errors import LockConflict\n"
    "try:\n"
    "    Client(sys.argv[1]).lock(sm=1500, gpus=[0], wait=6)\n"
    "    print('granted')\n"
    "except LockConflict as err:\n"
    "    print('refused:', err)\n"
)


def test_a_live_lease_cannot_be_taken_over_when_its_first_process_exits(work: Path) -> None:
    alice, bob = local_users(2)
    d = _daemon(work, alice, bob)
    forker = start_as(alice, FORK_AND_EXIT, d.socket, env=d.env)
    child = 0
    try:
        _, lease_id, pid = first_line(forker).split()
        child = int(pid)
        forker.wait(timeout=10)  # the process that asked for the lease is gone
        out = run_as(bob, TAKE, d.socket, env=d.env)
        assert out.stdout.startswith("refused:"), out.stdout + out.stderr
        assert alice.pw_name in out.stdout
        assert d.truth(0)[0] == (1350, 1350)
        with Client(d.socket) as root:
            assert [lease["id"] for lease in root.status()["leases"]] == [lease_id]
        os.kill(child, signal.SIGKILL)  # the last process with the connection ends
        child = 0
        assert d.wait_pristine(timeout=5.0) is not None
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        kill(forker)
        d.close()


# -- 4. numbers too large for a float ------------------------------------------------------------

HUGE = (
    "import json, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "f = s.makefile('rwb')\n"
    "def ask(**req):\n"
    "    f.write(json.dumps({'v': 1, 'id': 1, **req}).encode() + b'\\n')\n"
    "    f.flush()\n"
    "    while True:\n"
    "        reply = json.loads(f.readline())\n"
    "        if 'event' not in reply:\n"
    "            return reply\n"
    "print(ask(op='lock', gpus=[0], sm=1350)['ok'])\n"
    "huge = 10 ** 400\n"
    "for req in (dict(op='lock', gpus=[0], sm=1350, power_limit_w=huge),\n"
    "            dict(op='lock', gpus=[0], sm=1350, wait=huge),\n"
    "            dict(op='lock', gpus=[0], sm=[huge, huge]),\n"
    "            dict(op='subscribe', period=huge),\n"
    "            dict(op='window_end', window=huge),\n"
    "            dict(op='hello', versions=[huge])):\n"
    "    r = ask(**req)\n"
    "    print(r['ok'], r['error']['type'])\n"
    "print(len(ask(op='status')['leases']))\n"
)


def test_a_huge_number_gets_an_error_reply_and_the_connection_lives(
    alice_daemon: tuple[pwd.struct_passwd, DaemonProcess],
) -> None:
    alice, d = alice_daemon
    out = run_as(alice, HUGE, d.socket, env=d.env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == ["True", *["False ProtocolError"] * 6, "1"]
    # the lease ends with its connection; the daemon notices the close asynchronously
    assert d.wait_pristine(timeout=5.0) is not None
    assert "Traceback" not in d.log.read_text()


# -- 6. status while the daemon is down ------------------------------------------------------------

HOLD = (
    "import sys, time\n"
    "from gpuenv.daemon.client import Client\n"
    "lease = Client(sys.argv[1]).lock(sm=1350, gpus=[0])\n"
    "print('locked', lease.id, flush=True)\n"
    "time.sleep(120)\n"
)


def test_status_shows_a_lease_whose_daemon_is_gone_as_such(
    alice_daemon: tuple[pwd.struct_passwd, DaemonProcess],
) -> None:
    alice, d = alice_daemon
    holder = start_as(alice, HOLD, d.socket, env=d.env)
    try:
        assert first_line(holder).startswith("locked")
        d.kill()  # SIGKILL: nothing restores the GPU until gpuenvd starts again
        assert holder.poll() is None  # the client itself still runs
        out = subprocess.run(
            [sys.executable, "-m", "gpuenv", "status", "--json"],
            env=d.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        lock = json.loads(out.stdout)["gpus"][0]["lock"]
        assert lock["state"] == "locked" and lock["sm_mhz"] == [1350, 1350]  # still on the GPU
        assert lock["stale"] is True and lock["owners"] == []  # but nobody holds it
        assert "gpuenvd" in lock["text"] and "is gone" in lock["text"]
        table = subprocess.run(
            [sys.executable, "-m", "gpuenv", "status"],
            env=d.env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert "(stale)" in table and "is gone" in table
        d.start()  # recovery puts it back before the socket answers
        assert d.pristine()
    finally:
        kill(holder)


# -- the systemd unit --------------------------------------------------------------------------

UNIT = ops.packaged("unit")  # the copy `gpuenv ops install unit` installs


def test_the_systemd_unit_parses(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # verify wants ExecStart to exist: point it at an executable that does
    unit = tmp_path / "gpuenvd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/gpuenv", sys.executable))
    out = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    problems = [
        line
        for line in text.splitlines()
        if "gpuenvd.service" in line
        and any(w in line for w in ("Unknown", "Invalid", "Failed", "ignoring"))
    ]
    assert problems == []


def test_the_systemd_unit_drops_what_it_does_not_need() -> None:
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    assert settings["CapabilityBoundingSet"] == "CAP_SYS_ADMIN CAP_CHOWN"
    assert settings["RestrictAddressFamilies"] == "AF_UNIX"
    assert settings["ProtectSystem"] == "strict" and settings["ProtectHome"] == "yes"
    assert settings["PrivateTmp"] == "yes" and settings["NoNewPrivileges"] == "yes"
    assert settings["StateDirectoryMode"] == "0700"
    assert "PrivateDevices" not in settings  # NVML needs /dev/nvidia*
    assert int(settings["LimitNOFILE"]) >= 4096  # not systemd's 1,024 (issue 21)
