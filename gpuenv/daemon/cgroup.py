"""Which GPUs a process's device cgroup lets it open: the `job` rule outside Slurm.

A container runtime or a batch system without gpuenv's prolog confines a job's processes
to their GPUs with the cgroup `devices` controller. On cgroup v1 the controller's
`devices.list` says what the cgroup may open, one entry a line:

    c 195:1 rwm        character device major 195 (NVIDIA), minor 1: /dev/nvidia1
    c 195:* rwm        every NVIDIA device: no limit among GPUs
    a *:* rwm          every device: the cgroup sets no limit (a login shell's)

Only a limit grants: a cgroup that names each GPU's minor (`c 195:N`, read and write)
confines its processes to those GPUs, so they may lock them. A cgroup that allows every
GPU (`a *:*`, `c 195:*`, `c *:*`) sets no limit, and grants none: that is any login
shell. cgroup v2 has no `devices.list` (device access is an eBPF program attached to the
cgroup, which cannot be read back as a list): there nothing is granted either.

Where the controller is mounted comes from /proc/self/mountinfo (gpuenvd's own mount
namespace); the caller's cgroup from /proc/PID/cgroup. Both roots are parameters, so a
test builds a fake tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

NVIDIA_MAJOR = 195  # /dev/nvidiaN is char 195:N (255 is nvidiactl, 254 nvidia-modeset)
PROC = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
_MAX_BYTES = 1 << 20  # a /proc or cgroup file larger than this is not one we understand


@dataclass(frozen=True)
class DeviceLimit:
    """What a process's device cgroup says about NVIDIA GPUs.

    `minors`: the NVIDIA minors (/dev/nvidiaN) the cgroup allows, where it sets a limit;
    None where it sets none or none could be read. `why` says which, in words that follow
    "its process" ("runs in device cgroup /x, which allows /dev/nvidia1").
    """

    minors: frozenset[int] | None
    why: str

    def gpus(self, minor_to_gpu: Mapping[int, int]) -> frozenset[int]:
        """The GPU indices of the allowed minors (nvidiactl and unknown minors left out)."""
        return frozenset(minor_to_gpu[m] for m in self.minors or () if m in minor_to_gpu)


@dataclass(frozen=True)
class _Mount:
    root: str  # the part of the hierarchy mounted here ("/" on a host)
    path: str  # where, on this machine (rebased onto the injected cgroup root)


class DeviceCgroups:
    """Reads device cgroups under `proc` (/proc) and `cgroup_root` (/sys/fs/cgroup).

    Mount points that mountinfo gives under /sys/fs/cgroup are read under `cgroup_root`."""

    def __init__(self, proc: str = PROC, cgroup_root: str = CGROUP_ROOT):
        self.proc = proc
        self.cgroup_root = cgroup_root

    def limit(self, pid: int, uid: int | None = None) -> DeviceLimit:
        """The device limit of process `pid`. With `uid`, the process must still be that
        user's (a pid reused by another account's process grants nothing)."""
        if pid <= 0:
            return DeviceLimit(None, "is not visible to gpuenvd (no pid), so no cgroup is read")
        try:
            limit = self._limit(pid)
            if uid is not None and self._euid(pid) != uid:
                return DeviceLimit(None, f"(pid {pid}) has ended, so no cgroup is read")
        except (OSError, ValueError) as err:
            return DeviceLimit(None, f"(pid {pid}): its device cgroup cannot be read ({err})")
        return limit

    def _limit(self, pid: int) -> DeviceLimit:
        groups = _read_cgroups(_read(os.path.join(self.proc, str(pid), "cgroup")))
        mounts = self._mounts()
        if "devices" in groups and "devices" in mounts:
            where = groups["devices"]
            mount = mounts["devices"]
            rel = _under(where, mount.root)
            if rel is None:
                return DeviceLimit(
                    None,
                    f"(pid {pid}) runs in device cgroup {where}, outside gpuenvd's view of "
                    f"the devices hierarchy (mounted from {mount.root})",
                )
            text = _read(os.path.join(mount.path, rel.lstrip("/"), "devices.list"))
            return _from_list(text, f"(pid {pid}) runs in device cgroup {where}")
        if "" in groups and "cgroup2" in mounts:
            return DeviceLimit(
                None,
                f"(pid {pid}) runs in cgroup {groups['']} on cgroup v2, where device access "
                "is an eBPF program gpuenvd cannot read as a list of GPUs",
            )
        return DeviceLimit(None, f"(pid {pid}) runs in no device cgroup gpuenvd can read")

    def _euid(self, pid: int) -> int | None:
        """The effective uid /proc/PID/status gives (SO_PEERCRED's), None if it has none."""
        for line in _read(os.path.join(self.proc, str(pid), "status")).splitlines():
            if line.startswith("Uid:") and len(line.split()) > 2:
                return int(line.split()[2])
        return None

    def _mounts(self) -> dict[str, _Mount]:
        """'devices' -> the v1 devices controller's mount; 'cgroup2' -> the v2 one."""
        out: dict[str, _Mount] = {}
        for line in _read(os.path.join(self.proc, "self", "mountinfo")).splitlines():
            fields = line.split()
            if "-" not in fields:
                continue
            sep = fields.index("-")
            if sep < 5 or len(fields) < sep + 4:
                continue
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            mount = _Mount(_unescape(fields[3]), self._rebase(_unescape(fields[4])))
            if fstype == "cgroup" and "devices" in options:
                out.setdefault("devices", mount)
            elif fstype == "cgroup2":
                out.setdefault("cgroup2", mount)
        return out

    def _rebase(self, path: str) -> str:
        if self.cgroup_root != CGROUP_ROOT:
            rel = _under(path, CGROUP_ROOT)
            if rel is not None:
                return os.path.join(self.cgroup_root, rel.lstrip("/"))
        return path

    def describe(self) -> str:
        """This machine's device cgroups, for `gpuenv daemon check-config`."""
        try:
            mounts = self._mounts()
        except OSError as err:
            return f"cannot read this machine's cgroup mounts ({err})"
        if "devices" in mounts:
            return (
                f"cgroup v1 devices controller at {mounts['devices'].path}: a process whose "
                "devices.list names GPUs (c 195:N) may lock those"
            )
        if "cgroup2" in mounts:
            return (
                "cgroup v2 only: device access is an eBPF program gpuenvd cannot read, so "
                "outside a Slurm job the rule grants no GPU"
            )
        return "no device cgroup mounted: outside a Slurm job the rule grants no GPU"


def _from_list(text: str, who: str) -> DeviceLimit:
    """A v1 devices.list: the NVIDIA minors it allows for reading and writing."""
    minors: set[int] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or ":" not in parts[1]:
            continue
        kind, (major, minor), access = parts[0], parts[1].split(":", 1), parts[2]
        if kind not in ("a", "c") or not {"r", "w"} <= set(access):
            continue  # a block device, or one the cgroup may not open read-write
        if major not in ("*", str(NVIDIA_MAJOR)):
            continue
        if kind == "a" or major == "*" or minor == "*":
            return DeviceLimit(
                None,
                f"{who}, which sets no limit on GPUs ({line.strip()}): it allows every GPU",
            )
        if minor.isdigit():
            minors.add(int(minor))
    named = ", ".join(f"/dev/nvidia{m}" for m in sorted(minors)) or "no NVIDIA device"
    return DeviceLimit(frozenset(minors), f"{who}, which allows {named}")


def _read_cgroups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup: controller -> cgroup path ('' for the v2 line `0::/path`)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out.setdefault(controller, parts[2])
    return out


def _under(path: str, root: str) -> str | None:
    """`path` relative to `root` ('/' for root itself), or None if it is not under it."""
    root = root.rstrip("/")
    if path == root or not root:
        return path[len(root) :] or "/"
    if path.startswith(root + "/"):
        return path[len(root) :]
    return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040)."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(_MAX_BYTES)


__all__ = ["NVIDIA_MAJOR", "DeviceCgroups", "DeviceLimit"]
