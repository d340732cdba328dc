#!/usr/bin/env python3
"""Slurm's prolog and epilog: time per job, and GPUs any job left changed (goal 0).

gpuenv's prolog and epilog (gpuenv/ops/slurm/) under a real one-node Slurm (tests/slurm_harness.py:
munged, slurmctld, slurmd, two simulated GPUs, gpuenvd): many locked jobs, each ended at
random by completing, scancel, slurmd SIGKILLed and restarted, or its time limit. Prints
the prolog and epilog time per job (p50/p99) and how many GPUs any job left changed
(goal 0); --data keeps the raw data as JSON. Root, with slurm-wlm and munge installed.

    python -m benchmarks.slurm --jobs 100 --data slurm_jobs.json   # ~4 minutes
    python -m benchmarks.slurm --quick                             # 10 jobs, no time limit (~30 s)

Jobs take one GPU each (`--gres=gpu:1 --comment gpuenv:sm=1350`), one at a time beside the
time-limit jobs (a job is killed at its limit only on slurmctld's 30 s check, ~60-90 s after
it starts, so they run beside the others, one after another). After each job's epilog its
GPU is checked against the state before any job: settings (locked clocks, application
clocks, power limit) and gpuenvd's leases; at the end, both GPUs and the daemon's journal.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from slurm_harness import SlurmCluster, unavailable  # noqa: E402

from benchmarks import runner  # noqa: E402
from gpuenv.daemon.client import Client  # noqa: E402

FATES = (("complete", 0.6), ("scancel", 0.25), ("slurmd_kill", 0.15))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def job_gpus(slurm: SlurmCluster, jobid: str) -> list[int]:
    found = re.search(r"GPUS=([0-9,]+)", slurm.output(jobid))
    return [int(g) for g in found.group(1).split(",")] if found else []


def changed(slurm: SlurmCluster, gpus: list[int], ignore: set[int]) -> list[int]:
    """The GPUs of `gpus` not as they were before any job, or still under a lease."""
    with Client(slurm.gpuenvd.socket) as c:
        leased = {g for lease in c.status()["leases"] for g in lease["gpus"]}
    return [
        g
        for g in gpus
        if g not in ignore and (slurm.gpuenvd.truth(g) != slurm.gpuenvd.original[g] or g in leased)
    ]


def one_job(slurm: SlurmCluster, fate: str, rng: random.Random) -> dict:
    body = 'echo "GPUS=$SLURM_JOB_GPUS"; echo READY; ' + (
        "sleep 0.2" if fate == "complete" else "sleep 60" if fate == "scancel" else "sleep 2"
    )
    jobid = slurm.sbatch(body, "--gres=gpu:1", "--comment", "gpuenv:sm=1350")
    if fate != "complete":
        slurm.wait_output(jobid, "READY", timeout=60)
    if fate == "scancel":
        time.sleep(rng.uniform(0, 0.5))
        slurm.cmd("scancel", jobid)
    elif fate == "slurmd_kill":
        time.sleep(rng.uniform(0, 1.0))
        slurm.kill_slurmd()
        time.sleep(rng.uniform(0.5, 3.0))  # the job may end meanwhile: COMPLETING until back
        slurm.start_slurmd()
    state = slurm.wait_done(jobid, timeout=120)
    return {"job": jobid, "fate": fate, "state": state, "gpus": job_gpus(slurm, jobid)}


def lost_epilogs(slurm: SlurmCluster) -> tuple[list[str], list[str]]:
    """Jobs whose epilog never ran (the next job's prolog put their GPUs back), and jobs that
    asked for a lock and did not get it (gpuenvd's reports): a stale lock would show there."""
    log = slurm.records / "gpuenv-slurm.log"
    lost = re.findall(r"job (\S+)'s epilog never ran", log.read_text() if log.exists() else "")
    unlocked = []
    for path in (slurm.gpuenvd.workdir / "journal" / "jobs").glob("*.json"):
        report = json.loads(path.read_text())
        if report["lock"] != "not asked" and not report["lock"].startswith("locked"):
            unlocked.append(report["job"])
    return lost, sorted(unlocked, key=int)


def timings(slurm: SlurmCluster) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"prolog": [], "epilog": []}
    path = slurm.dir / "timings.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _job, t0, t1, _rc = line.split()
        out[name].append(float(t1) - float(t0))
    return out


def run_jobs(n_jobs: int, n_timeouts: int, seed: int) -> dict:
    rng = random.Random(seed)
    slurm = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpuenv-bench-slurm-")))
    slurm.start()
    jobs: list[dict] = []
    left: list[dict] = []
    timeout_job: dict | None = None
    started = time.monotonic()
    try:
        for _ in range(n_jobs):
            if timeout_job is None and n_timeouts:
                n_timeouts -= 1
                body = 'echo "GPUS=$SLURM_JOB_GPUS"; echo READY; sleep 300'
                jid = slurm.sbatch(body, "--gres=gpu:1", "--time=1", "--comment", "gpuenv:sm=1410")
                slurm.wait_output(jid, "READY", timeout=60)
                timeout_job = {"job": jid, "fate": "time_limit", "gpus": job_gpus(slurm, jid)}
            if timeout_job is not None and slurm.job_state(timeout_job["job"]) not in (
                "RUNNING",
                "PENDING",
                "CONFIGURING",
            ):
                timeout_job["state"] = slurm.wait_done(timeout_job["job"], timeout=120)
                jobs.append(timeout_job)
                bad = changed(slurm, timeout_job["gpus"], set())
                left += [{"job": timeout_job["job"], "gpus": bad}] if bad else []
                timeout_job = None
            fate = rng.choices([f for f, _ in FATES], [w for _, w in FATES])[0]
            job = one_job(slurm, fate, rng)
            jobs.append(job)
            busy = set(timeout_job["gpus"]) if timeout_job else set()
            bad = changed(slurm, job["gpus"], busy)
            left += [{"job": job["job"], "gpus": bad}] if bad else []
            print(
                f"{len(jobs):4d} job {job['job']} {fate:12s} {job['state']:10s} "
                f"GPU {job['gpus']} {'CHANGED ' + str(bad) if bad else 'as before'}",
                flush=True,
            )
        if timeout_job is not None:
            timeout_job["state"] = slurm.wait_done(timeout_job["job"], timeout=150)
            jobs.append(timeout_job)
            bad = changed(slurm, timeout_job["gpus"], set())
            left += [{"job": timeout_job["job"], "gpus": bad}] if bad else []
        end_changed = changed(slurm, [0, 1], set())
        # one job's report as `gpuenv job JOBID` prints it on the node: a 3 s job, 2 GPUs
        jid = slurm.sbatch("sleep 3", "--gres=gpu:2", "--comment", "gpuenv:sm=1350")
        slurm.wait_done(jid)
        example = slurm.cmd(str(slurm.dir / "gpuenv"), "job", jid)
        journal = sorted(p.name for p in (slurm.gpuenvd.workdir / "journal").glob("*.json"))
        lost, unlocked = lost_epilogs(slurm)
    finally:
        slurm.close()
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}",
        "seconds": round(time.monotonic() - started, 1),
        "jobs": jobs,
        "left_changed_after_job": left,
        "changed_at_end": end_changed,
        "journal_at_end": journal,
        "epilogs_lost": lost,
        "asked_but_not_locked": unlocked,
        "timings_s": timings(slurm),
        "example_report": example,
    }


def table(data: dict) -> str:
    fates: dict[str, int] = {}
    for job in data["jobs"]:
        fates[f"{job['fate']} ({job.get('state', '?')})"] = (
            fates.get(f"{job['fate']} ({job.get('state', '?')})", 0) + 1
        )
    t = data["timings_s"]
    lines = [
        f"{len(data['jobs'])} jobs in {data['seconds']} s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(fates.items())),
        "",
        "| script | runs | p50 | p99 | max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in ("prolog", "epilog"):
        v = t[name]
        if v:
            lines.append(
                f"| {name} | {len(v)} | {statistics.median(v):.2f} s | "
                f"{pct(v, 0.99):.2f} s | {max(v):.2f} s |"
            )
    lines += [
        "",
        f"GPUs left changed after a job: {len(data['left_changed_after_job'])} "
        f"(goal 0); at the end: {len(data['changed_at_end'])}; journal entries left: "
        f"{len(data['journal_at_end'])}",
        f"Epilogs Slurm never ran (put back at the next job's start): {len(data['epilogs_lost'])}; "
        f"jobs that asked and were not locked: {len(data['asked_but_not_locked'])}",
        "",
        "One job's report, as `gpuenv job JOBID` prints it on the node:",
        data.get("example_report", ""),
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=100, help="jobs with a random end")
    parser.add_argument("--time-limit-jobs", type=int, default=2, help="jobs ended at their limit")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--data", type=Path, help="write the raw data here (JSON)")


def run(args: argparse.Namespace) -> int:
    why = unavailable()
    if why:
        print(f"benchmarks.slurm: cannot start a Slurm here: {why}", file=sys.stderr)
        return 2
    data = run_jobs(args.jobs, args.time_limit_jobs, args.seed)
    if args.data:
        args.data.write_text(json.dumps(data, indent=1))
    print(table(data))
    t = data["timings_s"]
    for name in ("prolog", "epilog"):
        if t[name]:
            runner.metric(f"{name}_p50_s", statistics.median(t[name]), "s", slack=0.05)
    runner.metric("gpus_left_changed", len(data["left_changed_after_job"]), "GPUs")
    return 0 if not data["left_changed_after_job"] and not data["changed_at_end"] else 1


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "slurm",
            __doc__,
            add_arguments,
            run,
            sim_only=True,
            quick={"jobs": 10, "time_limit_jobs": 0},
        )
    )
