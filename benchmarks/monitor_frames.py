#!/usr/bin/env python3
"""`gpuenv monitor`'s cost per frame, in process: backend and NVML calls and CPU per frame.

One frame is what the live view does each interval: `MonitorModel.update()` (the GPUs,
their processes, the host) and the view's lines built as text (`render` + `ansi`; the
curses calls themselves are left out). The model runs on a virtual clock that advances
`--interval` per frame, so its periods (the board every 10 s, process snapshots every
2 s, ...) play out as in a live view without waiting for them.

  - backend calls per frame: every `Backend` method the model calls, counted through
    a proxy (the simulated GPU implements the same protocol, so the counts are the real
    path's, nvitop's process API aside);
  - NVML calls per frame (a real GPU): gpuenv's, counted at its one chokepoint
    (`NvmlCore._q`), and nvitop's (its `libnvml.nvmlQuery`), for the process rows;
  - CPU per frame: process time over `--frames` frames after 10 warm-up frames.

    python -m benchmarks.monitor_frames --sim --gpus 8       # simulated H100s
    python -m benchmarks.monitor_frames --sim --baseline main
                                    # the same, and the code of git ref `main`, side by side
    GPUENV_READONLY=1 python -m benchmarks.monitor_frames    # the GPUs here

`benchmarks.monitor` prints the same table (this checkout) after its own.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks import runner
from benchmarks.checkout import ROOT

WARMUP = 10
COLS, ROWS = 160, 40


class Counting:
    """A backend whose public methods count their calls (by name) in `calls`; a read_slow
    that reads the energy counter (~3 ms on an H100) counts as "read_slow +energy"."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if attr.startswith("_") or not callable(value) or isinstance(value, type):
            return value
        calls = self.calls

        def counted(*args: Any, **kwargs: Any) -> Any:
            energy = attr == "read_slow" and kwargs.get("energy", True)
            calls[attr + (" +energy" if energy else "")] += 1  # the ~3 ms counter: its own
            return value(*args, **kwargs)

        return counted


def _count_into(
    obj: Any, name: str, calls: collections.Counter[str], key: Callable[..., str]
) -> None:
    """Replace `obj.name` (a function) with one that counts its calls in `calls`."""
    fn = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[key(*args)] += 1
        return fn(*args, **kwargs)

    setattr(obj, name, counted)


def measure(backend: Any, gpus: list[int], frames: int, interval_s: float = 1.0) -> dict[str, Any]:
    """Per-frame calls and CPU of the monitor on `backend` (see the module's doc)."""
    from gpuenv.monitor.blocks import Frame
    from gpuenv.monitor.draw import ansi
    from gpuenv.monitor.model import MonitorModel
    from gpuenv.monitor.view import render
    from gpuenv.timebase import VirtualClock

    counting = Counting(backend)
    nvml: collections.Counter[str] = collections.Counter()
    inner = getattr(backend, "inner", backend)
    if hasattr(inner, "_q"):  # NvmlBackend: its one chokepoint
        _count_into(inner, "_q", nvml, lambda fn_name, *a: fn_name)
    nvitop: collections.Counter[str] = collections.Counter()
    if not backend.capabilities.simulated:
        try:
            from nvitop.api import libnvml  # the process rows' reader on a real GPU
        except ImportError:  # the rows then say why; their calls go uncounted
            libnvml = None
        if libnvml is not None:
            _count_into(
                libnvml,
                "nvmlQuery",
                nvitop,
                lambda fn, *a: fn if isinstance(fn, str) else fn.__name__,
            )
    clock = backend.clock if isinstance(backend.clock, VirtualClock) else VirtualClock()
    model = MonitorModel(counting, gpus, clock=clock)
    frame = Frame(source="bench", simulated=backend.capabilities.simulated, interval_s=interval_s)
    cpu = 0.0
    for k in range(WARMUP + frames):
        if k == WARMUP:
            for c in (counting.calls, nvml, nvitop):
                c.clear()
        c0 = time.process_time()
        views = model.update()
        frame.host = model.host
        ansi(render(views, frame, COLS, ROWS))
        if k >= WARMUP:
            cpu += time.process_time() - c0
        clock.advance(interval_s)
    return {
        "gpus": len(gpus),
        "frames": frames,
        "cpu_ms_per_frame": cpu / frames * 1000,
        "backend_calls": dict(counting.calls),
        "nvml_calls": dict(nvml),
        "nvitop_nvml_calls": dict(nvitop),
    }


def measure_sim(n_gpus: int, frames: int) -> dict[str, Any]:
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    sim = SimBackend(n_gpus=n_gpus, clock=VirtualClock())
    try:
        sim.open_context(0)  # one process on GPU 0: its row is read as a user would see it
        return measure(sim, list(range(n_gpus)), frames)
    finally:
        sim.close()


def measure_ref(ref: str, n_gpus: int, frames: int) -> dict[str, Any]:
    """`measure_sim` with gpuenv as git ref `ref` has it (its gpuenv/ exported to a temp dir)."""
    with tempfile.TemporaryDirectory(prefix="gpuenv-ref-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "gpuenv"], capture_output=True, check=False
        )
        if archive.returncode != 0:
            raise SystemExit(f"git archive {ref}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(ROOT)])}
        code = (
            f"import json, gpuenv; assert gpuenv.__file__.startswith({tmp!r}); "
            "from benchmarks.monitor_frames import measure_sim; "
            f"print(json.dumps(measure_sim({n_gpus}, {frames})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"measuring {ref}: {out.stderr.strip()[-600:]}")
        return dict(json.loads(out.stdout.splitlines()[-1]))


def per_frame(counts: dict[str, int], frames: int) -> float:
    return sum(counts.values()) / frames


def table(rows: list[tuple[str, dict[str, Any]]]) -> None:
    """Print the per-frame table of `rows` ((label, measure's result)); the methods called
    more than once every 10 frames in any row are listed per frame."""
    methods = sorted(
        {m for _, r in rows for m, n in r["backend_calls"].items() if n / r["frames"] >= 0.1}
    )
    print(
        "| code | GPUs | CPU ms / frame | backend calls / frame | gpuenv NVML calls / frame "
        "| nvitop NVML calls / frame | " + " | ".join(methods) + " |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(methods))
    for label, r in rows:
        n = r["frames"]
        cells = [f"{r['backend_calls'].get(m, 0) / n:.2g}" for m in methods]
        nvml = f"{per_frame(r['nvml_calls'], n):.1f}" if r["nvml_calls"] else "-"
        nvitop = f"{per_frame(r['nvitop_nvml_calls'], n):.1f}" if r["nvitop_nvml_calls"] else "-"
        print(
            f"| {label} | {r['gpus']} | {r['cpu_ms_per_frame']:.3f} | "
            f"{per_frame(r['backend_calls'], n):.1f} | {nvml} | {nvitop} | "
            + " | ".join(cells)
            + " |"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=int, default=300, help="frames measured (after 10)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (with --sim)")
    parser.add_argument("--baseline", metavar="REF", help="also measure git ref REF's code (--sim)")


def run(args: argparse.Namespace) -> int:
    rows: list[tuple[str, dict[str, Any]]] = []
    if args.sim:
        for n in sorted({1, args.gpus}):
            if args.baseline:
                before = measure_ref(args.baseline, n, args.frames)
                rows.append((f"{args.baseline} (before)", before))
            rows.append(("this checkout", measure_sim(n, args.frames)))
        machine = "simulated H100s (one process on GPU 0)"
    else:
        rows.append(("this checkout", measure_real(args.frames)))
        machine = runner.gpu_name(False)
    print(
        f"Monitor per frame, in process: {machine}, {args.frames} frames of 1 s (virtual), "
        f"{time.strftime('%Y-%m-%d')}\n"
    )
    table(rows)
    for label, r in rows:
        if label == "this checkout":
            runner.metric(f"frame_cpu_ms_{r['gpus']}gpu", r["cpu_ms_per_frame"], "ms", slack=0.2)
    return 0


def measure_real(frames: int) -> dict[str, Any]:
    from gpuenv.backend import open_backend

    backend = open_backend(None, readonly=True)
    try:
        return measure(backend, list(range(backend.device_count())), frames)
    finally:
        backend.close()


if __name__ == "__main__":
    sys.exit(runner.main("monitor_frames", __doc__, add_arguments, run, quick={"frames": 60}))
