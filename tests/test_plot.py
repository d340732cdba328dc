"""gpuenv plot on runs measured on the simulated GPU."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.errors import ConfigError
from gpuenv.results import Measurement, Run, load_run
from gpuenv.timebase import VirtualClock


def make_run(tmp_path, *, trace=True):
    import gpuenv.session as session_mod

    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(5)
    path = tmp_path / "run.jsonl"
    with session_mod.stable(backend=sim, mode="burst", output=str(path)) as env:
        env.bench(timing.sim_kernel(sim, 0, seconds=1.4e-3), name="cold", budget_s=1,
                  keep_trace=trace)
        timing.sim_kernel(sim, 0, seconds=5.0)()
        env.bench(timing.sim_kernel(sim, 0, seconds=1.4e-3), name="hot", budget_s=1,
                  condition=None, policy="reject", reps=30, keep_trace=trace)
    return path


@pytest.mark.parametrize("trace", [True, False])
def test_plot_writes_an_image(tmp_path, trace):
    pytest.importorskip("matplotlib")
    from gpuenv.plot import plot_run

    path = make_run(tmp_path, trace=trace)
    out = plot_run(load_run(path), tmp_path / "run.png")
    data = (tmp_path / "run.png").read_bytes()
    assert out.endswith("run.png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_cli_default_output_name(tmp_path):
    pytest.importorskip("matplotlib")
    path = make_run(tmp_path)
    res = CliRunner().invoke(cli, ["plot", str(path)], obj={})
    assert res.exit_code == 0, res.output
    assert (tmp_path / "run.png").exists()
    res = CliRunner().invoke(cli, ["plot", str(path), "-o", str(tmp_path / "x.svg")], obj={})
    assert res.exit_code == 0 and (tmp_path / "x.svg").read_text().lstrip().startswith("<?xml")


def test_run_without_telemetry_is_a_clear_error(tmp_path):
    pytest.importorskip("matplotlib")
    from gpuenv.plot import plot_run

    with pytest.raises(ConfigError, match="no telemetry"):
        plot_run(Run({}, (Measurement.build("x", [1.0]),)), tmp_path / "x.png")


def test_missing_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    import builtins

    from gpuenv import plot as plot_mod

    real_import = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(ConfigError, match=r"pip install 'gpuenv\[plot\]'"):
        plot_mod._matplotlib()
