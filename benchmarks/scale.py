#!/usr/bin/env python3
"""Flat at scale: what gpuenv costs as GPUs, clients, regions and hours grow.

On the simulated H100 (no GPU needed), one part at a time, each with a results file of
its own (benchmarks/results/scale-<part>.json):

  sampler  the sampler's CPU per GPU per tick at 1, 2, 4 and 8 GPUs (thread mode, real
           time: what the sim's reads and the sampler's own work cost), and `gpuenv
           monitor` at its 1 Hz on 1 and 8 GPUs, side by side in a pseudo-terminal
  daemon   gpuenvd with 8 GPUs and 200 clients (each locks one GPU, holds 0-200 ms,
           releases, pauses 0-100 ms), with two CPU hogs running, at nice 0 and at the
           unit's Nice=-10: lease round trip p50 / p99 / max (goal p99 <= 50 ms); with
           --before COMMIT, that commit's gpuenvd too, alternating with this one's
  run      `gpuenv run` of a child calling do_bench N times (a stand-in triton.testing
           whose do_bench spins 20 us: the automatic regions' hook is what is measured):
           added time per call, summary time (child's end to gpuenv's exit; goal <= 1 s),
           gpuenv's peak RSS, JSONL bytes per call
  day      a `stable()` session on virtual time for --hours simulated hours at the default
           sampling period, one `measure()` region every 10 s:
           Python's allocated blocks, RSS and what env.results holds, each simulated hour
           (goal: flat once the sampler's ring is full, but for the measurements kept)

    python -m benchmarks.scale --part run [--quick] [--before 2187591]
    python -m benchmarks.scale --part daemon --seconds 20 [--before 1a23628]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing as mp
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import runner
from benchmarks.checkout import GPUENV, ROOT, checkout_env

PARTS = ("sampler", "daemon", "run", "day")


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- sampler and monitor ----------------------------------------------------------------------


def sampler_cost(n_gpus: int, seconds: float, tmp: str) -> dict[str, float]:
    """A thread sampler of `n_gpus` simulated GPUs at the default period, real time."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.telemetry import Sampler

    backend = SimBackend("h100", n_gpus=n_gpus, state_file=os.path.join(tmp, f"s{n_gpus}.json"))
    try:
        sampler = Sampler(backend, list(range(n_gpus)), mode="thread")
        sampler.start()
        time.sleep(seconds)
        sampler.stop()
    finally:
        backend.close()
    per_tick = sampler.cpu_time_s / max(1, sampler.ticks)
    return {
        "gpus": n_gpus,
        "ticks": sampler.ticks,
        "tick_us": per_tick * 1e6,
        "gpu_tick_us": per_tick / n_gpus * 1e6,
        "core_pct": sampler.cpu_time_s / seconds * 100,
    }


def monitor_cpu(gpu_counts: list[int], seconds: float, tmp: str) -> dict[int, float]:
    """`gpuenv --sim monitor` (1 Hz) on each GPU count, all running side by side: % of a core."""
    from benchmarks.monitor import Pty

    terms = []
    for n in gpu_counts:
        env = checkout_env(
            TERM="xterm-256color",
            LANG="C.UTF-8",
            LC_ALL="C.UTF-8",
            GPUENV_SIM_GPUS=str(n),
            GPUENV_SIM_STATE=os.path.join(tmp, f"monitor{n}.json"),
        )
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        terms.append((n, Pty([*GPUENV, "--sim", "monitor"], env)))
    time.sleep(5.0)  # start-up and first frames are not the steady cost
    c0 = [t.cpu_seconds() for _, t in terms]
    w0 = time.perf_counter()
    time.sleep(seconds)
    c1 = [t.cpu_seconds() for _, t in terms]
    wall = time.perf_counter() - w0
    for _, t in terms:
        t.quit()
    return {n: (c1[k] - c0[k]) / wall * 100 for k, (n, _) in enumerate(terms)}


def part_sampler(args: argparse.Namespace, tmp: str) -> None:
    rows = [sampler_cost(n, args.seconds, tmp) for n in (1, 2, 4, 8)]
    print(
        f"Sampler on the simulated H100, thread mode, default period, {args.seconds:.0f} s "
        f"each; load average {_load()} (a 2-core machine shared with other work):\n"
    )
    print("| GPUs | ticks | CPU per tick | CPU per GPU per tick | % of a core |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['gpus']} | {r['ticks']} | {r['tick_us']:.0f} us | {r['gpu_tick_us']:.0f} us "
            f"| {r['core_pct']:.2f} |"
        )
    one, eight = rows[0], rows[-1]
    growth = eight["tick_us"] / one["tick_us"]
    runner.metric("sampler_8gpu_gpu_tick_us", eight["gpu_tick_us"], "us", slack=20.0)
    print(
        f"\n8 GPUs cost {growth:.1f}x one GPU's tick (linear would be 8x): a tick's fixed "
        "part (the loop, the slow-read grid, the clock) is shared by every GPU.\n"
    )
    cpu = monitor_cpu([1, 8], args.seconds, tmp)
    print(
        f"`gpuenv --sim monitor` at its default 1 Hz, both side by side for {args.seconds:.0f} "
        f"s; load average {_load()}:\n"
    )
    print("| GPUs | CPU (% of one core) |")
    print("| ---: | ---: |")
    for n, pct in cpu.items():
        runner.metric(f"monitor_{n}gpu_cpu_pct", pct, "% of a core", slack=0.5)
        print(f"| {n} | {pct:.2f} |")


# -- gpuenvd: 8 GPUs, 200 clients, two CPU hogs --------------------------------------------------


HOLD_S, THINK_S = 0.1, 0.05  # a client holds its lease 0-200 ms, then pauses 0-100 ms
START_S = 1.0  # each client's first request comes at a random point of the first second


def _client(job: tuple[str, int, int, float, float]) -> dict:
    from gpuenv.daemon.client import Client
    from gpuenv.errors import LockConflict

    sock, k, n_gpus, start_at, until = job
    rng = random.Random(k)
    lat: list[float] = []
    refused = errors = 0
    with Client(sock, timeout=120) as c:
        while time.time() < start_at:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, START_S))  # arrivals spread, not 200 at one instant
        while time.time() < until:
            t0 = time.perf_counter()
            try:
                lease = c.lock(sm=1350, gpus=[k % n_gpus], wait=30)
            except LockConflict:
                refused += 1
                continue
            except Exception:
                errors += 1
                continue
            t1 = time.perf_counter()
            time.sleep(rng.uniform(0, 2 * HOLD_S))
            t2 = time.perf_counter()
            lease.release()
            lat.append((t1 - t0) + (time.perf_counter() - t2))  # lock + release round trips
            time.sleep(rng.uniform(0, 2 * THINK_S))
    return {"lat": lat, "refused": refused, "errors": errors}


def daemon_run(
    clients: int, n_gpus: int, seconds: float, nice: int, hogs: int, gpuenv: str | None = None
) -> dict:
    """`gpuenv`: a directory holding the gpuenv package the daemon runs (default: this one)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from daemon_harness import DaemonProcess

    work = Path(tempfile.mkdtemp(prefix="bench-scale-daemon-"))
    d = DaemonProcess(work, n_gpus=n_gpus, nice=nice)
    if gpuenv is not None:  # and not the checkout's, which `python -c` finds in the cwd
        d.env.update(PYTHONPATH=gpuenv, PYTHONSAFEPATH="1")
    d.start()
    spin = "while True: pass"
    hog_procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(hogs)]
    try:
        start_at = time.time() + 2.0 + clients * 0.02
        until = start_at + seconds
        jobs = [(d.socket, k, n_gpus, start_at, until) for k in range(clients)]
        import psutil

        assert d.proc is not None
        daemon_proc = psutil.Process(d.proc.pid)
        cpu0 = daemon_proc.cpu_times()
        with mp.get_context("fork").Pool(clients) as pool:
            res = pool.map_async(_client, jobs)
            load_seen = []
            while not res.ready():
                if time.time() > start_at:
                    load_seen.append(os.getloadavg()[0])
                time.sleep(1.0)
            results = res.get(timeout=900)
        cpu1 = daemon_proc.cpu_times()
        settled = d.wait_pristine(timeout=10.0)
    finally:
        for p in hog_procs:
            p.kill()
            p.wait()
        d.close()
        shutil.rmtree(work, ignore_errors=True)
    lat = [x for r in results for x in r["lat"]]
    return {
        "nice": nice,
        "clients": clients,
        "gpus": n_gpus,
        "hogs": hogs,
        "leases": len(lat),
        "refused": sum(r["refused"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "lost": 0 if settled is not None else 1,
        "p50": _pct(lat, 50) if lat else float("nan"),
        "p99": _pct(lat, 99) if lat else float("nan"),
        "max": max(lat) if lat else float("nan"),
        "load": max(load_seen) if load_seen else os.getloadavg()[0],
        "daemon_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
    }


def part_daemon(args: argparse.Namespace, tmp: str) -> None:
    versions: dict[str, str | None] = {"this commit": None}
    if args.before:
        versions[f"before ({args.before[:9]})"] = _gpuenv_at(args.before, tmp)
    rows = []
    for nice in (0, -10):
        for version, where in versions.items():  # side by side: each nice, one after the other
            print(
                f"gpuenvd ({version}) at nice {nice}: {args.clients} clients, 8 GPUs, 2 hogs, "
                f"load {_load()}",
                file=sys.stderr,
            )
            rows.append(
                {**daemon_run(args.clients, 8, args.seconds, nice, 2, where), "version": version}
            )
            print(rows[-1], file=sys.stderr)
    print(
        f"gpuenvd with 8 simulated GPUs and {args.clients} client processes for "
        f"{args.seconds:.0f} s each (each locks one GPU at SM 1350 MHz, holds 0-200 ms, "
        "releases, pauses 0-100 ms; the first requests spread over 1 s), two CPU hogs running; "
        "round trip = lock + release:\n"
    )
    both = len(versions) > 1
    print(
        ("| gpuenvd " if both else "") + "| gpuenvd nice | leases | lease round trip p50 / p99 "
        "/ max | goal | errors | lost restores | gpuenvd CPU a lease | load average (1 min, "
        "highest) |"
    )
    print(("| --- " if both else "") + "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["version"] == "this commit":
            runner.metric(f"nice{r['nice']}_p99_ms", r["p99"] * 1e3, "ms", slack=5.0)
        print(
            (f"| {r['version']} " if both else "")
            + f"| {r['nice']} | {r['leases']} | {r['p50'] * 1e3:.1f} / {r['p99'] * 1e3:.1f} / "
            f"{r['max'] * 1e3:.1f} ms | p99 <= 50 ms | {r['errors']} | {r['lost']} | "
            f"{r['daemon_cpu_s'] / max(1, r['leases']) * 1e6:.0f} us | "
            f"{r['load']:.2f} |"
        )


# -- gpuenv run with N automatic regions ------------------------------------------------------


FAKE_TESTING = '''"""A stand-in for triton.testing: do_bench spins 20 us (no GPU, no triton)."""
import time
def do_bench(fn, warmup=25, rep=100, return_mode="mean"):
    t0 = time.perf_counter()
    fn()
    while time.perf_counter() - t0 < 20e-6:
        pass
    return (time.perf_counter() - t0) * 1e3
'''
CHILD = """import sys, time
import triton.testing as tt
n = int(sys.argv[1])
t0 = time.perf_counter()
for _ in range(n):
    tt.do_bench(lambda: None)
loop = time.perf_counter() - t0
print(f"loop {loop!r} end {time.monotonic()!r}", file=sys.stderr)
"""


def _child_run(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run `argv`; its child's loop time and end time (CLOCK_MONOTONIC), our exit time,
    and the peak RSS of the process we started (wait4's rusage)."""
    # not in the checkout: `python -c` puts the working directory first on sys.path
    proc = subprocess.Popen(
        argv,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    exited = time.monotonic()
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = next((ln for ln in err.splitlines() if ln.startswith("loop ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err[-2000:]}")
    words = line.split()
    return {
        "loop": float(words[1]),
        "end": float(words[3]),
        "exited": exited,
        "maxrss_mb": usage.ru_maxrss / 1024,
    }


def _gpuenv_at(commit: str, tmp: str) -> str:
    """A directory holding the gpuenv package of `commit` (git archive)."""
    where = Path(tmp) / f"gpuenv-{commit[:12]}"
    where.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "gpuenv"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return str(where)


def part_run(args: argparse.Namespace, tmp: str) -> None:
    n = args.calls
    fake = Path(tmp) / "fake" / "triton"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "testing.py").write_text(FAKE_TESTING)
    child = Path(tmp) / "child.py"
    child.write_text(CHILD)
    env = checkout_env(GPUENV_SIM_STATE=os.path.join(tmp, "sim.json"))
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env.get("PYTHONPATH", "")])
    versions = {"this commit": env}
    if args.before:
        old = _gpuenv_at(args.before, tmp)
        versions[f"before ({args.before[:9]})"] = {
            **env,
            "PYTHONPATH": os.pathsep.join([old, str(fake.parent)]),
        }
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in versions}
    for k in range(args.repeat):
        plain = _child_run([sys.executable, str(child), str(n)], env)
        for version, venv in versions.items():
            out = Path(tmp) / f"run{k}-{len(rows[version])}-{version[:4]}.jsonl"
            under = _child_run(
                [
                    *GPUENV,
                    "--sim",
                    "run",
                    "-q",
                    "-o",
                    str(out),
                    "--",
                    sys.executable,
                    str(child),
                    str(n),
                ],
                venv,
            )
            rows[version].append(
                {
                    "added_us": (under["loop"] - plain["loop"]) / n * 1e6,
                    "plain_us": plain["loop"] / n * 1e6,
                    "summary_s": under["exited"] - under["end"],
                    "rss_mb": under["maxrss_mb"],
                    "jsonl_b": out.stat().st_size,
                }
            )
            print(version, rows[version][-1], file=sys.stderr)

    def med(version: str, key: str) -> float:
        values = sorted(r[key] for r in rows[version])
        return values[len(values) // 2]

    print(
        f"`gpuenv --sim run -q -o run.jsonl -- python child.py`, the child calling do_bench "
        f"{n:,} times (each spins 20 us; each call is an automatic region); the median of "
        f"{args.repeat} runs of each, alternating with the child alone (a do_bench call alone: "
        f"{med('this commit', 'plain_us'):.1f} us); load average {_load()}:\n"
    )
    names = list(versions)
    print("| figure | " + " | ".join(names) + " | goal |")
    print("| --- | " + " | ".join("---:" for _ in names) + " | --- |")
    figures = (
        ("added time per do_bench call", "added_us", lambda v: f"{v:.1f} us", ""),
        (
            "summary time: the child's end to gpuenv's exit",
            "summary_s",
            lambda v: f"{v:.2f} s",
            "<= 1 s",
        ),
        ("peak RSS of gpuenv run", "rss_mb", lambda v: f"{v:.0f} MB", ""),
        ("JSONL written per call", "jsonl_b", lambda v: f"{v / n:,.0f} B", ""),
    )
    for what, key, fmt, goal in figures:
        print(f"| {what} | " + " | ".join(fmt(med(v, key)) for v in names) + f" | {goal} |")
    runner.metric("run_summary_s", med("this commit", "summary_s"), "s", slack=0.2)
    runner.metric("run_added_us", med("this commit", "added_us"), "us", slack=10.0)
    runner.metric("run_rss_mb", med("this commit", "rss_mb"), "MB", slack=10.0)
    runner.metric("run_jsonl_bytes_per_call", med("this commit", "jsonl_b") / n, "B", slack=50.0)


# -- a day of stable() ------------------------------------------------------------------------


def _rss_mb() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _deep_size(root: object) -> int:
    """Bytes of `root` and everything it references (each object once)."""
    seen: set[int] = set()
    todo, total = [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


def part_day(args: argparse.Namespace, tmp: str) -> None:
    import gpuenv
    from gpuenv.backend.sim import SimBackend
    from gpuenv.timebase import VirtualClock

    clock = VirtualClock()
    backend = SimBackend("h100", clock=clock)
    every_s, region_s = 10.0, 1.0
    rows = []
    wall0 = time.perf_counter()
    # no tracemalloc: it made each simulated hour 13x slower; Python's own count of its
    # allocated blocks, the RSS, and the measurements' own size tell the same story
    with gpuenv.stable(
        backend=backend, clock=clock, period=args.period, output=os.path.join(tmp, "day.jsonl")
    ) as env:
        t_start = clock.now()
        for hour in range(int(args.hours) + 1):
            if hour:
                until = t_start + hour * 3600
                while clock.now() < until:
                    with env.measure("step"):
                        backend.run_work(0, region_s * 1.5e9, power_intensity=0.6)
                    clock.sleep(max(0.0, every_s - region_s))
            gc.collect()
            held = _deep_size(list(env.results))
            rows.append(
                {
                    "hour": hour,
                    "blocks": sys.getallocatedblocks(),
                    "rss_mb": _rss_mb(),
                    "results_mb": held / 1e6,
                    "measurements": len(env.results),
                    "wall_s": time.perf_counter() - wall0,
                }
            )
            print(rows[-1], file=sys.stderr)
    print(
        f"A `stable()` session on the simulated H100 on virtual time: {args.hours:.0f} "
        f"simulated hours, sampling every {args.period * 1e3:.0f} ms, a 1 s `measure()` region "
        f"every {every_s:.0f} s, results appended to a JSONL file; "
        f"{time.perf_counter() - wall0:.0f} s of real time. `env.results` keeps every "
        "measurement (its documented job), so "
        "what it holds is shown apart:\n"
    )
    print(
        "| simulated hour | measurements | held by env.results | RSS | RSS less env.results "
        "| Python's allocated blocks |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['hour']} | {r['measurements']:,} | {r['results_mb']:.1f} MB | "
            f"{r['rss_mb']:.1f} MB | {r['rss_mb'] - r['results_mb']:.1f} MB | "
            f"{r['blocks']:,} |"
        )
    if len(rows) >= 4:
        # the second half: the sampler's ring (32,768 samples a GPU, 13.6 min at the
        # default period) and the trace log (thinned beyond 20,000 points) are long full
        first, last = rows[len(rows) // 2], rows[-1]
        hours = last["hour"] - first["hour"]
        other = (last["rss_mb"] - last["results_mb"]) - (first["rss_mb"] - first["results_mb"])
        per_m = (
            (last["results_mb"] - first["results_mb"])
            * 1e6
            / max(1, last["measurements"] - first["measurements"])
        )
        runner.metric("day_other_growth_mb_per_h", other / hours, "MB/h", slack=0.5)
        runner.metric("day_results_bytes_per_measurement", per_m, "B", slack=500.0)
        print(
            f"\nFrom hour {first['hour']} to {last['hour']}: RSS less env.results grew "
            f"{other:+.1f} MB ({other / hours:+.2f} MB an hour); env.results grew "
            f"{per_m:,.0f} B per measurement."
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=PARTS, required=True, help="which figure")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="sampler, monitor and daemon: seconds each"
    )
    parser.add_argument("--clients", type=int, default=200, help="daemon: client processes")
    parser.add_argument("--calls", type=int, default=10_000, help="run: do_bench calls")
    parser.add_argument("--repeat", type=int, default=3, help="run: runs")
    parser.add_argument(
        "--before", metavar="COMMIT", help="run, daemon: the gpuenv of COMMIT too, side by side"
    )
    parser.add_argument("--hours", type=float, default=24.0, help="day: simulated hours")
    parser.add_argument(
        "--period",
        type=float,
        default=0.025,
        help="day: seconds between samples (default: gpuenv's)",
    )


def run(args: argparse.Namespace) -> int:
    tmp = tempfile.mkdtemp(prefix="bench-scale-")
    try:
        {"sampler": part_sampler, "daemon": part_daemon, "run": part_run, "day": part_day}[
            args.part
        ](args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    QUICK = {"seconds": 5.0, "clients": 50, "calls": 2000, "repeat": 1, "hours": 2.0}
    sys.exit(
        runner.main(
            "scale",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            variant=lambda a: a.part,
            quick=QUICK,
        )
    )
