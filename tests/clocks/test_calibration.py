"""gpuenv calibrate on the simulated H100."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from gpuenv import clocks
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.clocks.calibration import calibrate
from gpuenv.errors import ConfigError
from gpuenv.timebase import VirtualClock


@pytest.fixture
def sim() -> SimBackend:
    backend = SimBackend(clock=VirtualClock())
    backend.open_context(0)
    backend.idle(10.0)
    return backend


def test_finds_the_clock_the_power_cap_holds_and_saves_it(sim, tmp_path):
    out = io.StringIO()
    (r,) = calibrate(sim, [0], duration_s=180, state_dir=str(tmp_path), progress=out)
    assert r.steady and r.capped
    truth = sim.truth(0)
    assert r.sustained_mhz == pytest.approx(truth.sm_mhz, abs=30)  # the equilibrium clock
    assert r.sustained_mhz < 1980 * 0.75  # well below boost under a 700 W cap
    assert r.lock_mhz <= r.min_mhz - 15 and r.lock_mhz % 15 == 0  # a supported step below
    assert r.temp_c > 55
    saved = clocks.load_calibration(r.uuid, state_dir=str(tmp_path))
    assert saved is not None and saved.sustained_mhz == r.lock_mhz
    assert "sustained SM clock" in r.summary() and "held" in r.summary()
    assert "gpuenv calibrate GPU 0: load" in out.getvalue()  # progress lines


def test_locked_at_the_calibrated_clock_the_gpu_holds_it(sim, tmp_path):
    (r,) = calibrate(sim, [0], duration_s=180, state_dir=str(tmp_path), save=False)
    sim.set_locked_sm_clocks(0, r.lock_mhz, r.lock_mhz)
    from gpuenv import timing

    timing.sim_kernel(sim, 0, seconds=120.0)()  # two more minutes of the same heavy load
    assert sim.truth(0).sm_mhz == r.lock_mhz


def test_too_short_is_not_steady_and_not_saved(sim, tmp_path):
    (r,) = calibrate(sim, [0], duration_s=3, state_dir=str(tmp_path))
    assert not r.steady and r.saved_to is None
    assert clocks.load_calibration(r.uuid, state_dir=str(tmp_path)) is None
    assert "did NOT reach equilibrium" in r.summary()


def test_bad_duration(sim):
    with pytest.raises(ConfigError, match="duration"):
        calibrate(sim, [0], duration_s=0)


def test_cli_reports_and_exits_1_when_too_short(monkeypatch):
    monkeypatch.setenv("GPUENV_SIM_STATE", "none")
    out = CliRunner().invoke(cli, ["--sim", "calibrate", "--duration", "1.5", "--json"], obj={})
    assert out.exit_code == 1, out.output
    data = json.loads(out.output[: out.output.rindex("]") + 1])
    assert data[0]["steady"] is False and data[0]["saved_to"] is None
    assert "did not reach equilibrium" in out.output
