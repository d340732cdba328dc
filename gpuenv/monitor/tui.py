"""`gpuenv monitor`'s interactive view: the curses loop (erase, noutrefresh, doupdate:
no flicker) until `q`, with `p` to pause, arrows or digits to pick a GPU and `?` or
`h` for the help overlay (view.KEY_HELP). `Ui` holds the key handling apart from
curses, so it is tested directly.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from gpuenv.monitor.blocks import Frame, shown_sort_keys
from gpuenv.monitor.draw import Glyphs, Line
from gpuenv.monitor.model import MonitorModel
from gpuenv.monitor.processes import KINDS, SORT_KEYS
from gpuenv.monitor.view import render
from gpuenv.table import cut, display_width

KEYS_NEXT = ("KEY_RIGHT", "KEY_DOWN", "\t", "j", "l")
KEYS_PREV = ("KEY_LEFT", "KEY_UP", "KEY_BTAB", "k")
KEYS_HELP = ("?", "h", "H", "KEY_F(1)")


class Ui:
    """Key handling and state of the interactive view, apart from curses (tested directly)."""

    def __init__(self, n_gpus: int, *, sort: str = "pid", reverse: bool = False, kind: str = "all"):
        self.n = n_gpus
        self.selected = 0
        self.paused = False
        self.quit = False
        self.help = False
        self.sort, self.reverse, self.kind = sort, reverse, kind
        self.width: int | None = None  # the terminal's, as last drawn: which columns show

    def key(self, key: str) -> bool:
        """Handle one key; True when the screen needs a redraw. With the help open, any
        key (Esc included) closes it and does nothing else."""
        if self.help:
            if key in ("", "KEY_RESIZE"):
                return key == "KEY_RESIZE"
            self.help = False
        elif key in KEYS_HELP:
            self.help = True
        elif key in ("q", "Q", "\x1b"):
            self.quit = True
        elif key in ("p", "P", " "):
            self.paused = not self.paused
        elif key in KEYS_NEXT:
            self.selected = (self.selected + 1) % max(self.n, 1)
        elif key in KEYS_PREV:
            self.selected = (self.selected - 1) % max(self.n, 1)
        elif len(key) == 1 and key.isdigit() and int(key) < self.n:
            self.selected = int(key)
        elif key in (",", "."):  # nvitop's keys: the previous / next sort column shown
            self.sort = self._next_sort(1 if key == "." else -1)
        elif key == "/":
            self.reverse = not self.reverse
        elif key in ("f", "F"):
            self.kind = KINDS[(KINDS.index(self.kind) + 1) % len(KINDS)]
        elif key != "KEY_RESIZE":
            return False
        return True

    def _next_sort(self, step: int) -> str:
        """The sort key `step` columns on, among those drawn at this width (all of them
        before the first draw), so the sort's marker stays in sight."""
        keys = list(SORT_KEYS)
        shown = set(keys if self.width is None else shown_sort_keys(self.width))
        k = keys.index(self.sort)
        for _ in keys:
            k = (k + step) % len(keys)
            if keys[k] in shown:
                return keys[k]
        return self.sort


def run_tui(
    model: MonitorModel,
    frame: Frame,
    *,
    interval_s: float,
    stop_after_s: float | None = None,
    ascii_only: bool = False,
) -> None:
    """The interactive view until `q` (or `stop_after_s`): erase + noutrefresh + doupdate
    each frame, so no flicker."""
    import curses
    import locale

    locale.setlocale(locale.LC_ALL, "")
    # ncurses prefers LINES/COLUMNS from the environment to the terminal's real size,
    # and a stale exported pair would pin the view to it, resizes included.
    os.environ.pop("LINES", None)
    os.environ.pop("COLUMNS", None)
    frame.glyphs = Glyphs.for_output(locale.getpreferredencoding(False), ascii_only=ascii_only)

    def main(scr: Any) -> None:
        curses.curs_set(0)
        with contextlib.suppress(AttributeError, curses.error):
            curses.set_escdelay(25)  # Esc closes the help at once, not after a second
        styles = _curses_styles(curses)
        ui = Ui(len(model.gpus), sort=frame.sort, reverse=frame.reverse, kind=frame.kind)
        views = model.update()
        started = model.clock.now()
        next_due = started + interval_s
        dirty = True
        while not ui.quit:
            if stop_after_s is not None and model.clock.now() - started >= stop_after_s:
                return
            if dirty:
                frame.paused, frame.selected, frame.help = ui.paused, ui.selected, ui.help
                frame.sort, frame.reverse, frame.kind = ui.sort, ui.reverse, ui.kind
                frame.host = model.host
                h, w = scr.getmaxyx()
                ui.width = w
                _draw(scr, render(views, frame, w, h), styles, curses)
                dirty = False
            wait_ms = max(10, int((next_due - model.clock.now()) * 1000))
            scr.timeout(min(wait_ms, 1000))
            try:
                key = scr.getkey()
            except curses.error:  # timeout: no key
                key = ""
            except KeyboardInterrupt:
                return
            if key:
                dirty = ui.key(key) or dirty
            if model.clock.now() >= next_due:
                next_due += interval_s * max(
                    1, int((model.clock.now() - next_due) // interval_s) + 1
                )
                if not ui.paused:
                    views = model.update()
                    dirty = True

    with contextlib.suppress(KeyboardInterrupt):
        curses.wrapper(main)


def _curses_styles(curses: Any) -> dict[str, int]:
    styles = {
        "": curses.A_NORMAL,
        "bold": curses.A_BOLD,
        "dim": curses.A_DIM,
        "sel": curses.A_REVERSE,
    }
    colours = {
        "title": (curses.COLOR_CYAN, curses.A_BOLD),
        "ok": (curses.COLOR_GREEN, 0),
        "warn": (curses.COLOR_YELLOW, 0),
        "bad": (curses.COLOR_RED, curses.A_BOLD),
        "bar": (curses.COLOR_BLUE, 0),
    }
    has = False
    with contextlib.suppress(curses.error):
        curses.start_color()
        curses.use_default_colors()
        has = curses.has_colors()
    for k, (name, (fg, extra)) in enumerate(colours.items(), start=1):
        if has:
            curses.init_pair(k, fg, -1)
            styles[name] = curses.color_pair(k) | extra
        else:
            styles[name] = curses.A_BOLD
    return styles


def _draw(scr: Any, lines: list[Line], styles: dict[str, int], curses: Any) -> None:
    scr.erase()
    h, w = scr.getmaxyx()
    for y, line in enumerate(lines[:h]):
        x = 0
        for text, style in line:
            if x >= w:
                break
            text = cut(text, w - x)  # display columns: a wide character takes two
            with contextlib.suppress(curses.error):  # the bottom-right cell raises after writing
                scr.addstr(y, x, text, styles.get(style, 0))
            x += display_width(text)
    scr.noutrefresh()
    curses.doupdate()


__all__ = ["Ui", "run_tui"]
