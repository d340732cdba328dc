"""At daemon start: put back what a daemon that died left locked, find standing leases again.

A connection lease dies with the daemon that held it (its journal owner is
that daemon: kind "lease", the daemon as pid and watchdog), so every GPU whose
owners are all gone is restored from its journal entry before the socket
answers. Standing leases granted through gpuenvd (kind "standing", command
ending "via gpuenvd") are taken back into the lease table.
"""

from __future__ import annotations

import logging

from gpuenv.clocks import release_owner
from gpuenv.clocks import restore as clocks_restore
from gpuenv.clocks.journal import Owner
from gpuenv.daemon.holds import DAEMON_MARK
from gpuenv.daemon.leases import Lease, LeaseManager
from gpuenv.errors import GpuenvError

log = logging.getLogger("gpuenv.daemon")


def recover(manager: LeaseManager) -> list[int]:
    """Restore every GPU whose owners are all gone and adopt standing leases; returns the GPUs
    restored. A GPU that cannot be restored is logged and left journaled: the daemon serves
    anyway, and 'gpuenv restore' retries."""
    backend, journal = manager.backend, manager.journal
    indices = {backend.device_info(i).uuid: i for i in range(backend.device_count())}
    restored: list[int] = []
    with journal.locked():
        entries, damaged = journal.scan()
        for bad in damaged:  # each GPU alone: the others are still recovered
            if bad.uuid in indices:
                log.error("recovery: GPU %d: %s: %s", indices[bad.uuid], bad.message, bad.hint)
        for entry in entries:
            index = indices.get(entry.uuid)
            if index is None or entry.backend != backend.name:
                continue  # another machine's GPU, or a simulated GPU's journal
            # a connection lease dies with the daemon that held it (its "watchdog")
            gone = [
                o
                for o in entry.owners
                if not o.alive() or (o.kind == "lease" and not o.watchdog_alive())
            ]
            try:
                for owner in gone:
                    log.warning(
                        "recovery: GPU %d: owner %s is gone; releasing its lock",
                        index,
                        owner.describe(),
                    )
                    release_owner(backend, journal, owner.token)
                if not entry.owners:
                    # nobody owns it (a rollback that failed): put it back as restore would
                    clocks_restore([index], backend=backend, journal=journal)
            except GpuenvError as err:  # serve anyway: the entry stays for 'gpuenv restore'
                log.error("recovery: GPU %d could not be restored: %s", index, err)
                continue
            if (gone or not entry.owners) and journal.get(entry.uuid) is None:
                restored.append(index)
        for entry in journal.entries():
            index = indices.get(entry.uuid)
            if index is None or entry.backend != backend.name:
                continue
            for owner in entry.owners:
                if owner.kind == "standing" and owner.command.endswith(DAEMON_MARK):
                    manager.adopt(_standing_lease(owner, index), index, entry.applied)
                    log.info(
                        "recovery: standing lease %s of %s on GPU %d is still held",
                        owner.token[:12],
                        owner.user,
                        index,
                    )
    return sorted(restored)


def _standing_lease(owner: Owner, index: int) -> Lease:
    command = owner.command.removesuffix(DAEMON_MARK).rstrip()
    return Lease(
        id=owner.token[:12],
        token=owner.token,
        uid=owner.uid,
        user=owner.user,
        pid=owner.pid,
        gpus=(index,),
        request=owner.request,
        standing=True,
        label=None,
        granted_at=owner.started_at,
        conn=None,
        command=command,
    )
