"""gpuenv plot on runs measured on the simulated GPU."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import pytest
from click.testing import CliRunner

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.errors import ConfigError
from gpuenv.results import Measurement, Run, load_run
from gpuenv.timebase import VirtualClock


def make_run(tmp_path, *, trace=True):
    """A session on the simulated H100: a cold bench, 5 s of load, a hot bench. Without
    `trace`, the file as gpuenv wrote it before sessions kept their trace."""
    import gpuenv.session as session_mod

    sim = SimBackend(clock=VirtualClock())
    sim.open_context(0)
    sim.idle(5)
    path = tmp_path / "run.jsonl"
    with session_mod.stable(backend=sim, mode="burst", output=str(path)) as env:
        env.bench(timing.sim_kernel(sim, 0, seconds=1.4e-3), name="cold", budget_s=1)
        timing.sim_kernel(sim, 0, seconds=5.0)()
        env.bench(
            timing.sim_kernel(sim, 0, seconds=1.4e-3),
            name="hot",
            budget_s=1,
            condition=None,
            policy="reject",
            reps=30,
        )
    if not trace:
        strip_traces(path)
    return path


def strip_traces(path):
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        for key in ("trace", "traces"):
            record.get("extra", {}).pop(key, None)
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


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
    with pytest.raises(ConfigError, match="pip install matplotlib"):
        plot_mod._matplotlib()


# -- what the figure shows (its artists, not its pixels) -----------------------------------

TITLE = re.compile(
    r"^gpuenv session · NVIDIA H100 80GB HBM3 · GPU 0 · "
    r"\d{4}-\d\d-\d\d \d\d:\d\d UTC · (\d+) measurements?$"
)


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.texts]


def shaded(ax) -> dict[str, int]:
    """Bands per region name in one axes."""
    out: dict[str, int] = {}
    for patch in ax.patches:
        gid = patch.get_gid() or ""
        if gid.startswith("region:"):
            out[gid[len("region:") :]] = out.get(gid[len("region:") :], 0) + 1
    return out


def names(fig) -> dict[str, object]:
    """Each region name above the panels, with its drawn extent."""
    renderer = fig.canvas.get_renderer()
    return {
        t.get_text(): t.get_window_extent(renderer)
        for t in fig.axes[0].texts
        if (t.get_gid() or "").startswith("name:")
    }


def assert_apart(boxes) -> None:
    boxes = list(boxes)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)


def session_with_load(tmp_path, sim, *names_: str):
    """Measurements on the simulated H100: a cold bench, 12 s of heavy load (the power cap
    pulls the clock down), then one more bench per extra name."""
    from gpuenv.session import stable

    sim.open_context(0)
    sim.idle(5)
    path = tmp_path / "session.jsonl"
    kernel = timing.sim_kernel(sim, 0, seconds=1.5e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # burst mode may not see the GPU cool down in 30 s
        with stable(backend=sim, output=path) as env:
            env.bench(kernel, name="matmul (cold)", budget_s=0.5)
            with env.measure("heavy load"):
                t0 = sim.clock.now()
                while sim.clock.now() - t0 < 12.0:
                    sim.run_work(0, 0.1 * 1980e6, power_intensity=1.0)
            for name in names_:
                env.bench(kernel, name=name, budget_s=0.5)
    return path


def test_a_session_plot_shows_the_trace_each_region_shaded_and_a_readable_title(tmp_path, sim):
    pytest.importorskip("matplotlib")
    from gpuenv.plot import run_figure

    fig = run_figure(load_run(session_with_load(tmp_path, sim, "matmul (after)")))
    clk, pw, tmp = fig.axes[:3]
    m = TITLE.match(texts(fig)[0])
    assert m and m.group(1) == "3", texts(fig)
    line = next(ln for ln in clk.get_lines() if ln.get_gid() == "trace")
    ys = [y for y in line.get_ydata() if y == y]
    # the 12 s of load at the sampler's 100 ms tick at least, and the cap's fall in it
    assert len(ys) > 12.0 / 0.1 and max(ys) >= 1900 and min(ys) <= 1600
    for ax in (clk, pw, tmp):
        assert shaded(ax) == {"matmul (cold)": 1, "heavy load": 1, "matmul (after)": 1}
    placed = names(fig)
    assert set(placed) == {"matmul (cold)", "heavy load [annotated]", "matmul (after)"}
    assert_apart(placed.values())
    assert not any("no telemetry trace" in t for t in texts(fig))


def test_names_of_regions_close_together_are_stacked_not_overlapped(tmp_path, sim):
    pytest.importorskip("matplotlib")
    from gpuenv.plot import run_figure

    extra = [f"a rather long benchmark name {k}" for k in range(5)]
    fig = run_figure(load_run(session_with_load(tmp_path, sim, *extra)))
    placed = names(fig)
    assert set(extra) <= set(placed)
    assert_apart(placed.values())
    assert len({round(placed[n].y0) for n in extra}) > 1  # some went a row up


def test_an_old_file_without_a_trace_still_plots_with_a_note(tmp_path):
    pytest.importorskip("matplotlib")
    from gpuenv.plot import NO_TRACE_NOTE, plot_run, run_figure

    path = make_run(tmp_path, trace=False)
    fig = run_figure(load_run(path))
    assert NO_TRACE_NOTE in texts(fig)
    steps = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "steps"]
    assert len(steps) == 1  # one line for every region's steps, broken between regions
    xs = list(steps[0].get_xdata())
    assert sum(x != x for x in xs) == 1 and len(xs) > 3
    assert shaded(fig.axes[0]).keys() == {"cold", "hot"}
    assert TITLE.match(texts(fig)[0])
    assert plot_run(load_run(path), tmp_path / "old.png").endswith("old.png")


def test_a_run_file_draws_its_trace_and_shades_its_regions_not_the_whole_run(tmp_path, sim):
    """gpuenv run -o: the "(run)" measurement holds the trace; only the regions are shaded
    and named (its name used to sit on the first region's)."""
    pytest.importorskip("matplotlib")
    from gpuenv.plot import run_figure

    session = load_run(session_with_load(tmp_path, sim))
    pieces = [m.extra["trace"] for m in session.measurements]
    whole = {k: [v for p in pieces for v in p[k]] for k in ("t_s", "sm_mhz", "power_w", "temp_c")}
    run_m = Measurement.build(
        "(run)",
        [20.0],
        gpus=(0,),
        extra={"command": ["python", "train.py"], "trace": {"t0": pieces[0]["t0"], **whole}},
    )
    regions = [dataclasses.replace(m, extra={}) for m in session.measurements]
    meta = {**session.metadata, "tool": "gpuenv run", "command": ["python", "train.py"]}
    meta.pop("session")
    fig = run_figure(Run(meta, (run_m, *regions)))
    assert texts(fig)[0].startswith("gpuenv run · python train.py · NVIDIA H100 80GB HBM3 · GPU 0")
    assert texts(fig)[0].endswith("· 2 measurements")
    assert shaded(fig.axes[0]) == {"matmul (cold)": 1, "heavy load": 1}
    assert "(run)" not in names(fig)
    assert [ln.get_gid() for ln in fig.axes[0].get_lines()].count("trace") == 1


def test_the_docs_script_makes_a_session_file_and_its_figure_on_the_sim(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "plot_stable_session.py"
    spec = importlib.util.spec_from_file_location("plot_stable_session", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert mod.main([str(tmp_path / "s.jsonl"), "--sim", "--png", str(tmp_path / "s.png")]) == 0
    run = load_run(tmp_path / "s.jsonl")
    assert [m.name for m in run.measurements] == [
        "matmul (cold)",
        "heavy load (12 s)",
        "matmul (after)",
    ]
    heavy = run.measurements[1].extra["trace"]["sm_mhz"]
    assert max(heavy) - min(heavy) > 300
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot: " in capsys.readouterr().out


def test_a_session_of_two_gpus_plots_the_one_asked_for(tmp_path, vclock):
    """Each GPU's pieces are kept (extra["traces"]); --gpu 1 draws GPU 1's, loaded as GPU 0
    idles, and says so in the title."""
    pytest.importorskip("matplotlib")
    from gpuenv.plot import run_figure
    from gpuenv.session import stable

    sim = SimBackend(n_gpus=2, clock=vclock)
    sim.open_context(1)
    sim.idle(5)
    path = tmp_path / "two.jsonl"
    with stable(backend=sim, output=path) as env, env.measure("load on 1"):
        t0 = vclock.now()
        while vclock.now() - t0 < 8.0:
            sim.run_work(1, 0.1 * 1980e6, power_intensity=1.0)
    run = load_run(path)
    assert set(run.measurements[0].extra["traces"]) == {"0", "1"}
    drawn = {}
    for g in (0, 1):
        fig = run_figure(run, gpu=g)
        assert f"· GPU {g} ·" in texts(fig)[0]
        line = next(ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "trace")
        drawn[g] = [y for y in line.get_ydata() if y == y]
    assert max(drawn[0]) < 1000 and min(drawn[1]) <= 1600 < 1900 <= max(drawn[1])


def test_the_h100_session_in_docs_plots_its_dynamics() -> None:
    """A real file, from the lent H100 (docs/stable_session_h100.jsonl, read-only): the
    cap's fall shows in the clock line, the three measurements are shaded and named."""
    pytest.importorskip("matplotlib")
    from pathlib import Path

    from gpuenv.plot import run_figure

    path = Path(__file__).resolve().parents[1] / "docs" / "stable_session_h100.jsonl"
    fig = run_figure(load_run(path))
    clk = fig.axes[0]
    line = next(ln for ln in clk.get_lines() if ln.get_gid() == "trace")
    ys = [y for y in line.get_ydata() if y == y]
    assert max(ys) == 1980 and min(ys) <= 1200  # 1980 -> 1125 MHz under the 700 W cap
    assert set(shaded(clk)) == {"matmul (cold)", "heavy load (12 s)", "matmul (after)"}
    title = texts(fig)[0]
    assert TITLE.match(title) and "NVIDIA H100 80GB HBM3" in title, title
    assert_apart(names(fig).values())


def test_a_long_trace_is_drawn_as_min_and_max_per_slice_keeping_spikes_and_breaks():
    from gpuenv.telemetry.trace import envelope

    ts = [k * 0.025 for k in range(100_000)]
    ys = [1980.0] * 100_000
    ys[31_337] = 1200.0  # one sample's dip: a pixel column must still show it
    ys[77_777] = 2100.0
    ys[50_000] = float("nan")  # a break in the line
    xs, drawn = envelope(ts, ys, 1000)
    assert len(xs) <= 2 * 1000 + 10 and len(xs) == len(drawn)
    assert min(y for y in drawn if y == y) == 1200.0 and max(drawn) == 2100.0
    assert xs[drawn.index(1200.0)] == ts[31_337]
    assert sum(y != y for y in drawn) == 1 and xs == sorted(xs)
    assert envelope(ts[:500], ys[:500], 1000) == (ts[:500], ys[:500])  # short: as it is


def test_thousands_of_regions_are_shaded_by_name_in_few_artists(tmp_path, sim):
    """A session of 300 measurements (a 30 MB file holds 12,000): the bands go in one
    collection per shade, the names in the legend with their counts, a note says so."""
    pytest.importorskip("matplotlib")
    from gpuenv.plot import MANY_REGIONS, run_figure
    from gpuenv.session import stable

    sim.open_context(0)
    sim.idle(5)
    path = tmp_path / "many.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with stable(backend=sim, output=path, mode="burst") as env:
            for k in range(300):
                with env.measure(f"step {k % 9}"):
                    sim.run_work(0, 0.02 * 1980e6, power_intensity=1.0)
    fig = run_figure(load_run(path))
    clk = fig.axes[0]
    assert MANY_REGIONS < 300 and not shaded(clk) and not names(fig)
    bands = [c for c in clk.collections if c.get_gid() == "regions"]
    assert 1 <= len(bands) <= 7  # six shades and grey
    labels = [t.get_text() for t in clk.get_legend().get_texts()]
    assert "step 0 (x34)" in labels and "3 other names (x99)" in labels, labels
    assert any("300 regions: shaded by name" in t for t in texts(fig))
    assert len(clk.get_lines()) <= 4
