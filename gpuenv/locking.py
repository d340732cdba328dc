"""One way to take a lock: every door (`gpuenv lock/restore`, `gpuenv run --sm`,
`gpuenv.lock()`, `stable(sm=)`, the Slurm prolog/epilog) calls `acquire` / `restore`.

Who applies the lock:
  - a gpuenvd answers on its socket (GPUENV_SOCKET, else /run/gpuenv/gpuenv.sock)
    and drives the same GPUs: the daemon, for every caller, root included. A
    process's lock is a lease tied to its connection (it ends when the process
    ends, SIGKILL included); `gpuenv lock` takes a standing lease that
    `gpuenv restore` ends. Root goes through the daemon too, so that the daemon
    stays the one authority: its queue orders every request (a root lock taken
    beside it would jump the queue of a user waiting for another clock), its
    log and status name every holder, and its leases are what status shows.
  - no daemon answers (or the backend is read-only, or a journal is given):
    locally (`gpuenv.clocks`), which needs root; a user without it is told how
    to get a daemon that serves them.

`restore` first releases the locks this process took through `acquire`, so
`lk = gpuenv.lock(sm="base")` ... `gpuenv.restore()` puts the GPU back.
"""

from __future__ import annotations

import contextlib
import os
import stat
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from gpuenv.backend import Backend
from gpuenv.clocks.journal import Applied, Journal
from gpuenv.clocks.plan import GpuPlan, LockPlan, plan_lock, read_state
from gpuenv.clocks.request import LockRequest, LockSettings, requested
from gpuenv.errors import ConfigError, GpuenvError, LockConflict, PermissionDenied

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+

    from gpuenv.daemon.client import Client

GpuSelector = str | int | Sequence[str | int] | None


class HeldLock(Protocol):
    """A lock `acquire` took: a local `gpuenv.clocks.Lock`, or gpuenvd's lease
    (`gpuenv.daemon.client.DaemonLock`). What every caller may use of either."""

    @property
    def gpus(self) -> list[int]:
        """The GPUs locked, by index."""
        ...

    @property
    def request(self) -> LockRequest:
        """What was asked for (`sm="sustained"` stays so: `plan` holds the clock it meant)."""
        ...

    @property
    def plan(self) -> LockPlan:
        """Each GPU's state before and the state applied (`lock_ranges` reads it)."""
        ...

    @property
    def notes(self) -> list[str]:
        """What a person should know (a clock snapped to a supported one, the daemon)."""
        ...

    @property
    def shared(self) -> list[int]:
        """The GPUs where the same state was already held by another owner (shared)."""
        ...

    @property
    def released(self) -> bool: ...

    def holds(self) -> dict[int, bool | None]:
        """Per GPU: is the SM clock inside the locked range now (None: cannot tell)."""
        ...

    def release(self) -> object:
        """Put back what was there before (idempotent)."""
        ...

    def __enter__(self) -> HeldLock: ...

    def __exit__(self, *exc: object) -> None: ...


# The locks this process took through acquire() (released ones pruned). The process owns
# them (a lease ends with it), so `gpuenv.restore()` puts back what `gpuenv.lock()` took
# in this process; which lock a restore releases is found by the GPU's UUID, never by an
# index that names another GPU on another backend.
_HELD: list[HeldLock] = []


class DaemonNotUsed(UserWarning):
    """A socket is where gpuenvd's would be, but no working gpuenvd answers on it."""


def daemon_client(
    backend: Backend, *, socket: str | os.PathLike[str] | None = None
) -> Client | None:
    """A connection to the gpuenvd that drives `backend`'s GPUs, or None when none answers.

    Cheap without a daemon (a stat of the socket). None for a read-only backend
    (nothing will be written) and when the daemon drives other GPUs (another
    machine's socket, another simulated GPU).
    """
    return None if backend.readonly else _connect(backend, socket)


def _connect(backend: Backend, socket: str | os.PathLike[str] | None) -> Client | None:
    from gpuenv.daemon.client import Client, DaemonNotTrusted, default_socket

    path = os.fspath(socket) if socket is not None else default_socket()
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return None
    except PermissionError:  # its directory is closed to us: gpuenvd's, for its group
        raise socket_denied(path) from None
    except OSError:
        return None
    if not os.access(path, os.W_OK):  # connecting needs write access: gpuenvd's group has it
        raise socket_denied(path)
    try:
        client = Client(path, client="gpuenv")
    except DaemonNotTrusted:
        raise  # a fake gpuenvd: said, never answered by a local lock as if none were there
    except (OSError, GpuenvError) as err:  # a socket is there: say why it is not used
        warnings.warn(f"{err}; going on without gpuenvd", DaemonNotUsed, stacklevel=3)
        return None
    mine = {backend.device_info(i).uuid for i in range(backend.device_count())}
    if not mine & {g.get("uuid") for g in client.info.get("gpus", [])}:
        client.close()
        return None
    return client


def acquire(
    sm: int | str | tuple[int, int] | None = None,
    /,
    *,
    request: LockRequest | None = None,
    gpus: GpuSelector = None,
    backend: Backend | None = None,
    standing: bool = False,
    force: bool = False,
    supervise: bool = True,
    journal: Journal | None = None,
    command: str | None = None,
    socket: str | os.PathLike[str] | None = None,
    **settings: Unpack[LockSettings],
) -> HeldLock:
    """Lock clocks through the daemon when one serves these GPUs, else locally.

    The `nvidia-smi` equivalent is `-lgc` / `-lmc` / `-pl`, with what was there before
    journaled and put back on release. What to lock is a `LockRequest`, or its keywords
    (`gpuenv.lock(sm=1350, power_limit_w=500)`), made into one here.

    Args:
        sm: the SM clock in MHz, a (min, max) range, or "max", "base", "sustained"
            (by position or by name).
        request: what to lock as one `LockRequest` (`gpuenv.clocks.make_request`),
            instead of the keywords.
        gpus: which GPUs (indices, UUIDs, PCI bus ids, "all"); default: the GPUs this
            process may use (`gpuenv.devices.own_gpus`: LOCAL_RANK's, else
            CUDA_VISIBLE_DEVICES', else Slurm's, else all).
        backend: the GPU backend (default: `open_backend()`).
        standing: the lock outlives this process until `restore()` (`gpuenv lock`).
        force: take over a lock another owner holds.
        supervise: a watchdog restores the GPUs if this process dies.
        journal: forces the local path (tests, the daemon itself).
        command: what the journal records as the owner's command.
        socket: gpuenvd's socket (default: GPUENV_SOCKET, or the standard path).
        **settings: `sm_max` (the top of the SM range when `sm` is its bottom), `mem` (the
            memory clock, as `sm`), `power_limit_w` (the power limit, in watts).

    Returns:
        A `HeldLock`: a `gpuenv.clocks.Lock` or a `gpuenv.daemon.client.DaemonLock`.

    Raises:
        LockConflict: another owner holds a different state on these GPUs.
        PermissionDenied: not root, and no gpuenvd serves these GPUs.
        ConfigError: a clock or limit the GPU does not support.
    """
    from gpuenv import validate
    from gpuenv.clocks import locks

    request = requested(request, sm, settings)
    gpus = validate.gpu_selector(gpus, "gpus")
    socket = validate.path_like(socket, "socket")
    held: HeldLock | None = None
    gpus = _own(backend) if gpus is None else gpus  # resolved here: a lease names its GPUs
    if journal is None:
        probe = backend if backend is not None else _open()
        try:
            client = daemon_client(probe, socket=socket)
            if client is not None:
                held = _lease(client, probe, request, gpus, standing, force, command)
        finally:
            if backend is None:
                probe.close()  # a lease needs no backend; a local lock opens its own
    if held is None:
        with _hinted():
            held = locks.local_lock(
                request=request,
                gpus=gpus,
                backend=backend,
                force=force,
                supervise=supervise,
                journal=journal,
                kind="standing" if standing else "process",
                command=command,
            )
    _HELD[:] = [lk for lk in _HELD if not lk.released]
    if not standing:
        _HELD.append(held)
    return held


lock = acquire  # gpuenv.lock()


def _open() -> Backend:
    from gpuenv.backend import open_backend

    return open_backend()


@contextlib.contextmanager
def _hinted() -> Iterator[None]:
    """A local write refused for want of root: say the step that makes it work."""
    try:
        yield
    except PermissionDenied as err:
        err.hint = _no_daemon_hint()
        raise


def _no_daemon_hint() -> str:
    from gpuenv.daemon.client import default_socket

    user = _user()
    hint = (
        f"run as root, or have an admin start gpuenvd ('sudo gpuenv daemon', or "
        f"'systemctl start gpuenvd') with 'user:{user} = all' under [lock] in "
        f"/etc/gpuenv/gpuenvd.conf; then retry as you are (no daemon answers on "
        f"{default_socket()})"
    )
    if os.environ.get("GPUENV_BACKEND", "").strip().lower() == "sim":
        # the host's simulated GPU is root's, as a real one; a machine of one's own is not
        hint += (
            "; or, to try locks on a simulated GPU of your own, in a directory you own: "
            "GPUENV_SIM_STATE=~/gpuenv-sim.json GPUENV_SIM_ROOT=1 gpuenv --sim lock ..."
        )
    return hint


def socket_denied(path: str) -> PermissionDenied:
    """gpuenvd's socket (or its directory) refused this account: name the group it is open
    to and how to join it, not "have an admin start gpuenvd" while it runs."""
    import grp

    group = None
    for where in (path, os.path.dirname(path)):
        try:
            gid = os.stat(where).st_gid
        except OSError:
            continue
        try:
            group = grp.getgrgid(gid).gr_name
        except KeyError:
            group = str(gid)
        break
    user = _user()
    if group is None:
        return PermissionDenied(
            f"permission denied on gpuenvd's socket {path}",
            hint="ask the admin which group gpuenvd's socket is open to (socket_group in "
            "/etc/gpuenv/gpuenvd.conf) and to add you to it",
        )
    return PermissionDenied(
        f"permission denied on gpuenvd's socket {path}: it is open to the group "
        f"'{group}', and {user} is not in it",
        hint=f"ask an admin to add you ('sudo usermod -aG {group} {user}'), then log in "
        f"again (or run 'newgrp {group}') and retry",
    )


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _lease(
    client: Client,
    backend: Backend,
    request: LockRequest,
    gpus: GpuSelector,
    standing: bool,
    force: bool,
    command: str | None,
) -> HeldLock:
    """A lease from the daemon on `client`'s connection (closed with the lease)."""
    from gpuenv.daemon.client import DaemonLock

    try:
        selected = _selected(backend, gpus)
        plan = _local_plan(backend, request, selected)
        if request.sm == "sustained" and plan is not None:
            # the clock the caller's own 'gpuenv calibrate' measured, not the daemon's
            targets = {gp.applied.locked_sm for gp in plan.gpus}
            if len(targets) == 1 and None not in targets:
                request = replace(request, sm=targets.pop())
        uuids = [backend.device_info(i).uuid for i in selected]
        if force:
            client.restore(uuids, all_owners=True)  # refused for others' leases unless admin
        info = client.lock(
            request,
            gpus=uuids,
            standing=standing,
            label=command,
        ).info
    except LockConflict as err:
        client.close()
        if not client.info.get("peer", {}).get("admin"):
            # --force is for the daemon's admins: say what this caller can do
            err.hint = (
                "wait for it to end, or ask for the same state to share it; an admin of "
                "gpuenvd (root, or [admin] in its config) can end it with 'gpuenv restore --all'"
            )
        raise
    except BaseException:
        client.close()
        raise
    if plan is None:
        plan = _plan_from_daemon(client, backend, list(info["gpus"]), request)
    return DaemonLock(client, info, plan)


def _selected(backend: Backend, gpus: GpuSelector) -> list[int]:
    """The GPUs `gpus` names; None: this process's own (gpuenv.devices.own_gpus)."""
    from gpuenv.devices import choose_gpus

    return choose_gpus(backend, gpus).indices


def _own(backend: Backend | None) -> list[int]:
    """This process's own GPUs (gpuenv.devices.own_gpus), on `backend` or one opened here."""
    from gpuenv.devices import own_gpus

    if backend is not None:
        return own_gpus(backend).indices
    opened = _open()
    try:
        return own_gpus(opened).indices
    finally:
        opened.close()


def _local_plan(backend: Backend, request: LockRequest, gpus: list[int]) -> LockPlan | None:
    """The plan as this process sees it (validation, snapping, notes); None when only the
    daemon can resolve it (sm='sustained' calibrated by root, not by this user)."""
    try:
        return plan_lock(backend, request, gpus, journal=Journal())
    except ConfigError:
        if request.sm == "sustained":
            return None
        raise


def _plan_from_daemon(
    client: Client, backend: Backend, gpus: list[int], request: LockRequest
) -> LockPlan:
    from gpuenv.devices import describe

    plans = []
    for g in client.status(gpus)["gpus"]:
        rng = g.get("range_mhz")
        index = int(g["index"])
        applied = Applied(locked_sm=(int(rng[0]), int(rng[1])) if rng else None)
        current = read_state(backend, index, journal=Journal())
        plans.append(GpuPlan(index, str(g["uuid"]), describe(backend, index), current, applied))
    return LockPlan(request, tuple(plans))


def release_own(gpus: Sequence[int] | None = None, *, backend: Backend | None = None) -> list[int]:
    """Release the locks this process took through `acquire` (on `gpus`, default all).

    `gpus` are indices on `backend`, matched to each lock's GPUs by UUID; without a
    backend, indices on each lock's own.
    """
    uuids = None
    if gpus is not None and backend is not None:
        uuids = {backend.device_info(i).uuid: i for i in gpus}
    done: list[int] = []
    for lk in list(_HELD):
        mine = _own_gpus(lk, gpus, uuids)
        if lk.released or not mine:
            continue
        lk.release()
        done.extend(mine)
    _HELD[:] = [lk for lk in _HELD if not lk.released]
    return sorted(set(done))


def _own_gpus(lk: Any, gpus: Sequence[int] | None, uuids: dict[str, int] | None) -> list[int]:
    """The GPUs of `gpus` that lock `lk` holds (all of its own when `gpus` is None)."""
    if gpus is None:
        return list(lk.gpus)
    if uuids is None:
        return [g for g in lk.gpus if g in set(gpus)]
    plan = getattr(lk, "plan", None)
    held = [gp.uuid for gp in plan.gpus] if plan is not None else []
    return [uuids[u] for u in held if u in uuids]


def restore(
    gpus: GpuSelector = None,
    *,
    backend: Backend | None = None,
    all_owners: bool = False,
    socket: str | os.PathLike[str] | None = None,
) -> list[int]:
    """Put back what locks changed on `gpus` (`gpuenv restore`); returns the GPUs put back.

    First the locks this process holds (taken through `acquire`); then, through the
    daemon when one serves these GPUs, your standing leases (admins with
    `all_owners`: everyone's); else locally (`gpuenv.clocks.restore`): standing locks
    and locks whose owner died.

    Args:
        gpus: which GPUs; default: the GPUs `acquire` takes by default, this process's
            own (`gpuenv.devices.own_gpus`); "all" for every GPU.
        backend: the GPU backend (default: `open_backend()`).
        all_owners: also what other owners locked (root, or gpuenvd's admins).
        socket: gpuenvd's socket (default: GPUENV_SOCKET, or the standard path).

    Returns:
        The indices of the GPUs put back.

    Raises:
        LockConflict: a live process holds a lock on these GPUs (unless `all_owners`).
        PermissionDenied: not root, and no gpuenvd serves these GPUs.
    """
    from gpuenv.clocks import restoring

    own = backend is None
    if backend is None:
        backend = _open()
    try:
        selected = _selected(backend, gpus)
        done = release_own(selected, backend=backend)
        client = daemon_client(backend, socket=socket)
        if client is None:
            with _hinted():
                done += restoring.restore(selected, backend=backend, all_owners=all_owners)
        else:
            with client:
                uuids = [backend.device_info(i).uuid for i in selected]
                done += client.restore(uuids, all_owners=all_owners)
        return sorted(set(done))
    finally:
        if own:
            backend.close()


def lock_ranges(lock: HeldLock, backend: Backend) -> dict[int, tuple[int, int]]:
    """The SM range each GPU of `lock` holds, the base clock resolved (app clocks: the SM one).
    A GPU locked to a base clock NVML does not report is left out (cannot be checked)."""
    from gpuenv.clocks.request import TDP_LOCK

    ranges: dict[int, tuple[int, int]] = {}
    for gp in lock.plan.gpus:
        applied = gp.applied
        if applied.locked_sm is not None:
            lo, hi = applied.locked_sm
            if (lo, hi) == TDP_LOCK:
                try:
                    base = backend.clock_limits(gp.index).base_sm_mhz
                except GpuenvError:
                    base = None
                if base is None:
                    continue
                lo = hi = base
            ranges[gp.index] = (int(lo), int(hi))
        elif applied.app_clocks is not None:
            ranges[gp.index] = (int(applied.app_clocks[1]), int(applied.app_clocks[1]))
    return ranges


def lock_view(backend: Backend, index: int) -> dict[str, Any] | None:
    """The lock on GPU `index` as the daemon sees it, for 'gpuenv status'; None when no
    daemon serves this GPU (then the local journal is the record)."""
    client = _connect(backend, None)  # reading: a read-only backend may ask too
    if client is None:
        return None
    with client:
        uuid = backend.device_info(index).uuid
        for g in client.status([uuid])["gpus"]:
            owners = [f"pid {o['pid']} ({o['user']}, {o['command']})" for o in g.get("owners", [])]
            return {
                "state": "locked" if g.get("locked") else "none",
                "sm_mhz": g.get("range_mhz"),
                "mem_mhz": None,
                "holds": g.get("holds"),
                "owners": owners,
                "stale": False,
                "text": f"{g.get('lock')} (gpuenvd)" if g.get("locked") else g.get("lock"),
            }
    return None


__all__ = [
    "HeldLock",
    "acquire",
    "daemon_client",
    "lock",
    "lock_ranges",
    "lock_view",
    "release_own",
    "restore",
]
