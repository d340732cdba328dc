"""gpuenv monitor's view: layout for any terminal size, glyphs and keys, in virtual time."""

from __future__ import annotations

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.monitor import MonitorModel
from gpuenv.monitor.tui import Ui
from gpuenv.monitor.view import Frame, Glyphs, plain, render, sparkline
from gpuenv.timebase import VirtualClock

MAX = 1980e6  # cycles a second at the H100's top clock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def sim(clock: VirtualClock) -> SimBackend:
    backend = SimBackend(n_gpus=2, clock=clock)
    yield backend
    backend.close()


def _tick(model: MonitorModel, sim: SimBackend, seconds: float = 1.0, *, work: bool = False):
    if work:
        sim.run_work(0, seconds * MAX * 0.7, power_intensity=1.0)
    else:
        sim.idle(seconds)
    return model.update()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160, 240])
@pytest.mark.parametrize("height", [8, 16, 24, 50])
def test_render_fits_any_terminal(sim, clock, width, height):
    model = MonitorModel(sim, [0, 1], clock=clock)
    sim.open_context(0)
    for _ in range(5):
        views = _tick(model, sim, work=True)
    lines = render(views, Frame(simulated=True, source="SIMULATED GPU"), width, height)
    assert len(lines) <= height
    assert all(sum(len(t) for t, _ in line) <= width for line in lines)
    assert "GPU 0" in plain(lines)


def test_many_gpus_in_a_small_terminal_get_one_row_each_and_the_selected_in_full(clock):
    sim = SimBackend(n_gpus=8, clock=clock)
    try:
        model = MonitorModel(sim, list(range(8)), clock=clock)
        views = model.update()
        lines = render(views, Frame(selected=5), 100, 30)
        text = plain(lines)
        for i in range(8):
            assert f"GPU {i} " in text
        rows = [line for line in text.splitlines() if line.startswith(("▶ GPU", "  GPU"))]
        assert rows[5].startswith("▶ GPU 5")
        assert "procs" in text or "why" in text  # the detail block of the selected GPU
        # tall enough: every GPU in full
        assert plain(render(views, Frame(), 100, None)).count("    memory  ") == 8
    finally:
        sim.close()


def test_keys_quit_pause_and_pick_gpus():
    ui = Ui(3)
    assert ui.key("KEY_RIGHT") and ui.selected == 1
    assert ui.key("KEY_LEFT") and ui.key("KEY_LEFT") and ui.selected == 2  # wraps
    assert ui.key("0") and ui.selected == 0
    assert not ui.key("7") and ui.selected == 0  # no GPU 7
    assert ui.key("p") and ui.paused
    assert ui.key("p") and not ui.paused
    assert not ui.key("x")
    assert ui.key("q") and ui.quit


def test_sparkline_and_durations():
    g = Glyphs()
    assert sparkline([0, 1, 2, 3], 4, 0, 3, g) == "▁▃▆█"
    assert sparkline([5, 5], 2, 5, 5, g) == "▅▅"  # flat: mid-height
    assert len(sparkline(list(range(120)), 30, 0, 119, g)) == 30
    assert sparkline([], 10, 0, 1, g) == ""
    ascii_g = Glyphs.for_encoding("ANSI_X3.4-1968")
    assert sparkline([0, 3], 2, 0, 3, ascii_g).isascii()
