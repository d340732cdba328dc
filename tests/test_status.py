"""`gpuenv status` on the simulated GPU: what it shows at idle, under load, locked, and broken."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.status import GPU_KEYS, SCHEMA, format_table, snapshot

pytestmark = pytest.mark.sim_gpus(2)


def test_idle_gpu_shows_idle_clock_and_reason(sim: SimBackend) -> None:
    snap = snapshot(sim, [0, 1])
    assert snap["schema"] == SCHEMA
    assert snap["backend"] == "sim"
    assert snap["driver_version"] == sim.driver_version()
    assert [g["index"] for g in snap["gpus"]] == [0, 1]
    g = snap["gpus"][0]
    assert tuple(g) == GPU_KEYS  # stable keys, in a stable order
    assert g["uuid"] == sim.device_info(0).uuid
    assert (g["sm_mhz"], g["sm_max_mhz"]) == (345, 1980)
    assert (g["mem_mhz"], g["mem_max_mhz"]) == (2619, 2619)
    assert g["reason_names"] == ["GpuIdle"] and g["reasons"] == 1
    assert g["power_limit_w"] == 700 and g["slowdown_c"] == 89
    assert g["persistence"] is True and g["processes"] == 0
    assert g["lock"]["state"] == "none"
    assert g["error"] is None


def test_sustained_load_shows_the_power_cap(sim: SimBackend) -> None:
    sim.open_context(0)
    sim.run_work(0, 1980e6 * 5)  # ~5 s of a heavy matmul at full clock
    g = snapshot(sim, [0])["gpus"][0]
    assert "SwPowerCap" in g["reason_names"]
    assert g["sm_mhz"] < 1980
    assert g["power_w"] > 600
    assert g["processes"] == 1
    assert g["temp_c"] > 36
    other = snapshot(sim, [1])["gpus"][0]
    assert other["reason_names"] == ["GpuIdle"]  # the other GPU stayed idle


def test_snapshot_is_json(sim: SimBackend) -> None:
    snap = snapshot(sim, [0, 1])
    assert json.loads(json.dumps(snap)) == snap


def test_a_lost_gpu_reports_its_error_and_the_others_still_show(sim: SimBackend) -> None:
    sim.inject_fault(1, "gpu_lost")
    snap = snapshot(sim, [0, 1])
    ok, lost = snap["gpus"]
    assert ok["error"] is None and ok["sm_mhz"] == 345
    assert lost["index"] == 1 and "lost" in lost["error"].lower()
    assert tuple(lost) == GPU_KEYS and lost["sm_mhz"] is None
    table = format_table(snap)
    assert "(error)" in table and "GPU 1:" in table


def test_unsupported_values_are_null_not_errors(sim: SimBackend) -> None:
    sim.inject_fault(0, "not_supported", op="power_limits")
    sim.inject_fault(0, "not_supported", op="persistence_mode")
    g = snapshot(sim, [0])["gpus"][0]
    assert g["error"] is None
    assert g["power_limit_w"] is None and g["persistence"] is None
    assert g["sm_mhz"] == 345


def test_locked_gpu_shows_range_owner_and_whether_it_holds(sim: SimBackend) -> None:
    from gpuenv.clocks import local_lock as lock

    with lock(sm=1350, gpus=[0], backend=sim, supervise=False):
        sim.open_context(0)
        sim.idle(0.5)
        g0, g1 = snapshot(sim, [0, 1])["gpus"]
        assert g0["lock"]["state"] == "locked"
        assert g0["lock"]["sm_mhz"] == [1350, 1350]
        assert g0["lock"]["holds"] is True
        assert any("pid" in owner for owner in g0["lock"]["owners"])
        assert g1["lock"]["state"] == "none"
        table = format_table(snapshot(sim, [0, 1]))
        assert "1350" in table and "GPU 0: locked" in table
    assert snapshot(sim, [0])["gpus"][0]["lock"]["state"] == "none"


def test_table_has_one_row_per_gpu_with_words_for_reasons(sim: SimBackend) -> None:
    table = format_table(snapshot(sim, [0, 1]))
    lines = table.splitlines()
    assert lines[0].startswith("sim backend, driver 580")
    assert lines[1].split()[:2] == ["GPU", "NAME"]
    assert len(lines) == 4
    for line, index in zip(lines[2:], (0, 1), strict=True):
        assert line.split()[0] == str(index)
        assert "345/1980" in line and "GpuIdle" in line and "on" in line


# -- the command ----------------------------------------------------------------------


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env={"GPUENV_SIM_GPUS": "2", **(env or {})})


def test_cli_json_on_the_sim() -> None:
    result = run("--sim", "status", "--json")
    assert result.exit_code == 0, result.output
    snap = json.loads(result.output)
    assert snap["backend"] == "sim" and len(snap["gpus"]) == 2
    assert snap["readonly"] is False  # writes are allowed here (status itself never writes)
    assert json.loads(run("--sim", "--dry-run", "status", "--json").output)["readonly"] is True
    ro = run("--sim", "status", env={"GPUENV_READONLY": "1"})
    assert "(read-only)" in ro.output.splitlines()[0]


def test_cli_selects_gpus_with_i() -> None:
    result = run("--sim", "status", "--json", "-i", "1")
    assert [g["index"] for g in json.loads(result.output)["gpus"]] == [1]


def test_cli_bad_selector_is_one_line_and_exit_6() -> None:
    result = run("--sim", "status", "-i", "7")
    assert result.exit_code == 6  # nvidia-smi's "not found"
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("gpuenv: error: no GPU matches '7'") and "0-1" in lines[0]


def test_cli_backend_env_var_selects_the_sim() -> None:
    result = run("status", env={"GPUENV_BACKEND": "sim"})
    assert result.exit_code == 0, result.output
    assert "NVIDIA H100 80GB HBM3" in result.output
