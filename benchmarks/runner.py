"""What every benchmark shares: one argument parser, the record of where and when it ran,
and its results written as JSON (`benchmarks/results/<name>.json`) that the benchmark pages
of the docs are generated from (`python -m benchmarks report`).

A benchmark module defines `add_arguments(parser)` (its own options) and `run(args)`, and
ends with `sys.exit(runner.main(NAME, __doc__, add_arguments, run, quick={...}))`. Every
benchmark then takes:

  --out PATH   where the results go (default benchmarks/results/<name>.json, or
               <name>-sim.json with --sim for a benchmark that also runs on a real GPU;
               `--out -` writes none)
  --quick      the smaller sizes of `quick` (a smoke run, or a machine shared with others)
  --sim        the simulated H100 (GPUENV_BACKEND=sim) where the benchmark can use a real GPU

What `run` prints stays its report: the runner keeps a copy, and the markdown tables in it
become the results' tables (columns and rows), the lines between them its text. A figure
that a later run must not regress on is recorded with `metric()`.

A results file with a "transcribed" key holds figures measured before this runner, kept
from the hand-typed page (its value says from where); "machine" then has only "text"
and "commit" is unknown. A run of the benchmark replaces it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SCHEMA = 1

_metrics: dict[str, dict[str, Any]] | None = None


def metric(
    name: str, value: float, unit: str = "", *, better: str = "lower", slack: float = 0.0
) -> None:
    """Record a figure the regression check compares (`python -m benchmarks check`).

    `better`: "lower" (a time, an overhead) or "higher" (a rate). `slack`: an absolute
    amount, in `unit`, a change must also exceed to count (for figures near zero, where
    10% of the value is below what the benchmark can resolve)."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better={better!r}: 'lower' or 'higher'")
    if _metrics is None or not math.isfinite(value):
        return  # run outside the runner (a test calling its functions), or nothing measured
    _metrics[name] = {"value": float(value), "unit": unit, "better": better, "slack": slack}


class _Tee(io.TextIOBase):
    """Writes go to the terminal and into a buffer the results are read from."""

    def __init__(self, out: Any):
        self.out, self.buf = out, io.StringIO()

    def write(self, s: str) -> int:
        self.out.write(s)
        return self.buf.write(s)

    def flush(self) -> None:
        self.out.flush()


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name(sim: bool) -> str:
    """The GPU the benchmark ran on, read through gpuenv (read-only), or why none."""
    from gpuenv.backend import open_backend
    from gpuenv.errors import GpuenvError

    try:
        backend = open_backend("sim" if sim else None, readonly=True)
    except GpuenvError as e:
        return f"none ({e})"
    try:
        names = sorted({backend.device_info(i).name for i in range(backend.device_count())})
        simulated = backend.capabilities.simulated
    except GpuenvError as e:
        return f"unknown ({e})"
    finally:
        backend.close()
    text = ", ".join(names) or "none"
    return f"simulated {text}" if simulated else text


def machine() -> dict[str, Any]:
    """Where this ran: the host, its CPU and the software."""
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        # a machine shared with others times slower and noisier: what else ran, at the end
        "load_1_5_15": [round(x, 2) for x in os.getloadavg()]
        if hasattr(os, "getloadavg")
        else None,
    }


GpuNames = bool | str | Callable[[argparse.Namespace], str | None]


def _gpu_used(gpu: GpuNames, args: argparse.Namespace, sim: bool) -> str:
    named = gpu(args) if callable(gpu) else gpu
    if isinstance(named, str):
        return named
    return gpu_name(sim) if gpu else "none used"


def commit() -> dict[str, Any]:
    """The checkout's commit, and whether its tracked files had changes."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"sha": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def parse_blocks(text: str) -> list[dict[str, Any]]:
    """A report's markdown tables ({"table": {"columns", "rows"}}) and the text between
    them ({"text": "..."}), in order."""
    blocks: list[dict[str, Any]] = []
    lines = text.splitlines()
    i, prose = 0, list[str]()
    while i < len(lines):
        if (
            lines[i].lstrip().startswith("|")
            and i + 1 < len(lines)
            and set(lines[i + 1].replace("|", "").strip()) <= set("-: ")
            and "-" in lines[i + 1]
        ):
            if "\n".join(prose).strip():
                blocks.append({"text": "\n".join(prose).strip("\n")})
            prose = []
            columns, align = _cells(lines[i]), [_align(c) for c in _cells(lines[i + 1])]
            i += 2
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            blocks.append({"table": {"columns": columns, "rows": rows, "align": align}})
            continue
        prose.append(lines[i])
        i += 1
    if "\n".join(prose).strip():
        blocks.append({"text": "\n".join(prose).strip("\n")})
    return blocks


def _align(separator: str) -> str:
    """A markdown separator cell's alignment: "right" (---:), "center" (:-:) or "left"."""
    if separator.endswith(":"):
        return "center" if separator.startswith(":") else "right"
    return "left"


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    cells, cell, escaped = [], "", False
    for ch in inner:
        if ch == "|" and not escaped:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
        escaped = ch == "\\" and not escaped
    cells.append(cell.strip())
    return cells


def title(doc: str | None, name: str) -> str:
    """A benchmark's title: its docstring's first paragraph, on one line."""
    return " ".join((doc or name).strip().split("\n\n")[0].split())


def _plain(value: object) -> object:
    """An argument as JSON holds it (paths and sets as text)."""
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def _parser(name: str, doc: str | None, add_arguments: Callable | None) -> argparse.ArgumentParser:
    title = (doc or name).strip().split("\n\n")[0]
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}",
        description=title,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = parser.add_argument_group("every benchmark")
    common.add_argument(
        "--out", help=f"results JSON (default benchmarks/results/{name}.json; '-' for none)"
    )
    common.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run")
    common.add_argument("--sim", action="store_true", help="the simulated H100")
    if add_arguments is not None:
        add_arguments(parser)
    return parser


def main(
    name: str,
    doc: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None,
    run: Callable[[argparse.Namespace], int | None],
    *,
    quick: Mapping[str, Any] | None = None,
    sim_only: bool = False,
    gpu: GpuNames = True,
    variant: Callable[[argparse.Namespace], str] | None = None,
    argv: list[str] | None = None,
) -> int:
    """Parse the arguments, run the benchmark, write its results; the exit status.

    `quick`: the defaults --quick gives (an option given on the command line still wins).
    `sim_only`: the benchmark runs on the simulated GPU whatever --sim says; `gpu=False`:
    it uses none (it reads the code, say); a string names the GPUs it used where that is not
    the default's (several simulated profiles); a function of `args` names them where it
    returns a string (a report of rows measured in earlier calls: their GPU, not this one's).
    `variant`: a part of the benchmark that `args` chose, whose results have a file of
    their own (<name>-<variant>.json)."""
    global _metrics
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(name, doc, add_arguments)
    if quick and "--quick" in argv:
        parser.set_defaults(**quick)
    args = parser.parse_args(argv)
    sim = bool(args.sim or sim_only)
    if args.sim:
        os.environ["GPUENV_BACKEND"] = "sim"
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    tee = _Tee(sys.stdout)
    _metrics = {}
    try:
        with contextlib.redirect_stdout(tee):
            rc = run(args) or 0
    finally:
        metrics, _metrics = _metrics, None
    if args.out == "-":
        return rc
    part = variant(args) if variant is not None else ""
    suffix = (f"-{part}" if part else "") + ("-sim" if args.sim and not sim_only else "")
    out = Path(args.out) if args.out else RESULTS / f"{name}{suffix}.json"
    record = {
        "schema": SCHEMA,
        "name": name,
        "key": f"{name}{suffix}",  # its kept file: benchmarks/results/<key>.json
        "title": title(doc, name),
        "command": " ".join(["python -m", f"benchmarks.{name}", *argv]).strip(),
        "date": started.isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": machine(),
        "commit": commit(),
        "gpu": _gpu_used(gpu, args, sim),
        "quick": bool(args.quick),
        "sim": sim,
        "exit_code": rc,
        "args": {k: _plain(v) for k, v in sorted(vars(args).items())},
        "metrics": metrics,
        "blocks": parse_blocks(tee.buf.getvalue()),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"results: {out}", file=sys.stderr)
    return rc
