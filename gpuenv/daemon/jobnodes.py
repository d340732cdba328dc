"""One job, all its nodes: each node's report where every node sees it, and each node's
one-line verdict in Slurm's own record of the job.

Each node's gpuenvd knows only its own GPUs (daemon/jobs.py). A job of several nodes is
gathered through a directory every node and the login node see (`GPUENV_JOBS_DIR`, a
shared file system), one file per node and job, `DIR/JOBID/NODE.json`:

- the prolog's `gpuenv job JOBID --begin` writes `{"state": "running", ...}`: the node has
  the job (its GPUs, whether it locked them);
- the epilog's `gpuenv job JOBID --publish --restored yes|no|none`, after its restore,
  replaces it by `{"state": "ended", "report": ..., "restored": ...}`: the node's judged
  report and whether its GPUs were put back.

A node the job ran on (Slurm's NodeList) whose file never says "ended" did not report, and
`gather` says why from what Slurm and the file tell: still running, its node down, its
epilog lost, or no prolog of gpuenv's ran there. Files, not each gpuenvd over the network:
a login node reaches a shared directory without a port opened on every compute node, and a
node that is down still has its file read.

Each node also writes its line into the job's AdminComment, where Princeton's jobstats keeps
its summary: the prolog's (`GPUs 0,1: locked sm=1350; running`) into slurmctld's record
(`scontrol update job=ID admincomment=...`), which `scontrol show job` shows; the epilog's
verdict into slurmdbd's (`sacctmgr update job`, as jobstats does), which `sacct -o
AdminComment` shows: slurmctld refuses any update of a job that has ended, and a node's
epilog runs after the job ended (measured with Slurm 22.05: "Job has already finished").
Nodes write one after another without a lock they share: each reads the comment, puts its
own line in (keeping every other line), writes it, and reads it back until its line is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuenv.daemon.jobs import check_job_id
from gpuenv.errors import ConfigError, FileError
from gpuenv.timebase import REAL_CLOCK, Clock

ENV = "GPUENV_JOBS_DIR"
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RESTORED = {
    "yes": "restored",
    "no": "NOT restored",
    "none": "nothing to restore",
}
SEP = " | "  # between the lines of AdminComment: one per node, and whatever others wrote
DOWN = ("DOWN", "NOT_RESPONDING", "FAIL", "POWERED_DOWN", "REBOOT")


def node_name() -> str:
    """This node as Slurm names it: SLURMD_NODENAME in a prolog or epilog, else the short host
    name (Slurm's default NodeName)."""
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if not NODE.match(name):
        raise ConfigError(f"{name!r:.70} is not a node name", hint="set SLURMD_NODENAME")
    return name


def jobs_dir(value: str | None = None) -> Path | None:
    """The shared directory: `value` (an option), else GPUENV_JOBS_DIR; None where neither."""
    value = value if value is not None else os.environ.get(ENV)
    return Path(value) if value else None


# -- what the prolog and the epilog write ----------------------------------------------------


def publish_begun(
    directory: Path,
    job: str,
    node: str,
    gpus: list[int],
    lock: str,
    *,
    clock: Clock = REAL_CLOCK,
) -> None:
    """The prolog's mark: `node` has job `job` on `gpus` (written at `clock`'s wall time)."""
    entry = {"state": "running", "gpus": gpus, "lock": lock}
    _write(directory, job, node, entry, clock.wall())


def begun(
    directory: Path | None, job: str, gpus: list[int], lock: str, *, clock: Clock = REAL_CLOCK
) -> None:
    """The prolog's: this node's mark where the other nodes see it (where there is a shared
    directory), and its line in the job's AdminComment."""
    node = node_name()
    if directory is not None:
        publish_begun(directory, job, node, gpus, lock, clock=clock)
    set_admin_comment(job, node, begun_line(node, gpus, lock), directory=directory, clock=clock)


def publish_ended(
    directory: Path,
    job: str,
    node: str,
    report: dict[str, Any],
    restored: str,
    *,
    clock: Clock = REAL_CLOCK,
) -> None:
    """The epilog's: the node's judged report and whether its GPUs were put back."""
    entry = {"state": "ended", "report": report, "restored": restored}
    _write(directory, job, node, entry, clock.wall())


def _write(directory: Path, job: str, node: str, entry: dict[str, Any], written: float) -> None:
    from gpuenv._files import open_dir, replace_at

    job = check_job_id(job)
    if not NODE.match(node):
        raise ConfigError(f"{node!r:.70} is not a node name", hint="set SLURMD_NODENAME")
    data = json.dumps({"job": job, "node": node, "written": written, **entry}).encode()
    try:
        # readable by everyone (a user's `gpuenv job` reads it), written by root alone
        fd = open_dir(directory / job, create=True, mode=0o755, own=False, what="the jobs dir")
        try:
            replace_at(fd, f"{node}.json", data, mode=0o644)
        finally:
            os.close(fd)
    except OSError as err:
        raise FileError.from_os_error(
            err, path=directory / job, where="the shared jobs directory", setting=ENV
        ) from err


# -- what `gpuenv job JOBID` reads -----------------------------------------------------------


def gather(directory: Path, job: str) -> dict[str, Any]:
    """Every node's entry for `job`, and why each node of the job (Slurm's NodeList) that did
    not report did not. Raises ConfigError where neither the directory nor Slurm knows it."""
    job = check_job_id(job)
    entries: dict[str, dict[str, Any]] = {}
    folder = directory / job
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            entry = json.loads(path.read_text())
            if isinstance(entry, dict) and entry.get("node") == path.stem:
                entries[path.stem] = entry
    slurm = slurm_job(job)
    nodes = hostnames(slurm.get("NodeList", "")) if slurm else []
    if not entries and not nodes:
        raise ConfigError(
            f"no node has reported job {job} in {folder}, and Slurm does not know it",
            hint="check the job id; the prolog and epilog write there only where "
            f"{ENV} is set in /etc/default/gpuenv-slurm on the nodes",
        )
    state = slurm.get("JobState", "") if slurm else ""
    missing = {
        n: _why(entries.get(n), state, n)
        for n in sorted(set(nodes) | set(entries))
        if entries.get(n, {}).get("state") != "ended"
    }
    return {
        "job": job,
        "job_state": state or None,
        "nodes": nodes,
        "entries": entries,
        "missing": missing,
    }


def _why(entry: dict[str, Any] | None, job_state: str, node: str) -> str:
    node_state = slurm_node_state(node)
    if any(s in node_state for s in DOWN):
        down = f"node down ({node_state})"
        return f"{down}: its epilog has not reported" if entry else down
    if "COMPLETING" in job_state:
        return "its epilog has not finished"
    if job_state in ("RUNNING", "CONFIGURING", "SUSPENDED"):
        return "the job is still running there"
    if entry is None:
        return "no gpuenv prolog recorded the job there (no gpuenvd, or GPUENV_JOBS_DIR unset)"
    return "its epilog lost the report (the prolog recorded the job; no epilog reported)"


# -- Slurm -----------------------------------------------------------------------------------


def _run(*args: str) -> str | None:
    """A Slurm command's output; None where it failed or is not installed."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _scontrol(*args: str) -> str | None:
    return _run("scontrol", *args)


def fields(line: str) -> dict[str, str]:
    """scontrol's one-line KEY=VALUE list (-o); a value may hold spaces (Reason, Comment)."""
    parts = re.split(r"\s+(?=[A-Z][A-Za-z:/_]*=)", line.strip())
    return dict(p.split("=", 1) for p in parts if "=" in p)


def slurm_job(job: str) -> dict[str, str]:
    """`scontrol show job -o JOB`; empty where Slurm no longer knows it (MinJobAge)."""
    out = _scontrol("show", "job", "-o", job)
    return fields(out) if out else {}


def hostnames(nodelist: str) -> list[str]:
    """gpunode[0-1] -> gpunode0, gpunode1 (`scontrol show hostnames`)."""
    if not nodelist or nodelist == "(null)":
        return []
    out = _scontrol("show", "hostnames", nodelist)
    return out.split() if out else [nodelist]


def slurm_node_state(node: str) -> str:
    out = _scontrol("show", "node", "-o", node)
    return fields(out).get("State", "") if out else ""


def admin_line(node: str, report: dict[str, Any], restored: str) -> str:
    """The epilog's line: `gpuenv NODE GPUs 0,1: locked sm=1350; lock held; ...; ok; restored`."""
    verdict = str(report["verdict"]).removeprefix(f"gpuenv: job {report['job']} ")
    return f"gpuenv {node} {verdict}; {RESTORED[restored]}"


def begun_line(node: str, gpus: list[int], lock: str) -> str:
    """The prolog's line, until the epilog's: `gpuenv NODE GPUs 0,1: locked sm=1350; running`."""
    return f"gpuenv {node} GPUs {','.join(str(g) for g in gpus)}: {lock}; running"


def _ctld_read(job: str) -> str:
    return slurm_job(job).get("AdminComment", "")


def _ctld_write(job: str, text: str) -> bool:
    return _scontrol("update", f"job={job}", f"admincomment={text}") is not None


def _dbd_read(job: str) -> str:
    out = _run("sacct", "-j", job, "-X", "-n", "-P", "-o", "AdminComment")
    return out.splitlines()[0] if out else ""


def _dbd_write(job: str, text: str) -> bool:
    where = ("where", f"jobid={job}", "set", f"AdminComment={text}")
    return _run("sacctmgr", "-i", "update", "job", *where) is not None


# slurmctld's record takes an AdminComment only while the job has not ended (a node's epilog
# runs after: refused, "Job has already finished"); slurmdbd's, where it runs, after too
STORES = {"slurmctld": (_ctld_read, _ctld_write), "slurmdbd": (_dbd_read, _dbd_write)}


def set_admin_comment(
    job: str,
    node: str,
    line: str,
    *,
    tries: int = 5,
    directory: Path | None = None,
    clock: Clock = REAL_CLOCK,
) -> str | None:
    """Put `line` into job `job`'s AdminComment in place of this node's earlier line, keeping
    every other: in slurmctld's record while the job runs, else in slurmdbd's. Returns which
    kept it (read back), None where neither took it or other nodes' writes kept taking it out.

    Slurm has no compare-and-set for it: two nodes that read before either writes lose one
    line (two epilogs at once did, 2 runs in 7 of the 2-node test). With the shared jobs
    `directory`, the nodes take turns under a lock file there; without one, each read back
    and retries."""
    with _turn(directory, job):
        # sacctmgr before Slurm 23.02 stores the comment lower-cased: lines compare as such
        mine, wanted = f"gpuenv {node} ".lower(), line.lower()
        for store, (read, write) in STORES.items():
            for _ in range(tries):
                kept = [p for p in read(job).split(SEP) if p and p != "(null)"]
                kept = [p for p in kept if not p.lower().startswith(mine)]
                if not write(job, SEP.join([*kept, line])):
                    break  # this store refuses it: the next one
                # another node may have read before our write and write after it
                clock.sleep(0.05 + random.random() * 0.1)
                if wanted in [p.lower() for p in read(job).split(SEP)]:
                    return store
        return None


@contextlib.contextmanager
def _turn(directory: Path | None, job: str) -> Iterator[None]:
    """This node's turn at job `job`'s AdminComment: an exclusive lock on a file in the job's
    folder of the shared directory (flock; NFS carries it as a POSIX lock), or nothing where
    there is no directory or it cannot be had (the read-back retries are then the guard)."""
    import fcntl

    from gpuenv._files import open_dir

    if directory is None:
        yield
        return
    fd = None
    try:
        dfd = open_dir(directory / check_job_id(job), create=True, mode=0o755, own=False)
        try:
            fd = os.open(
                ".admincomment.lock",
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dfd,
            )
        finally:
            os.close(dfd)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock
