"""Who may do what: the config file, the authorisation rules, SO_PEERCRED."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gpuenv.daemon.auth import (
    Authorizer,
    Config,
    Peer,
    load_config,
    make_peer,
    parse_config,
    parse_listen,
    peer_from_socket,
)
from gpuenv.errors import ConfigError, PermissionDenied

UUIDS = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222"]


def peer(user: str, uid: int, *groups: str) -> Peer:
    return Peer(pid=1, uid=uid, gid=uid, user=user, groups=frozenset(groups))


FULL = """
# the daemon's own settings
[daemon]
socket = /tmp/x.sock
socket_group = gpubench
sample_period = 0.05
metrics = 127.0.0.1:9400

[lock]
user:alice = all
user:bob = 0, GPU-cccc    ; a UUID prefix
group:gpubench = 1
user:1234 = 2
* = none

[admin]
users = ops root2
groups = wheel
"""


def test_full_config_parses() -> None:
    cfg = parse_config(FULL, source="gpuenvd.conf")
    assert cfg.socket == "/tmp/x.sock" and cfg.socket_group == "gpubench"
    assert cfg.sample_period == 0.05 and cfg.metrics == "127.0.0.1:9400"
    assert cfg.admin_users == {"ops", "root2"} and cfg.admin_groups == {"wheel"}
    assert cfg.socket_permissions() == 0o660  # a group: 0660
    auth = Authorizer(cfg, UUIDS)
    assert auth.rules()["user:bob"] == {0, 2}
    assert auth.lockable(peer("alice", 1001)) == {0, 1, 2}
    assert auth.lockable(peer("bob", 1002)) == {0, 2}
    assert auth.lockable(peer("carol", 1003, "gpubench")) == {1}
    assert auth.lockable(peer("1234", 1234)) == {2}  # a uid without a name
    assert auth.lockable(peer("dave", 1004)) == frozenset()


def test_admins_and_root_may_do_anything() -> None:
    auth = Authorizer(parse_config(FULL), UUIDS)
    for who in (peer("root", 0), peer("ops", 2000), peer("w", 2001, "wheel")):
        assert auth.is_admin(who)
        assert auth.lockable(who) == {0, 1, 2}
        auth.check_release(who, 1001, "alice", "lease L1")
    assert not auth.is_admin(peer("alice", 1001))


def test_lock_refusal_names_the_user_gpu_and_fix() -> None:
    auth = Authorizer(parse_config(FULL, source="/etc/gpuenv/gpuenvd.conf"), UUIDS)
    with pytest.raises(PermissionDenied) as err:
        auth.check_lock(peer("carol", 1003, "gpubench"), [1, 2])
    text = str(err.value)
    assert err.value.gpu == 2
    assert "carol may not lock" in text and "GPUs [1]" in text
    assert "user:carol" in text and "/etc/gpuenv/gpuenvd.conf" in text
    auth.check_lock(peer("carol", 1003, "gpubench"), [1])


def test_release_of_anothers_lease_is_refused() -> None:
    auth = Authorizer(parse_config(FULL), UUIDS)
    auth.check_release(peer("alice", 1001), 1001, "alice", "lease L1")
    with pytest.raises(PermissionDenied, match="belongs to alice; bob may release only"):
        auth.check_release(peer("bob", 1002), 1001, "alice", "lease L1")
    # same name, other uid: the uid decides
    with pytest.raises(PermissionDenied):
        auth.check_release(peer("alice", 999), 1001, "alice", "lease L1")


def test_defaults_let_only_root_lock() -> None:
    cfg = Config()
    assert cfg.socket == "/run/gpuenv/gpuenv.sock"
    assert cfg.socket_permissions() == 0o600
    auth = Authorizer(cfg, UUIDS)
    assert auth.lockable(peer("alice", 1001)) == frozenset()
    assert auth.lockable(peer("root", 0)) == {0, 1, 2}


def test_socket_mode_opens_when_users_are_named() -> None:
    assert parse_config("[lock]\nuser:alice = 0\n").socket_permissions() == 0o666
    assert parse_config("[lock]\n* = none\n").socket_permissions() == 0o600
    assert parse_config("[daemon]\nsocket_mode = 0640\n").socket_permissions() == 0o640


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[nonsense]\n", "unknown section"),
        ("[daemon]\nport = 5\n", "has no setting 'port'"),
        ("[daemon]\nsocket_mode = 999\n", "not octal"),
        ("[daemon]\nsample_period = fast\n", "sample_period"),
        ("[daemon]\nmetrics = here\n", "HOST:PORT"),
        ("[lock]\nalice = all\n", "not user:NAME"),
        ("[lock]\nuser: = all\n", "not user:NAME"),
        ("[lock]\nuser:alice =\n", "has no GPUs"),
        ("[admin]\nwho = x\n", "has no setting"),
        ("[lock]\nuser:a = 1\nuser:a = 2\n", "cannot read"),
        ("no section header\n", "cannot read"),
    ],
)
def test_bad_config_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config(text)


def test_gpu_selectors_are_checked_against_the_machine() -> None:
    with pytest.raises(ConfigError, match="names GPU 5, but this machine has 3"):
        Authorizer(parse_config("[lock]\nuser:a = 5\n"), UUIDS)
    with pytest.raises(ConfigError, match="matches 3 GPUs"):
        Authorizer(parse_config("[lock]\nuser:a = GPU-\n"), UUIDS)


def test_load_config(tmp_path: Path) -> None:
    path = tmp_path / "gpuenvd.conf"
    path.write_text("[lock]\nuser:alice = 0\n")
    assert load_config(path).lock_rules == {"user:alice": ("0",)}
    with pytest.raises(ConfigError, match="cannot read the daemon config"):
        load_config(tmp_path / "missing.conf")


def test_parse_listen() -> None:
    assert parse_listen("9400") == ("127.0.0.1", 9400)
    assert parse_listen("0.0.0.0:1") == ("0.0.0.0", 1)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    with pytest.raises(ConfigError):
        parse_listen("127.0.0.1:99999")


def test_so_peercred_names_this_process(tmp_path: Path) -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        me = peer_from_socket(a)
    finally:
        a.close()
        b.close()
    assert (me.pid, me.uid, me.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert me.user and me.groups


def test_unknown_uid_gets_a_numeric_name() -> None:
    p = make_peer(4242, 3_999_999, 3_999_999)
    assert p.user == "3999999" and "3999999" in p.groups


def test_connection_limits_are_configurable_and_checked() -> None:
    cfg = parse_config("[daemon]\nmax_connections_per_user = 8\nidle_timeout = 30\n")
    assert cfg.max_connections_per_user == 8 and cfg.idle_timeout == 30.0
    assert parse_config("").max_connections_per_user == 32  # the defaults
    for bad in ("max_connections_per_user = 0", "idle_timeout = soon", "idle_timeout = 1e9"):
        with pytest.raises(ConfigError, match=bad.split()[0]):
            parse_config(f"[daemon]\n{bad}\n", source="gpuenvd.conf")


def test_a_bad_metrics_address_in_a_config_names_the_file() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("[daemon]\nmetrics = 127.0.0.1:99999\n", source="/etc/gpuenv/gpuenvd.conf")
    assert str(err.value).startswith("/etc/gpuenv/gpuenvd.conf: metrics address")
    assert "127.0.0.1:19400" in str(err.value)  # what to write instead


JOBS = """
[lock]
* = job
user:carol = all
group:ops = job, 2
"""


def test_the_job_rule_grants_a_users_own_jobs_gpus_and_no_rule_lands_on_anothers() -> None:
    running = [(0, "101", "alice"), (1, "102", "1002")]  # bob's job, by uid
    auth = Authorizer(parse_config(JOBS), UUIDS, jobs=lambda: running)
    alice, bob, carol = peer("alice", 1001), peer("bob", 1002), peer("carol", 1003)
    assert auth.lockable(alice) == {0} and auth.lockable(bob) == {1}
    assert auth.lockable(peer("dave", 1004)) == frozenset()  # no job of his on this node
    assert auth.lockable(carol) == {2}  # all: every GPU no other account's job holds
    assert auth.lockable(peer("erin", 1005, "ops")) == {2}
    auth.check_lock(alice, [0])
    with pytest.raises(PermissionDenied) as err:
        auth.check_lock(alice, [0, 1])
    assert err.value.gpu == 1 and err.value.exit_code == 4
    assert "alice may not lock a GPU of 1002's running Slurm job 102" in str(err.value)
    with pytest.raises(PermissionDenied, match="carol may not lock a GPU of alice's running Slurm"):
        auth.check_lock(carol, [0])
    with pytest.raises(PermissionDenied, match="none of them is on this GPU") as err:
        auth.check_lock(alice, [2])
    assert "inside your job" in (err.value.hint or "")
    auth.check_lock(peer("root", 0), [0, 1, 2])  # an admin (the prolog) locks any
    running.clear()  # the jobs ended: their GPUs are no one's
    assert auth.lockable(alice) == frozenset() and auth.lockable(carol) == {0, 1, 2}


def test_the_job_rule_is_described_and_read_in_any_case() -> None:
    cfg = parse_config(JOBS.replace("* = job", "* = JOB"))
    assert cfg.lock_rules["*"] == ("job",) and cfg.lock_rules["group:ops"] == ("job", "2")
    assert cfg.socket_permissions() == 0o666  # a rule names everyone: checked per request
    described = Authorizer(cfg, UUIDS).describe_rules()
    assert described["*"] == (
        "job (the GPUs of the caller's own running Slurm job; outside Slurm, the GPUs its "
        "process's device cgroup limits it to, cgroup v1 only)"
    )
    assert described["group:ops"].startswith("2, job (") and described["user:carol"] == "0, 1, 2"
