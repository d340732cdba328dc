"""`gpuenv doctor`'s host checks on a fake host (sysfs tree, environment, load)."""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.helpers import by_name, make_sysfs, severities
from gpuenv.backend.sim import SimBackend
from gpuenv.doctor import Host, diagnose

pytestmark = pytest.mark.sim_gpus(2)


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
