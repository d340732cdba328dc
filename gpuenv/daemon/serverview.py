"""What gpuenvd's readers see of it: the `Server` protocol (gpuenv.daemon.server.Server is
one). The metrics endpoint and the families beside it (daemon/fleet.py, daemon/jobs.py)
take it, so they read the daemon through its members without importing the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuenv.backend import Backend, DeviceInfo
    from gpuenv.daemon.leases import LeaseManager
    from gpuenv.telemetry import Sampler
    from gpuenv.timebase import Clock


class Server(Protocol):
    """What the endpoint reads of the daemon (gpuenv.daemon.server.Server is one)."""

    backend: Backend
    infos: list[DeviceInfo]
    sampler: Sampler
    clock: Clock
    leases: LeaseManager
    started_at: float
    requests: int
    protocol_errors: int

    def connections(self) -> int:
        """How many clients are connected now."""
        ...

    def subscribers_dropped(self) -> int:
        """How many streaming subscribers were dropped for not reading."""
        ...
