"""Plot a run: SM clock, power and temperature over time, each measurement shaded.

    plot_run(load_run("run.jsonl"), "run.png")

Three panels share the time axis (seconds from the run's first telemetry):
SM clock (NVML's, and the effective clock probed before each rep where
gpuenv.bench measured it), power, temperature. Where a measurement kept its
telemetry trace (gpuenv.bench does, warmup and conditioning included) it is
drawn as a line; otherwise each rep's window is drawn as a step. Each
measurement's region is shaded and named; rejected reps are marked with a red
x, reps touched by a warning with an orange dot.

matplotlib is an optional extra (`pip install 'gpuenv[plot]'`), imported only
here and only when plotting; the figure is drawn without pyplot, so nothing in
the caller's matplotlib state changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from gpuenv.errors import ConfigError

_SHADES = ("#4c72b0", "#55a868", "#8172b2", "#ccb974", "#64b5cd", "#c44e52")


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ConfigError(
            "plotting needs matplotlib", hint="pip install 'gpuenv[plot]'"
        ) from err
    return Figure, FigureCanvasAgg


def _origin(measurements: Sequence[Any]) -> float | None:
    starts = []
    for m in measurements:
        trace = m.extra.get("trace") if isinstance(m.extra, dict) else None
        if trace and trace.get("t_s"):
            starts.append(float(trace["t0"]))
        starts += [w.t0 for w in m.windows]
        starts += [w.t0 for w in m.summary_windows]
    return min(starts) if starts else None


def plot_run(run: Any, path: str | os.PathLike[str], *, title: str | None = None,
             gpu: int | None = None) -> str:
    """Draw `run` (a results.Run) to `path` (.png, .svg, .pdf: by extension); returns the path.

    `gpu`: which GPU's telemetry to draw (default: each measurement's first).
    """
    measurements = list(run.measurements)
    t00 = _origin(measurements)
    if t00 is None:
        raise ConfigError(
            "this run has no telemetry to plot",
            hint="measure with gpuenv.stable() / gpuenv.bench() so each rep carries its window",
        )
    Figure, Canvas = _matplotlib()
    _check_output(path, Canvas)
    _check_gpu(measurements, gpu)
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    Canvas(fig)
    panels = _Panels(*fig.subplots(3, 1, sharex=True))
    for k, m in enumerate(measurements):
        panels.draw(m, _SHADES[k % len(_SHADES)], gpu, t00)
    if panels.labelled:
        panels.clk.legend(loc="lower left", fontsize=8, framealpha=0.8)
    meta = getattr(run, "metadata", {}) or {}
    gpus = meta.get("gpus") or []
    name = gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None
    fig.suptitle(title or " - ".join(x for x in (name, meta.get("time_utc")) if x) or "gpuenv run",
                 fontsize=10)
    return _save(fig, os.fspath(path))


class _Panels:
    """The three axes sharing time, and the legend's labels, each given once."""

    def __init__(self, clk: Any, pow_: Any, tmp: Any) -> None:
        self.clk, self.pow, self.tmp = clk, pow_, tmp
        clk.set_ylabel("SM clock (MHz)")
        pow_.set_ylabel("power (W)")
        tmp.set_ylabel("temperature (C)")
        tmp.set_xlabel("time (s)")
        self.labelled: set[str] = set()

    def label(self, text: str) -> str | None:
        if text in self.labelled:
            return None
        self.labelled.add(text)
        return text

    def draw(self, m: Any, color: str, gpu: int | None, t00: float) -> None:
        g = gpu if gpu is not None else (m.gpus[0] if m.gpus else None)
        windows = [w for w in m.windows if g is None or w.gpu == g]
        self._telemetry(m, windows, t00)
        self._region(m, windows, color, t00)
        self._probed_clock(m, windows, color, t00)
        self._marked_reps(m, windows, t00)

    def _telemetry(self, m: Any, windows: list[Any], t00: float) -> None:
        """The measurement's trace as a line, else each rep's window as a step."""
        trace = m.extra.get("trace") if isinstance(m.extra, dict) else None
        if trace and trace.get("t_s"):
            ts = [float(trace["t0"]) - t00 + t for t in trace["t_s"]]
            self.clk.plot(ts, trace["sm_mhz"], color="0.25", lw=0.9,
                          label=self.label("NVML SM clock"))
            self.pow.plot(ts, trace["power_w"], color="0.25", lw=0.9)
            self.tmp.plot(ts, trace["temp_c"], color="0.25", lw=0.9)
        elif windows:
            xs, clk, pw, tp = [], [], [], []
            for w in windows:
                xs += [w.t0 - t00, w.t1 - t00]
                clk += [w.sm_mhz_mean, w.sm_mhz_mean]
                pw += [w.power_w_mean, w.power_w_mean]
                tp += [w.temp_c_start, w.temp_c_end]
            self.clk.plot(xs, clk, color="0.25", lw=0.9,
                          label=self.label("NVML SM clock (per rep)"))
            self.pow.plot(xs, pw, color="0.25", lw=0.9)
            self.tmp.plot(xs, tp, color="0.25", lw=0.9)

    def _region(self, m: Any, windows: list[Any], color: str, t00: float) -> None:
        """The measured region, shaded and named."""
        spans = [(w.t0, w.t1) for w in windows] or [(w.t0, w.t1) for w in m.summary_windows]
        if spans:
            lo, hi = min(a for a, _ in spans) - t00, max(b for _, b in spans) - t00
            for ax in (self.clk, self.pow, self.tmp):
                ax.axvspan(lo, hi, color=color, alpha=0.15, lw=0)
            verdict = "" if m.verdict == "ok" else f" [{m.verdict}]"
            self.clk.annotate(f"{m.name}{verdict}", xy=((lo + hi) / 2, 1.0),
                              xycoords=("data", "axes fraction"), ha="center", va="bottom",
                              fontsize=8, color=color, annotation_clip=False)

    def _probed_clock(self, m: Any, windows: list[Any], color: str, t00: float) -> None:
        """The effective clock probed before each rep (gpuenv.bench)."""
        eff = m.extra.get("rep_clock_mhz") if isinstance(m.extra, dict) else None
        if eff and len(eff) == len(windows):
            pts = [((w.t0 + w.t1) / 2 - t00, c) for w, c in zip(windows, eff, strict=True) if c]
            if pts:
                self.clk.plot([p[0] for p in pts], [p[1] for p in pts], ".", ms=2.5,
                              color=color, label=self.label("effective clock (probe)"))

    def _marked_reps(self, m: Any, windows: list[Any], t00: float) -> None:
        """Rejected reps and reps touched by a warning."""
        per_rep = len(windows)
        if not per_rep:
            return
        warned = {r for f in m.findings if f.severity != "info" for r in f.reps
                  if r < per_rep and r not in m.rejected_reps}
        for reps, marker, colour, text in (
            (sorted(warned), "o", "#dd8452", "rep with a warning"),
            (sorted(r for r in m.rejected_reps if r < per_rep), "x", "#c44e52",
             "rejected rep"),
        ):
            pts = [((windows[r].t0 + windows[r].t1) / 2 - t00, windows[r].sm_mhz_mean)
                   for r in reps if windows[r].sm_mhz_mean is not None]
            if pts:
                self.clk.plot([p[0] for p in pts], [p[1] for p in pts], marker, ms=6,
                              color=colour, mfc="none" if marker == "o" else colour,
                              label=self.label(text))


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
    seen = sorted({w.gpu for m in measurements for w in m.windows} | {
        g for m in measurements for g in (m.gpus or ())})
    if gpu not in seen:
        raise ConfigError(
            f"this run has no telemetry of GPU {gpu}",
            hint=f"it has GPU {', '.join(map(str, seen))}" if seen else "it names no GPU",
        )


def _save(fig: Any, out: str) -> str:
    """Write through a temporary file beside `out`: a full disk leaves no half image."""
    import tempfile

    folder, name = os.path.split(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, dpi=110, format=os.path.splitext(out)[1][1:].lower())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out


__all__ = ["plot_run"]
