#!/usr/bin/env python3
"""`gpuenv monitor` against nvitop: start-up to the first frame, and CPU use while running.

Both run as a user runs them: in a terminal (a pseudo-terminal of 40 x 160,
TERM=xterm-256color), each at its default refresh (gpuenv 1 s; nvitop 2 s for
processes), and gpuenv also at nvitop's 2 s.

  - start-up: from spawning the process to the end of its first frame: the
    first burst of output that names the GPU (its model, e.g. "H100"),
    followed by 0.1 s of quiet. Fresh processes, alternating, the first pair
    discarded (file cache).
  - CPU use: both tools running side by side for --seconds (after 5 s of
    settling); CPU seconds (user + system, all threads) per wall second.

    GPUENV_READONLY=1 python -m benchmarks.monitor          # on a GPU machine
    python -m benchmarks.monitor --sim                      # gpuenv only, simulated GPU

Prints a markdown table. Needs nvitop (a gpuenv dependency) and psutil.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import platform
import re
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env

ROWS, COLS = 40, 160
HEADLINE = "monitor_over_nvitop_cpu"  # the headline page's figure (benchmarks/report.py)
QUIET_S = 0.1  # a frame is done when the output pauses this long
FIRST_FRAME_MAX_S = 30.0


class Pty:
    """A command in a pseudo-terminal; a thread drains its output (timestamps kept)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            close_fds=True,
        )
        os.close(slave)
        self.chunks: list[tuple[float, bytes]] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.5)
            except (OSError, ValueError):
                return
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.chunks.append((time.perf_counter(), data))

    def first_frame(self, marker: bytes) -> tuple[float, float] | None:
        """(seconds to the marker, seconds to the end of that burst) or None on timeout."""
        deadline = time.perf_counter() + FIRST_FRAME_MAX_S
        seen_at = None
        while time.perf_counter() < deadline:
            time.sleep(0.01)
            with self.lock:
                chunks = list(self.chunks)
            if seen_at is None:
                text = b""
                for t, data in chunks:
                    text += data
                    if marker in text:
                        seen_at = t
                        break
                if seen_at is None:
                    if self.proc.poll() is not None:
                        return None
                    continue
            last = max(t for t, _ in chunks)
            if time.perf_counter() - last >= QUIET_S:
                return seen_at - self.t0, last - self.t0
        return None

    def cpu_seconds(self) -> float:
        import psutil

        try:
            c = psutil.Process(self.proc.pid).cpu_times()
            return c.user + c.system
        except psutil.Error:
            return float("nan")

    def quit(self) -> None:
        try:
            os.write(self.master, b"q")
            self.proc.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired):
            with contextlib.suppress(Exception):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=3)
        with contextlib.suppress(Exception):
            os.close(self.master)

    def output(self) -> str:
        with self.lock:
            return b"".join(d for _, d in self.chunks).decode("utf-8", "replace")


def gpu_marker(sim: bool) -> bytes:
    """A token of GPU 0's model name that every monitor prints ("H100")."""
    from gpuenv.backend import open_backend

    backend = open_backend("sim" if sim else None, readonly=True)
    try:
        name = backend.device_info(0).name
    finally:
        backend.close()
    tokens = [t for t in re.split(r"\s+", name) if t.upper() != "NVIDIA"]
    with_digit = [t for t in tokens if any(c.isdigit() for c in t)]
    return (with_digit or tokens or [name])[0].encode()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--runs", type=int, default=5, help="start-up runs per tool")
    parser.add_argument("--seconds", type=float, default=30.0, help="CPU measurement length")


def run(args: argparse.Namespace) -> int:

    env = checkout_env(TERM="xterm-256color", LANG="C.UTF-8", LC_ALL="C.UTF-8")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    tmp = tempfile.mkdtemp(prefix="gpuenv-bench-monitor-")
    gpuenv = list(GPUENV)
    if args.sim:
        env["GPUENV_SIM_STATE"] = os.path.join(tmp, "sim.json")
        gpuenv.append("--sim")
    marker = gpu_marker(args.sim)
    tools: list[tuple[str, list[str]]] = [
        ("gpuenv monitor (1 s)", [*gpuenv, "monitor"]),
        ("gpuenv monitor -d 2", [*gpuenv, "monitor", "-d", "2"]),
    ]
    if not args.sim:
        tools.append(("nvitop (2 s)", [sys.executable, "-m", "nvitop"]))

    startup: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in tools}
    failures: dict[str, str] = {}
    for i in range(args.runs + 1):
        for name, argv in tools:
            term = Pty(argv, env)
            got = term.first_frame(marker)
            term.quit()
            if got is None:
                failures[name] = term.output()[-400:]
            elif i > 0:
                startup[name].append(got)

    running = [(name, Pty(argv, env)) for name, argv in tools]
    time.sleep(5.0)
    c0 = [t.cpu_seconds() for _, t in running]
    w0 = time.perf_counter()
    time.sleep(args.seconds)
    c1 = [t.cpu_seconds() for _, t in running]
    wall = time.perf_counter() - w0
    for _, t in running:
        t.quit()

    machine = "simulated H100" if args.sim else gpu_name_line()
    print(
        f"Monitors side by side: {platform.node()} ({os.cpu_count()} CPUs), {machine}, "
        f"{time.strftime('%Y-%m-%d')}; terminal {COLS}x{ROWS}; start-up over {args.runs} runs, "
        f"CPU over {args.seconds:.0f} s\n"
    )
    print("| monitor | first frame, median s | fastest s | CPU use (% of one core) |")
    print("| --- | ---: | ---: | ---: |")
    for k, (name, _) in enumerate(tools):
        runs = startup[name]
        if runs:
            med = statistics.median(r[1] for r in runs)
            fast = min(r[1] for r in runs)
            first = f"{med:.3f} | {fast:.3f}"
        else:
            first = "failed | -"
        cpu = (c1[k] - c0[k]) / wall * 100
        key = name.split(" (")[0].replace("gpuenv monitor", "monitor").replace(" ", "_")
        runner.metric(f"{key.replace('-', '')}_cpu_pct", cpu, "% of a core", slack=0.5)
        print(f"| {name} | {first} | {cpu:.2f} |")
    cpus = {name: (c1[k] - c0[k]) / wall * 100 for k, (name, _) in enumerate(tools)}
    if "nvitop (2 s)" in cpus and cpus["nvitop (2 s)"] > 0:
        ratio = cpus["gpuenv monitor (1 s)"] / cpus["nvitop (2 s)"]
        runner.metric("monitor_over_nvitop_cpu", ratio, "x", slack=0.2)
        print(
            f"\ngpuenv monitor at 1 s uses {ratio:.2f}x nvitop's CPU (goal: <= 0.5x); "
            f"CPU seconds tick at 10 ms: +-{1 / args.seconds:.2f}% of a core at --seconds "
            f"{args.seconds:g}"
        )
    for name, tail in failures.items():
        print(f"\n{name}: no first frame naming {marker.decode()!r}; its last output:\n{tail!r}")
    shutil.rmtree(tmp, ignore_errors=True)
    frames_table(args)
    return 0


def frames_table(args: argparse.Namespace) -> None:
    """What one frame of the live view reads and costs, in this process (monitor_frames)."""
    from benchmarks import monitor_frames

    frames = 60 if args.quick else 300
    if args.sim:
        rows = [("this checkout", monitor_frames.measure_sim(n, frames)) for n in (1, 8)]
    else:
        rows = [("this checkout", monitor_frames.measure_real(frames))]
    print(
        f"\nPer frame, in process ({frames} frames of 1 s on a virtual clock: "
        "benchmarks/monitor_frames.py):\n"
    )
    monitor_frames.table(rows)
    for _, r in rows:
        runner.metric(f"frame_cpu_ms_{r['gpus']}gpu", r["cpu_ms_per_frame"], "ms", slack=0.2)


def gpu_name_line() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "GPU"
    out = subprocess.run(
        [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return (out.stdout.strip().splitlines() or ["GPU"])[0] + " (driver)"


if __name__ == "__main__":
    sys.exit(
        runner.main("monitor", __doc__, add_arguments, run, quick={"runs": 2, "seconds": 10.0})
    )
