"""Who is on the other end of the socket, and what they may do.

Identity comes from the kernel (SO_PEERCRED: pid, uid, gid of the connecting
process), never from the request. What an identity may do comes from the
daemon's config file, an INI file read with the standard library's
configparser (no new dependency on Python 3.10, comments allowed):

    [daemon]
    socket = /run/gpuenv/gpuenv.sock
    user = gpuenvd               ; the account gpuenvd runs as, when not root (User= in
                                 ; the unit): clients trust a socket served by root or it
    socket_group = gpubench      ; the socket is chown'ed to this group ...
    socket_mode = 0660           ; ... with this mode: who may connect at all
    sample_period = 0.1          ; the daemon's own sampler, seconds
    metrics = 127.0.0.1:19400    ; Prometheus endpoint; leave out for none
    max_connections_per_user = 32 ; a user who is not an admin (root, admins: no limit)
    idle_timeout = 300           ; close a connection that holds nothing and says nothing

    [lock]                       ; who may lock which GPUs
    user:alice = all
    group:gpubench = 0,1         ; NVML indices or UUIDs (GPU-...), comma-separated
    group:slurmusers = job       ; the GPUs of the caller's own running Slurm job (outside
                                 ; Slurm: those its device cgroup allows, cgroup v1)
    * = none                     ; everyone else who can connect (the default)

    [admin]                      ; may release anyone's lease and restore any GPU
    users = ops
    groups = wheel

root (uid 0) is always an admin. Anyone who can connect may read (hello,
status, window, subscribe); only lock needs a `[lock]` entry.

On a Slurm node gpuenvd knows each running job's GPUs and user (the prolog's `job_begin`,
daemon/jobs.py). `job` grants a caller the GPUs of its own running jobs (the job's user is
the caller), and no rule but an admin's lands a lock on a GPU of another account's running
job: `all` means every GPU that no other account's job holds. A caller with no running
Slurm job here gets, under `job`, the GPUs its process's device cgroup limits it to
(cgroup v1's devices.list, daemon/cgroup.py); a cgroup that sets no limit, or cgroup v2,
grants none.
"""

from __future__ import annotations

import configparser
import contextlib
import grp
import ipaddress
import os
import pwd
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpuenv.daemon.cgroup import DeviceCgroups, DeviceLimit
from gpuenv.errors import ConfigError, PermissionDenied

DEFAULT_SOCKET = "/run/gpuenv/gpuenv.sock"
DEFAULT_CONFIG = "/etc/gpuenv/gpuenvd.conf"

ALL = "all"
JOB = "job"  # a [lock] selector: the GPUs of the caller's own running Slurm jobs
KEYWORDS = ("all", "none", JOB)

# (GPU, job id, user) of every running job gpuenvd knows (JobBook.running)
RunningJobs = Callable[[], Iterable[tuple[int, str, str]]]
# each GPU's NVIDIA minor number (/dev/nvidiaN), by NVML index; None where unknown
MinorNumbers = Callable[[], Sequence[int | None]]


@dataclass(frozen=True)
class Peer:
    """The process on the other end of a connection, as the kernel reports it."""

    pid: int
    uid: int
    gid: int
    user: str
    groups: frozenset[str] = frozenset()

    def describe(self) -> str:
        return f"{self.user} (uid {self.uid}, pid {self.pid})"


def peer_from_socket(sock: socket.socket) -> Peer:
    """SO_PEERCRED of a connected Unix socket, with the user's name and groups."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return make_peer(pid, uid, gid)


def make_peer(pid: int, uid: int, gid: int) -> Peer:
    """A Peer with its user name and group names looked up (numeric when unknown)."""
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    gids = {gid}
    with contextlib.suppress(KeyError, OSError):
        gids.update(os.getgrouplist(user, gid))
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            names.add(str(g))
    return Peer(pid=pid, uid=uid, gid=gid, user=user, groups=frozenset(names))


@dataclass(frozen=True)
class Config:
    """The daemon's settings.

    `lock_rules` maps "user:NAME" / "group:NAME" / "*" to GPU selectors.
    """

    socket: str = DEFAULT_SOCKET
    socket_group: str | None = None
    socket_mode: int | None = None  # None: derived, see socket_permissions()
    sample_period: float = 0.1
    metrics: str | None = None
    lock_rules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    admin_users: frozenset[str] = frozenset()
    admin_groups: frozenset[str] = frozenset()
    # connections a user who is not an admin may hold open at once (root and admins: no limit)
    max_connections_per_user: int = 32
    idle_timeout: float = 300.0  # seconds; a connection holding nothing is closed after this
    user: str | None = None  # the account gpuenvd runs as when not root: clients trust it
    source: str | None = None  # the file it came from

    def socket_permissions(self) -> int:
        """The socket's mode: as configured; else 0660 with a socket_group; else 0666 when
        the config lets anyone but root lock or administer (the daemon checks each
        request by SO_PEERCRED), 0600 when it lets no one."""
        if self.socket_mode is not None:
            return self.socket_mode
        if self.socket_group:
            return 0o660
        if (
            any(gpus != ("none",) for gpus in self.lock_rules.values())
            or self.admin_users
            or self.admin_groups
        ):
            return 0o666
        return 0o600

    def with_socket(self, path: str | None) -> Config:
        if not path:
            return self
        return Config(**{**self.__dict__, "socket": path})


_DAEMON_KEYS = (
    "socket",
    "user",
    "socket_group",
    "socket_mode",
    "sample_period",
    "metrics",
    "max_connections_per_user",
    "idle_timeout",
)


def _number(text: str, key: str, lo: float, hi: float, source: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:
        raise ConfigError(f"{source}: {key} {text!r} must be a number from {lo:g} to {hi:g}")
    return int(value) if key.startswith("max_") else value


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.replace(" ", ",").split(",") if p.strip())


def _daemon_settings(d: configparser.SectionProxy, source: str) -> dict:
    """The [daemon] section's settings, checked."""
    kwargs: dict = {}
    for key in d:
        if key not in _DAEMON_KEYS:
            raise ConfigError(
                f"{source}: [daemon] has no setting {key!r}",
                hint="settings: " + ", ".join(_DAEMON_KEYS),
            )
    if d.get("socket"):
        if not os.path.isabs(d["socket"]):  # the daemon and its clients start elsewhere
            raise ConfigError(
                f"{source}: socket {d['socket']!r} is a relative path",
                hint="give an absolute one, e.g. /run/gpuenv/gpuenvd.sock",
            )
        kwargs["socket"] = d["socket"]
    if d.get("socket_group"):
        kwargs["socket_group"] = d["socket_group"]
    if d.get("user"):
        kwargs["user"] = d["user"]
    if "socket_mode" in d:
        try:
            mode = int(d["socket_mode"], 8)
        except ValueError:
            raise ConfigError(
                f"{source}: socket_mode {d['socket_mode']!r} is not octal", hint="e.g. 0660"
            ) from None
        if not 0 <= mode <= 0o777:
            raise ConfigError(
                f"{source}: socket_mode {d['socket_mode']!r} is out of range", hint="e.g. 0660"
            )
        kwargs["socket_mode"] = mode
    if "sample_period" in d:
        try:
            period = float(d["sample_period"])
        except ValueError:
            period = -1.0
        if not 0.001 <= period <= 10:
            raise ConfigError(
                f"{source}: sample_period {d['sample_period']!r} must be 0.001 to 10 seconds"
            )
        kwargs["sample_period"] = period
    for key, lo, hi in (("max_connections_per_user", 1, 4096), ("idle_timeout", 1, 86400)):
        if key in d:
            kwargs[key] = _number(d[key], key, lo, hi, source)
    if d.get("metrics"):
        kwargs["metrics"] = d["metrics"]
        try:
            parse_listen(d["metrics"])
        except ConfigError as err:  # the file it is in, as every other setting's error says
            raise ConfigError(f"{source}: {err.message}", hint=err.hint) from None
    return kwargs


def parse_config(text: str, *, source: str = "<config>") -> Config:
    """Parse the INI text of a config file; ConfigError names the line that is wrong."""
    parser = configparser.ConfigParser(
        interpolation=None, inline_comment_prefixes=(";", "#"), delimiters=("=",)
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # user names are case-sensitive
    try:
        parser.read_string(text, source=source)
    except configparser.Error as err:
        raise ConfigError(
            f"cannot read {source}: {err}".replace("\n", " "),
            hint="see 'gpuenv daemon --help' for the format",
        ) from None
    known = {"daemon", "lock", "admin"}
    for section in parser.sections():
        if section not in known:
            raise ConfigError(
                f"{source}: unknown section [{section}]", hint="sections: [daemon], [lock], [admin]"
            )
    kwargs: dict = {"source": source}
    if parser.has_section("daemon"):
        kwargs.update(_daemon_settings(parser["daemon"], source))
    rules: dict[str, tuple[str, ...]] = {}
    if parser.has_section("lock"):
        for key, value in parser["lock"].items():
            if not (key == "*" or key.startswith(("user:", "group:"))) or key.endswith(":"):
                raise ConfigError(f"{source}: [lock] key {key!r} is not user:NAME, group:NAME or *")
            gpus = tuple(g.lower() if g.lower() in KEYWORDS else g for g in _split(value))
            if not gpus:
                raise ConfigError(
                    f"{source}: [lock] {key} has no GPUs",
                    hint="use all, none, job, or indices/UUIDs",
                )
            rules[key] = gpus
    kwargs["lock_rules"] = rules
    if parser.has_section("admin"):
        a = parser["admin"]
        for key in a:
            if key not in ("users", "groups"):
                raise ConfigError(
                    f"{source}: [admin] has no setting {key!r}", hint="settings: users, groups"
                )
        kwargs["admin_users"] = frozenset(_split(a.get("users", "")))
        kwargs["admin_groups"] = frozenset(_split(a.get("groups", "")))
    return Config(**kwargs)


def load_config(path: str | os.PathLike | None) -> Config:
    """Read the config file; None reads DEFAULT_CONFIG if it exists, else the defaults.

    The defaults let only root and admins lock: a fresh install refuses
    everyone else until the admin says who may.
    """
    if path is None:
        if not os.path.exists(DEFAULT_CONFIG):
            return Config()
        path = DEFAULT_CONFIG
    from gpuenv import reader  # a regular text file, bounded: a FIFO or /dev/zero is refused

    text = reader.read_text(path, what="cannot read the daemon config", setting="--config")
    return parse_config(text or "", source=os.fspath(path))


def trusted_daemon_uids() -> dict[int, str]:
    """The accounts a client believes to be gpuenvd (uid -> name): root; this user (a daemon
    you started yourself is no stranger); the account GPUENV_DAEMON_USER or the config's
    `[daemon] user` names. A socket served by anyone else is a fake (client.py refuses it)."""
    names = {0: "root"}
    me = os.geteuid()
    names[me] = _user_name(me)
    wanted = os.environ.get("GPUENV_DAEMON_USER", "").strip()
    if not wanted:
        with contextlib.suppress(ConfigError, OSError):
            wanted = load_config(None).user or ""
    if wanted:
        try:  # an account that does not exist adds no one (root is trusted still)
            uid = int(wanted) if wanted.isdigit() else pwd.getpwnam(wanted).pw_uid
            names[uid] = _user_name(uid)
        except KeyError:
            pass
    return names


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# gpuenvd's metrics port when only a host is given: outside the Prometheus wiki's exporter
# range 9100-9999 (fully allocated; 9400 is dcgm-exporter's), below Linux's ephemeral ports
METRICS_PORT = 19400


def _is_address(text: str) -> bool:
    if text == "localhost":
        return True
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def parse_listen(value: str) -> tuple[str, int]:
    """ "127.0.0.1:19400", "19400" (on 127.0.0.1) or an address alone, "0.0.0.0" or
    "localhost" (on METRICS_PORT) -> (host, port)."""
    if _is_address(value.strip()):
        value = f"[{value.strip()}]:{METRICS_PORT}"
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise ConfigError(
            f"metrics address {value!r} is not HOST:PORT", hint=f"e.g. 127.0.0.1:{METRICS_PORT}"
        )
    return host, number


class Authorizer:
    """Decisions from a Config: may this peer lock these GPUs, release that lease.

    `jobs` lists the running Slurm jobs gpuenvd knows (gpuenvd's JobBook.running): the
    `job` rule's GPUs, and the GPUs no rule but an admin's may lock for another account.
    Outside Slurm the `job` rule reads the caller's device cgroup (`cgroups`) and maps the
    minors it allows to GPUs with `minors` (asked once, when first needed).
    """

    def __init__(
        self,
        config: Config,
        uuids: Sequence[str],
        jobs: RunningJobs | None = None,
        *,
        minors: MinorNumbers | None = None,
        cgroups: DeviceCgroups | None = None,
    ):
        self.config = config
        self._uuids = list(uuids)
        self._rules = {key: self._resolve(key, sel) for key, sel in config.lock_rules.items()}
        self._job_rules = frozenset(k for k, sel in config.lock_rules.items() if JOB in sel)
        self.jobs: RunningJobs = jobs or (lambda: ())
        self._minors = minors or (lambda: ())
        self._minor_to_gpu: dict[int, int] | None = None  # filled once (idempotent)
        self.cgroups = cgroups or DeviceCgroups()

    def _resolve(self, key: str, selectors: Iterable[str]) -> frozenset[int]:
        out: set[int] = set()
        for sel in selectors:
            if sel == "all":
                out.update(range(len(self._uuids)))
            elif sel in ("none", JOB):  # job: the caller's own jobs' GPUs, asked at lock time
                continue
            elif sel.isdigit():
                index = int(sel)
                if index >= len(self._uuids):
                    raise ConfigError(
                        f"{self.config.source}: [lock] {key} names GPU {index}, "
                        f"but this machine has {len(self._uuids)}",
                        hint=f"use indices 0-{len(self._uuids) - 1} or UUIDs",
                    )
                out.add(index)
            else:
                matches = [
                    i for i, u in enumerate(self._uuids) if u.lower().startswith(sel.lower())
                ]
                if len(matches) != 1:
                    raise ConfigError(
                        f"{self.config.source}: [lock] {key} names {sel!r}, "
                        f"which matches {len(matches)} GPUs",
                        hint="use an index or a unique UUID prefix ('gpuenv status' lists them)",
                    )
                out.add(matches[0])
        return frozenset(out)

    def rules(self) -> dict[str, frozenset[int]]:
        """Each [lock] key with the GPU indices it resolved to (a `job` rule's are not
        fixed: see describe_rules)."""
        return dict(self._rules)

    def describe_rules(self) -> dict[str, str]:
        """Each [lock] key with what it grants, in words: its GPU indices, and `job` (the
        caller's own running Slurm jobs' GPUs) where it says so."""
        out = {}
        for key, gpus in self._rules.items():
            parts = [str(g) for g in sorted(gpus)]
            if key in self._job_rules:
                parts.append(JOB_WORDS)
            out[key] = ", ".join(parts) or "none"
        return out

    def is_admin(self, peer: Peer) -> bool:
        return (
            peer.uid == 0
            or peer.user in self.config.admin_users
            or bool(peer.groups & self.config.admin_groups)
        )

    def _applying(self, peer: Peer) -> list[str]:
        """The [lock] keys that apply to this peer: *, its user (name or uid), its groups."""
        keys = ["*", f"user:{peer.user}"]
        if str(peer.uid) != peer.user:
            keys.append(f"user:{peer.uid}")
        keys += [f"group:{group}" for group in sorted(peer.groups)]
        return [k for k in keys if k in self._rules]

    def _jobs(self, peer: Peer) -> tuple[set[int], dict[int, tuple[str, str]]]:
        """The GPUs of this peer's own running jobs, and those of other accounts' jobs
        (GPU -> (job, user))."""
        mine: set[int] = set()
        theirs: dict[int, tuple[str, str]] = {}
        for gpu, job, user in self.jobs():
            if _is_user(peer, user):
                mine.add(gpu)
            else:
                theirs[gpu] = (job, user)
        return mine, theirs

    def _cgroup(self, peer: Peer) -> tuple[frozenset[int], DeviceLimit]:
        """The GPUs the peer's device cgroup limits it to, and what the cgroup says."""
        if self._minor_to_gpu is None:
            self._minor_to_gpu = {m: i for i, m in enumerate(self._minors()) if m is not None}
        limit = self.cgroups.limit(peer.pid, peer.uid)
        return limit.gpus(self._minor_to_gpu), limit

    def lockable(self, peer: Peer) -> frozenset[int]:
        """The GPUs this peer may lock: admins all; else its user, group and * rules together
        (a `job` rule: its own running jobs' GPUs; with none, those its device cgroup
        limits it to), less any GPU of another account's job."""
        if self.is_admin(peer):
            return frozenset(range(len(self._uuids)))
        keys = self._applying(peer)
        allowed: set[int] = set()
        for key in keys:
            allowed |= self._rules[key]
        mine, theirs = self._jobs(peer)
        if any(key in self._job_rules for key in keys):
            allowed |= mine or self._cgroup(peer)[0]  # a Slurm job first: its GPUs
        return frozenset(allowed - set(theirs))

    def check_lock(self, peer: Peer, gpus: Iterable[int]) -> None:
        """Raise PermissionDenied naming the first GPU this peer may not lock (and, for a GPU
        of another account's running job, that job and its owner)."""
        if self.is_admin(peer):
            return
        allowed = self.lockable(peer)
        for gpu in gpus:
            if gpu not in allowed:
                raise self._refusal(peer, gpu, allowed)

    def _refusal(self, peer: Peer, gpu: int, allowed: frozenset[int]) -> PermissionDenied:
        where = f"GPUs {sorted(allowed)}" if allowed else "no GPU"
        _, theirs = self._jobs(peer)
        if gpu in theirs:
            job, owner = theirs[gpu]
            return PermissionDenied(
                f"{peer.user} may not lock a GPU of {owner}'s running Slurm job {job} "
                f"(allowed: {where})",
                op="lock",
                gpu=gpu,
                hint=f"lock only your own job's GPUs (SLURM_JOB_GPUS); GPU {gpu} is free "
                f"once job {job} ends",
            )
        if any(key in self._job_rules for key in self._applying(peer)):
            return self._job_refusal(peer, gpu, where)
        return PermissionDenied(
            f"{peer.user} may not lock clocks through gpuenvd (allowed: {where})",
            op="lock",
            gpu=gpu,
            hint=f"ask the admin to add 'user:{peer.user} = ...' to [lock] in "
            f"{self.config.source or DEFAULT_CONFIG}",
        )

    def _job_refusal(self, peer: Peer, gpu: int, where: str) -> PermissionDenied:
        """The `job` rule's refusal: the caller's Slurm jobs are elsewhere, or (with none)
        what its device cgroup says."""
        mine, _ = self._jobs(peer)
        if mine:
            return PermissionDenied(
                f"{peer.user} may lock only the GPUs of their own running Slurm jobs, and "
                f"none of them is on this GPU (allowed: {where})",
                op="lock",
                gpu=gpu,
                hint="lock from inside your job (sbatch/srun --gres=gpu:N), on its GPUs "
                "(SLURM_JOB_GPUS)",
            )
        gpus, limit = self._cgroup(peer)
        why = limit.why
        if limit.minors and not gpus:
            why += " (none of them is a GPU gpuenvd knows the minor number of)"
        if gpus:
            hint = f"lock the GPUs your cgroup allows (-i {','.join(map(str, sorted(gpus)))})"
        else:
            hint = (
                "run the job under Slurm (sbatch/srun --gres=gpu:N), whose GPUs it may lock, "
                f"or ask the admin for a [lock] rule that names GPUs ('user:{peer.user} = "
                f"0,1' in {self.config.source or DEFAULT_CONFIG})"
            )
        return PermissionDenied(
            f"{peer.user} may lock only the GPUs of their own running Slurm jobs or, "
            "outside Slurm, those their process's device cgroup limits it to; no Slurm job "
            f"of theirs runs here, and their process {why} (allowed: {where})",
            op="lock",
            gpu=gpu,
            hint=hint,
        )

    def check_release(self, peer: Peer, owner_uid: int, owner: str, what: str) -> None:
        """Users release only their own leases (same uid); admins release any."""
        if peer.uid != owner_uid and not self.is_admin(peer):
            raise PermissionDenied(
                f"{what} belongs to {owner}; {peer.user} may release only their own leases",
                op="release",
                hint="ask its owner, or an admin ([admin] in the daemon config)",
            )


JOB_WORDS = (
    "job (the GPUs of the caller's own running Slurm job; outside Slurm, the GPUs its "
    "process's device cgroup limits it to, cgroup v1 only)"
)


def _is_user(peer: Peer, user: str) -> bool:
    """Whether a job's user (Slurm's SLURM_JOB_USER, its getpwuid name; or a uid) is this
    peer's. Both names come from the same account database: no lookup here, which on a
    site's LDAP would cost each hello a round trip per running job."""
    return user == peer.user or user == str(peer.uid)
