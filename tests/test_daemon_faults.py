"""gpuenvd as a subprocess: clients and the daemon SIGKILLed mid-lease, a light load with
conflicts, and the live daemon fuzzed with malformed, oversized, truncated and
out-of-order messages. The figures at full size come from benchmarks/daemon.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, check_exchange, client_process, fuzz_messages
from hypothesis import HealthCheck, given, settings

from gpuenv.daemon.client import Client
from gpuenv.errors import LockConflict


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path / "d")
    d.start()
    try:
        yield d
    finally:
        d.close()


def _wait_locked(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("locked"):
        proc.kill()
        raise AssertionError(f"client failed: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return line.split()[1]


def test_sigkilled_client_is_restored_within_a_second(daemon: DaemonProcess) -> None:
    for sm in (1350, 1200):
        client = client_process(daemon.socket, sm, env=daemon.env)
        _wait_locked(client)
        assert daemon.truth(0)[0] == (sm, sm) and daemon.truth(1)[0] == (sm, sm)
        client.kill()  # SIGKILL: no finally, no atexit
        elapsed = daemon.wait_pristine(timeout=5.0)
        client.wait()
        assert elapsed is not None, "the GPUs were not restored"
        assert elapsed <= 1.0
    assert daemon.alive()


def test_sigkilled_daemon_restores_at_restart_and_keeps_standing_leases(
    daemon: DaemonProcess,
) -> None:
    client = client_process(daemon.socket, 1350, gpus="0", env=daemon.env)
    _wait_locked(client)
    with Client(daemon.socket) as c:
        standing = c.lock(sm=1500, gpus=[1], standing=True)
    daemon.kill()
    # the daemon is gone mid-lease: the GPU stays locked until someone restores it
    assert daemon.truth(0)[0] == (1350, 1350)
    assert daemon.truth(1)[0] == (1500, 1500)
    daemon.start()
    try:
        assert daemon.truth(0) == daemon.original[0]  # recovered before it listened
        assert daemon.truth(1)[0] == (1500, 1500)  # the standing lease is still held ...
        with Client(daemon.socket) as c:
            leases = c.status()["leases"]
            assert [lease["id"] for lease in leases] == [standing.id]  # ... and known
            assert c.restore([1]) == [1]
        assert daemon.pristine()
        assert "recovery" in daemon.log.read_text()
    finally:
        client.kill()
        client.wait()


def test_load_with_conflicts_loses_no_restore(daemon: DaemonProcess) -> None:
    n_clients, cycles = 8, 15
    grants = conflicts = 0
    problems: list[str] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        nonlocal grants, conflicts
        rng = random.Random(k)
        with Client(daemon.socket) as c:
            for _ in range(cycles):
                sm = rng.choice((1350, 1500))  # identical requests share, others conflict
                try:
                    lease = c.lock(sm=sm, gpus=[0])
                except LockConflict as err:
                    with lock:
                        conflicts += 1
                    if "via gpuenvd" not in str(err):
                        problems.append(f"conflict does not name the holder: {err}")
                    continue
                except Exception as err:
                    problems.append(repr(err))
                    continue
                if daemon.truth(0)[0] != (sm, sm):
                    problems.append(f"granted {sm} but the GPU is at {daemon.truth(0)[0]}")
                lease.release()
                with lock:
                    grants += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert problems == []
    assert grants + conflicts == n_clients * cycles and grants > 0 and conflicts > 0
    assert daemon.wait_pristine(timeout=5.0) is not None
    with Client(daemon.socket) as c:
        status = c.status()
    assert status["leases"] == [] and status["daemon"]["grants"] == grants


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_real_peer_credentials_refuse_a_user_not_in_the_config(tmp_path: Path) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    try:
        subprocess.run(
            [sys.executable, "-c", "import gpuenv"],
            user=nobody.pw_uid,
            check=True,
            group=nobody.pw_gid,
            extra_groups=[],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("this Python or gpuenv is not readable by 'nobody'")
    shared = Path(tempfile.mkdtemp(prefix="gpuenvd-"))
    shared.chmod(0o755)
    d = DaemonProcess(shared, n_gpus=1, config="[lock]\nuser:somebody-else = all\n")
    try:
        d.start()
        code = (
            "import sys\n"
            "from gpuenv.daemon.client import Client\n"
            "from gpuenv.errors import PermissionDenied\n"
            "c = Client(sys.argv[1])\n"
            "print(c.info['peer']['user'], c.info['may_lock'])\n"
            "try:\n"
            "    c.lock(sm=1350, gpus=[0])\n"
            "except PermissionDenied as err:\n"
            "    print('refused:', err)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, d.socket],
            env={**d.env, "HOME": "/tmp"},
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == "nobody []"
        assert "refused: nobody may not lock" in out.stdout
        assert d.pristine()
        assert "refused nobody" in d.log.read_text()
    finally:
        d.close()
        shutil.rmtree(shared, ignore_errors=True)


# -- fuzzing the live daemon -------------------------------------------------------------------


def test_fuzz_the_live_daemon(daemon: DaemonProcess) -> None:
    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(fuzz_messages)
    def run(data: bytes) -> None:
        check_exchange(daemon.socket, data)

    run()
    # out of order by hand: ends before starts, twice, and for what is not there
    for line in (
        {"op": "release", "lease": "nope"},
        {"op": "window_end", "window": 1},
        {"op": "unsubscribe"},
        {"op": "restore", "gpus": [0]},
        {"op": "hello", "versions": [99]},
    ):
        check_exchange(daemon.socket, json.dumps({"v": 1, "id": 1, **line}).encode() + b"\n")
    assert daemon.alive()
    assert daemon.wait_pristine(timeout=5.0) is not None  # leases a fuzz case took are gone
    with Client(daemon.socket) as c:
        assert c.status()["leases"] == []
    assert "Traceback" not in daemon.log.read_text()
