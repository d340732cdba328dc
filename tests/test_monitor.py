"""gpuenv monitor: the model and its rendering on the simulated GPU, in virtual time."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest
from click.testing import CliRunner
from monitor_harness import tick

from gpuenv.backend import REASON_GPU_IDLE, REASON_SW_POWER_CAP
from gpuenv.cli import cli
from gpuenv.clocks.journal import Journal
from gpuenv.monitor import STREAM_FIELDS, MonitorModel, stream, stream_record
from gpuenv.monitor.blocks import Frame
from gpuenv.monitor.draw import plain
from gpuenv.monitor.view import render

pytestmark = pytest.mark.sim_gpus(2)


def test_idle_gpu_says_idle_and_for_how_long(sim, vclock):
    model = MonitorModel(sim, [0, 1], clock=vclock)
    views = model.update()
    assert views[0].reasons & REASON_GPU_IDLE
    first = views[0].active[0]
    assert first.name == "GpuIdle" and first.at_least  # active before the monitor started
    for _ in range(10):
        views = tick(model, sim)
    idle = views[0].active[0]
    assert idle.active_s == pytest.approx(10.0)
    assert idle.share == pytest.approx(1.0, abs=0.02)  # from the low-utilisation counter
    assert views[0].sm_mhz == 345


def test_power_cap_appears_with_duration_and_counter_share(sim, vclock):
    model = MonitorModel(sim, [0], clock=vclock)
    model.update()
    sim.open_context(0)
    views = None
    for _ in range(30):
        views = tick(model, sim, work=True)
    v = views[0]
    assert v.reasons & REASON_SW_POWER_CAP
    cap = next(r for r in v.active if r.bit == REASON_SW_POWER_CAP)
    assert not cap.at_least  # seen to start while the monitor watched
    assert 10 < cap.active_s <= 30
    assert 0.3 < cap.share <= 1.0
    assert v.power_w > 0.9 * v.power_limit_w
    assert v.sm_mhz < v.max_sm_mhz
    text = plain(render(views, Frame(), 120, None))
    assert "power cap for" in text and "power limit" in text


def test_history_keeps_the_last_minute(sim, vclock):
    model = MonitorModel(sim, [0], clock=vclock, history_s=60.0)
    for _ in range(100):
        views = tick(model, sim)
    hist = views[0].history
    assert hist[-1][0] - hist[0][0] <= 60.0
    assert len(hist) == 61


def test_lock_and_owner_are_shown(sim, vclock):
    from gpuenv import clocks

    model = MonitorModel(sim, [0], clock=vclock)
    sim.open_context(0)
    sim.idle(1.0)
    with clocks.local_lock(sm=1350, gpus=[0], backend=sim, supervise=False):
        views = tick(model, sim)
        lk = views[0].lock
        assert lk.locked_sm == (1350, 1350)
        assert lk.holds is True
        assert f"pid {os.getpid()}" in lk.owner
        text = plain(render(views, Frame(), 120, None))
        assert "locked 1350 MHz" in text and "holds" in text
    views = tick(model, sim, 2.0)  # the journal is read again every 2 s
    assert views[0].lock.locked_sm is None
    assert "not locked by gpuenv" in plain(render(views, Frame(), 120, None))
    assert Journal().entries() == []


def test_processes_named_through_psutil(sim, vclock):
    model = MonitorModel(sim, [0], clock=vclock)
    sim.open_context(0, pid=os.getpid())
    views = tick(model, sim)
    (proc,) = views[0].processes
    assert proc.pid == os.getpid()
    assert "python" in proc.command or "pytest" in proc.command
    assert proc.used_memory_mib and proc.used_memory_mib > 0
    assert str(os.getpid()) in plain(render(views, Frame(), 120, None))


def test_a_lost_gpu_is_shown_not_raised(sim, vclock):
    model = MonitorModel(sim, [0, 1], clock=vclock)
    model.update()
    sim.inject_fault(1, "gpu_lost")
    views = tick(model, sim)
    assert views[0].error is None
    assert views[1].error and "lost" in views[1].error
    text = plain(render(views, Frame(), 100, None))
    assert "error:" in text and "GPU 0" in text


def test_stream_json_one_line_per_gpu_per_tick(sim, vclock):
    model = MonitorModel(sim, [0, 1], clock=vclock)
    out = io.StringIO()
    ticks = stream(model, out, fmt="json", interval_s=0.5, count=4)
    assert ticks == 4
    recs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(recs) == 8
    assert [r["gpu"] for r in recs[:2]] == [0, 1]
    assert set(recs[0]) == set(STREAM_FIELDS)
    assert recs[0]["reason_names"] == ["GpuIdle"] and recs[0]["reasons"] == "0x1"
    assert vclock.now() == pytest.approx(1000.0 + 1.5)  # 4 ticks 0.5 s apart: no drift


def test_stream_csv_duration(sim, vclock):
    model = MonitorModel(sim, [0], clock=vclock, processes=False)
    out = io.StringIO()
    ticks = stream(model, out, fmt="csv", interval_s=1.0, duration_s=3.0)
    assert ticks == 4  # t = 0, 1, 2, 3
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == 4 and rows[0]["sm_mhz"] == "345" and rows[0]["reason_names"] == "GpuIdle"


def test_stream_record_of_an_error_view(sim, vclock):
    sim.inject_fault(0, "timeout", op="read_fast")
    (v,) = MonitorModel(sim, [0], clock=vclock).update()
    rec = stream_record(v)
    assert rec["error"] and rec["sm_mhz"] is None and rec["gpu"] == 0


# -- the command -------------------------------------------------------------------------


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), obj={}, catch_exceptions=False)


def test_cli_once_prints_a_snapshot():
    result = _invoke("--sim", "monitor", "--once")
    assert result.exit_code == 0, result.output
    assert "gpuenv monitor" in result.output and "SIMULATED GPU" in result.output
    assert "GPU 0" in result.output and "345 MHz" in result.output
    assert "\x1b[" not in result.output  # not a terminal: no colours


def test_cli_json_stream_counts():
    result = _invoke("--sim", "monitor", "--json", "-n", "3", "-d", "0.02")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 3 and all(json.loads(x)["gpu"] == 0 for x in lines)


def test_cli_csv_with_a_scenario_shows_the_sim_moving():
    result = _invoke("--sim", "monitor", "--csv", "-n", "2", "-d", "0.3", "--scenario", "load")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert len(rows) == 2
    assert int(rows[-1]["sm_mhz"]) > 345  # a context exists: boosted, no longer parked
    assert "GpuIdle" not in rows[-1]["reason_names"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["monitor", "--scenario", "load", "--once"], "--scenario drives the simulated GPU"),
        (["--sim", "monitor", "-d", "0"], "-d must be a finite number of seconds >= 0.01"),
        (["--sim", "monitor", "-n", "0", "--json"], "--count must be a whole number >= 1, not 0"),
        (["--sim", "monitor"], "the live view needs a terminal"),
        (["--sim", "monitor", "-i", "5", "--once"], "no GPU matches '5'"),
    ],
)
def test_cli_bad_input_is_one_clear_line(args, message):
    result = CliRunner().invoke(cli, args, obj={})
    not_found = "no GPU matches" in message  # nvidia-smi's exit code 6
    assert result.exit_code == (6 if not_found else 2), result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_lock_the_power_cap_breaks_is_shown_as_not_holding_and_why(sim, vclock):
    from gpuenv import clocks

    model = MonitorModel(sim, [0], clock=vclock)
    with clocks.local_lock(sm=1800, gpus=[0], backend=sim, supervise=False):
        for _ in range(20):
            views = tick(model, sim, work=True)
        v = views[0]
        assert v.lock.holds is False and v.sm_mhz < 1800
        text = plain(render(views, Frame(), 140, None))
        assert "NOT holding: the power cap pulls the clock below the lock" in text
        assert "lock 1800 ✗" in text  # on the SM line too


# -- on a real GPU (the device machine), read-only ----------------------------------------


@pytest.mark.gpu
def test_once_and_json_on_the_real_gpu(monkeypatch):
    monkeypatch.setenv("GPUENV_READONLY", "1")  # the monitor never writes; make sure of it
    from gpuenv.backend import open_backend

    backend = open_backend("nvml")
    try:
        name = backend.device_info(0).name
    finally:
        backend.close()
    once = CliRunner().invoke(cli, ["monitor", "--once", "-i", "0"], obj={})
    assert once.exit_code == 0, once.output
    assert name in once.output and "MHz" in once.output and "    error: " not in once.output
    stream_out = CliRunner().invoke(cli, ["monitor", "--json", "-n", "2", "-d", "0.2"], obj={})
    assert stream_out.exit_code == 0, stream_out.output
    recs = [json.loads(x) for x in stream_out.output.splitlines()]
    assert recs and all(r["sm_mhz"] and r["sm_mhz"] > 0 and r["error"] is None for r in recs)


def test_the_board_and_the_host_are_read_as_nvitop_shows_them(sim, vclock):
    """P-state, fan (none on an SXM board), ECC, persistence, compute and MIG mode, bus id;
    and the host (psutil) once per update."""
    model = MonitorModel(sim, [0], clock=vclock, processes=False, lock_lookup=None)
    (v,) = model.update()
    assert (v.pstate, v.fan_pct, v.ecc_errors, v.persistence) == (0, None, 0, True)
    assert (v.compute_mode, v.mig_mode, v.bus_id) == ("Default", False, "00000000:18:00.0")
    assert model.host is not None and model.host.cpus and model.host.mem_total_gib
    sim.inject_fault(0, "not_supported", op="details")  # the board's extras go, nothing else
    vclock.advance(model.board_period)
    (v,) = model.update()
    assert v.error is None and v.pstate == 0 and v.fan_pct is None and v.ecc_errors is None


def test_the_simulated_monitors_default_work_is_named_and_yields_to_others(vclock):
    from gpuenv.backend.sim import SimBackend
    from gpuenv.monitor.scenarios import DEFAULT, choose

    sim = SimBackend(clock=vclock)
    name, header = choose(None, sim, [0], live=True)
    assert name == DEFAULT and f"scenario {DEFAULT}" in header and "--scenario none" in header
    assert choose(None, sim, [0], live=False) == (None, "SIMULATED GPU")  # --once, streams
    assert choose("none", sim, [0], live=True) == (None, "SIMULATED GPU")
    assert choose("load", sim, [0], live=True) == ("load", "SIMULATED GPU - scenario load")
    sim.set_background_load(0, 0.6)  # another process runs work: watch it, add none
    name, header = choose(None, sim, [0], live=True)
    assert name is None and "the work other processes run" in header
