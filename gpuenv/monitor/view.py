"""`gpuenv monitor`'s view: `GpuView`s (model.py) laid out for a terminal of any size.

`render()` turns them into lines of styled segments (draw.py) for a `width` x
`height` terminal: every GPU in full when they fit, the spare rows going to the
process tables and to a taller clock graph; otherwise one line per GPU and the
selected GPU in full, its least useful lines giving way first. Bars and the clock
history grow with the width; a narrow terminal drops whole columns and ends a line
at a word boundary, never wraps; the key hints stay, shortened. `?` or `h` opens
the help overlay (`help_lines`). `plain()` and `ansi()` print the lines (`--once`);
tui.py draws them with curses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gpuenv.monitor.blocks import Frame, Part, fit, gpu_parts, gpu_row, proc_lines, title_line
from gpuenv.monitor.draw import Glyphs, Line, Segment, clip, width_of
from gpuenv.monitor.host import host_segments
from gpuenv.monitor.model import GpuView
from gpuenv.table import display_width

KEY_HELP = (  # (keys, what they do): the help overlay and docs/how-to/monitor.md say the same
    ("q  Esc", "quit"),
    ("p  Space", "pause or resume the updates"),
    ("→ ↓ Tab j l", "select the next GPU"),
    ("← ↑ k", "select the previous GPU"),
    ("0-9", "select GPU N"),
    (",  .", "sort the processes by the previous / next column shown (PID, GPU MEM, SM, ...)"),
    ("/", "reverse the sort order"),
    ("f", "filter the processes: all, compute (C) only, graphics (G) only"),
    ("?  h", "this help (any key closes it)"),
)
PART_HELP = (
    ("SM", "clock against its max and the lock (bar); history: the clock over the last updates"),
    ("lock", "gpuenv's lock, whether it holds (why not), and who holds it"),
    ("memory", "device memory used of total"),
    ("power", "power against the enforced limit"),
    ("temp", "temperature against the slowdown threshold"),
    ("why", "active clock-event reasons: how long on, or (on and off) their share of a minute"),
    ("board", "P-state, fan, uncorrected ECC errors, persistence, compute and MIG mode, bus id"),
    ("procs", "PID, type (C/G), user, GPU memory, SM share, %CPU, %MEM, TIME, command"),
    ("host", "the line under the title: CPU, memory, swap, load average, uptime"),
)


def _key_hints(n_gpus: int, g: Glyphs, help_open: bool, paused: bool = False) -> list[str]:
    """The key hints, longest first; `p` says what it would do now (pause, or resume)."""
    if help_open:
        return ["any key closes the help", "any key: close", "any key"]
    pick = [f"  {g.arrows} GPU"] if n_gpus > 1 else [""]
    p = "p resume" if paused else "p pause"
    return [
        f"q quit  {p}{pick[0]}  ? help",
        f"q quit  {p}  ? help",
        "q quit  ? help",
        "? help",
    ]


def header(views: Sequence[GpuView], frame: Frame, width: int) -> Line:
    """Title, time, period and source on the left, key hints on the right: what does not
    fit goes, the source and the period first, the hints last (shortened)."""
    wall = views[0].wall if views else time.time()
    clock = f"  {time.strftime('%H:%M:%S', time.localtime(wall))}"
    short = "SIMULATED" if frame.simulated else "NVML"
    src = "warn" if frame.simulated else "dim"
    paused: list[Segment] = [("  PAUSED", "warn")] if frame.paused else []
    name: Segment = ("gpuenv monitor", "title")
    every: Segment = (f"  every {frame.interval_s:g} s", "dim")
    lefts: list[Line] = [
        [name, (clock, ""), every, (f"  {frame.source}", src), *paused],
        [name, (clock, ""), (f"  {frame.source}", src), *paused],
        [name, (clock, ""), (f"  {short}", src), *paused],
        [name, (f"  {short}", src), *paused],
        [name, *paused],
        [("gpuenv", "title"), *paused],
    ]
    if not frame.source:
        lefts = [[s for s in left if s[0].strip() not in ("", short)] for left in lefts]
    if not frame.keys:
        return lefts[0]
    for keys in _key_hints(len(views), frame.glyphs, frame.help, frame.paused):
        for left in lefts:
            pad = width - width_of(left) - display_width(keys)
            if pad >= 2:
                return [*left, (" " * pad + keys, "dim")]
    return lefts[-1]


def help_lines(frame: Frame, width: int, height: int | None) -> list[Line]:
    """The help overlay: the keys first, then what each part of a GPU's block shows."""
    lines: list[Line] = [[], [("  Keys", "title")]]
    lines += [[(f"    {k:<14}", "bold"), (what, "")] for k, what in KEY_HELP]
    parts: list[Line] = [[], [("  What a GPU's block shows", "title")]]
    parts += [[(f"    {k:<8}", "bold"), (what, "dim")] for k, what in PART_HELP]
    parts += [[], [("  Press any key to close this help.", "dim")]]
    if height is None or len(lines) + len(parts) <= height:
        lines += parts
    return lines[: height if height is not None else None]


def gpu_block(
    v: GpuView,
    width: int,
    frame: Frame,
    *,
    selected: bool = False,
    budget: int | None = None,
    graph_rows: int = 1,
) -> list[Line]:
    """The detailed lines for one GPU, in `budget` rows (None: every line, every process).

    Short of rows, the least useful lines go first (the memory clock, utilisation, the
    history), the process table keeps its header and as many rows as fit."""
    title = title_line(v, frame, selected=selected)
    g = frame.glyphs
    parts = gpu_parts(v, width, frame, graph_rows=graph_rows)
    if v.error is not None or budget is None:
        procs = [] if v.error is not None else proc_lines(v, width, g, None, frame)
        return [title, *(line for p in parts for line in p.lines), *procs]
    procs_part = Part(65, proc_lines(v, width, g, 1, frame))
    kept = fit([*parts, procs_part], budget - 1)
    used = sum(len(p.lines) for p in kept)
    if procs_part in kept:
        room = budget - 1 - used + len(procs_part.lines) - 1  # rows for the process rows
        procs_part.lines = proc_lines(v, width, g, max(1, room), frame)
    return [title, *(line for p in kept for line in p.lines)]


def _natural_rows(v: GpuView, width: int, frame: Frame) -> int:
    """Rows of a GPU's full block (a one-row history, every process) and its blank line."""
    return 1 + len(gpu_block(v, width, frame))


def render(views: Sequence[GpuView], frame: Frame, width: int, height: int | None) -> list[Line]:
    """Lay the views out for a `width` x `height` terminal (height None: no limit, for --once).

    Every GPU in full when they fit, the spare rows growing the clock graphs; otherwise
    one compact row per GPU and the selected GPU in full below, in the rows left.
    """
    lines: list[Line] = [header(views, frame, width)]
    if frame.host is not None and (height is None or height >= 12):
        lines.append(host_segments(frame.host))
    top = len(lines)
    if frame.help:
        lines += help_lines(frame, width, None if height is None else height - top)
        return _finish(lines, frame, width)
    sel = min(max(frame.selected, 0), max(len(views) - 1, 0))
    many = len(views) > 1
    natural = sum(_natural_rows(v, width, frame) for v in views)
    if height is None or top + natural <= height:
        spare = 0 if height is None else (height - top - natural) // max(1, len(views))
        # the clock graph takes the spare rows, up to half the screen
        tall = min(spare + 1, max(8, height // 2)) if height is not None else 1
        graph_rows = tall if spare >= 2 and width >= 80 else 1
        for k, v in enumerate(views):
            lines.append([])
            block = gpu_block(v, width, frame, selected=(k == sel and many), graph_rows=graph_rows)
            lines.extend(block)
    elif not many:
        lines.extend(gpu_block(views[0], width, frame, budget=height - top))
    else:
        room = height - top
        rows = [gpu_row(v, frame, selected=(k == sel)) for k, v in enumerate(views)]
        n_rows = min(len(rows), max(1, room - 5))  # keep room for the detail block
        first = min(max(0, sel - n_rows // 2), len(rows) - n_rows)
        lines.append([])
        lines.extend(rows[first : first + n_rows])
        budget = room - n_rows - 2
        if budget >= 2:
            lines.append([])
            lines.extend(gpu_block(views[sel], width, frame, budget=budget))
    if height is not None:
        lines = lines[:height]
    return _finish(lines, frame, width)


# What the ASCII glyph set writes for the other characters the view uses
_ASCII = str.maketrans(
    {
        "→": ">",
        "←": "<",
        "↑": "^",
        "↓": "v",
        "…": "~",
        "·": "|",
        "▲": "^",
        "▼": "v",
        "—": "-",
        "–": "-",
        "≥": ">",
        "°": " ",
    }
)


def _finish(lines: list[Line], frame: Frame, width: int) -> list[Line]:
    """Clip each line to the width; with the ASCII glyphs, nothing but ASCII leaves (a
    terminal or pipe that is not UTF-8: LANG=C, PYTHONIOENCODING=ascii)."""
    out = [clip(line, width, frame.glyphs.more) for line in lines]
    if not frame.glyphs.ascii:
        return out
    return [[(_ascii(text), style) for text, style in line] for line in out]


def _ascii(text: str) -> str:
    return text.translate(_ASCII).encode("ascii", "replace").decode("ascii")


__all__ = ["KEY_HELP", "PART_HELP", "gpu_block", "header", "help_lines", "render"]
