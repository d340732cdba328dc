"""The `job` rule outside Slurm: a caller's device cgroup (daemon/cgroup.py), read from a
fake /proc and /sys/fs/cgroup built in tmp_path, and what gpuenvd's Authorizer grants
and refuses from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from server_harness import ALICE

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon.auth import Authorizer, Peer, parse_config
from gpuenv.daemon.cgroup import DeviceCgroups
from gpuenv.daemon.client import Client
from gpuenv.daemon.server import Server
from gpuenv.errors import PermissionDenied

UUIDS = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222"]
PID, UID = 4242, 1001
V1 = "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime shared:9 - cgroup cgroup rw,devices\n"
V2 = "41 23 0:38 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
ALICE_NOW = Peer(pid=PID, uid=UID, gid=UID, user="alice")


def fake(
    tmp_path: Path, *, mounts: str, cgroup: str, devices: str | None = None, uid: int = UID
) -> DeviceCgroups:
    """/proc/self/mountinfo, /proc/PID/{cgroup,status} and, with `devices`, the devices.list
    of the cgroup /proc/PID/cgroup names, under tmp_path."""
    proc, root = tmp_path / "proc", tmp_path / "sys" / "fs" / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / str(PID)).mkdir()
    (proc / "self" / "mountinfo").write_text(
        "22 1 259:1 / / rw,relatime - ext4 /dev/root rw\n" + mounts
    )
    (proc / str(PID) / "cgroup").write_text(cgroup)
    (proc / str(PID) / "status").write_text(f"Name:\tbench\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if devices is not None:
        where = next(line.split(":", 2)[2] for line in cgroup.splitlines() if ":devices:" in line)
        listing = root / "devices" / where.lstrip("/")
        listing.mkdir(parents=True)
        (listing / "devices.list").write_text(devices)
    return DeviceCgroups(proc=str(proc), cgroup_root=str(root))


DOCKER = "12:devices:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n"
ONE_GPU = "c 1:3 rwm\nc 195:255 rwm\nc 195:1 rwm\nb 195:0 rwm\nc 195:2 r\n"


def auth(cgroups: DeviceCgroups, running: list[tuple[int, str, str]] | None = None) -> Authorizer:
    config = parse_config("[lock]\n* = job\n", source="/etc/gpuenv/gpuenvd.conf")
    return Authorizer(
        config, UUIDS, jobs=lambda: running or [], minors=lambda: [0, 1, 2], cgroups=cgroups
    )


def test_a_v1_cgroup_that_names_gpu_1_grants_gpu_1_and_refuses_gpu_0(tmp_path: Path) -> None:
    cgroups = fake(tmp_path, mounts=V1, cgroup=DOCKER, devices=ONE_GPU)
    limit = cgroups.limit(PID, UID)
    assert limit.minors == {1, 255}  # a block device and a read-only one are no grant
    assert limit.gpus({0: 0, 1: 1, 2: 2}) == {1}  # nvidiactl is no GPU
    a = auth(cgroups)
    assert a.lockable(ALICE_NOW) == {1}
    a.check_lock(ALICE_NOW, [1])
    with pytest.raises(PermissionDenied) as err:
        a.check_lock(ALICE_NOW, [0])
    assert err.value.exit_code == 4 and err.value.gpu == 0
    text = str(err.value)
    assert "no Slurm job of theirs runs here" in text
    assert "(pid 4242) runs in device cgroup /docker/abc, which allows /dev/nvidia1" in text
    assert "(allowed: GPUs [1])" in text and "-i 1" in (err.value.hint or "")


def test_a_cgroup_that_sets_no_limit_grants_nothing(tmp_path: Path) -> None:
    for i, listing in enumerate(("a *:* rwm\n", "c 1:3 rwm\nc 195:* rwm\n")):
        cgroups = fake(
            tmp_path / str(i), mounts=V1, cgroup="5:devices:/user.slice\n", devices=listing
        )
        assert cgroups.limit(PID, UID).minors is None
        a = auth(cgroups)
        assert a.lockable(ALICE_NOW) == frozenset()
        with pytest.raises(PermissionDenied) as err:
            a.check_lock(ALICE_NOW, [0])
        assert err.value.exit_code == 4
        assert "runs in device cgroup /user.slice, which sets no limit on GPUs" in str(err.value)
        assert listing.splitlines()[-1] in str(err.value)  # the entry that allows every GPU
        assert "under Slurm" in (err.value.hint or "")


def test_cgroup_v2_is_refused_saying_it_cannot_be_read(tmp_path: Path) -> None:
    cgroups = fake(tmp_path, mounts=V2, cgroup="0::/user.slice/user-1001.slice/session-3.scope\n")
    a = auth(cgroups)
    assert a.lockable(ALICE_NOW) == frozenset()
    with pytest.raises(PermissionDenied) as err:
        a.check_lock(ALICE_NOW, [1])
    assert err.value.exit_code == 4
    assert "on cgroup v2, where device access is an eBPF program gpuenvd cannot read" in str(
        err.value
    )
    hint = err.value.hint or ""
    assert "sbatch/srun --gres=gpu:N" in hint and "user:alice = 0,1" in hint
    assert "v2 only" in cgroups.describe()


def test_a_hybrid_host_reads_the_v1_devices_controller(tmp_path: Path) -> None:
    cgroups = fake(tmp_path, mounts=V1 + V2, cgroup=DOCKER, devices=ONE_GPU)
    assert cgroups.limit(PID, UID).minors == {1, 255}
    assert "cgroup v1 devices controller at" in cgroups.describe()


def test_a_running_slurm_job_comes_first(tmp_path: Path) -> None:
    cgroups = fake(tmp_path, mounts=V1, cgroup=DOCKER, devices=ONE_GPU)
    a = auth(cgroups, running=[(2, "77", "alice"), (0, "78", "bob")])
    assert a.lockable(ALICE_NOW) == {2}  # the job's GPU, not the cgroup's GPU 1
    with pytest.raises(PermissionDenied, match="none of them is on this GPU"):
        a.check_lock(ALICE_NOW, [1])
    carol = Peer(pid=PID, uid=UID, gid=UID, user="carol")  # same cgroup, no job of hers
    assert auth(cgroups, running=[(1, "78", "bob")]).lockable(carol) == frozenset()  # bob's


def test_a_pid_now_anothers_or_gone_grants_nothing(tmp_path: Path) -> None:
    cgroups = fake(tmp_path, mounts=V1, cgroup=DOCKER, devices=ONE_GPU, uid=0)
    assert cgroups.limit(PID, UID).minors is None  # reused by root's process: not alice's
    assert "has ended" in cgroups.limit(PID, UID).why
    gone = cgroups.limit(PID + 1, UID)
    assert gone.minors is None and "cannot be read" in gone.why
    assert cgroups.limit(0, UID).minors is None  # no pid (another pid namespace)


def test_a_cgroup_outside_the_mounted_hierarchy_grants_nothing(tmp_path: Path) -> None:
    mounts = V1.replace(" / /sys/fs/cgroup/devices", " /docker/xyz /sys/fs/cgroup/devices")
    cgroups = fake(tmp_path, mounts=mounts, cgroup="12:devices:/slurm/job_5\n")
    assert "outside gpuenvd's view" in cgroups.limit(PID, UID).why
    inside = fake(tmp_path / "in", mounts=mounts, cgroup="12:devices:/docker/xyz/a\n")
    listing = tmp_path / "in/sys/fs/cgroup/devices/a/devices.list"  # under the mount's root
    listing.parent.mkdir(parents=True)
    listing.write_text("c 195:0 rw\n")
    assert inside.limit(PID, UID).minors == {0}


def test_gpuenvd_maps_the_sims_minors_and_says_so_in_hello(tmp_path: Path) -> None:
    """The daemon's Authorizer asks the backend for each GPU's minor (the sim's: its index)."""
    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    assert [backend.details(i).minor_number for i in (0, 1)] == [0, 1]
    me = Peer(pid=PID, uid=ALICE.uid, gid=ALICE.gid, user="alice")
    config = parse_config("[lock]\n* = job\n").with_socket(str(tmp_path / "s"))
    server = Server(config, backend, journal=Journal(tmp_path / "j"), peer_of=lambda s: me)
    server.auth.cgroups = fake(
        tmp_path / "t", mounts=V1, cgroup=DOCKER, devices="c 195:1 rwm\n", uid=ALICE.uid
    )
    server.start()
    try:
        with Client(server.address) as c:
            assert c.info["may_lock"] == [1]
            with c.lock(sm=1350, gpus=[1]):
                assert backend.truth(1).locked_sm == (1350, 1350)
            with pytest.raises(PermissionDenied, match="allows /dev/nvidia1"):
                c.lock(sm=1350, gpus=[0])
    finally:
        server.stop()
    assert backend.truth(0).locked_sm is None


def test_the_real_tree_is_read_without_error() -> None:
    # whatever this machine is (v1, v2, none), this process's limit is an answer, not a raise
    limit = DeviceCgroups().limit(os.getpid(), os.geteuid())
    assert limit.why.startswith("(pid ") or limit.why.startswith("is not")
