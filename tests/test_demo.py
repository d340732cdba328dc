"""`gpuenv demo`: the simulated tour tells the true story; the real tour only reads."""

from __future__ import annotations

import ctypes

import pytest
from click.testing import CliRunner

from gpuenv.backend import REASON_SW_POWER_CAP, ReadOnlyBackend
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.demo import real_tour, sim_tour
from gpuenv.timebase import VirtualClock


def test_sim_tour_shows_the_same_kernel_slower_after_sustained_load() -> None:
    lines: list[str] = []
    result = sim_tour(lines.append, pace=0)
    assert result["idle_mhz"] == 345 and result["boost_mhz"] == 1980
    # GPU_FACTS.md: 1.37 ms at 1980 MHz, ~1.6 ms after sustained load, back after a rest
    assert result["cold_ms"] == pytest.approx(1.37, rel=0.05)
    assert result["hot_ms"] > result["cold_ms"] * 1.10
    assert result["rested_ms"] == pytest.approx(result["cold_ms"], rel=0.01)
    rows = result["rows"]
    assert all(reasons & REASON_SW_POWER_CAP for *_, reasons in rows)
    assert rows[-1][1] < rows[0][1] < 1980  # the capped clock creeps down
    assert rows[-1][3] > rows[0][3] + 10  # as the chip heats
    text = "\n".join(lines)
    assert "GpuIdle" in text and "SwPowerCap" in text
    assert f"{result['hot_ms']:.2f} ms" in text


def test_sim_tour_on_another_profile() -> None:
    lines: list[str] = []
    result = sim_tour(lines.append, pace=0, profile="rtx4090", seconds=5)
    assert "RTX 4090" in lines[0]
    assert result["hot_ms"] > result["cold_ms"]


def test_real_tour_only_reads() -> None:
    # the real tour on a read-only simulated GPU: any write would raise ReadOnlyError
    sim = SimBackend("h100", clock=VirtualClock())
    backend = ReadOnlyBackend(sim, reason="demo")
    lines: list[str] = []
    try:
        result = real_tour(backend, [0], lines.append, pace=0, seconds=0.2)  # type: ignore[arg-type]
    finally:
        sim.close()
    assert result["readings"] >= 1
    text = "\n".join(lines)
    assert "read-only" in text and "GpuIdle" in text and "gpuenv demo --sim" in text


def test_cli_sim_demo() -> None:
    result = CliRunner().invoke(cli, ["--sim", "demo", "--fast", "--profile", "h100"])
    assert result.exit_code == 0, result.output
    assert "SwPowerCap" in result.output


def test_cli_unknown_profile_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["--sim", "demo", "--fast", "--profile", "gtx9999"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1


def _nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_loadable(), reason="this machine has an NVIDIA driver")
def test_cli_demo_without_a_gpu_tours_the_sim() -> None:
    result = CliRunner().invoke(cli, ["demo", "--fast"])
    assert result.exit_code == 0, result.output
    assert "touring a simulated GPU" in result.output
