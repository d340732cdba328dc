"""gpuenvd's operations: one method per protocol op (`op_<name>`), each returning its reply's
fields or raising a GpuenvError (the server turns it into an error reply)."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

from gpuenv.backend import Backend, DeviceInfo
from gpuenv.clocks.request import LockRequest
from gpuenv.daemon import protocol
from gpuenv.daemon.auth import Authorizer
from gpuenv.daemon.connection import MAX_SUBSCRIPTIONS, MAX_WINDOWS, Conn
from gpuenv.daemon.jobs import JobBook, job_ops
from gpuenv.daemon.leases import LeaseManager
from gpuenv.devices import select_gpus
from gpuenv.errors import ConfigError
from gpuenv.telemetry import Sampler
from gpuenv.telemetry.host import descends_from
from gpuenv.timebase import Clock


class Operations:
    """What each request does, on the daemon's parts (no socket handling here)."""

    def __init__(
        self,
        backend: Backend,
        infos: list[DeviceInfo],
        auth: Authorizer,
        leases: LeaseManager,
        sampler: Sampler,
        clock: Clock,
        connections: Callable[[], int],
    ):
        self.backend = backend
        self.infos = infos
        self.gpus = [info.index for info in infos]
        self.auth = auth
        self.leases = leases
        self.sampler = sampler
        self.clock = clock
        self.connections = connections
        self.started_at = clock.wall()  # epoch seconds; uptime counts on clock.now()
        self._t0 = clock.now()
        self._ids = itertools.count(1)
        jobs_dir = leases.journal.path / "jobs"  # beside the journal: the daemon's own
        self.jobs = JobBook(backend, infos, sampler, leases.lock_range, jobs_dir, clock=clock)
        auth.jobs = self.jobs.running  # the `job` rule, and other accounts' jobs' GPUs

    def _gpus(self, selector: list[int | str] | None) -> list[int]:
        if selector is None:
            return list(self.gpus)
        for item in selector:
            if isinstance(item, str) and item.lower().startswith(("cuda:", "local")):
                raise ConfigError(
                    f"gpuenvd cannot resolve {item!r}: CUDA numbering belongs to the client",
                    hint="resolve it to an NVML index or a UUID before asking the daemon",
                )
        return select_gpus(self.backend, selector)

    def op_hello(self, conn: Conn, versions: list[int], client: str | None) -> dict[str, Any]:
        """The handshake: the newest protocol version both sides speak, who the daemon
        takes the peer to be (its credentials, not what it claims), whether it is an admin,
        the GPUs it may lock and every GPU the daemon serves. No common version: a
        ProtocolError."""
        common = sorted(set(versions) & set(protocol.SUPPORTED_VERSIONS))
        if not common:
            raise protocol.ProtocolError(
                f"no common protocol version (client {versions}, "
                f"daemon {list(protocol.SUPPORTED_VERSIONS)})",
                hint="upgrade gpuenv on the older side",
            )
        peer = conn.peer
        return {
            "protocol": common[-1],
            "daemon": version(),
            "pid": os.getpid(),
            "backend": self.backend.name,
            "peer": {
                "uid": peer.uid,
                "user": peer.user,
                "pid": peer.pid,
                "admin": self.auth.is_admin(peer),
            },
            "may_lock": sorted(self.auth.lockable(peer)),
            "gpus": [{"index": i.index, "uuid": i.uuid, "name": i.name} for i in self.infos],
        }

    def op_status(self, conn: Conn, gpus: list[int | str] | None) -> dict[str, Any]:
        """`gpuenv status` through the daemon: each GPU's latest sample and lock state,
        every lease, and the daemon's own figures (pid, version, uptime, connections,
        counters). Anyone may ask."""
        out = []
        for index in self._gpus(gpus):
            sample = self.sampler.latest(index)
            out.append(
                {
                    "index": index,
                    "uuid": self.infos[index].uuid,
                    "name": self.infos[index].name,
                    "sample": sample.to_dict() if sample is not None else None,
                    **self.leases.gpu_status(index),
                }
            )
        return {
            "gpus": out,
            "leases": [lease.to_dict() for lease in self.leases.leases()],
            "daemon": {
                "pid": os.getpid(),
                "version": version(),
                "uptime_s": round(self.clock.now() - self._t0, 3),
                "connections": self.connections(),
                **self.leases.counters(),
            },
        }

    def op_lock(
        self,
        conn: Conn,
        gpus: list[int | str] | None,
        standing: bool,
        wait: float,
        label: str | None,
        **wire: Any,
    ) -> dict[str, Any]:
        """`gpuenv lock` through the daemon: a lease on `gpus` for the request in `wire`
        (`LockRequest.to_wire`'s fields), granted as leases.LeaseManager.grant decides
        (shared when another lease asks the same state, queued up to `wait` seconds
        otherwise). `standing`: it outlives the connection until released or restored."""
        indices = self._gpus(gpus)
        request = LockRequest.from_wire(wire)  # the request's own fields, read in one place
        lease = self.leases.grant(
            conn.peer,
            conn.id,
            indices,
            request,
            standing=standing,
            wait=wait,
            label=label,
            hangup=conn.hung_up,
        )
        return {"lease": lease.to_dict()}

    def op_release(self, conn: Conn, lease: str) -> dict[str, Any]:
        """End one lease (its owner's, or any for an admin): `lease`'s record as it ended.
        Its GPUs go back to their state before it unless another lease shares them."""
        ended = self.leases.release(conn.peer, lease)
        return {"lease": ended.to_dict()}

    def op_restore(self, conn: Conn, gpus: list[int | str] | None, all: bool) -> dict[str, Any]:
        """`gpuenv restore` through the daemon: the peer's standing leases on `gpus` end
        (`all`: an admin ends everyone's and puts back any other gpuenv lock); the GPUs put
        back (leases.LeaseManager.restore)."""
        restored = self.leases.restore(conn.peer, self._gpus(gpus), all_owners=all)
        return {"restored": restored}

    def op_window_start(self, conn: Conn, gpus: list[int | str] | None) -> dict[str, Any]:
        """Mark the start of a timed region on `gpus`: a window id for window_end, and its
        start on the daemon's sampler clock. A connection keeps at most MAX_WINDOWS open
        (the oldest is dropped)."""
        indices = self._gpus(gpus)
        t0 = self.sampler.mark()
        wid = next(self._ids)
        if len(conn.windows) >= MAX_WINDOWS:
            conn.windows.pop(next(iter(conn.windows)))
        conn.windows[wid] = (t0, indices)
        return {"window": wid, "t0": t0}

    def op_window_end(self, conn: Conn, window: int) -> dict[str, Any]:
        """Close `window`: one telemetry Window per GPU from the daemon's sampler over the
        region, the client's own process not counted as another on the GPU. A window
        not open on this connection (or ended already): a ProtocolError."""
        if window not in conn.windows:
            raise protocol.ProtocolError(
                f"no open window {window} on this connection",
                hint="call window_start first; each window ends once",
            )
        t0, indices = conn.windows.pop(window)
        t1 = self.sampler.mark()
        windows = []
        for index in indices:
            w = self.sampler.window(t0, t1, index, lock_range=self.leases.lock_range(index))
            # the client's own process (and its children) are expected on the GPU, not
            # "another process"
            w = w.without_others(lambda p: descends_from(p, conn.peer.pid))
            windows.append(w.to_dict())
        return {"t0": t0, "t1": t1, "windows": windows}

    def op_subscribe(
        self, conn: Conn, gpus: list[int | str] | None, period: float, events: bool
    ) -> dict[str, Any]:
        """Stream `gpus`' samples to this connection every `period` seconds (a thread per
        subscription; `events`: lease events too) until unsubscribe or hang-up: the
        subscription's id. At most MAX_SUBSCRIPTIONS per connection."""
        if len(conn.subs) >= MAX_SUBSCRIPTIONS:
            raise protocol.ProtocolError(
                f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection",
                hint="unsubscribe first",
            )
        indices = self._gpus(gpus)
        sub = next(self._ids)
        stop = threading.Event()
        conn.subs[sub] = stop
        if events and conn.event_sub is None:
            conn.event_sub = sub
        threading.Thread(
            target=self._stream,
            args=(conn, sub, indices, period, stop),
            name=f"gpuenvd-sub-{sub}",
            daemon=True,
        ).start()
        return {"sub": sub}

    def op_unsubscribe(self, conn: Conn) -> dict[str, Any]:
        """Stop every stream of this connection: the subscriptions stopped."""
        subs = list(conn.subs)
        for sub in subs:
            conn.subs.pop(sub).set()
        conn.event_sub = None
        return {"stopped": subs}

    op_job_begin, op_job_end, op_job_report = job_ops()

    def _stream(
        self, conn: Conn, sub: int, gpus: list[int], period: float, stop: threading.Event
    ) -> None:
        last = self.clock.now()
        while not stop.wait(period) and not conn.closed.is_set():
            now = self.clock.now()
            samples = [
                s.to_dict() for g in gpus for s in self.sampler.samples(last, now, g) if s.t > last
            ]
            last = now
            if not conn.push(
                protocol.event("samples", sub=sub, samples=samples, leases=self.leases.summary())
            ):
                return


def version() -> str:
    """gpuenv's version, as this daemon reports it in hello and status."""
    from gpuenv import __version__

    return __version__
