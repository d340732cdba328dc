"""One line of progress on stderr, redrawn in place, for anything that may take seconds.

    with Progress("reading run.jsonl (30 MB)") as p:  # "reading run.jsonl (30 MB) · 3 s"
        ...                                             # (shown once it has taken DELAY_S)
        p.update("drawing 9,000 regions")
    # the line is gone: what the command prints next starts on a clean line

Inside the `with`, a small thread redraws the line (and its seconds) while one long step
runs without a word (a 30 MB file being parsed); `update` changes what it says.

A terminal only: nothing is written when stderr is not a TTY (a log file, a pipe, a CI
job keeps its output as it was), when GPUENV_QUIET is set (`gpuenv --quiet`), or for work
that ends within DELAY_S. The line is cut to the terminal's width, so it never wraps
(a wrapped line could not be redrawn), and redrawn at most every INTERVAL_S. A write that
fails (the terminal went away) turns the line off, never the work.

Time here is the host's monotonic clock, not an injected one: it decides only when a
line is drawn, never what is measured.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import threading
import time
import warnings
from typing import IO, Any

from gpuenv.table import cut, display_width

QUIET_ENV = "GPUENV_QUIET"
DELAY_ENV = "GPUENV_PROGRESS_DELAY_S"  # DELAY_S otherwise (tests set 0: no timing in them)
DELAY_S = 1.0  # work that ends sooner shows nothing
INTERVAL_S = 0.1  # the line is redrawn at most this often

# The lines inside one another (a bench's, then the wait for the GPU inside it): only the
# innermost is drawn; when it ends, the one around it is drawn again at its next update.
_nested: list[Progress] = []
_nested_lock = threading.Lock()


def quiet() -> bool:
    """GPUENV_QUIET is set to anything but "" or "0"."""
    return os.environ.get(QUIET_ENV, "").strip() not in ("", "0")


def enabled(stream: Any) -> bool:
    """Progress is drawn on `stream`: a terminal, and not quiet."""
    if quiet():
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
        return False


def default_delay() -> float:
    """DELAY_S, or GPUENV_PROGRESS_DELAY_S where it is a number of seconds >= 0."""
    try:
        value = float(os.environ.get(DELAY_ENV, ""))
    except ValueError:
        return DELAY_S
    return value if math.isfinite(value) and value >= 0 else DELAY_S


def sized(path: str | os.PathLike[str]) -> str:
    """ "run.jsonl (30 MB)": what a long read is reading (the size from 1 MB on)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return os.fspath(path)
    return f"{os.fspath(path)} ({size / 1e6:.0f} MB)" if size >= 1e6 else os.fspath(path)


class _MakeRoom(logging.Filter):
    """On gpuenv's logger while a line may be drawn: each record takes the line off first
    (Python's last-resort handler writes a WARNING to stderr, the line's terminal)."""

    def filter(self, record: logging.LogRecord) -> bool:
        make_room()
        return True


_ROOM = _MakeRoom()
_plain_showwarning: Any = None  # warnings.showwarning as it was before a line was drawn


def _show_warning(*args: Any, **kwargs: Any) -> None:
    """warnings.showwarning while a line may be drawn: the line off, then the warning as
    it was shown before (Python's own in a script, the CLI's one-line form)."""
    make_room()
    (_plain_showwarning or warnings._showwarning_orig)(*args, **kwargs)  # type: ignore[attr-defined]


def _hook() -> None:
    """While any line is on (the first one entered): a warning or a log record of gpuenv's
    takes the line off before it is written, in a Python script as in the CLI."""
    global _plain_showwarning
    if warnings.showwarning is not _show_warning:
        _plain_showwarning = warnings.showwarning
        warnings.showwarning = _show_warning
    logging.getLogger("gpuenv").addFilter(_ROOM)


def _unhook() -> None:
    """The last line ended: warnings and logging as they were (unless replaced since)."""
    global _plain_showwarning
    if warnings.showwarning is _show_warning and _plain_showwarning is not None:
        warnings.showwarning = _plain_showwarning
    _plain_showwarning = None
    logging.getLogger("gpuenv").removeFilter(_ROOM)


def make_room() -> None:
    """Take the line off the terminal before something else is written to it (a warning):
    it is drawn again, below what was written, at its next update."""
    with _nested_lock:
        shown = [p for p in _nested if p._drawn]
    for p in shown:
        with p._lock:
            if p._drawn:
                p._write("\r\x1b[K")
                # not at once: the ticking thread must not draw it back before the warning
                p._drawn, p._drawn_at = False, time.monotonic()


class Progress:
    """The line; `update(text)` redraws it, `clear()` (or leaving the `with`) removes it.

    `stream`: default sys.stderr, looked up when the Progress is made. `delay_s`: how
    long the work runs before the first line is drawn (default: `default_delay()`).
    `show`: force the line on or off (default: `enabled(stream)`)."""

    def __init__(
        self,
        text: str = "",
        *,
        stream: IO[str] | None = None,
        delay_s: float | None = None,
        show: bool | None = None,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.on = enabled(self.stream) if show is None else show
        self.delay_s = default_delay() if delay_s is None else delay_s
        self.text = text
        self._start = time.monotonic()
        self._drawn_at = -math.inf
        self._drawn = False
        self._line = ""
        self._lock = threading.Lock()  # the ticking thread and the caller both draw
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def update(self, text: str) -> None:
        """Redraw the line with `text` (when due: the delay past, the interval since the last)."""
        self.text = text
        if not self.on or not text:
            return
        with _nested_lock:
            if self in _nested and _nested[-1] is not self:
                return  # a line inside this one is showing
        with self._lock:
            now = time.monotonic()
            if now - self._start < self.delay_s or now - self._drawn_at < INTERVAL_S:
                return
            text = f"{text} · {now - self._start:.0f} s"
            width = max(10, self._columns() - 1)
            line = text if display_width(text) <= width else cut(text, width - 1) + "…"
            if self._drawn and line == self._line:
                return  # nothing new to say: the terminal is not written to
            self._drawn_at, self._line = now, line
            self._write("\r" + line + "\x1b[K")
            self._drawn = True

    def _columns(self) -> int:
        """The width of the terminal the line is drawn on (stderr's, not stdout's)."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        return columns if columns > 0 else shutil.get_terminal_size((80, 24)).columns  # 0: unset

    def tick(self) -> None:
        """Draw the present text again if it is due (work that says nothing new for a while)."""
        self.update(self.text)

    def clear(self) -> None:
        """Stop the ticking thread; remove the line, if one was drawn."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self._drawn:
                self._drawn = False
                self._write("\r\x1b[K")
        with _nested_lock:
            if self in _nested:
                _nested.remove(self)
                if _nested:  # the line around this one: drawn again at its next update
                    outer = _nested[-1]
                    outer._drawn, outer._drawn_at = False, -math.inf
                else:
                    _unhook()

    def _write(self, data: str) -> None:
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):
            self.on = self._drawn = False

    def __enter__(self) -> Progress:
        if self.on:
            with _nested_lock:
                if not _nested:
                    _hook()
                _nested.append(self)
        self.tick()  # drawn at once where no delay is asked for
        if self.on and self.text and self._ticker is None:
            self._ticker = threading.Thread(
                target=self._tick_loop, name="gpuenv-progress", daemon=True
            )
            self._ticker.start()
        return self

    def _tick_loop(self) -> None:
        while not self._stop.wait(INTERVAL_S * 2):
            self.tick()

    def __exit__(self, *exc: object) -> None:
        self.clear()


__all__ = [
    "DELAY_ENV",
    "DELAY_S",
    "INTERVAL_S",
    "QUIET_ENV",
    "Progress",
    "default_delay",
    "enabled",
    "make_room",
    "quiet",
    "sized",
]
