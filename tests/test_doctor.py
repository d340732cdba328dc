"""`gpuenv doctor` on the simulated GPU and a fake host (sysfs tree, environment, uid)."""

from __future__ import annotations

import ctypes
import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.doctor import Check, Host, diagnose, exit_code, format_checks
from gpuenv.errors import NvmlUnavailable
from gpuenv.timebase import VirtualClock


@pytest.fixture
def sim() -> SimBackend:
    backend = SimBackend("h100", n_gpus=2, clock=VirtualClock())
    yield backend
    backend.close()


def make_sysfs(root: Path, governors: list[str], *, no_turbo: str | None = "1") -> str:
    for n, gov in enumerate(governors):
        d = root / f"devices/system/cpu/cpu{n}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
    if no_turbo is not None:
        d = root / "devices/system/cpu/intel_pstate"
        d.mkdir(parents=True, exist_ok=True)
        (d / "no_turbo").write_text(no_turbo + "\n")
    return str(root)


@pytest.fixture
def quiet_host(tmp_path: Path) -> Host:
    """A host with nothing wrong: root, performance governor, no turbo, idle, clean env."""
    return Host(
        euid=0,
        pid=1,
        env={},
        sysfs=make_sysfs(tmp_path / "sys", ["performance"] * 4),
        socket=str(tmp_path / "none.sock"),
        cpu_count=4,
        loadavg=(0.1, 0.1, 0.1),
    )


def by_name(checks: list[Check], name: str, gpu: int | None = None) -> list[Check]:
    return [c for c in checks if c.name == name and (gpu is None or c.gpu == gpu)]


def severities(checks: list[Check], name: str) -> set[str]:
    return {c.severity for c in by_name(checks, name)}


def test_a_clean_simulated_machine_has_nothing_to_fix(sim: SimBackend, quiet_host: Host) -> None:
    checks = diagnose(sim, host=quiet_host)
    bad = [c for c in checks if c.severity in ("warning", "error")]
    assert bad == []
    assert exit_code(checks) == 0
    assert severities(checks, "persistence") == {"ok"}
    assert {c.gpu for c in by_name(checks, "processes")} == {0, 1}


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
    from gpuenv.clocks import lock

    with lock(sm=1350, gpus=[1], backend=sim, supervise=False):
        checks = by_name(diagnose(sim, host=quiet_host), "journal")
        assert [(c.gpu, c.severity) for c in checks] == [(1, "info")]
        assert "pid" in checks[0].message
    assert by_name(diagnose(sim, host=quiet_host), "journal") == []


def test_cpu_governor_not_performance(sim: SimBackend, quiet_host: Host, tmp_path: Path) -> None:
    quiet_host.sysfs = make_sysfs(tmp_path / "s2", ["powersave", "performance", "powersave"])
    check = by_name(diagnose(sim, host=quiet_host), "cpu_governor")[0]
    assert check.severity == "warning"
    assert "2 CPUs 'powersave'" in check.message
    assert "cpupower" in (check.fix or "")


def test_no_cpufreq_is_info(sim: SimBackend, quiet_host: Host, tmp_path: Path) -> None:
    quiet_host.sysfs = str(tmp_path / "empty")
    assert severities(diagnose(sim, host=quiet_host), "cpu_governor") == {"info"}


def test_cpu_turbo_on_is_info(sim: SimBackend, quiet_host: Host, tmp_path: Path) -> None:
    quiet_host.sysfs = make_sysfs(tmp_path / "s3", ["performance"], no_turbo="0")
    assert severities(diagnose(sim, host=quiet_host), "cpu_boost") == {"info"}


def test_busy_host(sim: SimBackend, quiet_host: Host) -> None:
    quiet_host.loadavg = (7.5, 6.0, 5.0)
    check = by_name(diagnose(sim, host=quiet_host), "cpu_load")[0]
    assert check.severity == "warning" and "7.5" in check.message


def test_environment_variables(sim: SimBackend, quiet_host: Host) -> None:
    quiet_host.env = {"CUDA_LAUNCH_BLOCKING": "1", "GPUENV_READONLY": "1"}
    checks = diagnose(sim, host=quiet_host)
    assert any("CUDA_LAUNCH_BLOCKING" in c.message for c in by_name(checks, "env"))
    assert severities(checks, "readonly") == {"info"}
    quiet_host.env = {"GPUENV_READONLY": "maybe"}
    assert "error" in severities(diagnose(sim, host=quiet_host), "env")


def test_permission_without_root_or_daemon(quiet_host: Host, tmp_path: Path) -> None:
    quiet_host.euid = 1000
    checks = diagnose(None, open_error=NvmlUnavailable(), host=quiet_host)
    perm = by_name(checks, "permission")[0]
    assert perm.severity == "warning" and "gpuenv daemon" in (perm.fix or "")
    # a socket file with nobody answering is not a daemon
    path = tmp_path / "gpuenv.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        quiet_host.socket = str(path)
        perm = by_name(diagnose(None, open_error=NvmlUnavailable(), host=quiet_host), "permission")
        assert perm[0].severity == "warning" and "no gpuenv daemon answers" in perm[0].message


def test_simulated_gpu_without_root(quiet_host: Host) -> None:
    backend = SimBackend("h100", clock=VirtualClock(), root=False)
    try:
        assert severities(diagnose(backend, host=quiet_host), "permission") == {"warning"}
    finally:
        backend.close()


def test_a_failing_read_becomes_a_finding_not_a_crash(sim: SimBackend, quiet_host: Host) -> None:
    sim.inject_fault(0, "timeout", op="read_fast")
    checks = diagnose(sim, host=quiet_host)
    failed = [c for c in checks if c.severity == "error"]
    assert failed and all("could not check" in c.message for c in failed)
    assert severities(checks, "cpu_governor") == {"ok"}  # the rest still ran
    assert exit_code(checks) == 2


def test_exit_codes_and_report() -> None:
    assert exit_code([]) == 0
    assert exit_code([Check("a", "ok", "x"), Check("b", "info", "y")]) == 0
    assert exit_code([Check("a", "warning", "x", "do z")]) == 1
    assert exit_code([Check("a", "warning", "x"), Check("b", "error", "y")]) == 2
    text = format_checks(
        [Check("a", "ok", "fine"), Check("bb", "warning", "hot", "cool it", gpu=0)]
    )
    lines = text.splitlines()
    assert lines[0] == "gpuenv doctor: 0 errors, 1 warning"
    assert "WARNING" in lines[2] and "hot" in lines[2]
    assert lines[3].strip() == "fix: cool it"


def test_cli_json_exit_code_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["--sim", "doctor", "--json"])
    out = json.loads(result.output)
    assert result.exit_code == out["exit_code"]
    assert {c["name"] for c in out["checks"]} >= {"driver", "persistence", "cpu_governor"}


def _nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_loadable(), reason="this machine has an NVIDIA driver")
def test_cli_without_a_driver_reports_it_and_exits_2() -> None:
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 2
    assert "ERROR" in result.output and "NVML" in result.output
