"""`gpuenv doctor` as a whole: every check runs, exit codes, the report, the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from driver_harness import without_driver

from doctor.helpers import by_name, severities
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.doctor import Check, Host, diagnose, exit_code, format_checks

pytestmark = pytest.mark.sim_gpus(2)


def test_a_clean_simulated_machine_has_nothing_to_fix(sim: SimBackend, quiet_host: Host) -> None:
    checks = diagnose(sim, host=quiet_host)
    bad = [c for c in checks if c.severity in ("warning", "error")]
    assert bad == []
    assert exit_code(checks) == 0
    assert severities(checks, "persistence") == {"ok"}
    assert {c.gpu for c in by_name(checks, "processes")} == {0, 1}


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


@without_driver
def test_cli_without_a_driver_reports_it_and_exits_2() -> None:
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 2
    assert "ERROR" in result.output and "NVML" in result.output
