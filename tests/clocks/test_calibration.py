"""gpuenv calibrate on the simulated H100."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv import clocks, timing
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
    # not a terminal (a log): one line as the load starts, not one a chunk (20 of them)
    assert out.getvalue() == (
        "gpuenv calibrate GPU 0: load until clock and temperature reach equilibrium "
        "(at most 180 s)\n"
    )


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
    data = json.loads(out.output[out.output.index("[") : out.output.rindex("]") + 1])
    assert data[0]["steady"] is False and data[0]["saved_to"] is None
    assert "did not reach equilibrium" in out.output


# -- gpuenv --sim calibrate: a fresh copy of the model, on virtual time ----------------------


def _cli_calibrate(monkeypatch: pytest.MonkeyPatch, state: Path) -> tuple[dict, list[float]]:
    """`gpuenv --sim calibrate --no-save --json` on the simulator state file `state`: its
    result, and every real sleep it asked for."""
    slept: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setenv("GPUENV_SIM_STATE", str(state))
    with monkeypatch.context() as m:
        m.setattr(time, "sleep", sleep)
        out = CliRunner().invoke(cli, ["--sim", "calibrate", "--no-save", "--json"], obj={})
    assert out.exit_code == 0, out.output
    assert out.output.count("gpuenv calibrate GPU 0: load") == 1  # one line, not a terminal
    (result,) = json.loads(out.output[out.output.index("[") : out.output.rindex("]") + 1])
    return result, slept


def test_cli_on_the_simulator_runs_on_virtual_time_and_repeats_exactly(monkeypatch, tmp_path):
    first, slept = _cli_calibrate(monkeypatch, tmp_path / "a.json")
    second, _ = _cli_calibrate(monkeypatch, tmp_path / "b.json")
    assert first == second  # two fresh simulated GPUs: the same answer, to the last digit
    assert first["steady"] and first["capped"] and first["saved_to"] is None
    assert first["lock_mhz"] % 15 == 0 and first["lock_mhz"] < first["sustained_mhz"]
    assert "virtual time, from a fresh GPU at idle" in first["load"]
    # a minute and more of load, and hardly a real second slept for it: virtual time
    assert first["seconds"] > 60 and sum(slept) < 1.0


def test_cli_on_the_simulator_forgets_what_heated_it(monkeypatch, tmp_path):
    fresh, _ = _cli_calibrate(monkeypatch, tmp_path / "fresh.json")
    state = tmp_path / "heated.json"
    heater = SimBackend(clock=VirtualClock(), state_file=state)  # an earlier benchmark
    timing.sim_kernel(heater, 0, seconds=120.0)()
    heater.close()
    seen = SimBackend(state_file=state)  # what the next command finds: a hot GPU
    assert seen.read_fast(0).temp_c > fresh["temp_c"] - 5
    hot = SimBackend(clock=VirtualClock(), state_file=state)
    (as_it_stands,) = calibrate(hot, [0], save=False)  # calibrated hot, the answer differs
    assert (as_it_stands.sustained_mhz, as_it_stands.seconds) != (
        fresh["sustained_mhz"],
        fresh["seconds"],
    )
    hot.close()
    seen.close()
    heated, _ = _cli_calibrate(monkeypatch, state)
    assert heated == fresh
    after = SimBackend(state_file=state)  # and calibrating left the simulated GPU as it was
    assert after.read_fast(0).temp_c > fresh["temp_c"] - 5 and after.truth(0).contexts == ()
    after.close()


def test_a_calibration_cut_by_a_file_size_limit_keeps_the_old_one_and_no_tmp(tmp_path) -> None:
    """A real fault: RLIMIT_FSIZE cuts the write; the stored clock stays the earlier one."""
    import subprocess
    import sys

    from gpuenv.clocks.calibration_store import load_calibration, save_calibration

    save_calibration("GPU-x", 1320, state_dir=tmp_path)
    code = (
        "import resource, signal, sys\n"
        "from gpuenv.clocks.calibration_store import save_calibration\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "try:\n"
        "    save_calibration('GPU-x', 1500, details={'pad': 'x' * 4096}, state_dir=sys.argv[1])\n"
        "except OSError as err:\n"
        "    print('refused', err.errno)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.startswith("refused"), out.stdout + out.stderr
    stored = load_calibration("GPU-x", state_dir=tmp_path)
    assert stored is not None and stored.sustained_mhz == 1320
    assert not [p.name for p in tmp_path.rglob("*.tmp")]
