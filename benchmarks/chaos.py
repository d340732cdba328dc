#!/usr/bin/env python3
"""Chaos benchmark: SIGKILL a process that holds a clock lock; are the GPUs put back?

Each trial: a fresh simulated 2-GPU machine (state file shared between
processes) gets a non-default prior state (application clocks on GPU 0, a
650 W power limit on GPU 1). A child process locks both GPUs (SM 1350 MHz,
power limit 500 W) and is SIGKILLed either at an exact point (the child's simulated
GPUs, `PausingSim`, stop it at a write: its first, after the journal write and
before any setting changes; halfway through the multi-GPU apply; fully locked;
halfway through its own release) or after a random delay (anywhere from
interpreter start-up to holding the lock). The parent then polls the simulated
GPUs until they equal the prior state and the journal is empty: the watchdog's
work. What the watchdog left undone, 'gpuenv restore' is asked to finish, and
anything still different after that is counted as left changed.

Also measured: lock + release latency on the simulator, with and without the
watchdog. Prints markdown tables.

    python -m benchmarks.chaos --trials 1000
    python benchmarks/chaos.py --child ...   (internal: the process that gets killed)
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import runner  # noqa: E402
from gpuenv.backend.base import WRITES as BACKEND_WRITES  # noqa: E402

PAUSE_POINTS = ("after_journal", "mid_apply", "after_apply", "mid_release")
N_GPUS = 2
SM_MHZ = 1350
POWER_W = 500.0


@dataclass
class Trial:
    how: str  # a pause point, or "random"
    changed_at_kill: bool  # the journal or the GPUs differed from the prior state when killed
    restored_by_watchdog: bool
    left_changed: int  # GPUs still differing after the watchdog and 'gpuenv restore'
    restore_s: float | None  # owner death -> GPUs and journal back to the prior state


def _settings(truth: object) -> tuple[object, ...]:
    return tuple(
        getattr(truth, k)
        for k in (
            "locked_sm",
            "locked_mem",
            "app_sm_mhz",
            "app_mem_mhz",
            "power_limit_w",
            "persistence",
        )
    )


def prepare(workdir: Path) -> tuple[Path, Path, list[tuple[object, ...]]]:
    """A fresh simulated machine with a non-default prior state; returns its files and state."""
    from gpuenv.backend.sim import SimBackend

    workdir.mkdir(parents=True, exist_ok=True)
    state_file, state_dir = workdir / "sim.json", workdir / "journal"
    sim = SimBackend(n_gpus=N_GPUS, state_file=state_file)
    try:
        sim.set_app_clocks(0, 2619, 1755)
        sim.set_power_limit(1, 650.0)
        prior = [_settings(sim.truth(i)) for i in range(N_GPUS)]
    finally:
        sim.close()
    return state_file, state_dir, prior


# the writes a lock (clocks/restoring.py's apply_state) and a restore make: the Backend's
# (what the read-only guard refuses) and the simulated GPU's persistence mode
WRITES = (*BACKEND_WRITES, "set_persistence_mode")


def paused(point: str) -> None:
    """Say so on stderr (the parent waits for it) and hold still until SIGKILLed."""
    print(f"GPUENV_PAUSED {point}", file=sys.stderr, flush=True)
    time.sleep(60)


def pausing_sim(state_file: str, point: str | None) -> Any:
    """The child's simulated GPUs, which stop the child at `point` of its lock's writes: the
    seam is the backend, so no hook lives in gpuenv. A lock journals every GPU before its
    first write and applies one GPU after another (power limit first, locked SM clock last:
    apply_state); a release restores one GPU and clears its record before the next. The
    watchdog opens the plain simulator from the same state file (Backend.spec)."""
    from gpuenv.backend.sim import SimBackend

    class PausingSim(SimBackend):
        releasing = False  # set by the child before its release
        _first: int | None = None  # the GPU this phase (lock, release) wrote first
        _phase = False

        def _before(self, index: int) -> None:
            if self._phase != self.releasing:
                self._phase, self._first = self.releasing, None
            if not self.releasing and point == "after_journal" and self._first is None:
                paused("after_journal")
            between = point == ("mid_release" if self.releasing else "mid_apply")
            if between and self._first is not None and index != self._first:
                paused("mid_release" if self.releasing else "mid_apply")
            if self._first is None:
                self._first = index

        def _after(self, name: str, index: int) -> None:
            last = name == "set_locked_sm_clocks" and index == N_GPUS - 1
            if not self.releasing and point == "after_apply" and last:
                paused("after_apply")

    def wrap(name: str) -> Any:
        write = getattr(SimBackend, name)

        def pausing(self: Any, index: int, *args: Any) -> Any:
            self._before(index)
            done = write(self, index, *args)
            self._after(name, index)
            return done

        return pausing

    for name in WRITES:
        setattr(PausingSim, name, wrap(name))
    return PausingSim(n_gpus=N_GPUS, state_file=state_file)


def child_main(state_file: str, state_dir: str, release: bool, point: str | None) -> None:
    """Lock every GPU and hold it (or release it, for the mid_release point)."""
    from gpuenv.clocks import local_lock as lock
    from gpuenv.clocks.journal import Journal

    sim = pausing_sim(state_file, point)
    lk = lock(SM_MHZ, power_limit_w=POWER_W, backend=sim, journal=Journal(state_dir))
    print("GPUENV_PAUSED locked", file=sys.stderr, flush=True)
    if release:
        sim.releasing = True
        lk.release()
    time.sleep(60)


def _wait_marker(proc: subprocess.Popen[bytes], marker: bytes, timeout_s: float) -> bool:
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while marker not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return False
        chunk = os.read(fd, 4096)
        if not chunk:
            return False
        buf += chunk
    return True


def run_trial(
    workdir: Path, how: str, *, kill_after_s: float = 0.0, restore_timeout_s: float = 5.0
) -> Trial:
    """One SIGKILL trial (see the module docstring). `how`: a pause point, 'locked' or 'random'."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks import restore
    from gpuenv.clocks.journal import Journal

    state_file, state_dir, prior = prepare(workdir)
    env = dict(os.environ)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(state_file),
        str(state_dir),
    ]
    if how in PAUSE_POINTS:
        cmd += ["--pause", how]
    if how == "mid_release":
        cmd.append("--release")
    journal = Journal(state_dir)
    sim = SimBackend(n_gpus=N_GPUS, state_file=state_file)  # the observer

    def back() -> bool:
        return not journal.entries() and all(
            _settings(sim.truth(i)) == prior[i] for i in range(N_GPUS)
        )

    try:
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        try:
            if how == "random":
                time.sleep(kill_after_s)
            else:
                marker = b"GPUENV_PAUSED " + (b"locked" if how == "locked" else how.encode())
                if not _wait_marker(proc, marker, 30.0):
                    raise RuntimeError(f"the child never reached {how!r}")
            changed_at_kill = not back()  # a paused child changes nothing until killed
            proc.send_signal(signal.SIGKILL)
            t_kill = time.monotonic()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()

        restore_s = None
        deadline = t_kill + restore_timeout_s
        while True:
            if back():
                if changed_at_kill:
                    restore_s = time.monotonic() - t_kill
                break
            changed_at_kill = True  # a random kill may land just after the check
            if time.monotonic() > deadline:  # what the watchdog left: 'gpuenv restore' finishes
                restore(backend=sim, journal=journal, all_owners=True)
                break
            time.sleep(0.002)
        left = sum(_settings(sim.truth(i)) != prior[i] for i in range(N_GPUS))
        left += len(journal.entries())
        return Trial(how, changed_at_kill, restore_s is not None, left, restore_s)
    finally:
        sim.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_latency(workdir: Path, reps: int) -> list[tuple[str, list[float]]]:
    """Lock + release on the simulator: with the watchdog (state file) and without it."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks import local_lock as lock
    from gpuenv.clocks.journal import Journal

    out = []
    state_file, state_dir, _ = prepare(workdir)
    for label, sim in (
        (
            "lock + release, 2 GPUs, with watchdog (state-file sim)",
            SimBackend(n_gpus=N_GPUS, state_file=state_file),
        ),
        ("lock + release, 2 GPUs, no watchdog (in-memory sim)", SimBackend(n_gpus=N_GPUS)),
    ):
        journal = Journal(state_dir)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            lk = lock(SM_MHZ, power_limit_w=POWER_W, backend=sim, journal=journal)
            lk.release()
            times.append(time.perf_counter() - t0)
        sim.close()
        out.append((label, times))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--latency-reps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)


def child(argv: list[str]) -> int:
    """The process that gets killed: not a benchmark run, no results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=2, metavar=("STATE_FILE", "STATE_DIR"), required=True)
    parser.add_argument("--release", action="store_true")
    parser.add_argument("--pause", choices=PAUSE_POINTS)
    args = parser.parse_args(argv)
    child_main(args.child[0], args.child[1], args.release, args.pause)
    return 0


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    kinds = [*PAUSE_POINTS, "locked", "random", "random", "random"]
    trials: list[Trial] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuenv-chaos-") as tmp:
        for n in range(args.trials):
            how = kinds[n % len(kinds)]
            trials.append(run_trial(Path(tmp) / f"t{n}", how, kill_after_s=rng.uniform(0.0, 0.6)))
            if (n + 1) % 100 == 0:
                print(f"... {n + 1} trials, {time.monotonic() - t0:.0f} s", file=sys.stderr)
        latency = bench_latency(Path(tmp) / "latency", args.latency_reps)

    print(
        "| SIGKILL at | trials | GPU state changed at kill | GPUs left changed | "
        "restored by the watchdog | death to restore p50 / p99 / max (ms) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for how in [*PAUSE_POINTS, "locked", "random", "all"]:
        group = [t for t in trials if how in ("all", t.how)]
        if not group:
            continue
        times = [t.restore_s * 1e3 for t in group if t.restore_s is not None]
        lat = (
            f"{_pct(times, 0.5):.0f} / {_pct(times, 0.99):.0f} / {max(times):.0f}" if times else "-"
        )
        print(
            f"| {how} | {len(group)} | {sum(t.changed_at_kill for t in group)} | "
            f"{sum(t.left_changed for t in group)} | "
            f"{sum(t.restored_by_watchdog for t in group)} | {lat} |"
        )
    print()
    print("| operation (simulator) | reps | p50 (ms) | p99 (ms) |")
    print("| --- | --- | --- | --- |")
    for label, times in latency:
        ms = [t * 1e3 for t in times]
        print(f"| {label} | {len(ms)} | {statistics.median(ms):.1f} | {_pct(ms, 0.99):.1f} |")
    runner.metric("gpus_left_changed", sum(t.left_changed for t in trials), "GPUs", slack=0.0)
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(child(sys.argv[1:]))
    sys.exit(
        runner.main(
            "chaos",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"trials": 100, "latency_reps": 30},
        )
    )
