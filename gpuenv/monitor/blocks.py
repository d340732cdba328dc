"""One GPU laid out for `gpuenv monitor`: its detail block (parts that give way by
priority when rows are short; the process table and the clock graph take the spare
rows) and its one-line row for many GPUs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuenv.monitor.draw import Glyphs, Line, Segment, bar, graph, sparkline
from gpuenv.monitor.host import HostView
from gpuenv.monitor.model import (
    BAD_REASONS,
    REASON_SHORT,
    WARN_REASONS,
    GpuView,
    ProcView,
    ReasonView,
)
from gpuenv.monitor.processes import KIND_NAMES, SORT_KEYS, arrange, shorten_command
from gpuenv.reasons import HARDWARE, THERMAL, Reason
from gpuenv.table import cut, display_width, pad
from gpuenv.units import fmt_elapsed

SYMBOLIC_CLOCKS = 0xFFFFFF00  # NVML's CLOCK_LIMIT_* ids (TDP, unlimited) lie above this


@dataclass
class Frame:
    """What the header says about the whole screen."""

    source: str = ""  # "NVML" / "SIMULATED GPU (scenario load)"
    simulated: bool = False
    interval_s: float = 1.0
    paused: bool = False
    selected: int = 0  # position in the views list
    keys: bool = True  # show the key hints
    help: bool = False  # the help overlay is open
    glyphs: Glyphs = field(default_factory=Glyphs)
    host: HostView | None = None  # the host line under the header (None: not shown)
    # the process tables: nvitop's sort keys (processes.SORT_KEYS) and filters
    sort: str = "pid"
    reverse: bool = False
    kind: str = "all"  # "all", "C" (compute) or "G" (graphics)
    users: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


@dataclass
class Part:
    """Lines of a GPU block that stay or go together; higher `keep` stays longer."""

    keep: int
    lines: list[Line]


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
    if v.reasons & Reason.SW_POWER_CAP:
        return "the power cap pulls the clock below the lock"
    if v.reasons & THERMAL:
        return "thermal slowdown pulls the clock below the lock"
    if v.reasons & HARDWARE:  # HW slowdown or power brake: HW thermal is the line above
        return "a hardware slowdown pulls the clock below the lock"
    if v.reasons & Reason.GPU_IDLE:
        return "the GPU is idle"
    return (lk.why if lk and lk.why else "") or "below the locked range"


def _range_text(locked_sm: tuple[int, int], base: str, unit: str) -> str:
    """A locked SM range: "1350<unit>", "1200-1350<unit>", or `base` for NVML's symbolic
    limits (CLOCK_LIMIT_TDP: the base clock)."""
    lo, hi = locked_sm
    if lo >= SYMBOLIC_CLOCKS:
        return base
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _lock_range(v: GpuView, g: Glyphs) -> tuple[str, str]:
    """The locked range in short ("1350", "base") and whether it holds (a glyph or "")."""
    assert v.lock is not None and v.lock.locked_sm is not None
    rng = _range_text(v.lock.locked_sm, "base", "")
    held = "" if v.lock.holds is None else (f" {g.yes}" if v.lock.holds else f" {g.no}")
    return rng, held


def _lock_segments(v: GpuView, g: Glyphs) -> Line:
    lk = v.lock
    if lk is None:
        return [("lock: unknown", "dim")]
    if lk.locked_sm is None:
        return [("lock: journaled, SM not locked" if lk.known else "not locked by gpuenv", "dim")]
    rng = _range_text(lk.locked_sm, "base clock", " MHz")
    segs: Line = [("locked ", "bold"), (rng, "bold")]
    if lk.holds is True:
        segs.append((f" {g.yes} holds", "ok"))
    elif lk.holds is False:
        segs += [(f" {g.no} NOT holding", "bad"), (f": {_not_held_why(v)}", "bad")]
    return segs


def _mib(mib: int) -> str:
    return f"{mib} MiB" if mib < 1000 else f"{mib / 1024:.1f} GiB"


class _Rows:
    """The columns of a GPU's detail lines: label, value, a bar as wide as the terminal
    allows (none when narrow), the rest."""

    label_w = 12
    value_w = 10

    def __init__(self, width: int, g: Glyphs):
        self.g = g
        self.width = width
        bw = width - self.label_w - self.value_w - 34
        self.bw = bw if bw >= 8 else 0

    def label(self, text: str, style: str = "dim") -> Segment:
        return (f"    {text:<{self.label_w - 4}}", style)

    def row(
        self, label: str, value: str, style: str, rest: Line, frac: float | None = None
    ) -> Line:
        out: Line = [self.label(label), (f"{value:>{self.value_w - 2}}  ", style)]
        if self.bw and frac is not None:
            out += [(bar(frac, self.bw, self.g), style or "bar"), ("  ", "")]
        return out + rest


def _clock_parts(v: GpuView, rows: _Rows, graph_rows: int) -> list[Part]:
    """SM clock against max and the lock; its history over the width; the lock's owner."""
    g = rows.g
    cstyle = _clock_style(v)
    frac = v.sm_mhz / v.max_sm_mhz if v.sm_mhz is not None and v.max_sm_mhz else None
    rest: Line = [(f"of {v.max_sm_mhz} max", "dim")]
    if v.lock and v.lock.locked_sm:
        rng, held = _lock_range(v, g)
        rest.append((f"  lock {rng}{held}", "bad" if v.lock.holds is False else "ok"))
    parts = [Part(95, [rows.row("SM", f"{v.sm_mhz} MHz", cstyle, rest, frac)])]
    parts.append(Part(60, _history_lines(v, rows, graph_rows, cstyle)))
    lock_line: Line = [rows.label("lock"), *_lock_segments(v, g)]
    parts.append(Part(85, [lock_line]))
    lk = v.lock
    if lk is not None and lk.owner and lk.locked_sm is not None:
        parts.append(Part(25, [[(" " * rows.label_w, ""), (f"by {lk.owner}", "dim")]]))
    return parts


def _history_lines(v: GpuView, rows: _Rows, graph_rows: int, style: str) -> list[Line]:
    """The SM clock over the last updates, one a column across the width: a sparkline,
    or a graph `graph_rows` high with its scale beside it."""
    span_w = 16
    cells = max(0, rows.width - rows.label_w - rows.value_w - span_w)
    vals = [mhz for _, mhz in v.history][-cells:] if cells else []
    if len(vals) < 2:
        return []
    shown = v.history[-len(vals) :]
    lo, hi = min(vals), max(vals)
    ago = fmt_elapsed(shown[-1][0] - shown[0][0], compact=True)
    span = f"  {lo}-{hi} MHz" if lo != hi else f"  {lo} MHz"
    if graph_rows < 2:
        # scaled to the range shown beside it: small moves (a cap creeping down) stay visible
        spark = sparkline(vals, cells, lo, hi, rows.g)
        return [rows.row("history", ago, "dim", [(spark, style), (span, "dim")])]
    # The graph's floor lies below the lowest clock by half the range shown (at least 2%
    # of the top): a dip reads as a dip, not as the bottom, and small moves stay visible.
    floor = lo if lo == hi else max(0, int(lo - max((hi - lo) / 2, 0.02 * hi)) // 50 * 50)
    body = graph(vals, cells, graph_rows, floor, hi, rows.g)
    out: list[Line] = []
    for k, cells_text in enumerate(body):
        value = ago if k == 0 else ""
        scale = {0: f"  {hi} MHz", len(body) - 1: f"  {floor} MHz"}.get(k, "")
        if k == len(body) - 2 and lo != hi:
            scale = f"  min {lo} MHz"
        lead = rows.label("history" if k == 0 else "")
        out.append([lead, (f"{value:>{rows.value_w - 2}}  ", "dim"), (cells_text, style)])
        out[-1].append((scale, "dim"))
    return out


def _gauge_parts(v: GpuView, rows: _Rows) -> list[Part]:
    """Device memory, power against the limit, temperature against slowdown, utilisation,
    the memory clock."""
    parts: list[Part] = []
    if v.mem_used_mib is not None and v.mem_total_mib:
        frac = v.mem_used_mib / v.mem_total_mib
        rest: Line = [(f"of {_mib(v.mem_total_mib)}  {frac:.0%} used", "dim")]
        parts.append(Part(80, [rows.row("memory", _mib(v.mem_used_mib), "", rest, frac)]))
    if v.power_w is not None:
        pfrac = v.power_w / v.power_limit_w if v.power_limit_w else None
        pstyle = "warn" if pfrac is not None and pfrac >= 0.95 else ""
        lim = f"of {v.power_limit_w:.0f} W limit" if v.power_limit_w else "limit unknown"
        power = rows.row("power", f"{v.power_w:.0f} W", pstyle, [(lim, "dim")], pfrac)
        parts.append(Part(75, [power]))
    if v.temp_c is not None:
        tfrac = v.temp_c / v.slowdown_c if v.slowdown_c else None
        tstyle = ""
        if v.slowdown_c:
            hot = v.temp_c >= v.slowdown_c
            tstyle = "bad" if hot else ("warn" if v.temp_c >= v.slowdown_c - 10 else "")
        tail = f"slowdown at {v.slowdown_c:.0f} C" if v.slowdown_c else "slowdown unknown"
        temp = rows.row("temp", f"{v.temp_c:.0f} C", tstyle, [(tail, "dim")], tfrac)
        parts.append(Part(70, [temp]))
    if v.util_gpu is not None:
        rest = [(f"memory {v.util_mem} %", "dim")]
        parts.append(Part(40, [rows.row("util", f"{v.util_gpu} %", "", rest, v.util_gpu / 100)]))
    mem_clk = rows.row("mem clk", f"{v.mem_mhz} MHz", "", [(f"of {v.max_mem_mhz} max", "dim")])
    parts.append(Part(30, [mem_clk]))
    return parts


def _board_part(v: GpuView, rows: _Rows) -> Part:
    """nvitop's device columns: P-state, fan, ECC errors, bus id, persistence, compute and
    MIG mode; what the GPU does not say reads N/A, as in nvitop."""

    def on(value: bool | None) -> str:
        return "N/A" if value is None else ("On" if value else "Off")

    na = "N/A"
    ecc_style = "bad" if v.ecc_errors else ""
    line: Line = [
        rows.label("board"),
        (f"{'P' + str(v.pstate) if v.pstate is not None else na:>{rows.value_w - 2}}  ", ""),
        (f"fan {na if v.fan_pct is None else str(v.fan_pct) + '%'}  ", ""),
        (f"ECC {na if v.ecc_errors is None else v.ecc_errors}", ecc_style),
        (
            f"  persist {on(v.persistence)}  compute {v.compute_mode or na}  MIG {on(v.mig_mode)}",
            "dim",
        ),
        (f"  bus {v.bus_id or na}", "dim"),
    ]
    return Part(45, [line])


def _why_parts(v: GpuView, rows: _Rows) -> list[Part]:
    """The active clock-event reasons, each with one window: how long it has been on without
    a break, or (on and off before that) its share of the counters' span."""
    g = rows.g
    if not v.active:
        ok = "no clock-event reason: at the clock the GPU allows"
        return [Part(90, [[rows.label("why"), (ok, "ok")]])]
    parts = []
    for k, r in enumerate(v.active):
        line: Line = [
            rows.label("why" if k == 0 else ""),
            (REASON_SHORT.get(r.bit, r.name), _reason_style(r.bit)),
            (_how_long(r, v.counter_span_s), ""),
            (f"  {g.sep} {r.words}", "dim"),
        ]
        parts.append(Part(90 if k == 0 else 50, [line]))
    if v.below_max_share is not None and v.below_max_share > 0.005 and v.counter_span_s:
        span = fmt_elapsed(v.counter_span_s)
        text = f"below its top clock {v.below_max_share:.0%} of the last {span} (all limiters)"
        parts.append(Part(20, [[rows.label("", ""), (text, "dim")]]))
    return parts


# How much more time the counter may count under a reason than its unbroken run before
# the run is no longer the whole story (the bit is sampled; the counter sees every moment)
_RUN_SLACK_S = 1.0


def _how_long(r: ReasonView, span_s: float | None) -> str:
    """One window for a reason: its unbroken run ("for 6 s"), or, where the counter saw
    it on and off before that run, its share of the counter's span ("40% of the last
    1 min"). Never both: two windows side by side read as two answers that disagree."""
    counted = r.share * span_s if r.share is not None and span_s else None
    run = r.active_s
    if counted is not None and span_s and (run is None or counted > run + _RUN_SLACK_S):
        return f" {r.share:.0%} of the last {fmt_elapsed(span_s)}"
    if run is None or (r.at_least and run < 1):
        return ""
    return f" for {'>=' if r.at_least else ''}{fmt_elapsed(run)}"


def _time(seconds: float | None) -> str:
    """ps's TIME as nvitop shows it: m:ss, h:mm:ss, or d-hh:mm:ss."""
    if seconds is None:
        return "N/A"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    mins, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{mins:02d}:{secs:02d}"
    return f"{hours}:{mins:02d}:{secs:02d}" if hours else f"{mins}:{secs:02d}"


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.1f}"


# (header, width, the narrowest terminal that shows it, the cell of a process)
_COLUMNS: tuple[tuple[str, int, int, Callable[[ProcView], str]], ...] = (
    ("PID", 7, 0, lambda p: str(p.pid)),
    ("T", 4, 0, lambda p: p.kind),
    ("USER", 11, 110, lambda p: p.user),
    ("GPU MEM", 9, 0, lambda p: _mib(p.used_memory_mib) if p.used_memory_mib is not None else "-"),
    ("SM", 5, 50, lambda p: f"{p.sm_pct}%" if p.sm_pct is not None else "-"),
    ("%CPU", 6, 72, lambda p: _pct(p.cpu_pct)),
    ("%MEM", 6, 72, lambda p: _pct(p.mem_pct)),
    ("TIME", 11, 100, lambda p: _time(p.time_s)),
)


def shown_sort_keys(width: int) -> list[str]:
    """The SORT_KEYS whose column a `width`-column process table shows, in their order: the
    ones `,` and `.` step through, so the sort's marker is never on a column not drawn."""
    shown = {h for h, _, min_w, _ in _COLUMNS if width >= min_w}
    return [k for k, (header, _) in SORT_KEYS.items() if header in shown]


def _filter_words(frame: Frame) -> str:
    """What the table leaves out, in words ("" when it shows every process)."""
    words = [KIND_NAMES[frame.kind]] if frame.kind != "all" else []
    if frame.users:
        words.append("user " + ",".join(frame.users))
    if frame.pids:
        words.append("pid " + ",".join(map(str, frame.pids)))
    return ", ".join(words)


def proc_lines(
    v: GpuView, width: int, g: Glyphs, max_rows: int | None, frame: Frame | None = None
) -> list[Line]:
    """The process table as nvitop's: PID, TYPE, USER, GPU MEM, SM, %CPU, %MEM, TIME and
    the COMMAND from its start, sorted and filtered as `frame` says (its sort column's
    header marked, the filter named after COMMAND). Narrow terminals drop USER, TIME,
    then %CPU/%MEM, then SM; sorted by a column they dropped, the header says so."""
    frame = frame or Frame()
    lead = "    procs   "
    if v.processes_error is not None:
        return [[(lead, "dim"), (f"unknown: {v.processes_error}", "warn")]]
    procs = arrange(v.processes, frame.sort, frame.reverse, frame.kind, frame.users, frame.pids)
    only = _filter_words(frame)
    if not procs:
        return [[(lead, "dim"), ("none" + (f" ({only})" if only else ""), "dim")]]
    cols = [c for c in _COLUMNS if width >= c[2]]
    marked = SORT_KEYS[frame.sort][0]
    arrow = ("v" if frame.reverse else "^") if g.more == "~" else ("▼" if frame.reverse else "▲")

    def cell(text: str, w: int, left: bool) -> str:  # w display columns (a wide name: 2 each)
        text = text if display_width(text) <= w - 1 else cut(text, w - 2) + g.more
        return pad(text, w) if left else pad(text, w - 1, right=True) + " "

    head = "".join(
        cell(h + (arrow if h == marked else ""), w, h in ("USER", "T")) for h, w, _, _ in cols
    )
    cmd_w = max(0, width - len(lead) - display_width(head) - 1)
    lines: list[Line] = [[(lead, "dim"), (head + " COMMAND", "dim")]]
    if all(h != marked for h, _, _, _ in cols):  # a resize hid it: the marker moves here
        lines[0].append((f"  sorted by {marked}{arrow}", "dim"))
    if only:  # named on the table it filters, from the first `f` press on
        lines[0].append((f"  {only}", "warn"))
    shown = list(procs) if max_rows is None else list(procs[: max(0, max_rows)])
    if max_rows is not None and len(shown) < len(procs) and shown:
        shown = shown[:-1]  # room for the "more" line
    for p in shown:
        text = "".join(cell(fn(p), w, h in ("USER", "T")) for h, w, _, fn in cols)
        cmd = shorten_command(p.command, cmd_w, g.more)
        lines.append([(" " * len(lead), ""), (text + " ", ""), (cmd, "bold")])
    if len(shown) < len(procs):
        more = f"{g.more} {len(procs) - len(shown)} more"
        lines.append([(" " * len(lead), ""), (more, "dim")])
    return lines


def title_line(v: GpuView, frame: Frame, *, selected: bool) -> Line:
    g = frame.glyphs
    title: Line = [(f"{g.sel} " if selected else "  ", "sel" if selected else "")]
    title.append((f"GPU {v.index}", "title"))
    if v.name:
        title.append((f"  {v.name}", "bold"))
    if frame.simulated:
        title.append(("  (simulated)", "warn"))
    if v.uuid:
        title.append((f"  {v.uuid}", "dim"))
    return title


def gpu_parts(v: GpuView, width: int, frame: Frame, *, graph_rows: int = 1) -> list[Part]:
    """The detail block of one GPU in display order, processes excepted (see proc_lines)."""
    if v.error is not None:
        return [Part(100, [[("    error: ", "bad"), (v.error, "bad")]])]
    rows = _Rows(width, frame.glyphs)
    return [
        *_clock_parts(v, rows, graph_rows),
        *_gauge_parts(v, rows),
        _board_part(v, rows),
        *_why_parts(v, rows),
    ]


def fit(parts: list[Part], budget: int) -> list[Part]:
    """The parts in order, leaving out the least kept ones until they fit in `budget` rows."""
    kept = list(parts)
    while kept and sum(len(p.lines) for p in kept) > budget:
        kept.remove(min(kept, key=lambda p: p.keep))
    return kept


def gpu_row(v: GpuView, frame: Frame, *, selected: bool) -> Line:
    """One compact line per GPU, for many GPUs or a small terminal."""
    g = frame.glyphs
    mark = (f"{g.sel} ", "sel") if selected else ("  ", "")
    if v.error is not None:
        return [mark, (f"GPU {v.index:<2} ", "title"), (v.error, "bad")]
    short = v.name.replace("NVIDIA ", "")[:16]
    segs: Line = [mark, (f"GPU {v.index:<2} ", "title"), (f"{short:<17}", "")]
    segs.append((f"{v.sm_mhz:>4}/{v.max_sm_mhz} MHz  ", _clock_style(v)))
    if v.mem_used_mib is not None and v.mem_total_mib:
        segs.append((f"{_mib(v.mem_used_mib)}/{_mib(v.mem_total_mib)}  ", ""))
    if v.power_w is not None:
        lim = f"/{v.power_limit_w:.0f}" if v.power_limit_w else ""
        segs.append((f"{v.power_w:>4.0f}{lim} W  ", ""))
    if v.temp_c is not None:
        segs.append((f"{v.temp_c:>3.0f} C  ", ""))
    if v.util_gpu is not None:
        segs.append((f"{v.util_gpu:>3}%  ", ""))
    if v.lock and v.lock.locked_sm:
        rng, held = _lock_range(v, g)
        segs.append((f"lock {rng}{held}  ", "bad" if v.lock.holds is False else "bold"))
    for r in v.active:
        segs.append((REASON_SHORT.get(r.bit, r.name) + " ", _reason_style(r.bit)))
    return segs


__all__ = [
    "Frame",
    "Part",
    "fit",
    "gpu_parts",
    "gpu_row",
    "proc_lines",
    "shown_sort_keys",
    "title_line",
]
