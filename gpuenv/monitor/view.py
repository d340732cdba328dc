"""`gpuenv monitor`'s view: `GpuView`s (model.py) laid out for a terminal.

`render()` turns them into lines of styled segments for a terminal of a given
size: every GPU in full when they fit, otherwise one line per GPU and the
selected GPU in full. `plain()` and `ansi()` print them (`--once`); tui.py
draws them with curses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuenv.monitor.model import BAD_REASONS, REASON_SHORT, WARN_REASONS, GpuView
from gpuenv.units import fmt_elapsed

Segment = tuple[str, str]  # (text, style); styles: "" bold dim title ok warn bad sel bar
Line = list[Segment]


@dataclass
class Glyphs:
    bar_full: str = "█"
    bar_empty: str = "░"
    spark: str = "▁▂▃▄▅▆▇█"
    sep: str = "·"
    sel: str = "▶"
    yes: str = "✓"
    no: str = "✗"

    @classmethod
    def for_encoding(cls, encoding: str | None) -> Glyphs:
        if encoding and encoding.lower().replace("-", "") in ("utf8", "utf16", "utf32"):
            return cls()
        return cls(bar_full="#", bar_empty=".", spark="_.-=^", sep="|", sel=">", yes="ok", no="NO")


@dataclass
class Frame:
    """What the header says about the whole screen."""

    source: str = ""  # "NVML" / "SIMULATED GPU (scenario load)"
    simulated: bool = False
    interval_s: float = 1.0
    paused: bool = False
    selected: int = 0  # position in the views list
    keys: bool = True  # show the key help
    glyphs: Glyphs = field(default_factory=Glyphs)


def bar(frac: float | None, width: int, g: Glyphs) -> str:
    if width <= 0:
        return ""
    if frac is None:
        return " " * width
    n = round(max(0.0, min(1.0, frac)) * width)
    return g.bar_full * n + g.bar_empty * (width - n)


def sparkline(values: Sequence[float], width: int, lo: float, hi: float, g: Glyphs) -> str:
    """`values` in `width` cells (means of buckets when there are more values than cells),
    scaled from `lo` (lowest glyph) to `hi` (highest); a flat line sits mid-height."""
    if width <= 0 or not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        buckets = [
            values[int(k * step) : max(int(k * step) + 1, int((k + 1) * step))]
            for k in range(width)
        ]
        values = [sum(b) / len(b) for b in buckets]
    levels = len(g.spark)
    if hi <= lo:
        return g.spark[levels // 2] * len(values)
    span = hi - lo
    return "".join(g.spark[min(levels - 1, max(0, int((v - lo) / span * levels)))] for v in values)


def _clock_style(v: GpuView) -> str:
    if v.reasons & BAD_REASONS or (v.lock and v.lock.holds is False):
        return "bad"
    if v.reasons & WARN_REASONS:
        return "warn"
    return "ok"


def _reason_style(bit: int) -> str:
    if bit & BAD_REASONS:
        return "bad"
    if bit & WARN_REASONS:
        return "warn"
    return "dim"


def _not_held_why(v: GpuView) -> str:
    lk = v.lock
    if lk is not None and lk.locked_sm and v.sm_mhz is not None and v.sm_mhz > lk.locked_sm[1]:
        return "clock above the lock: not in force (reset by the driver or another tool?)"
    if v.reasons & 0x4:
        return "the power cap pulls the clock below the lock"
    if v.reasons & (0x20 | 0x40):
        return "thermal slowdown pulls the clock below the lock"
    if v.reasons & (0x8 | 0x80):
        return "a hardware slowdown pulls the clock below the lock"
    if v.reasons & 0x1:
        return "the GPU is idle"
    return (lk.why if lk and lk.why else "") or "below the locked range"


def _owner_text(v: GpuView) -> str:
    lk = v.lock
    if lk is None or not lk.owner or lk.locked_sm is None:
        return ""
    return f"by {lk.owner}"


def _lock_segments(v: GpuView, g: Glyphs, *, why: bool) -> Line:
    lk = v.lock
    if lk is None:
        return [("lock: unknown", "dim")]
    if lk.locked_sm is None:
        if lk.known:
            return [("lock: journaled, SM not locked", "dim")]
        return [("not locked by gpuenv", "dim")]
    lo, hi = lk.locked_sm
    rng = "base clock" if lo >= 0xFFFFFF00 else (f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz")
    segs: Line = [("locked ", "bold"), (rng, "bold")]
    if lk.holds is True:
        segs.append((f" {g.yes} holds", "ok"))
    elif lk.holds is False:
        segs.append((f" {g.no} NOT holding", "bad"))
        if why:
            segs.append((f": {_not_held_why(v)}", "bad"))
    return segs


def gpu_block(
    v: GpuView, width: int, frame: Frame, *, selected: bool = False, max_procs: int = 8
) -> list[Line]:
    """The detailed lines for one GPU."""
    g = frame.glyphs
    mark = f"{g.sel} " if selected else "  "
    title: Line = [(mark, "sel" if selected else ""), (f"GPU {v.index}", "title")]
    if v.name:
        title.append((f"  {v.name}", "bold"))
    if frame.simulated:
        title.append(("  (simulated)", "warn"))
    if v.uuid:
        title.append((f"  {v.uuid}", "dim"))
    lines: list[Line] = [title]
    if v.error is not None:
        lines.append([("    error: ", "bad"), (v.error, "bad")])
        return lines
    rows = _Rows(width, g)
    lines += _clock_lines(v, width, rows)
    lines += _gauge_lines(v, rows)
    lines += _why_lines(v, rows)
    lines += _proc_lines(v, rows, max_procs)
    return lines


class _Rows:
    """The columns of a GPU's detail lines: label, value, an optional bar, the rest."""

    label_w = 12
    value_w = 10

    def __init__(self, width: int, g: Glyphs):
        self.g = g
        bw = max(0, min(30, width - self.label_w - self.value_w - 40))
        self.bw = bw if bw >= 5 else 0

    def label(self, text: str, style: str = "dim") -> Segment:
        return (f"    {text:<{self.label_w - 4}}", style)

    def row(
        self,
        label: str,
        value: str,
        value_style: str,
        rest: Line,
        frac: float | None = None,
        frac_style: str = "",
    ) -> Line:
        out: Line = [
            (f"    {label:<{self.label_w - 4}}", "dim"),
            (f"{value:>{self.value_w - 2}}  ", value_style),
        ]
        if self.bw and frac is not None:
            out.append((bar(frac, self.bw, self.g), frac_style or value_style or "bar"))
            out.append(("  ", ""))
        return out + rest


def _clock_lines(v: GpuView, width: int, rows: _Rows) -> list[Line]:
    """SM clock against max and the lock, its history, the lock and its owner."""
    g = rows.g
    lines: list[Line] = []
    cstyle = _clock_style(v)
    frac = v.sm_mhz / v.max_sm_mhz if v.sm_mhz is not None and v.max_sm_mhz else None
    rest: Line = [(f"of {v.max_sm_mhz} max", "dim")]
    if v.lock and v.lock.locked_sm:
        lo, hi = v.lock.locked_sm
        rng = "base" if lo >= 0xFFFFFF00 else (f"{lo}" if lo == hi else f"{lo}-{hi}")
        held = "" if v.lock.holds is None else (f" {g.yes}" if v.lock.holds else f" {g.no}")
        rest.append((f"  lock {rng}{held}", "bad" if v.lock.holds is False else "ok"))
    lines.append(rows.row("SM", f"{v.sm_mhz} MHz", cstyle, rest, frac))
    vals = [mhz for _, mhz in v.history]
    if len(vals) >= 2:
        lo_v, hi_v = min(vals), max(vals)
        span = f"  {lo_v}-{hi_v} MHz" if lo_v != hi_v else f"  {lo_v} MHz"
        ago = fmt_elapsed(v.history[-1][0] - v.history[0][0])
        sw = max(0, width - rows.label_w - rows.value_w - len(span) - 1)
        # scaled to the range shown beside it: small moves (a cap creeping down) stay visible
        spark = sparkline(vals, min(sw, len(vals)), lo_v, hi_v, g)
        lines.append(rows.row("history", ago, "dim", [(spark, cstyle), (span, "dim")]))
    # the lock and its owner (on a line of its own when both do not fit)
    lock_line: Line = [rows.label("lock"), *_lock_segments(v, g, why=True)]
    owner = _owner_text(v)
    if owner and sum(len(t) for t, _ in lock_line) + 2 + len(owner) > width:
        lines += [lock_line, [(" " * rows.label_w, ""), (owner, "dim")]]
    else:
        lines.append([*lock_line, *([(f"  {owner}", "dim")] if owner else [])])
    return lines


def _gauge_lines(v: GpuView, rows: _Rows) -> list[Line]:
    """Memory clock, power against the limit, temperature against slowdown, utilisation."""
    lines = [rows.row("memory", f"{v.mem_mhz} MHz", "", [(f"of {v.max_mem_mhz} max", "dim")])]
    if v.power_w is not None:
        pfrac = v.power_w / v.power_limit_w if v.power_limit_w else None
        pstyle = "warn" if pfrac is not None and pfrac >= 0.95 else ""
        lim = f"of {v.power_limit_w:.0f} W limit" if v.power_limit_w else "limit unknown"
        lines.append(rows.row("power", f"{v.power_w:.0f} W", pstyle, [(lim, "dim")], pfrac))
    if v.temp_c is not None:
        tfrac = v.temp_c / v.slowdown_c if v.slowdown_c else None
        tstyle = ""
        if v.slowdown_c:
            tstyle = (
                "bad"
                if v.temp_c >= v.slowdown_c
                else ("warn" if v.temp_c >= v.slowdown_c - 10 else "")
            )
        tail = f"slowdown at {v.slowdown_c:.0f} C" if v.slowdown_c else "slowdown threshold unknown"
        lines.append(rows.row("temp", f"{v.temp_c:.0f} C", tstyle, [(tail, "dim")], tfrac))
    if v.util_gpu is not None:
        lines.append(
            rows.row(
                "util", f"{v.util_gpu} %", "", [(f"memory {v.util_mem} %", "dim")], v.util_gpu / 100
            )
        )
    return lines


def _why_lines(v: GpuView, rows: _Rows) -> list[Line]:
    """The active clock-event reasons: for how long, and their share of the counter span."""
    g = rows.g
    lines: list[Line] = []
    if not v.active:
        lines.append(
            [rows.label("why"), ("no clock-event reason: at the clock the GPU allows", "ok")]
        )
    for k, r in enumerate(v.active):
        lead = "why" if k == 0 else ""
        how_long = ""
        if r.active_s is not None and not (r.at_least and r.active_s < 1):
            how_long = f" for {'>=' if r.at_least else ''}{fmt_elapsed(r.active_s)}"
        share = ""
        if r.share is not None and v.counter_span_s:
            share = f", {r.share:.0%} of the last {fmt_elapsed(v.counter_span_s)}"
        lines.append(
            [
                rows.label(lead),
                (REASON_SHORT.get(r.bit, r.name), _reason_style(r.bit)),
                (how_long + share, ""),
                (f"  {g.sep} {r.words}", "dim"),
            ]
        )
    if v.below_max_share is not None and v.below_max_share > 0.005 and v.counter_span_s:
        span = fmt_elapsed(v.counter_span_s)
        text = f"below its top clock {v.below_max_share:.0%} of the last {span}"
        lines.append([rows.label("", ""), (text + " (all limiters)", "dim")])
    return lines


def _proc_lines(v: GpuView, rows: _Rows, max_procs: int) -> list[Line]:
    """The processes on the GPU, at most `max_procs` of them."""
    if not v.processes:
        return [[rows.label("procs"), ("none", "dim")]]
    lines: list[Line] = [
        [rows.label("procs"), (f"{'PID':>7}  {'USER':<10} {'GPU MEM':>9}  COMMAND", "dim")]
    ]
    for p in v.processes[:max_procs]:
        mem = f"{p.used_memory_mib} MiB" if p.used_memory_mib is not None else "-"
        lines.append(
            [rows.label("", ""), (f"{p.pid:>7}  {p.user[:10]:<10} {mem:>9}  {p.command}", "")]
        )
    if len(v.processes) > max_procs:
        lines.append([rows.label("", ""), (f"... {len(v.processes) - max_procs} more", "dim")])
    return lines


def gpu_row(v: GpuView, frame: Frame, *, selected: bool) -> Line:
    """One compact line per GPU, for many GPUs or a small terminal."""
    g = frame.glyphs
    mark = (f"{g.sel} ", "sel") if selected else ("  ", "")
    if v.error is not None:
        return [mark, (f"GPU {v.index:<2} ", "title"), (v.error, "bad")]
    short = v.name.replace("NVIDIA ", "")[:16]
    segs: Line = [mark, (f"GPU {v.index:<2} ", "title"), (f"{short:<17}", "")]
    segs.append((f"{v.sm_mhz:>4}/{v.max_sm_mhz} MHz  ", _clock_style(v)))
    if v.power_w is not None:
        lim = f"/{v.power_limit_w:.0f}" if v.power_limit_w else ""
        segs.append((f"{v.power_w:>4.0f}{lim} W  ", ""))
    if v.temp_c is not None:
        segs.append((f"{v.temp_c:>3.0f} C  ", ""))
    if v.util_gpu is not None:
        segs.append((f"{v.util_gpu:>3}%  ", ""))
    if v.lock and v.lock.locked_sm:
        lo, hi = v.lock.locked_sm
        rng = "base" if lo >= 0xFFFFFF00 else (f"{lo}" if lo == hi else f"{lo}-{hi}")
        held = "" if v.lock.holds is None else (f" {g.yes}" if v.lock.holds else f" {g.no}")
        segs.append((f"lock {rng}{held}  ", "bad" if v.lock.holds is False else "bold"))
    for r in v.active:
        segs.append((REASON_SHORT.get(r.bit, r.name) + " ", _reason_style(r.bit)))
    return segs


def header(views: Sequence[GpuView], frame: Frame, width: int) -> Line:
    wall = views[0].wall if views else time.time()
    left: Line = [
        ("gpuenv monitor", "title"),
        (f"  {time.strftime('%H:%M:%S', time.localtime(wall))}", ""),
    ]
    left.append((f"  every {frame.interval_s:g} s", "dim"))
    if frame.source:
        left.append((f"  {frame.source}", "warn" if frame.simulated else "dim"))
    if frame.paused:
        left.append(("  PAUSED", "warn"))
    if frame.keys:
        keys = "q quit  p pause" + ("  arrows/0-9 GPU" if len(views) > 1 else "")
        used = sum(len(t) for t, _ in left)
        pad = width - used - len(keys)
        if pad >= 2:
            left.append((" " * pad + keys, "dim"))
    return left


def render(views: Sequence[GpuView], frame: Frame, width: int, height: int | None) -> list[Line]:
    """Lay the views out for a `width` x `height` terminal (height None: no limit, for --once).

    Every GPU in full when they fit; otherwise one compact row per GPU and the
    selected GPU in full below, cut to the height left.
    """
    lines: list[Line] = [header(views, frame, width)]
    sel = min(max(frame.selected, 0), max(len(views) - 1, 0))
    blocks = [
        gpu_block(v, width, frame, selected=(k == sel and len(views) > 1))
        for k, v in enumerate(views)
    ]
    full = sum(len(b) + 1 for b in blocks)
    if height is None or 1 + full <= height:
        for b in blocks:
            lines.append([])
            lines.extend(b)
    else:
        room = height - 1
        rows = [gpu_row(v, frame, selected=(k == sel)) for k, v in enumerate(views)]
        n_rows = min(len(rows), max(1, room - 4))  # keep room for the detail block
        first = min(max(0, sel - n_rows // 2), len(rows) - n_rows)
        lines.append([])
        lines.extend(rows[first : first + n_rows])
        if views:
            lines.append([])
            lines.extend(gpu_block(views[sel], width, frame, selected=False, max_procs=3))
        lines = lines[:height]
    return [clip(line, width) for line in lines]


def clip(line: Line, width: int) -> Line:
    out: Line = []
    used = 0
    for text, style in line:
        if used >= width:
            break
        text = text[: width - used]
        out.append((text, style))
        used += len(text)
    return out


def plain(lines: Iterable[Line]) -> str:
    return "\n".join("".join(t for t, _ in line).rstrip() for line in lines) + "\n"


_ANSI = {
    "": "",
    "bold": "1",
    "dim": "2",
    "title": "1;36",
    "ok": "32",
    "warn": "33",
    "bad": "1;31",
    "sel": "7",
    "bar": "34",
}


def ansi(lines: Iterable[Line]) -> str:
    out = []
    for line in lines:
        parts = []
        for text, style in line:
            code = _ANSI.get(style, "")
            parts.append(f"\x1b[{code}m{text}\x1b[0m" if code and text.strip() else text)
        out.append("".join(parts).rstrip())
    return "\n".join(out) + "\n"


__all__ = [
    "Frame",
    "Glyphs",
    "Line",
    "Segment",
    "ansi",
    "bar",
    "clip",
    "gpu_block",
    "gpu_row",
    "header",
    "plain",
    "render",
    "sparkline",
]
