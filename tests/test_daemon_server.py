"""gpuenvd in-process: who may do what, windows, streams, bad requests, recovery.

The server runs on threads in this process over a real Unix socket, on the
simulated GPU with a state file. `peer_of` is injected so one test can play
several users (the kernel's SO_PEERCRED would say every connection is us);
SO_PEERCRED itself is tested in test_daemon_auth.py and by the subprocess tests.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from server_harness import ALICE, BOB, CONFIG, EVE, ME, OPS, Harness, h

from gpuenv.backend.sim import SimBackend
from gpuenv.daemon.auth import Peer, parse_config
from gpuenv.daemon.client import Client, DaemonUnavailable, daemon_available
from gpuenv.daemon.server import Server
from gpuenv.errors import ConfigError, PermissionDenied

__all__ = ["h"]  # the fixture, imported


# -- who may do what ---------------------------------------------------------------------------


def test_a_user_not_in_the_config_is_refused(h: Harness) -> None:
    with h.client(EVE) as c:
        assert c.info["may_lock"] == []
        with pytest.raises(PermissionDenied) as err:
            c.lock(sm=1350, gpus=[0])
        assert "eve may not lock" in str(err.value) and "user:eve" in str(err.value)
        assert c.status()["gpus"][0]["index"] == 0  # reading is allowed
    assert h.truth(0) == h.original[0]


def test_gpus_outside_the_users_rules_are_refused(h: Harness) -> None:
    with h.client(BOB) as b:  # user:bob = 0, group:bench = 1
        assert b.info["may_lock"] == [0, 1]
    carol = Peer(pid=ME, uid=50005, gid=50005, user="carol", groups=frozenset({"bench"}))
    with h.client(carol) as c:
        assert c.info["may_lock"] == [1]
        with pytest.raises(PermissionDenied):
            c.lock(sm=1350, gpus=[0, 1])  # all or nothing: GPU 1 is not touched either
        c.lock(sm=1350, gpus=[1]).release()
    assert h.truth(0) == h.original[0] and h.truth(1) == h.original[1]


def test_a_user_cannot_release_anothers_lease_but_an_admin_can(h: Harness) -> None:
    with h.client(ALICE) as a, h.client(BOB) as b, h.client(OPS) as ops:
        lease = a.lock(sm=1350, gpus=[0])
        with pytest.raises(PermissionDenied, match="alice"):
            b.release(lease.id)
        assert h.locked_sm(0) == (1350, 1350)
        assert ops.info["peer"]["admin"] is True
        ended = ops.release(lease.id)
        assert ended["id"] == lease.id
        assert h.truth(0) == h.original[0]
        with pytest.raises(ConfigError, match="no lease"):
            a.release(lease.id)


def test_admin_restore_all_ends_every_lease(h: Harness) -> None:
    with h.client(ALICE) as a, h.client(OPS) as ops:
        a.lock(sm=1350, gpus=[0])
        a.lock(sm=1500, gpus=[1], standing=True)
        assert sorted(ops.restore(all_owners=True)) == [0, 1]
        assert h.server.leases.leases() == []
        assert h.truth(0) == h.original[0] and h.truth(1) == h.original[1]


def test_bad_lock_requests_say_what_is_valid(h: Harness) -> None:
    with h.client(ALICE) as c:
        with pytest.raises(ConfigError, match="345-1980 MHz"):
            c.lock(sm=99999 - 1, gpus=[0])
        with pytest.raises(ConfigError, match="nothing to lock"):
            c.lock(gpus=[0])
        with pytest.raises(ConfigError, match="no GPU matches"):
            c.lock(sm=1350, gpus=[7])
        with pytest.raises(ConfigError, match="CUDA numbering"):
            c.lock(sm=1350, gpus="cuda:0")
    assert h.journal.entries() == []


# -- telemetry -------------------------------------------------------------------------------


def test_window_is_answered_from_the_daemons_sampler(h: Harness) -> None:
    with h.client(ALICE) as c, c.lock(sm=1350, gpus=[0]):
        h.backend.open_context(0)
        with c.window(gpus=[0]) as windows:
            time.sleep(0.35)
        h.backend.close_context(0)
    (w,) = windows
    assert w.gpu == 0 and w.n_samples >= 2
    assert w.sm_mhz_max == 1350 and w.lock_held is True
    assert 0.3 < w.duration_s < 5


def test_window_end_out_of_order_is_an_error_not_a_crash(h: Harness) -> None:
    with h.client(ALICE) as c:
        with pytest.raises(Exception, match="no open window"):
            c.window_end(12345)
        wid = c.window_start()
        c.window_end(wid)
        with pytest.raises(Exception, match="no open window"):
            c.window_end(wid)  # each window ends once
        assert c.status()["daemon"]["pid"] == os.getpid()


def test_subscribe_streams_samples_and_lease_events(h: Harness) -> None:
    with h.client(OPS) as mon, h.client(ALICE) as a:
        stream = mon.subscribe(period=0.05, events=True)
        first = next(stream)
        assert first["event"] == "samples"
        a.lock(sm=1350, gpus=[0]).release()
        seen = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and {"granted", "released"} - seen:
            msg = next(stream)
            if msg["event"] == "lease":
                seen.add(msg["action"])
        assert seen == {"granted", "released"}
        assert mon.call("unsubscribe")["stopped"]


def test_lease_events_wait_for_no_one_when_nobody_asked_for_them(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a grant and a release queue an event only while some connection subscribed to events
    # (each queued one woke the dispatcher thread: a share of every lease's CPU, for no one)
    queued: list[str] = []
    put = h.server._events.put_nowait

    def counted(item: Any) -> None:
        queued.append(item[0])
        put(item)

    monkeypatch.setattr(h.server._events, "put_nowait", counted)
    with h.client(OPS) as mon, h.client(ALICE) as a:
        stream = mon.subscribe(period=0.05, events=False)  # samples only
        next(stream)
        assert not h.server.conns.watching()
        for _ in range(3):
            a.lock(sm=1350, gpus=[0]).release()
        assert queued == []
        assert mon.call("unsubscribe")["stopped"]
        with h.client(BOB) as b:
            watch = b.subscribe(period=0.05)  # events too (the default)
            next(watch)
            assert h.server.conns.watching()
            a.lock(sm=1350, gpus=[0]).release()
            actions: set[str] = set()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and {"granted", "released"} - actions:
                msg = next(watch)
                if msg["event"] == "lease":
                    actions.add(msg["action"])
            assert actions == {"granted", "released"} and queued == ["granted", "released"]
        deadline = time.monotonic() + 5  # its connection closed: the server drops it
        while h.server.conns.watching() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not h.server.conns.watching()


# -- the wire ----------------------------------------------------------------------------------


def _raw(h: Harness, data: bytes, peer: Peer = ALICE) -> list[dict]:
    h.queue.append(peer)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(h.sock)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return [json.loads(line) for line in out.splitlines()]


def test_malformed_requests_get_error_replies(h: Harness) -> None:
    lines = [
        b"not json",
        b"[1,2,3]",
        b'{"v": 1, "id": 5, "op": "launch_missiles"}',
        b'{"v": 99, "id": 6, "op": "hello"}',
        b'{"v": 1, "id": 7, "op": "lock", "gpus": [0], "sm": "fast"}',
        b'{"v": 1, "id": 8, "op": "lock", "gpus": [0], "sm": 1350, "color": "red"}',
        b'{"v": 1, "id": 9, "op": "release"}',
        b'{"v": 1, "id": 10, "op": "lock", "sm": NaN}',
        b"\xff\xfe",
        b'{"v": 1, "id": 11, "op": "status"}',
    ]
    replies = _raw(h, b"\n".join(lines) + b"\n")
    assert len(replies) == len(lines)
    assert [r["ok"] for r in replies] == [False] * 9 + [True]
    assert {r["error"]["type"] for r in replies[:-1]} == {"ProtocolError"}
    assert [r["id"] for r in replies[2:]] == [5, 6, 7, 8, 9, None, None, 11]  # NaN: not JSON
    assert "launch_missiles" in replies[2]["error"]["message"]
    assert h.journal.entries() == []


def test_an_oversized_line_is_refused_and_the_connection_goes_on(h: Harness) -> None:
    big = b'{"v": 1, "id": 1, "op": "status", "pad": "' + b"x" * 200_000 + b'"}\n'
    replies = _raw(h, big + b'{"v": 1, "id": 2, "op": "hello"}\n')
    assert replies[0]["ok"] is False and "longer than" in replies[0]["error"]["message"]
    assert replies[1]["ok"] is True and replies[1]["id"] == 2


def test_a_truncated_request_gets_no_reply_and_changes_nothing(h: Harness) -> None:
    replies = _raw(h, b'{"v": 1, "id": 1, "op": "lock", "gpus": [0], "sm": 13')
    assert replies == []
    assert h.truth(0) == h.original[0]
    assert daemon_available(h.sock)


def test_an_unprivileged_process_locks_through_the_daemon(h: Harness) -> None:
    from gpuenv.locking import acquire, daemon_client

    user_view = SimBackend("h100", n_gpus=2, state_file=h.tmp / "sim.json", root=False)
    try:
        # one authority: root and users alike go through the daemon that serves their GPUs
        h.queue.append(ALICE)
        client = daemon_client(user_view, socket=h.sock)
        assert client is not None
        client.close()
        assert daemon_client(user_view, socket=h.tmp / "none.sock") is None
        h.queue.append(ALICE)
        with acquire(1350, gpus="1", backend=user_view, socket=h.sock) as lk:
            assert lk.gpus == [1] and h.locked_sm(1) == (1350, 1350)
            assert lk.holds() == {1: None} or lk.holds()[1] in (True, False)
            with pytest.raises(ConfigError, match="re-entrant"):
                lk.__enter__()
        assert lk.released and h.truth(1) == h.original[1]
    finally:
        user_view.close()


def _leave_a_dead_daemons_lease(h: Harness) -> None:
    """Journal a lease whose client and daemon are both gone, as after a daemon crash."""
    from gpuenv.clocks import Lock, make_request, plan_lock
    from gpuenv.clocks.journal import Owner

    dead = subprocess.Popen(["true"])
    dead.wait()
    owner = dataclasses.replace(
        Owner.current(kind="lease", request="SM 1350 MHz"), pid=dead.pid, watchdog_pid=dead.pid
    )
    plan = plan_lock(h.backend, make_request(1350), [0], journal=h.journal)
    lk = Lock(h.backend, plan, h.journal, kind="lease", supervise=False, owner=owner)
    atexit.unregister(lk.release)


def test_recovery_restores_a_dead_daemons_leases(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuenv.backend import ReadOnlyBackend

    h = Harness(tmp_path)
    try:
        _leave_a_dead_daemons_lease(h)
        assert h.locked_sm(0) == (1350, 1350)
        # a daemon that cannot write (read-only) says so and serves anyway
        cfg = parse_config(CONFIG).with_socket(str(tmp_path / "ro.sock"))
        ro = Server(cfg, ReadOnlyBackend(h.backend), journal=h.journal)  # type: ignore[arg-type]
        ro.start()
        ro.stop()
        assert h.locked_sm(0) == (1350, 1350) and len(h.journal.entries()) == 1
        assert "GPU 0 could not be restored" in caplog.text
        h.server.start()  # a daemon that can: restores before it listens
        assert h.truth(0) == h.original[0] and h.journal.entries() == []
    finally:
        h.server.stop()
        h.backend.close()


def test_client_reports_a_missing_daemon(tmp_path: Path) -> None:
    assert daemon_available(tmp_path / "none.sock") is False
    with pytest.raises(DaemonUnavailable, match="sudo gpuenv daemon"):
        Client(tmp_path / "none.sock")


def test_a_second_daemon_on_the_same_socket_refuses_to_start(h: Harness) -> None:
    other = Server(parse_config(CONFIG).with_socket(h.sock), h.backend, journal=h.journal)
    with pytest.raises(ConfigError, match="already listens"):
        other.start()
    with Client(h.sock) as c:  # the first one is untouched
        assert c.status()["gpus"]


def test_socket_permissions_follow_the_config(tmp_path: Path) -> None:
    harness = Harness(tmp_path, config="[daemon]\nsocket_mode = 0640\n")
    harness.server.start()
    try:
        assert os.stat(harness.sock).st_mode & 0o777 == 0o640
    finally:
        harness.server.stop()
        harness.backend.close()
    assert not os.path.exists(harness.sock)  # removed on stop
