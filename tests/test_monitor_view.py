"""gpuenv monitor's view: layout for any terminal size, glyphs and keys, in virtual time."""

from __future__ import annotations

import pytest
from monitor_harness import tick

from gpuenv.backend.sim import SimBackend
from gpuenv.monitor import MonitorModel
from gpuenv.monitor.blocks import Frame
from gpuenv.monitor.draw import Glyphs, clip, graph, plain, sparkline
from gpuenv.monitor.tui import Ui
from gpuenv.monitor.view import KEY_HELP, render

pytestmark = pytest.mark.sim_gpus(2)


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160, 240])
@pytest.mark.parametrize("height", [8, 16, 24, 50])
def test_render_fits_any_terminal(sim, vclock, width, height):
    model = MonitorModel(sim, [0, 1], clock=vclock)
    sim.open_context(0)
    for _ in range(5):
        views = tick(model, sim, work=True)
    lines = render(views, Frame(simulated=True, source="SIMULATED GPU"), width, height)
    assert len(lines) <= height
    assert all(sum(len(t) for t, _ in line) <= width for line in lines)
    assert "GPU 0" in plain(lines)


def test_many_gpus_in_a_small_terminal_get_one_row_each_and_the_selected_in_full(vclock):
    sim = SimBackend(n_gpus=8, clock=vclock)
    try:
        model = MonitorModel(sim, list(range(8)), clock=vclock)
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


def test_help_opens_on_question_mark_or_h_and_any_key_closes_it():
    ui = Ui(2)
    for opener, closer in (("?", "x"), ("h", "\x1b"), ("?", "q")):
        assert ui.key(opener) and ui.help
        assert not ui.key("") and ui.help  # a timeout is no key
        assert ui.key(closer) and not ui.help
        assert not ui.quit and not ui.paused and ui.selected == 0  # the key did nothing else
    assert ui.key("q") and ui.quit


@pytest.mark.parametrize(("width", "height"), [(60, 15), (100, 32), (200, 50), (40, 8)])
def test_the_help_overlay_lists_the_keys_in_any_terminal(sim, vclock, width, height):
    views = MonitorModel(sim, [0, 1], clock=vclock).update()
    lines = render(views, Frame(help=True), width, height)
    text = plain(lines)
    assert len(lines) <= height and all(sum(len(t) for t, _ in x) <= width for x in lines)
    assert "any key" in text.splitlines()[0]
    if height >= 15:
        assert all(keys.split()[0] in text for keys, _ in KEY_HELP)
    if height >= 32:
        assert "What a GPU's block shows" in text and "procs" in text


def test_clip_ends_at_a_word_boundary_and_never_wraps():
    line = [("    why     ", "dim"), ("power cap for 12 s", "warn"), ("  · clock lowered", "dim")]
    assert plain([clip(line, 30)]) == "    why     power cap for 12…\n"
    assert plain([clip(line, 36)]) == "    why     power cap for 12 s…\n"  # no dangling "·"
    assert clip(line, 200) == line
    assert plain([clip([("averyveryverylongword", "")], 8)]) == "averyve…\n"


def test_graph_fills_columns_to_the_value_scaled_between_lo_and_hi():
    g = Glyphs()
    assert graph([0, 4, 8], 3, 1, 0, 8, g) == ["▁▄█"]  # the lowest value still shows
    two = graph([0, 8, 16], 4, 2, 0, 16, g)
    assert two == ["   █", " ▁██"]  # right-aligned, top row first
    assert graph([5, 5], 2, 3, 5, 5, g) == ["  ", "  ", "▄▄"]  # flat: low in the bottom row


def test_wide_terminals_get_wider_bars_a_taller_graph_and_the_spare_rows(sim, vclock):
    model = MonitorModel(sim, [0], clock=vclock)
    sim.open_context(0)
    for _ in range(30):
        views = tick(model, sim, work=True)
    narrow = plain(render(views, Frame(), 100, 32)).splitlines()
    wide = plain(render(views, Frame(), 200, 50)).splitlines()

    def longest_bar(rows):
        return max(len(max(r.split(), key=lambda w: w.count("█"))) for r in rows if "█" in r)

    assert longest_bar(wide) >= 2 * longest_bar(narrow) - 10
    graph_rows = [r for r in wide[wide.index(next(r for r in wide if "history" in r)) :]]
    assert next(k for k, r in enumerate(graph_rows) if r.startswith("    lock")) >= 10
    assert len(wide) >= 35 and max(len(r) for r in wide) <= 200


def test_narrow_terminals_drop_columns_and_keep_the_key_hints(sim, vclock):
    model = MonitorModel(sim, [0], clock=vclock)
    sim.set_background_load(0, 0.5)
    views = tick(model, sim, work=True)
    text = plain(render(views, Frame(simulated=True, source="SIMULATED GPU"), 60, 15))
    rows = text.splitlines()
    assert rows[0].endswith("? help") and "q quit" in rows[0]
    assert "USER" not in text and "GPU MEM" in text and "400000" in text  # USER dropped
    assert "memory" in text and "SM" in text


def test_many_processes_take_the_spare_rows_and_say_how_many_more(sim, vclock):
    for pid in range(1000, 1040):
        sim.open_context(0, pid=pid)
    views = MonitorModel(sim, [0], clock=vclock).update()[:1]
    lines = plain(render(views, Frame(), 100, 32)).splitlines()
    assert len(lines) == 32 and lines[-1].strip().startswith("… ")
    shown = [x for x in lines if x.strip()[:4].isdigit()]
    more = int(lines[-1].split()[1])
    assert len(shown) + more == 40 and len(shown) >= 15


def test_sort_keys_step_over_the_columns_a_narrow_terminal_hides():
    """At 80 columns USER and TIME are not drawn: `.` and `,` never sort by them, so the
    sort's marker stays on a column in sight."""
    ui = Ui(1)
    ui.width = 80
    assert ui.key(".") and ui.sort == "gpu_memory"  # PID -> (USER hidden) -> GPU MEM
    assert ui.key(",") and ui.sort == "pid"
    assert ui.key(",") and ui.sort == "memory_percent"  # (TIME hidden)
    ui.width = 200  # wide: every column, nvitop's order
    assert ui.key(".") and ui.sort == "time"


def test_a_sort_by_a_column_a_resize_hid_is_named(sim, vclock):
    sim.set_background_load(0, 0.5)
    views = tick(MonitorModel(sim, [0], clock=vclock), sim, work=True)[:1]
    narrow = plain(render(views, Frame(sort="user"), 80, None))
    assert "USER" not in narrow.replace("sorted by USER▲", "")
    assert "sorted by USER▲" in narrow
    assert "sorted by" not in plain(render(views, Frame(sort="user"), 120, None))


def test_the_filter_is_named_from_the_first_press(sim, vclock):
    sim.set_background_load(0, 0.5)
    views = tick(MonitorModel(sim, [0], clock=vclock), sim, work=True)[:1]
    ui = Ui(1)
    assert "only" not in plain(render(views, Frame(kind=ui.kind), 80, None))
    ui.key("f")  # all -> compute
    text = plain(render(views, Frame(kind=ui.kind), 80, None))
    head = next(r for r in text.splitlines() if "COMMAND" in r)
    assert head.rstrip().endswith("compute (C) only") and "400000" in text
    ui.key("f")  # -> graphics: none on this GPU, and the table says which filter
    assert "none (graphics (G) only)" in plain(render(views, Frame(kind=ui.kind), 80, None))


def test_the_pause_hint_says_what_p_does_now(sim, vclock):
    views = MonitorModel(sim, [0], clock=vclock).update()[:1]
    running = plain(render(views, Frame(), 80, 24)).splitlines()[0]
    paused = plain(render(views, Frame(paused=True), 80, 24)).splitlines()[0]
    assert "p pause" in running and "p resume" not in running
    assert "PAUSED" in paused and "p resume" in paused and "p pause" not in paused


def _why(text: str) -> list[str]:
    return [r for r in text.splitlines() if "power cap" in r]


def test_the_why_line_gives_one_window(sim, vclock):
    """A cap on without a break reads "for N s"; one that was on and off reads its share of
    the counters' span. Never both ("for 6 s, 95% of the last 5 s" read as two answers)."""
    model = MonitorModel(sim, [0], clock=vclock)
    model.update()
    sim.open_context(0)
    for _ in range(20):
        views = tick(model, sim, work=True)
    steady = _why(plain(render(views, Frame(), 120, None)))
    assert len(steady) == 1 and " for " in steady[0] and "of the last" not in steady[0]
    for _ in range(5):  # the cap lets go while idle, then comes back
        views = tick(model, sim)
    for _ in range(3):
        views = tick(model, sim, work=True)
    cap = next(r for r in views[0].active if r.name == "SwPowerCap")
    assert cap.active_s is not None and cap.active_s < 5  # the new run is short
    again = _why(plain(render(views, Frame(), 120, None)))
    assert len(again) == 1 and "of the last" in again[0] and " for " not in again[0]
