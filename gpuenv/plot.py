"""Plot a run or a session: SM clock, power and temperature over time, each measurement shaded.

    plot_run(load_run("run.jsonl"), "run.png")
    fig = run_figure(load_run("session.jsonl"))     # a matplotlib Figure, to inspect or save

Three panels share the time axis (seconds from the file's first telemetry): SM clock
(NVML's, and the effective clock probed before each rep where gpuenv.bench measured
it), power, temperature. The lines are the file's telemetry trace (gpuenv.telemetry.trace):
the "(run)" measurement's for `gpuenv run -o`, the pieces each measurement of a
`gpuenv.stable()` session carries, joined. Each measurement's region is shaded and
named above the panels, names that would overlap stacked in rows; rejected reps are
marked with a red x, reps touched by a warning with an orange dot. A measurement the
trace does not cover (a file written before gpuenv kept one) is drawn as each rep's
window, a flat step, and a note under the figure says so.

matplotlib is optional (the `plot` extra, or `pip install matplotlib`), imported only
here and only when plotting; the figure is drawn without pyplot, so nothing in
the caller's matplotlib state changes.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv._files import replaced
from gpuenv.errors import ConfigError
from gpuenv.run.report import RUN_NAME
from gpuenv.telemetry.trace import envelope  # gpuenv run's whole command: holds the trace

_SHADES = ("#4c72b0", "#55a868", "#8172b2", "#ccb974", "#64b5cd", "#c44e52")
OTHER_SHADE = "0.6"  # regions beyond the shades a big run names
LABEL_PT = 8  # region names' font size, points
MIN_BAND = 0.004  # a region's shading is at least this share of the time axis wide (visible)
DRAWN_POINTS = 2000  # a longer trace is drawn as min/max per slice (the figure is ~1200 px)
PART_TRACE_NOTE = "where the trace has a gap, each rep's window is drawn as a flat step"
MANY_REGIONS = 40  # more regions than this: shaded by name, named in the legend, not one by one
NO_TRACE_NOTE = (
    "no telemetry trace in this file (written before gpuenv kept one): "
    "each rep's window is drawn as a flat step"
)


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ConfigError("plotting needs matplotlib", hint="pip install matplotlib") from err
    return Figure, FigureCanvasAgg


def plot_run(
    run: Any, path: str | os.PathLike[str], *, title: str | None = None, gpu: int | None = None
) -> str:
    """Draw `run` (a results.Run) to `path` (.png, .svg, .pdf: by extension); returns the path.

    `gpu`: which GPU's telemetry to draw (default: the run's first).
    """
    _check_output(path, _matplotlib()[1])
    return _save(run_figure(run, title=title, gpu=gpu), os.fspath(path))


def run_figure(run: Any, *, title: str | None = None, gpu: int | None = None) -> Any:
    """The figure `plot_run` saves (a matplotlib Figure with an Agg canvas)."""
    measurements = list(run.measurements)
    _check_gpu(measurements, gpu)
    g = gpu if gpu is not None else _first_gpu(run, measurements)
    line = _Line.of(measurements, g)
    t00 = _origin(measurements, line)
    if t00 is None:
        raise ConfigError(
            "this run has no telemetry to plot",
            hint="measure with gpuenv.stable() / gpuenv.bench() so each rep carries its window",
        )
    Figure, Canvas = _matplotlib()
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    Canvas(fig)
    regions = [m for m in measurements if not _is_container(m, measurements)]
    ends = [b for m in regions if (sp := _span(m, m.windows)) is not None for b in sp]
    width = max([*ends, *(b for _, b in line.spans)], default=t00) - t00
    panels = _Panels(*fig.subplots(3, 1, sharex=True), min_band_s=MIN_BAND * width)
    notes = [panels.trace(line, t00)]
    colours = _colours(regions)
    uncovered = []
    for m in regions:
        windows = [w for w in m.windows if g is None or w.gpu == g]
        if not line.covers(_span(m, windows)):
            uncovered.append(windows)
        panels.region(m, windows, colours[id(m)], t00)
    if len(regions) > MANY_REGIONS:
        notes.append(f"{len(regions):,} regions: shaded by name (legend), not named one by one")
    panels.draw(many=len(regions) > MANY_REGIONS)
    if panels.steps(uncovered, t00):
        notes.append(NO_TRACE_NOTE if not line.t else PART_TRACE_NOTE)
    if panels.labelled:  # "best" weighs every drawn point: an upper corner for a big run
        panels.clk.legend(
            loc="best" if len(regions) <= MANY_REGIONS else "upper right",
            fontsize=8,
            framealpha=0.8,
        )
    fig.suptitle(title or _title(run, g, len(regions)), fontsize=10)
    if any(notes):
        fig.supxlabel("\n".join(n for n in notes if n), fontsize=8, color="0.35")
    if len(regions) <= MANY_REGIONS:
        panels.place_names(fig)
    return fig


def _colours(regions: Sequence[Any]) -> dict[int, str]:
    """Each region's shade: in turn for a few; by name for many (the most frequent names
    their own shades, the rest grey), so a thousand repeats of one step read as one."""
    if len(regions) <= MANY_REGIONS:
        return {id(m): _SHADES[k % len(_SHADES)] for k, m in enumerate(regions)}
    counts: dict[str, int] = {}
    for m in regions:
        counts[m.name] = counts.get(m.name, 0) + 1
    top = sorted(counts, key=lambda n: -counts[n])[: len(_SHADES)]
    shade = {name: _SHADES[k] for k, name in enumerate(top)}
    return {id(m): shade.get(m.name, OTHER_SHADE) for m in regions}


@dataclass
class _Line:
    """The file's telemetry trace of one GPU, joined: absolute host times; NaN breaks it."""

    t: list[float]
    sm_mhz: list[float]
    power_w: list[float]
    temp_c: list[float]
    spans: list[tuple[float, float]]  # the stretches the trace covers without a break

    @classmethod
    def of(cls, measurements: Sequence[Any], gpu: int | None) -> _Line:
        pieces = [p for m in measurements if (p := _piece(m, gpu)) is not None]
        pieces.sort(key=lambda p: float(p["t0"]) + float(p["t_s"][0]))
        line = cls([], [], [], [], [])
        for p in pieces:
            line._join(p)
        return line

    def _join(self, piece: dict[str, Any]) -> None:
        t0 = float(piece["t0"])
        rows = [
            (t0 + float(t), c, w, tc)
            for t, c, w, tc in zip(
                piece["t_s"], piece["sm_mhz"], piece["power_w"], piece["temp_c"], strict=False
            )
        ]
        last = self.spans[-1][1] if self.spans else -math.inf
        rows = [r for r in rows if r[0] > last]  # a piece the line already covers adds nothing
        if not rows:
            return
        step = (rows[-1][0] - rows[0][0]) / max(1, len(rows) - 1)
        if self.spans and rows[0][0] - last <= max(1.0, 4 * step):
            self.spans[-1] = (self.spans[-1][0], rows[-1][0])  # the next piece: no break
        else:
            if self.spans:
                for series in (self.t, self.sm_mhz, self.power_w, self.temp_c):
                    series.append(math.nan)
            self.spans.append((rows[0][0], rows[-1][0]))
        for t, c, w, tc in rows:
            self.t.append(t)
            self.sm_mhz.append(math.nan if c is None else c)
            self.power_w.append(math.nan if w is None else w)
            self.temp_c.append(math.nan if tc is None else tc)

    def covers(self, span: tuple[float, float] | None) -> bool:
        if span is None:
            return True
        return any(a <= span[1] and span[0] <= b for a, b in self.spans)


def _piece(m: Any, gpu: int | None) -> dict[str, Any] | None:
    """The trace record `m` carries for `gpu` (every GPU's under "traces"; the first's under
    "trace"), or None."""
    extra = m.extra if isinstance(m.extra, dict) else {}
    traces = extra.get("traces")
    if gpu is not None and isinstance(traces, dict) and str(gpu) in traces:
        trace = traces[str(gpu)]
    elif gpu is None or not m.gpus or m.gpus[0] == gpu:
        trace = extra.get("trace")
    else:
        trace = None
    return trace if isinstance(trace, dict) and trace.get("t_s") else None


def _is_container(m: Any, measurements: Sequence[Any]) -> bool:
    """gpuenv run's "(run)" beside the regions it holds: its trace is drawn, it is not shaded."""
    return m.name == RUN_NAME and "command" in m.extra and len(measurements) > 1


def _span(m: Any, windows: Sequence[Any]) -> tuple[float, float] | None:
    spans = [(w.t0, w.t1) for w in windows] or [(w.t0, w.t1) for w in m.summary_windows]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None


def _bands(windows: Sequence[Any], join_s: float) -> list[tuple[float, float]]:
    """The windows' spans, those less than `join_s` apart joined."""
    bands: list[tuple[float, float]] = []
    for w in sorted(windows, key=lambda w: w.t0):
        if bands and w.t0 - bands[-1][1] <= join_s:
            bands[-1] = (bands[-1][0], max(bands[-1][1], w.t1))
        else:
            bands.append((w.t0, w.t1))
    return bands


def _origin(measurements: Sequence[Any], line: _Line) -> float | None:
    starts = [line.spans[0][0]] if line.spans else []
    for m in measurements:
        trace = _piece(m, None)
        if trace is not None:
            starts.append(float(trace["t0"]))
        starts += [w.t0 for w in m.windows]
        starts += [w.t0 for w in m.summary_windows]
    return min(starts) if starts else None


def _first_gpu(run: Any, measurements: Sequence[Any]) -> int | None:
    for entry in (getattr(run, "metadata", None) or {}).get("gpus") or []:
        if isinstance(entry, dict) and isinstance(entry.get("index"), int):
            return int(entry["index"])
    for m in measurements:
        if m.gpus:
            return int(m.gpus[0])
    return None


def _title(run: Any, gpu: int | None, count: int) -> str:
    """ "gpuenv session · NVIDIA H100 80GB HBM3 · GPU 0 · 2026-11-22 20:37 UTC · 4 measurements"."""
    meta = getattr(run, "metadata", None) or {}
    if meta.get("tool") == "gpuenv run":
        command = meta.get("command")
        what = "gpuenv run"
        if isinstance(command, list) and command:
            text = shlex.join(str(c) for c in command)
            what += f" · {text if len(text) <= 40 else text[:39] + '…'}"
    else:
        what = "gpuenv session" if "session" in meta else "gpuenv results"
    gpus = [e for e in meta.get("gpus") or [] if isinstance(e, dict)]
    entry = next((e for e in gpus if e.get("index") == gpu), gpus[0] if gpus else {})
    parts = [
        what,
        entry.get("name"),
        None if gpu is None else f"GPU {gpu}",
        _when(meta),
        f"{count} measurement{'' if count == 1 else 's'}",
    ]
    return " · ".join(str(p) for p in parts if p)


def _when(meta: dict[str, Any]) -> str | None:
    """The run's start in UTC to the minute."""
    utc = datetime.timezone.utc
    when = None
    with contextlib.suppress(TypeError, ValueError, OverflowError, OSError):
        if isinstance(meta.get("time_unix"), (int, float)):
            when = datetime.datetime.fromtimestamp(meta["time_unix"], utc)
        elif isinstance(meta.get("time_utc"), str):
            when = datetime.datetime.fromisoformat(meta["time_utc"]).astimezone(utc)
    return None if when is None else when.strftime("%Y-%m-%d %H:%M UTC")


class _Panels:
    """The three axes sharing time, the legend's labels (each given once), the region names."""

    def __init__(self, clk: Any, pow_: Any, tmp: Any, *, min_band_s: float) -> None:
        self.clk, self.pow, self.tmp = clk, pow_, tmp
        self.min_band_s = min_band_s
        clk.set_ylabel("SM clock (MHz)")
        pow_.set_ylabel("power (W)")
        tmp.set_ylabel("temperature (C)")
        tmp.set_xlabel("time (s)")
        for ax in (clk, pow_, tmp):  # whole units: no "+1.98e3" offset above a flat clock
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        self.labelled: set[str] = set()
        self.names: list[tuple[float, float, str, str]] = []  # region lo, hi, name, colour
        self.shaded: list[tuple[str, str, list[tuple[float, float]]]] = []  # name, colour, bands
        # (marker, colour, label): the points drawn as one line each
        self.points: dict[tuple[str, str, str], list[tuple[float, float]]] = {}

    def label(self, text: str) -> str | None:
        if text in self.labelled:
            return None
        self.labelled.add(text)
        return text

    def trace(self, line: _Line, t00: float) -> str:
        """The trace; a long one as each slice's min and max (what a pixel column can
        show: a spike is kept), said in the returned note."""
        if not line.t:
            return ""
        ts = [t - t00 for t in line.t]
        for ax, ys, label in (
            (self.clk, line.sm_mhz, self.label("NVML SM clock")),
            (self.pow, line.power_w, None),
            (self.tmp, line.temp_c, None),
        ):
            xs, drawn = envelope(ts, ys, DRAWN_POINTS // 2)
            ax.plot(xs, drawn, color="0.25", lw=0.9, label=label, gid="trace")
        if len(ts) <= DRAWN_POINTS:
            return ""
        return (
            f"{len(ts):,} samples drawn as the lowest and highest of each of "
            f"{DRAWN_POINTS // 2:,} slices"
        )

    def steps(self, regions: Sequence[Sequence[Any]], t00: float) -> bool:
        """Each rep's window as a flat step (no trace covers it), one line with a break
        between regions; True when drawn."""
        xs: list[float] = []
        clk: list[float | None] = []
        pw: list[float | None] = []
        tp: list[float | None] = []
        for windows in regions:
            if xs and windows:
                for series in (xs, clk, pw, tp):
                    series.append(math.nan)
            for w in windows:
                xs += [w.t0 - t00, w.t1 - t00]
                clk += [w.sm_mhz_mean, w.sm_mhz_mean]
                pw += [w.power_w_mean, w.power_w_mean]
                tp += [w.temp_c_start, w.temp_c_end]
        if not xs:
            return False
        self.clk.plot(
            xs, clk, color="0.25", lw=0.9, label=self.label("NVML SM clock (per rep)"), gid="steps"
        )
        self.pow.plot(xs, pw, color="0.25", lw=0.9, gid="steps")
        self.tmp.plot(xs, tp, color="0.25", lw=0.9, gid="steps")
        return True

    def region(self, m: Any, windows: list[Any], color: str, t00: float) -> None:
        """The measured region's shading kept for `draw` (its name placed then), its reps'
        marks kept: reps closer together than a narrow band share one band."""
        span = _span(m, windows)
        if span is not None:
            bands = [
                (a - t00, b - t00) for a, b in _bands(windows or m.summary_windows, self.min_band_s)
            ]
            verdict = "" if m.verdict == "ok" else f" [{m.verdict}]"
            self.shaded.append((m.name, color, bands))
            self.names.append((span[0] - t00, span[1] - t00, f"{m.name}{verdict}", color))
        self._probed_clock(m, windows, color, t00)
        self._marked_reps(m, windows, t00)

    def draw(self, *, many: bool) -> None:
        """The regions' shading and the reps' marks, each kind in one artist
        where it can be: 12,000 regions drawn one by one took minutes."""
        if many:
            self._shade_by_colour()
        else:
            for name, color, bands in self.shaded:
                for a, b in bands:
                    mid, half = (a + b) / 2, max(b - a, self.min_band_s) / 2
                    for ax in (self.clk, self.pow, self.tmp):
                        ax.axvspan(
                            mid - half,
                            mid + half,
                            color=color,
                            alpha=0.15,
                            lw=0,
                            gid=f"region:{name}",
                        )
        for (marker, color, text), pts in self.points.items():
            style = (
                {"ms": 2.5}
                if marker == "."
                else {"ms": 6, "mfc": "none" if marker == "o" else color}
            )
            self.clk.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker,
                color=color,
                label=self.label(text),
                **style,
            )

    def _shade_by_colour(self) -> None:
        """One band collection per shade, bands nearer than a narrow band joined; the
        legend names each shade's regions and how many there are."""
        by_colour: dict[str, list[tuple[float, float]]] = {}
        names: dict[str, dict[str, int]] = {}
        for name, color, bands in self.shaded:
            by_colour.setdefault(color, []).extend(bands)
            names.setdefault(color, {})[name] = names.get(color, {}).get(name, 0) + 1
        for color, bands in by_colour.items():
            joined: list[list[float]] = []
            for a, b in sorted(bands):
                if joined and a - joined[-1][1] <= self.min_band_s:
                    joined[-1][1] = max(joined[-1][1], b)
                else:
                    joined.append([a, b])
            spans = [
                ((a + b) / 2 - max(b - a, self.min_band_s) / 2, max(b - a, self.min_band_s))
                for a, b in joined
            ]
            counts = names[color]
            top = sorted(counts, key=lambda n: -counts[n])
            label = (
                f"{top[0]} (x{counts[top[0]]:,})"
                if len(top) == 1
                else f"{len(top)} other names (x{sum(counts.values()):,})"
            )
            for ax in (self.clk, self.pow, self.tmp):
                ax.broken_barh(
                    spans,
                    (0, 1),
                    transform=ax.get_xaxis_transform(),
                    color=color,
                    alpha=0.15,
                    lw=0,
                    gid="regions",
                    label=label if ax is self.clk else None,
                )
            self.labelled.add(label)

    def place_names(self, fig: Any) -> None:
        """Each region's name above the panels, over its middle; a name that would overlap
        one already placed goes a row higher."""
        if not self.names:
            return
        fig.draw_without_rendering()  # lay out the axes: names are placed in pixels
        renderer = fig.canvas.get_renderer()
        box = self.clk.get_window_extent(renderer)
        to_px = self.clk.transData.transform
        rows: list[list[tuple[float, float]]] = []
        for lo, hi, text, color in sorted(self.names):
            width = _text_width(fig, text, renderer)
            mid = to_px(((lo + hi) / 2, 0))[0]
            left = min(max(mid - width / 2, box.x0), box.x1 - width)
            extent = (left - 3, left + width + 3)  # 3 px apart at least
            row = next(
                (
                    k
                    for k, placed in enumerate(rows)
                    if all(extent[1] <= a or b <= extent[0] for a, b in placed)
                ),
                len(rows),
            )
            if row == len(rows):
                rows.append([])
            rows[row].append(extent)
            x = self.clk.transData.inverted().transform((left, 0))[0]
            self.clk.annotate(
                text,
                xy=(x, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 2 + row * (LABEL_PT + 3)),
                textcoords="offset points",
                ha="left",
                va="bottom",
                fontsize=LABEL_PT,
                color=color,
                annotation_clip=False,
                gid=f"name:{text}",
            )

    def _probed_clock(self, m: Any, windows: list[Any], color: str, t00: float) -> None:
        """The effective clock probed before each rep (gpuenv.bench)."""
        eff = m.extra.get("rep_clock_mhz") if isinstance(m.extra, dict) else None
        if eff and len(eff) == len(windows):
            pts = [((w.t0 + w.t1) / 2 - t00, c) for w, c in zip(windows, eff, strict=True) if c]
            if pts:
                self.points.setdefault((".", color, "effective clock (probe)"), []).extend(pts)

    def _marked_reps(self, m: Any, windows: list[Any], t00: float) -> None:
        """Rejected reps and reps touched by a warning."""
        per_rep = len(windows)
        if not per_rep:
            return
        warned = {
            r
            for f in m.findings
            if f.severity != "info"
            for r in f.reps
            if r < per_rep and r not in m.rejected_reps
        }
        for reps, marker, colour, text in (
            (sorted(warned), "o", "#dd8452", "rep with a warning"),
            (sorted(r for r in m.rejected_reps if r < per_rep), "x", "#c44e52", "rejected rep"),
        ):
            pts = [
                ((windows[r].t0 + windows[r].t1) / 2 - t00, windows[r].sm_mhz_mean)
                for r in reps
                if windows[r].sm_mhz_mean is not None
            ]
            if pts:
                self.points.setdefault((marker, colour, text), []).extend(pts)


def _text_width(fig: Any, text: str, renderer: Any) -> float:
    """How wide `text` is drawn at LABEL_PT, in pixels."""
    probe = fig.text(0, 0, text, fontsize=LABEL_PT)
    try:
        return float(probe.get_window_extent(renderer).width)
    finally:
        probe.remove()


def _check_output(path: str | os.PathLike[str], canvas: Any) -> None:
    """A format matplotlib writes, in a directory that exists: said before drawing."""
    from pathlib import Path

    out = Path(path)
    kinds = sorted(canvas(None).get_supported_filetypes())
    ext = out.suffix.lower().lstrip(".")
    if ext not in kinds:
        raise ConfigError(
            f"cannot write a {ext or 'nameless'} image ({out})",
            hint=f"end the name with one of .{', .'.join(kinds)}",
        )
    if not out.parent.is_dir():
        raise ConfigError(
            f"the directory {out.parent} does not exist",
            hint=f"create it (mkdir -p {out.parent}) or write the image elsewhere",
        )


def _check_gpu(measurements: Sequence[Any], gpu: int | None) -> None:
    if gpu is None:
        return
    seen = sorted(
        {w.gpu for m in measurements for w in m.windows}
        | {g for m in measurements for g in (m.gpus or ())}
    )
    if gpu not in seen:
        raise ConfigError(
            f"this run has no telemetry of GPU {gpu}",
            hint=f"it has GPU {', '.join(map(str, seen))}" if seen else "it names no GPU",
        )


def recorded_gpu(run: Any, selector: str) -> int:
    """The one GPU `-i` names among those the run recorded (a plot draws one)."""
    from gpuenv.devices import select_recorded

    recorded = list(run.metadata.get("gpus") or [])
    seen = {int(g["index"]) for g in recorded if isinstance(g, dict) and "index" in g}
    windows = {w.gpu for m in run.measurements for w in m.windows if w.gpu not in seen}
    recorded += [{"index": i} for i in sorted(windows)]  # telemetry of a GPU the meta lacks
    chosen = select_recorded(recorded, selector)
    if len(chosen) != 1:
        raise ConfigError(
            f"-i {selector} names {len(chosen)} GPUs and a plot draws one",
            hint="name one: -i " + (str(chosen[0]) if chosen else "0"),
        )
    return chosen[0]


def _save(fig: Any, out: str) -> str:
    """Write through a temporary file beside `out`: a full disk leaves no half image."""
    with replaced(out, binary=True, umask_mode=True) as fh:
        fig.savefig(fh, dpi=110, format=os.path.splitext(out)[1][1:].lower())
    return out


__all__ = ["plot_run", "recorded_gpu", "run_figure"]
