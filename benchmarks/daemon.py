#!/usr/bin/env python3
"""gpuenvd figures on the simulated GPU: lease latency, load with conflicts, SIGKILL
recovery, a 10,000-input fuzz, sharing at scale and fair queuing, as markdown tables.

    python -m benchmarks.daemon                  # full size (a few minutes)
    python -m benchmarks.daemon --quick          # smaller, for a smoke run
    python -m benchmarks.daemon --latency-only   # the latency rows alone (~30 s)
    python -m benchmarks.daemon --sharing        # 10/50/100/200 clients sharing a lock,
                                                 # then 5% of requests for another clock

The daemon runs as a subprocess on a socket in a temp dir (GPUENV_BACKEND=sim),
exactly as in tests/test_daemon_faults.py, whose harness this script uses.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from daemon_harness import DaemonProcess, check_exchange, client_process, fuzz_messages  # noqa: E402

from benchmarks import runner  # noqa: E402
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


# -- sharing at scale, and fair queuing ----------------------------------------------------------


def _share_worker(args: tuple[str, int, float, float, float, float, float, float]) -> dict:
    """One client: lock, hold, release, think, until `until`. A share of requests (`other`)
    ask for another clock and wait up to 30 s for their turn; the others wait `main_wait`."""
    sock, k, start_at, until, hold_s, think_s, other, main_wait = args
    rng = random.Random(k)
    lat: dict[str, list[float]] = {"main": [], "other": []}
    refused = {"main": 0, "other": 0}
    errors = 0
    with Client(sock, timeout=120) as c:
        while time.time() < start_at:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, think_s))
        while time.time() < until:
            kind = "other" if rng.random() < other else "main"
            t0 = time.perf_counter()
            try:
                if kind == "other":
                    lease = c.lock(sm=1500, gpus=[0], wait=30)
                else:
                    lease = c.lock(sm=1350, gpus=[0], wait=main_wait)
            except LockConflict:
                refused[kind] += 1
                time.sleep(rng.uniform(0, 2 * think_s))
                continue
            except Exception:
                errors += 1
                continue
            lat[kind].append(time.perf_counter() - t0)
            time.sleep(rng.uniform(0, 2 * hold_s))
            lease.release()
            time.sleep(rng.uniform(0, 2 * think_s))
    return {"lat": lat, "refused": refused, "errors": errors}


def bench_sharing(
    d: DaemonProcess, clients: int, seconds: float, other: float, main_wait: float
) -> dict:
    """`clients` processes for `seconds`; the journal record's size is watched meanwhile."""
    ctx = mp.get_context("fork")
    start_at = time.time() + 2.0 + clients * 0.02  # every client connected before the clock runs
    until = start_at + seconds
    record = Path(d.env["GPUENV_STATE_DIR"]) / f"{d.backend.device_info(0).uuid}.json"
    biggest = 0
    work = [
        (d.socket, k, start_at, until, HOLD_S, THINK_S, other, main_wait) for k in range(clients)
    ]
    with ctx.Pool(clients) as pool:
        res = pool.map_async(_share_worker, work)
        while not res.ready():
            with contextlib.suppress(OSError):
                biggest = max(biggest, record.stat().st_size)
            time.sleep(0.05)
        results = res.get(timeout=900)
    settled = d.wait_pristine(timeout=10.0)
    out: dict = {"clients": clients, "record_bytes": biggest, "share": other, "wait": main_wait}
    for kind in ("main", "other"):
        lat = [x for r in results for x in r["lat"][kind]]
        out[kind] = {
            "grants": len(lat),
            "refused": sum(r["refused"][kind] for r in results),
            "p50": pct(lat, 50) if lat else float("nan"),
            "p99": pct(lat, 99) if lat else float("nan"),
            "max": max(lat) if lat else float("nan"),
        }
    out["errors"] = sum(r["errors"] for r in results)
    out["lost"] = 0 if settled is not None else 1
    return out


HOLD_S, THINK_S = 0.1, 0.05  # a client holds its lease 0-200 ms, then pauses 0-100 ms


def run_sharing(sizes: list[int], seconds: float, fair: bool, nice: int = 0) -> None:
    """The sharing table: `sizes` clients sharing SM 1350 MHz; with `fair`, 50 clients of
    which 5% of requests ask for SM 1500 MHz, the sharers waiting (30 s) or not (0 s)."""
    runs = [(n, 0.0, 30.0) for n in sizes] + ([(50, 0.05, 30.0), (50, 0.05, 0.0)] if fair else [])
    rows = []
    for clients, other, main_wait in runs:
        work = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
        d = DaemonProcess(work, n_gpus=1, nice=nice)
        d.start()
        try:
            print(
                f"sharing: {clients} clients, {other:.0%} for another clock, "
                f"load average {_loadavg()} ...",
                file=sys.stderr,
            )
            rows.append(bench_sharing(d, clients, seconds, other, main_wait))
            print(rows[-1], file=sys.stderr)
        finally:
            d.close()
            shutil.rmtree(work, ignore_errors=True)
    when = time.strftime("%Y-%m-%d")
    cpu = f"{os.cpu_count()}-core CPU machine ({platform.machine()}), no GPU, simulated H100"
    print(
        f"\nSharing one lock ({when}, {cpu}; `python -m benchmarks.daemon --sharing`, gpuenvd at "
        f"nice {nice}): each client "
        f"locks, holds 0-{2 * HOLD_S * 1e3:.0f} ms, releases, pauses 0-{2 * THINK_S * 1e3:.0f} "
        f"ms, for {seconds:.0f} s:\n"
    )
    print(
        "| clients | asks for (wait) | grants | lock round trip p50 / p99 / max | refused | "
        "journal record, largest | lost restores |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for kind in ("main", "other"):
            k = r[kind]
            if kind == "other" and not r["share"]:
                continue
            share = f"{1 - r['share']:.0%} " if r["share"] else ""
            what = (
                "SM 1500 MHz, 5% (30 s)"
                if kind == "other"
                else f"SM 1350 MHz, {share}({r['wait']:.0f} s)"
            )
            runner.metric(f"sharing_{r['clients']}_{kind}_p99_ms", k["p99"] * 1e3, "ms", slack=5.0)
            print(
                f"| {r['clients']} | {what} | {k['grants']} | {ms(k['p50'])} / {ms(k['p99'])} / "
                f"{ms(k['max'])} | {k['refused']} | {r['record_bytes']:,} B | {r['lost']} |"
            )


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

    stats: dict[str, Any] = {"inputs": 0, "bad": 0, "crashes": 0}
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
    print(f"gpuenvd on the simulated GPU ({when}, {cpu}; `python -m benchmarks.daemon`):\n")
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
            runner.metric(f"{key}_{fs}_p99_ms", pct(lat[key], 99) * 1e3, "ms", slack=2.0)
            print(
                f"| {what}, state on {fs}, p50 / p99 | {ms(pct(lat[key], 50))} / "
                f"{ms(pct(lat[key], 99))} | {goal if key == 'lease' else ''} |"
            )


def latency_on_disk_and_tmpfs(n_lat: int) -> dict[str, dict[str, list[float]]]:
    """Latency twice: with the journal and the simulated driver's state on this machine's
    disk (every lock and release fsyncs the journal: crash safety costs what the disk
    costs), and on tmpfs, which leaves the daemon's own cost."""
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
    return lat_by_fs


def print_rest(
    load: dict, kill_times: list[float], kill_failed: int, dkill: tuple[int, int], fz: dict
) -> None:
    """The table's rows after the latency rows."""
    drestored, dtrials = dkill
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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--latency-only",
        action="store_true",
        help="only the lease latency rows (disk and tmpfs), for repeated runs",
    )
    ap.add_argument(
        "--sharing",
        action="store_true",
        help="only the sharing-at-scale and fair-queuing table (a few minutes)",
    )
    ap.add_argument(
        "--sizes",
        default="10,50,100,200",
        help="with --sharing: how many clients share, comma-separated ('' for none)",
    )
    ap.add_argument("--no-fair", action="store_true", help="with --sharing: no fairness rows")
    ap.add_argument(
        "--nice", type=int, default=0, help="run gpuenvd at this niceness (the unit: -10)"
    )


def run(args: argparse.Namespace) -> None:
    if args.sharing:
        sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
        run_sharing(
            sizes[:2] if args.quick else sizes,
            5.0 if args.quick else 20.0,
            not args.no_fair,
            args.nice,
        )
        return
    n_lat, clients, cycles, kills, dkills, fuzz = (
        (200, 10, 20, 20, 3, 500) if args.quick else (2000, 50, 100, 100, 10, 10_000)
    )
    lat_by_fs = latency_on_disk_and_tmpfs(n_lat)
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
    print_rest(load, kill_times, kill_failed, (drestored, dtrials), fz)


def variant(args: argparse.Namespace) -> str:
    """Each part's results in a file of its own."""
    return "sharing" if args.sharing else "latency" if args.latency_only else ""


if __name__ == "__main__":
    sys.exit(runner.main("daemon", __doc__, add_arguments, run, sim_only=True, variant=variant))
