#!/usr/bin/env python3
"""gpuenvd's throughput under mixed load: `--clients` client processes
lock GPU 0 and release it as fast as they can for `--seconds`, 10% of them (every tenth)
asking another state (SM 1500 MHz, the rest SM 1350 MHz), so that the GPU's state changes
whenever a different-state client's turn comes: each change is a restore, a journal record
removed and another written, and the new state applied.

Two runs a tree: without waits (a conflicting request is refused at once and retried) and
with waits (each request waits up to 30 s for its turn, in the fair queue). Reported:
lease cycles (lock + release) per second, a cycle's round trip p50 / p99, and gpuenvd's CPU
time per cycle (user + system, from /proc). With `--tree DIR` the daemon of another checkout
(the code before a change) runs too, alternating with this one's, `--rounds` times each.

Then what a lease costs, in one process on the daemon's lease manager (no socket, one
thread; each tree in a fresh process, alternating): a lock + release that changes the GPU's
state (restore, journal written and removed, the GPU written), one that shares a state
already held (no write), and a request refused because another state is held.

    python -m benchmarks.daemon_mixed --sim --tree /tmp/old
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from daemon_harness import DaemonProcess  # noqa: E402

from benchmarks import runner  # noqa: E402
from benchmarks.checkout import add_tree_argument  # noqa: E402
from benchmarks.checkout import trees as checkout_trees  # noqa: E402
from gpuenv.daemon.client import Client  # noqa: E402
from gpuenv.errors import LockConflict  # noqa: E402

OTHER_EVERY = 10  # every tenth client asks the other state

# A lease's costs on the lease manager in process (argv: tree, state dir); prints JSON.
COSTS = """
import itertools, json, os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.clocks.request import LockRequest
from gpuenv.daemon.auth import Authorizer, Peer, parse_config
from gpuenv.daemon.leases import LeaseManager
from gpuenv.errors import LockConflict
tmp = Path(tempfile.mkdtemp(dir=sys.argv[2]))
sim = SimBackend("h100", n_gpus=1, state_file=tmp / "sim.json")
auth = Authorizer(parse_config("[lock]\\nuser:alice = all\\n"), [sim.device_info(0).uuid])
m = LeaseManager(sim, Journal(tmp / "j"), auth)
me = Peer(pid=os.getpid(), uid=50001, gid=50001, user="alice", groups=frozenset({"alice"}))
def cycle(sm):
    m.release(me, m.grant(me, 1, [0], LockRequest(sm=sm)).id)
def refuse():
    try:
        m.grant(me, 2, [0], LockRequest(sm=1500))
    except LockConflict:
        pass
def per_op_ms(fn, n):
    for _ in range(n // 10):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3
states = itertools.cycle((1350, 1500))
out = {"change": per_op_ms(lambda: cycle(next(states)), 200)}
held = m.grant(me, 1, [0], LockRequest(sm=1350))
out["share"] = per_op_ms(lambda: cycle(1350), 1000)
out["refusal"] = per_op_ms(refuse, 1000)
print(json.dumps(out))
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if values else 0.0


def _client(job: tuple[str, int, float, float, float]) -> dict[str, object]:
    """One client: lock, release, again, from `start_at` until `until`."""
    sock, k, start_at, until, wait = job
    sm = 1500 if k % OTHER_EVERY == 0 else 1350
    cycles: list[float] = []
    refused = errors = 0
    with Client(sock, timeout=120) as c:
        while time.time() < start_at:
            time.sleep(0.005)
        while time.time() < until:
            t0 = time.perf_counter()
            try:
                c.lock(sm=sm, gpus=[0], wait=wait).release()
                cycles.append(time.perf_counter() - t0)
            except LockConflict:  # refused at once (no wait): asked again straight away
                refused += 1
            except Exception:
                errors += 1
    return {"cycles": cycles, "refused": refused, "errors": errors}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(tree: Path | None, clients: int, seconds: float, wait: float) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="gpuenv-mixed-"))
    d = DaemonProcess(work, n_gpus=1)
    if tree is not None:
        d.env["PYTHONPATH"] = str(tree)
    try:
        d.start()
        assert d.proc is not None
        start_at = time.time() + 1.0 + clients * 0.02
        jobs = [(d.socket, k, start_at, start_at + seconds, wait) for k in range(clients)]
        with mp.get_context("fork").Pool(clients) as pool:
            pending = pool.map_async(_client, jobs)
            while time.time() < start_at:
                time.sleep(0.005)
            cpu0 = _cpu_s(d.proc.pid)
            results = pending.get(timeout=seconds + 300)
            cpu = _cpu_s(d.proc.pid) - cpu0
        lost = 0 if d.wait_pristine(timeout=10.0) is not None else 1
    finally:
        d.close()
        shutil.rmtree(work, ignore_errors=True)
    lat = [x for r in results for x in r["cycles"]]  # type: ignore[attr-defined]
    n = len(lat)
    return {
        "cycles_per_s": n / seconds,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
        "refused": float(sum(r["refused"] for r in results)),  # type: ignore[misc]
        "errors": float(sum(r["errors"] for r in results)),  # type: ignore[misc]
        "cpu_ms_per_cycle": cpu / n * 1e3 if n else float("nan"),
        "lost": float(lost),
    }


def lease_costs(tree: Path | None) -> dict[str, float]:
    """COSTS in a fresh process of `tree`'s gpuenv (its cwd a temp dir: `-c` imports from the
    cwd first)."""
    with tempfile.TemporaryDirectory(prefix="gpuenv-costs-") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", COSTS, str(tree or ROOT), tmp],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    return json.loads(out.stdout.splitlines()[-1])


def print_costs(trees: list[tuple[str, Path | None]], rounds: int) -> None:
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(rounds):
        for name, tree in trees:
            runs[name].append(lease_costs(tree))
    print(
        "\n| daemon | lock + release, state changed (ms) | lock + release, shared (ms) | "
        "refused request (ms) |"
    )
    print("| --- | ---: | ---: | ---: |")
    for i, (name, got) in enumerate(runs.items()):
        med = {k: sorted(r[k] for r in got)[len(got) // 2] for k in ("change", "share", "refusal")}
        if i == 0:
            for k, v in med.items():
                runner.metric(f"lease_{k}_ms", v, "ms", slack=0.5)
        print(f"| {name} | {med['change']:.2f} | {med['share']:.3f} | {med['refusal']:.3f} |")
    print(
        f"\nwall time per operation on the lease manager in one process (median of {rounds} "
        "runs a tree, alternating; the state change on a 1-GPU simulated driver whose state "
        "file is rewritten on each write, ~1 ms of it, and on this machine's ext4 disk)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating")
    add_tree_argument(parser)


def run(args: argparse.Namespace) -> int:
    trees = checkout_trees(args)
    rows: dict[tuple[str, float], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for wait in (0.0, 30.0):
            for name, tree in trees:  # alternating: the same minute of a noisy machine
                rows.setdefault((name, wait), []).append(
                    one_run(tree, args.clients, args.seconds, wait)
                )
                print(name, wait, rows[(name, wait)][-1], file=sys.stderr)
    print(
        "| daemon | waits | cycles/s (each run) | p50 / p99 ms (median run) | gpuenvd CPU a "
        "cycle (ms) | refused | errors | lost restores |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    mine: dict[float, float] = {}
    for (name, wait), runs in rows.items():
        rate = sorted(r["cycles_per_s"] for r in runs)
        mid = sorted(runs, key=lambda r: r["cycles_per_s"])[len(runs) // 2]
        cpu = sorted(r["cpu_ms_per_cycle"] for r in runs)[len(runs) // 2]
        if name == trees[0][0]:
            mine[wait] = mid["cycles_per_s"]
            tag = "wait" if wait else "nowait"
            runner.metric(f"cycles_per_s_{tag}", mid["cycles_per_s"], "/s", better="higher")
            runner.metric(f"p99_ms_{tag}", mid["p99_ms"], "ms", slack=50.0)
        print(
            f"| {name} | {'30 s' if wait else 'none'} | {' / '.join(f'{x:.0f}' for x in rate)} | "
            f"{mid['p50_ms']:.1f} / {mid['p99_ms']:.1f} | {cpu:.2f} | "
            f"{sum(r['refused'] for r in runs):.0f} | {sum(r['errors'] for r in runs):.0f} | "
            f"{sum(r['lost'] for r in runs):.0f} |"
        )
    print(
        f"\n{args.clients} client processes on 1 simulated GPU, {args.seconds:.0f} s a run, "
        f"every {OTHER_EVERY}th client asking SM 1500 MHz (the rest 1350); {args.rounds} runs "
        f"of each tree, alternating, on a {os.cpu_count()}-core machine shared with other "
        "work (compare the trees' ratio, not the absolute rates)"
    )
    print_costs(trees, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "daemon_mixed",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"seconds": 4.0, "rounds": 1, "clients": 10},
        )
    )
