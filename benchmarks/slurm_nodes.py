#!/usr/bin/env python3
"""Slurm on two nodes: prolog and epilog time, `gpuenv job` gathering a job's report from both
nodes, and GPUs left changed under faults (goal 0).

gpuenv's prolog and epilog (gpuenv/ops/slurm/) under a real two-node Slurm
(tests/slurm_harness.py with nodes=2: one slurmctld, two slurmd on this host, each node with
its own gpuenvd on its own two simulated GPUs, a jobs directory both nodes share, and
slurmdbd on MariaDB where Debian's are installed). Each job takes both nodes
(`-N2 --gres=gpu:1 --comment gpuenv:sm=1350`, one job at a time) and ends at random:

- complete: its step on each node exits after 0.2 s;
- scancel: cancelled while its steps run;
- slurmd_kill: one node's slurmd SIGKILLed mid-job and started again 0.5-3 s later (the job
  may end meanwhile: it stays COMPLETING until that slurmd is back);
- gpuenvd_restart: one node's gpuenvd SIGKILLed mid-job and started again before the job
  ends (what it held in memory lost), as a node's daemon restarted by its service manager.

After each job's epilogs, every GPU of both nodes is checked against its state before any
job (locked clocks, application clocks, power limit) and against its gpuenvd's leases, and
`gpuenv job JOBID` is timed gathering the job's report from the shared directory, and checked
for accounting for every GPU of the job on both nodes. Prints prolog and epilog time per run
(p50/p99) and of a job's slowest node, the gather time, and by fate how many reports held
every GPU and how many GPUs were left changed. Root, with slurm-wlm and munge installed.

    python -m benchmarks.slurm_nodes --jobs 100     # ~10 minutes on a 2-core machine
    python -m benchmarks.slurm_nodes --quick        # 8 jobs (~1 minute)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from slurm_harness import SlurmCluster, accounting_unavailable, unavailable  # noqa: E402

from benchmarks import runner  # noqa: E402
from benchmarks.slurm import pct  # noqa: E402
from gpuenv.daemon.client import Client  # noqa: E402

FATES = (("complete", 0.5), ("scancel", 0.2), ("slurmd_kill", 0.15), ("gpuenvd_restart", 0.15))
NODES = 2


def changed(slurm: SlurmCluster) -> list[str]:
    """Every GPU of every node not as it was before any job, or still under a lease."""
    bad = []
    for node in slurm.nodes:
        with Client(node.gpuenvd.socket) as c:
            leased = {g for lease in c.status()["leases"] for g in lease["gpus"]}
        for g in range(node.gpuenvd.n_gpus):
            if node.gpuenvd.truth(g) != node.gpuenvd.original[g] or g in leased:
                bad.append(f"{node.name}:{g}")
    return bad


def body(fate: str, flag: Path) -> str:
    """The job: one step on each node that says it runs, then waits as its fate needs."""
    wait = {
        "complete": "sleep 0.2",
        "scancel": "sleep 60",
        "slurmd_kill": "sleep 2",
        # until the benchmark has restarted the node's gpuenvd (bounded: 60 s)
        "gpuenvd_restart": f"for _ in $(seq 600); do [ -e {flag} ] && break; sleep 0.1; done",
    }[fate]
    return f"srun -N{NODES} --ntasks-per-node=1 bash -c 'echo \"READY $SLURMD_NODENAME\"; {wait}'"


def one_job(slurm: SlurmCluster, fate: str, rng: random.Random) -> dict:
    flag = slurm.dir / "out" / f"go-{time.monotonic_ns()}"
    jobid = slurm.sbatch(
        body(fate, flag), f"-N{NODES}", "--gres=gpu:1", "--comment", "gpuenv:sm=1350"
    )
    node = rng.choice(slurm.nodes)
    if fate != "complete":
        for n in slurm.nodes:
            slurm.wait_output(jobid, f"READY {n.name}", timeout=60)
    if fate == "scancel":
        time.sleep(rng.uniform(0, 0.5))
        slurm.cmd("scancel", jobid)
    elif fate == "slurmd_kill":
        time.sleep(rng.uniform(0, 1.0))
        slurm.kill_slurmd(node.name)
        time.sleep(rng.uniform(0.5, 3.0))
        slurm.start_slurmd(node.name)
    elif fate == "gpuenvd_restart":
        try:
            node.gpuenvd.kill()
            node.gpuenvd.start()
        finally:
            flag.touch()
    state = slurm.wait_done(jobid, timeout=120)
    return {
        "job": jobid,
        "fate": fate,
        "node": node.name if fate != "complete" else None,
        "state": state,
    }


def gather(slurm: SlurmCluster, jobid: str) -> dict:
    """`gpuenv job JOBID --json` as on any node: its wall time, and what it accounted for."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(slurm.dir / "gpuenv"), "job", jobid, "--json"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.perf_counter() - t0
    try:
        got = json.loads(done.stdout)
    except ValueError:
        return {"gather_s": took, "rc": done.returncode, "gpus": 0, "missing": {"?": done.stderr}}
    gpus = sum(len(e["report"]["gpus_report"]) for e in got["entries"].values() if "report" in e)
    gaps = sum(
        1
        for e in got["entries"].values()
        for g in e.get("report", {}).get("gpus_report", [])
        if any(f["kind"] == "telemetry_gap" for f in g["findings"])
    )
    return {
        "gather_s": took,
        "rc": done.returncode,
        "gpus": gpus,
        "missing": got["missing"],
        "gaps": gaps,
    }


def timings(slurm: SlurmCluster) -> dict[str, dict[str, list[float]]]:
    """Each job's prolog and epilog runs, in seconds: {script: {job: [one per node]}}."""
    out: dict[str, dict[str, list[float]]] = {"prolog": {}, "epilog": {}}
    path = slurm.dir / "timings.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, job, t0, t1, _rc = line.split()
        out[name].setdefault(job, []).append(float(t1) - float(t0))
    return out


def run_jobs(n_jobs: int, seed: int, accounting: bool) -> dict:
    rng = random.Random(seed)
    load_before = os.getloadavg()[0]
    slurm = SlurmCluster(
        Path(tempfile.mkdtemp(prefix="gpuenv-bench-slurm-nodes-")),
        nodes=NODES,
        accounting=accounting,
    )
    slurm.start()
    jobs: list[dict] = []
    started = time.monotonic()
    try:
        for _ in range(n_jobs):
            fate = rng.choices([f for f, _ in FATES], [w for _, w in FATES])[0]
            job = one_job(slurm, fate, rng)
            job["left_changed"] = changed(slurm)
            job.update(gather(slurm, job["job"]))
            jobs.append(job)
            print(  # progress, not the report: every job's line is in --data
                f"{len(jobs):4d} job {job['job']} {fate:15s} {job['state']:10s} "
                f"report {job['gpus']} GPUs in {job['gather_s']:.2f} s"
                + (f", missing {job['missing']}" if job["missing"] else "")
                + (f"; CHANGED {job['left_changed']}" if job["left_changed"] else "; as before"),
                file=sys.stderr,
                flush=True,
            )
        end_changed = changed(slurm)
        journals = sorted(
            f"{n.name}:{p.name}"
            for n in slurm.nodes
            for p in (n.gpuenvd.workdir / "journal").glob("*.json")
        )
        example = next(
            (j["job"] for j in reversed(jobs) if j["fate"] == "gpuenvd_restart"), jobs[-1]["job"]
        )
        shown = slurm.cmd(str(slurm.dir / "gpuenv"), "job", example, check=False)
    finally:
        slurm.close()
    return {
        "seconds": round(time.monotonic() - started, 1),
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        "accounting": accounting,
        "jobs": jobs,
        "changed_at_end": end_changed,
        "journal_at_end": journals,
        "timings_s": timings(slurm),
        "example_job": example,
        "example_report": shown,
    }


def _row(name: str, values: list[float]) -> str:
    if not values:
        return f"| {name} | 0 | - | - | - |"
    return (
        f"| {name} | {len(values)} | {statistics.median(values):.2f} s | "
        f"{pct(values, 0.99):.2f} s | {max(values):.2f} s |"
    )


def table(data: dict) -> str:
    jobs = data["jobs"]
    t = data["timings_s"]
    lines = [
        f"{len(jobs)} jobs of {NODES} nodes in {data['seconds']} s, one at a time; slurmdbd "
        + (
            "on MariaDB ran (the epilogs' AdminComment goes to it)"
            if data["accounting"]
            else "not run"
        ),
        f"Every daemon of the cluster (slurmctld, {NODES} slurmd, "
        + ("slurmdbd, MariaDB, " if data["accounting"] else "")
        + f"{NODES} gpuenvd) and every prolog and epilog share this machine's "
        f"{data['cores']} cores; the load average was {data['load_before']} before the "
        "cluster started" + (" (other work ran beside it)" if data["load_before"] >= 0.5 else ""),
        "",
        "| script | runs | p50 | p99 | max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in ("prolog", "epilog"):
        runs = t[name]
        lines.append(_row(f"{name}, each node's run", [v for per in runs.values() for v in per]))
        lines.append(
            _row(
                f"{name}, a job's slowest node",
                [max(per) for per in runs.values() if len(per) == NODES],
            )
        )
    lines.append(_row("`gpuenv job JOBID` gathering both nodes", [j["gather_s"] for j in jobs]))
    lines += [
        "",
        "| end of the job | jobs | end state | reports with every GPU of both nodes "
        "| GPUs named as lost telemetry | GPUs left changed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fate, _ in FATES:
        mine = [j for j in jobs if j["fate"] == fate]
        if not mine:
            continue
        states = sorted({j["state"] for j in mine})
        whole = sum(1 for j in mine if j["gpus"] == NODES and not j["missing"])
        lines.append(
            f"| {fate} | {len(mine)} | {', '.join(states)} | {whole} of {len(mine)} | "
            f"{sum(j.get('gaps', 0) for j in mine)} | {sum(len(j['left_changed']) for j in mine)} |"
        )
    left = sum(len(j["left_changed"]) for j in jobs)
    lines += [
        "",
        f"GPUs left changed after a job: {left} (goal 0); at the end: "
        f"{len(data['changed_at_end'])}; journal entries left: {len(data['journal_at_end'])}",
    ]
    missing = [f"job {j['job']} ({j['fate']}): {j['missing']}" for j in jobs if j["missing"]]
    if missing:
        lines += ["Reports that did not account for every node:", *missing]
    lines += [
        "",
        f"Job {data['example_job']}'s report, as `gpuenv job JOBID` prints it on any node:",
        data["example_report"],
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=100, help="jobs with a random end")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument(
        "--no-accounting", action="store_true", help="no slurmdbd, even where it is installed"
    )
    parser.add_argument("--data", type=Path, help="write the raw data here (JSON)")


def run(args: argparse.Namespace) -> int:
    why = unavailable()
    if why:
        print(f"benchmarks.slurm_nodes: cannot start a Slurm here: {why}", file=sys.stderr)
        return 2
    accounting = not args.no_accounting and accounting_unavailable() is None
    data = run_jobs(args.jobs, args.seed, accounting)
    if args.data:
        args.data.write_text(json.dumps(data, indent=1))
    print(table(data))
    for name in ("prolog", "epilog"):
        runs = [v for per in data["timings_s"][name].values() for v in per]
        if runs:
            runner.metric(f"{name}_p50_s", statistics.median(runs), "s", slack=0.05)
    runner.metric(
        "gather_p50_s", statistics.median(j["gather_s"] for j in data["jobs"]), "s", slack=0.05
    )
    left = sum(len(j["left_changed"]) for j in data["jobs"]) + len(data["changed_at_end"])
    runner.metric("gpus_left_changed", left, "GPUs")
    unaccounted = sum(1 for j in data["jobs"] if j["missing"] or j["gpus"] != NODES)
    runner.metric("reports_missing_a_node", unaccounted, "jobs")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(
        runner.main("slurm_nodes", __doc__, add_arguments, run, sim_only=True, quick={"jobs": 8})
    )
