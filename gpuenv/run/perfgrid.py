"""perf_report's own table, with a verdict in each cell.

A triton `perf_report` benchmark prints (print_data) and saves (save_path) a table:
a row per x value, a column per line. Under `gpuenv run` each do_bench call made at
one of its points is a measurement of its own (autoregions.py), whose facts name the
benchmark run, the point's x values and its line. At the end of the run the parent
lays those measurements out in the same grid, each cell saying the point's verdict
and its findings' kinds, on stderr after the summary and as a CSV beside the
user's: `<save_path>/<plot_name>.gpuenv.csv` (`.gpuenv.rankN.csv` under torchrun /
Slurm). The user's own output and files are never touched.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.results import Measurement

_ORDER = ("ok", "annotated", "rejected")


@dataclass
class Grid:
    """One run of a perf_report benchmark: its points' measurements by (x values, line)."""

    name: str
    x_names: list[str]
    line_names: list[str]
    save_path: str
    printed: bool
    rows: list[tuple[Any, ...]] = field(default_factory=list)  # x values, in order measured
    cells: dict[tuple[tuple[Any, ...], str], list[Measurement]] = field(default_factory=dict)

    def cell(self, x: tuple[Any, ...], line: str) -> str:
        """'ok', 'annotated: power_cap', 'rejected: thermal, power_cap'; '-' if not measured;
        the worst of several calls at one point, with their count."""
        ms = self.cells.get((x, line))
        if not ms:
            return "-"
        verdict = max((m.verdict for m in ms), key=lambda v: _ORDER.index(v) if v in _ORDER else 0)
        kinds = sorted({f.kind for m in ms for f in m.findings})
        text = verdict + (": " + ", ".join(kinds) if kinds else "")
        return f"{len(ms)} calls: {text}" if len(ms) > 1 else text

    def table(self) -> list[list[str]]:
        """The grid as rows of text, its header first (x names, then line names)."""
        out = [[*self.x_names, *self.line_names]]
        for x in self.rows:
            out.append(
                [
                    *("" if v is None else str(v) for v in x),
                    *(self.cell(x, line) for line in self.line_names),
                ]
            )
        return out

    def all_ok(self) -> bool:
        return all(m.verdict == "ok" for ms in self.cells.values() for m in ms)


def grids(measurements: Sequence[Measurement]) -> list[Grid]:
    """The perf_report runs among `measurements`, in the order they ran."""
    found: dict[tuple[Any, ...], Grid] = {}
    for m in measurements:
        plot = m.extra.get("plot")
        if not isinstance(plot, dict) or m.extra.get("autotune"):
            continue  # the autotuner's calls are not the point the table shows
        try:
            key = (tuple(m.extra.get("pids") or ()), plot["serial"])
            grid = found.get(key)
            if grid is None:
                grid = found[key] = Grid(
                    str(plot["name"]),
                    [str(n) for n in plot["x_names"]],
                    [str(n) for n in plot["line_names"]],
                    str(plot.get("save_path") or ""),
                    bool(plot.get("print")),
                )
            x, line = tuple(plot["x"]), str(plot["line"])
        except (KeyError, TypeError):
            continue  # facts from a child we do not understand: no grid, never an error
        if x not in grid.rows:
            grid.rows.append(x)
        if line not in grid.line_names:
            grid.line_names.append(line)
        grid.cells.setdefault((x, line), []).append(m)
    return list(found.values())


def grid_text(grid: Grid, *, verbose: bool = False) -> str:
    """The grid as the summary shows it: one line when every point is ok (unless verbose)."""
    n = sum(len(ms) for ms in grid.cells.values())
    head = f"gpuenv: {grid.name} (perf_report): "
    if grid.all_ok() and not verbose:
        return head + f"all {n} points ok"
    rows = grid.table()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head + "each point's verdict"]
    for k, r in enumerate(rows):
        index = "" if k == 0 else str(k - 1)
        cells = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
        lines.append(f"  {index:>4}  {cells}".rstrip())
    return "\n".join(lines)


def csv_path(grid: Grid, rank: int | None = None) -> Path | None:
    """Where a grid's CSV goes: beside the user's `<plot_name>.csv` (None: no save_path)."""
    if not grid.save_path:
        return None
    suffix = ".gpuenv.csv" if rank is None else f".gpuenv.rank{rank}.csv"
    return Path(grid.save_path) / f"{grid.name}{suffix}"


def write_grids(
    all_grids: Sequence[Grid], *, rank: int | None = None, verbose: bool = False
) -> list[str]:
    """Write each saved grid's CSV; returns what to print on stderr (the grids of the
    benchmarks that printed or saved their table, where each CSV went, what failed)."""
    theirs = {Path(g.save_path) / f"{g.name}.csv" for g in all_grids if g.save_path}
    lines = []
    for grid in all_grids:
        if grid.printed or grid.save_path:
            lines.append(grid_text(grid, verbose=verbose))
        path = csv_path(grid, rank)
        if path is None:
            continue
        if path in theirs:  # a plot named "<name>.gpuenv": never write over the user's file
            lines.append(f"gpuenv: not writing {path}: it is the CSV of another plot")
            continue
        try:
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows(grid.table())
        except OSError as err:
            lines.append(f"gpuenv: could not write {path}: {err.strerror or err}")
            continue
        shown = os.path.relpath(path)
        lines.append(f"gpuenv: each point's verdict: {path if shown.startswith('..') else shown}")
    return lines


__all__ = ["Grid", "csv_path", "grid_text", "grids", "write_grids"]
