"""`gpuenv doctor`'s GPU checks on the simulated GPU: driver, permission, each GPU's state."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from doctor.helpers import by_name, severities
from gpuenv.backend.sim import SimBackend
from gpuenv.doctor import Host, diagnose, exit_code
from gpuenv.errors import NvmlUnavailable
from gpuenv.timebase import VirtualClock

pytestmark = pytest.mark.sim_gpus(2)


def test_no_driver_is_an_error_and_host_checks_still_run(quiet_host: Host) -> None:
    checks = diagnose(None, open_error=NvmlUnavailable(), host=quiet_host)
    driver = by_name(checks, "driver")[0]
    assert driver.severity == "error"
    assert "NVML" in driver.message and "--sim" in (driver.fix or "")
    assert severities(checks, "cpu_governor") == {"ok"}
    assert by_name(checks, "processes") == []  # no GPU checks without a GPU
    assert exit_code(checks) == 2


def test_other_process_on_the_gpu_is_named(sim: SimBackend, quiet_host: Host) -> None:
    sim.set_background_load(1, 0.9, pid=424242)
    sim.idle(2.0)
    checks = diagnose(sim, host=quiet_host)
    procs = by_name(checks, "processes", gpu=1)[0]
    assert procs.severity == "warning" and "424242" in procs.message
    assert by_name(checks, "processes", gpu=0)[0].severity == "ok"
    assert exit_code(checks) == 1


def test_a_reason_already_active_is_named(sim: SimBackend, quiet_host: Host) -> None:
    sim.set_power_limit(0, 200)
    sim.set_background_load(0, 1.0, pid=5555)
    sim.idle(3.0)
    reasons = by_name(diagnose(sim, host=quiet_host), "reasons", gpu=0)[0]
    assert reasons.severity == "warning" and "SwPowerCap" in reasons.message


def test_power_limit_below_default(sim: SimBackend, quiet_host: Host) -> None:
    sim.set_power_limit(0, 500)
    check = by_name(diagnose(sim, host=quiet_host), "power_limit", gpu=0)[0]
    assert check.severity == "warning"
    assert "500 W" in check.message and "-pl 700" in (check.fix or "")


def test_persistence_off(sim: SimBackend, quiet_host: Host) -> None:
    sim.set_persistence_mode(1, False)
    checks = diagnose(sim, host=quiet_host)
    assert by_name(checks, "persistence", gpu=1)[0].severity == "warning"
    assert "-pm 1" in (by_name(checks, "persistence", gpu=1)[0].fix or "")
    assert by_name(checks, "persistence", gpu=0)[0].severity == "ok"


def test_application_clocks_not_default(sim: SimBackend, quiet_host: Host) -> None:
    sim.set_app_clocks(0, 2619, 1500)
    check = by_name(diagnose(sim, host=quiet_host), "app_clocks", gpu=0)[0]
    assert check.severity == "warning" and "1500" in check.message
    assert "-rac" in (check.fix or "")


def test_a_gpuenv_lock_is_reported_with_its_owner(sim: SimBackend, quiet_host: Host) -> None:
    from gpuenv.clocks import local_lock as lock

    with lock(sm=1350, gpus=[1], backend=sim, supervise=False):
        checks = by_name(diagnose(sim, host=quiet_host), "journal")
        assert [(c.gpu, c.severity) for c in checks] == [(1, "info")]
        assert "pid" in checks[0].message
    assert by_name(diagnose(sim, host=quiet_host), "journal") == []


def test_without_a_driver_permission_is_not_claimed(quiet_host: Host, tmp_path: Path) -> None:
    # "ok permission ... clocks can be locked" beside "ERROR driver": it checked nothing
    for euid in (0, 1000):
        quiet_host.euid = euid
        checks = diagnose(None, open_error=NvmlUnavailable(), host=quiet_host)
        assert by_name(checks, "permission") == []
        assert "clocks can be locked" not in " ".join(c.message for c in checks)
    # a socket file with nobody answering is not a daemon
    quiet_host.euid = 1000
    path = tmp_path / "gpuenv.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        quiet_host.socket = str(path)
        checks = diagnose(None, open_error=NvmlUnavailable(), host=quiet_host)
        (daemon,) = by_name(checks, "daemon")
        assert daemon.severity == "warning" and "no gpuenv daemon answers" in daemon.message
        # root is told too (it may lock without the daemon, but its users go through it)
        quiet_host.euid = 0
        (daemon,) = by_name(diagnose(None, open_error=NvmlUnavailable(), host=quiet_host), "daemon")
        assert daemon.severity == "warning"


def test_no_daemon_socket_is_no_daemon_finding(quiet_host: Host) -> None:
    assert by_name(diagnose(None, open_error=NvmlUnavailable(), host=quiet_host), "daemon") == []


def test_simulated_gpu_without_root(quiet_host: Host) -> None:
    backend = SimBackend("h100", clock=VirtualClock(), root=False)
    try:
        assert severities(diagnose(backend, host=quiet_host), "permission") == {"warning"}
    finally:
        backend.close()
