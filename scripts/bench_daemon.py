#!/usr/bin/env python3
"""gpuenvd figures on the simulated GPU: lease latency, load with conflicts, SIGKILL
recovery, and a 10,000-input fuzz. Prints a markdown table for docs/benchmarks.md.

    .venv/bin/python scripts/bench_daemon.py            # full size (a few minutes)
    .venv/bin/python scripts/bench_daemon.py --quick    # smaller, for a smoke run
    .venv/bin/python scripts/bench_daemon.py --latency-only   # the latency rows alone (~30 s)

The daemon runs as a subprocess on a socket in a temp dir (GPUENV_BACKEND=sim),
exactly as in tests/test_daemon_faults.py, whose harness this script uses.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from daemon_harness import DaemonProcess, check_exchange, client_process, fuzz_messages  # noqa: E402

from gpuenv.daemon.client import Client  # noqa: E402
from gpuenv.errors import LockConflict  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(v: float) -> str:
    return f"{v * 1e3:.2f} ms"


# -- latency ----------------------------------------------------------------------------------


def bench_latency(d: DaemonProcess, n: int) -> dict[str, list[float]]:
    """One client, one connection: hello, lock, release, and lock+release as one lease."""
    out: dict[str, list[float]] = {"hello": [], "lock": [], "release": [], "lease": []}
    with Client(d.socket) as c:
        for _ in range(20):  # warm up
            c.lock(sm=1350, gpus=[0]).release()
        for _ in range(n):
            t0 = time.perf_counter()
            c.call("hello", versions=[1])
            out["hello"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lease = c.lock(sm=1350, gpus=[0])
            t1 = time.perf_counter()
            lease.release()
            t2 = time.perf_counter()
            out["lock"].append(t1 - t0)
            out["release"].append(t2 - t1)
            out["lease"].append(t2 - t0)
    return out


# -- load -------------------------------------------------------------------------------------


def _load_worker(args: tuple[str, int, int]) -> dict:
    sock, k, cycles = args
    rng = random.Random(k)
    grants = conflicts = errors = unnamed = 0
    lat: list[float] = []
    with Client(sock, timeout=120) as c:
        for _ in range(cycles):
            sm = rng.choice((1350, 1500))  # two clocks: identical requests share, others conflict
            t0 = time.perf_counter()
            try:
                lease = c.lock(sm=sm, gpus=[0])
            except LockConflict as err:
                lat.append(time.perf_counter() - t0)
                conflicts += 1
                unnamed += "via gpuenvd" not in str(err)
                continue
            except Exception:
                errors += 1
                continue
            lease.release()
            lat.append(time.perf_counter() - t0)
            grants += 1
    return {
        "grants": grants,
        "conflicts": conflicts,
        "errors": errors,
        "unnamed": unnamed,
        "lat": lat,
    }


def bench_load(d: DaemonProcess, clients: int, cycles: int) -> dict:
    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    with ctx.Pool(clients) as pool:
        res = pool.map_async(_load_worker, [(d.socket, k, cycles) for k in range(clients)])
        results = res.get(timeout=900)  # a deadlock shows as a timeout here
    wall = time.perf_counter() - t0
    lat = [x for r in results for x in r["lat"]]
    settled = d.wait_pristine(timeout=5.0)
    with Client(d.socket) as c:
        left = c.status()["leases"]
    return {
        "clients": clients,
        "cycles": cycles,
        "grants": sum(r["grants"] for r in results),
        "conflicts": sum(r["conflicts"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "unnamed": sum(r["unnamed"] for r in results),
        "lost": 0 if settled is not None and not left else 1,
        "wall": wall,
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
    }


# -- SIGKILL --------------------------------------------------------------------------------


def bench_client_kill(d: DaemonProcess, trials: int) -> tuple[list[float], int]:
    times: list[float] = []
    failed = 0
    for k in range(trials):
        proc = client_process(d.socket, 1350 if k % 2 else 1200, env=d.env)
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("locked"):
            failed += 1
            proc.kill()
            proc.wait()
            continue
        proc.kill()
        t = d.wait_pristine(timeout=5.0)
        proc.wait()
        if t is None:
            failed += 1
        else:
            times.append(t)
    return times, failed


def bench_daemon_kill(d: DaemonProcess, trials: int) -> tuple[int, int]:
    restored = 0
    for k in range(trials):
        proc = client_process(d.socket, 1350 if k % 2 else 1200, env=d.env)
        assert proc.stdout is not None
        proc.stdout.readline()
        d.kill()
        still_locked = not d.pristine()
        d.start()  # recovery runs before the socket answers
        restored += still_locked and d.pristine()
        proc.kill()
        proc.wait()
    return restored, trials


# -- fuzz -----------------------------------------------------------------------------------


def bench_fuzz(d: DaemonProcess, n: int) -> dict:
    from hypothesis import HealthCheck, given, settings

    stats = {"inputs": 0, "bad": 0, "crashes": 0}
    first_bad: list[str] = []

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_messages)
    def case(data: bytes) -> None:
        stats["inputs"] += 1
        try:
            check_exchange(d.socket, data)
        except Exception as err:
            stats["bad"] += 1
            if not first_bad:
                first_bad.append(f"{err!r} for {data[:200]!r}")
        if not d.alive():
            stats["crashes"] += 1
            d.start()

    t0 = time.perf_counter()
    case()
    stats["wall"] = time.perf_counter() - t0
    stats["changed"] = 0 if d.wait_pristine(timeout=5.0) is not None else 1
    stats["first_bad"] = first_bad[0] if first_bad else ""
    return stats


def _loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def print_latency(lat_by_fs: dict[str, dict[str, list[float]]]) -> None:
    """The table's heading and its latency rows."""
    when = time.strftime("%Y-%m-%d")
    cpu = f"{os.cpu_count()}-core CPU machine ({platform.machine()}), no GPU, simulated H100"
    print(f"gpuenvd on the simulated GPU ({when}, {cpu}; `scripts/bench_daemon.py`):\n")
    print("| figure | result | goal |")
    print("| --- | --- | --- |")
    for fs, lat in lat_by_fs.items():
        goal = "p99 <= 20 ms" if fs == "disk" else ""
        for key, what in (
            ("lease", "lease round trip (lock + release, one client)"),
            ("lock", "lock alone"),
            ("release", "release alone"),
            ("hello", "protocol round trip (hello)"),
        ):
            print(
                f"| {what}, state on {fs}, p50 / p99 | {ms(pct(lat[key], 50))} / "
                f"{ms(pct(lat[key], 99))} | {goal if key == 'lease' else ''} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    ap.add_argument(
        "--latency-only",
        action="store_true",
        help="only the lease latency rows (disk and tmpfs), for repeated runs",
    )
    args = ap.parse_args()
    n_lat, clients, cycles, kills, dkills, fuzz = (
        (200, 10, 20, 20, 3, 500) if args.quick else (2000, 50, 100, 100, 10, 10_000)
    )
    # Latency twice: with the journal and the simulated driver's state on this machine's
    # disk (every lock and release fsyncs the journal: crash safety costs what the disk
    # costs), and on tmpfs, which leaves the daemon's own cost.
    lat_by_fs: dict[str, dict[str, list[float]]] = {}
    places = [("disk", None)] + ([("tmpfs", "/dev/shm")] if os.path.isdir("/dev/shm") else [])
    for fs, base in places:
        work = Path(tempfile.mkdtemp(prefix="bench-daemon-", dir=base))
        d = DaemonProcess(work, n_gpus=2)
        d.start()
        try:
            print(
                f"latency ({fs}): {n_lat} lock/release round trips, load average {_loadavg()} ...",
                file=sys.stderr,
            )
            lat_by_fs[fs] = bench_latency(d, n_lat)
        finally:
            d.close()
            shutil.rmtree(work, ignore_errors=True)
    if args.latency_only:
        print(f"load average after: {_loadavg()}", file=sys.stderr)
        print_latency(lat_by_fs)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    d = DaemonProcess(work, n_gpus=2)
    d.start()
    try:
        print(f"load: {clients} clients x {cycles} cycles ...", file=sys.stderr)
        load = bench_load(d, clients, cycles)
        print(f"SIGKILL: {kills} clients, {dkills} daemons ...", file=sys.stderr)
        kill_times, kill_failed = bench_client_kill(d, kills)
        drestored, dtrials = bench_daemon_kill(d, dkills)
        print(f"fuzz: {fuzz} inputs ...", file=sys.stderr)
        fz = bench_fuzz(d, fuzz)
    finally:
        d.close()
        shutil.rmtree(work, ignore_errors=True)
    print_latency(lat_by_fs)
    print(
        f"| load: {load['clients']} client processes x {load['cycles']} lock/release cycles, "
        f"each at one of two clocks at random | {load['grants']} granted, "
        f"{load['conflicts']} refused ({load['unnamed']} without the holder named), "
        f"{load['errors']} errors, "
        f"{load['lost']} lost restores, no deadlock, {load['wall']:.1f} s | 0 lost, 0 deadlocks |"
    )
    print(
        f"| load: attempt latency (grant + release, or refusal), p50 / p99 | "
        f"{ms(load['p50'])} / {ms(load['p99'])} | |"
    )
    if kill_times:
        print(
            f"| client SIGKILLed mid-lease: time to restore, p50 / p99 / max "
            f"({len(kill_times)} trials, {kill_failed} not restored) | {ms(pct(kill_times, 50))} / "
            f"{ms(pct(kill_times, 99))} / {ms(max(kill_times))} | <= 1 s |"
        )
    print(
        f"| daemon SIGKILLed mid-lease, then restarted: GPUs restored at start | "
        f"{drestored} of {dtrials} | all |"
    )
    print(
        f"| fuzz: malformed, oversized, truncated, out-of-order inputs | {fz['inputs']} inputs, "
        f"{fz['crashes']} crashes, {fz['bad']} wrong replies, GPUs changed afterwards: "
        f"{fz['changed']}, {fz['wall']:.0f} s | 10,000 inputs, 0 crashes |"
    )
    if fz["first_bad"]:
        print(f"\nfirst wrong reply: {fz['first_bad']}", file=sys.stderr)


if __name__ == "__main__":
    main()
