"""A real Slurm for tests and benchmarks/slurm.py: munged, slurmctld and one slurmd per node
on 127.0.0.1, everything in a temp dir (no systemd); each node with two simulated GPUs declared
in gres.conf (character devices the harness makes), its own gpuenvd serving them (sim backend,
its own state file and socket in the temp dir), and the Slurm prolog and epilog gpuenv ships
(gpuenv/ops/slurm/) as every node's Prolog and Epilog.

Several nodes are several slurmd on this one host, each started as `slurmd -N NODE` and
listening on its own `Port=` (Debian's slurm-wlm is built with multiple-slurmd support):
measured here, two nodes reach IDLE as fast as one, and a 2-node `sbatch -N2` runs both
nodes' prologs and epilogs in ~0.4 s. Network namespaces (ip netns + veth) also work here
as root, but would add routes, addresses and a cleanup that can leak namespaces, for no
difference Slurm can see: slurmctld tells nodes apart by name and port, and each node's
prolog talks only to its own gpuenvd (its wrapper below sets the node's socket). What
nodes share here and would not on a cluster: the file system (each node's records go to
its own directory) and the host name (each node runs as NodeHostname=this host).

Not a test module: helpers only. What a one-machine Slurm does and needs was measured in
shared/SLURM_FACTS.md; the reasons for each setting below come from there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from daemon_harness import DaemonProcess

from gpuenv import ops

PROLOG = ops.packaged("prolog")  # the copies `gpuenv ops install prolog epilog` installs
EPILOG = ops.packaged("epilog")
NODE = "gpunode0"
ENDED = ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "NODE_FAIL")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "srun", "mknod")
# slurmdbd on MariaDB (Debian's slurmdbd and mariadb-server): jobs' records after they end
DB_TOOLS = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")


def unavailable() -> str | None:
    """Why a Slurm cannot be started here, or None when it can."""
    if os.geteuid() != 0:  # first: an ordinary account's PATH has no /usr/sbin, where they are
        return "slurmd runs prologs as root and makes device files: needs root (CI runs as root)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; .ci/run does)"
    return None


def _marks() -> list[Any]:
    import pytest

    return [
        pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
        pytest.mark.xdist_group("slurm"),  # one worker under -n: one cluster a session, in order
    ]


# every Slurm module's pytestmark: skipped, saying why, where a Slurm cannot start
MARKS = _marks()


def accounting_unavailable() -> str | None:
    """Why slurmdbd cannot run here, or None when it can."""
    missing = [t for t in DB_TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurmdbd mariadb-server)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_lines(nodes: list[str]) -> str:
    """One NodeName line per node; several share this host, each on its own slurmd port."""
    host = socket.gethostname()
    port = (lambda: f" Port={_free_port()}") if len(nodes) > 1 else (lambda: "")
    return "".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1{port()} CPUs=2 Gres=gpu:2 "
        "State=UNKNOWN\n"
        for n in nodes
    )


def _down_after(d: Path, nodes: list[str]) -> str:
    """Several nodes: a node whose slurmd stops answering is DOWN within ~10 s, not Slurm's
    default 300 s (a test of a node down waits for it); each task gets its node's simulated
    GPUs from the TaskProlog (SlurmCluster.task_prolog)."""
    return f"SlurmdTimeout=6\nTaskProlog={d}/taskprolog\n" if len(nodes) > 1 else ""


def _accounting(d: Path, dbd_port: int | None) -> str:
    if dbd_port is None:
        return "AccountingStorageType=accounting_storage/none\n"
    # the munge socket that reaches slurmdbd is AccountingStoragePass's, not AuthInfo's
    return (
        "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
        f"AccountingStoragePort={dbd_port}\nAccountingStoragePass={d}/munge/munge.socket\n"
    )


def _dbd_conf(d: Path, dbd_port: int, db_port: int) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
LogFile={d}/slurmdbd.log
PidFile={d}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=root
StorageLoc=slurm_acct_db
"""


def _conf(d: Path, ctld_port: int, slurmd_port: int, nodes: list[str], dbd_port: int | None) -> str:
    return f"""\
ClusterName=gpuenvtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
{_accounting(d, dbd_port)}SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
KillWait=2
{_down_after(d, nodes)}MinJobAge=300
Prolog={d}/prolog
Epilog={d}/epilog
PrologFlags=Alloc
{_node_lines(nodes)}\
PartitionName=gpu Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _fields(line: str) -> dict[str, str]:
    """scontrol's one-line KEY=VALUE list; a value may hold spaces (Reason, Comment)."""
    return dict(
        f.split("=", 1) for f in re.split(r"\s+(?=[A-Za-z][A-Za-z:/_]*=)", line.strip()) if "=" in f
    )


class Node:
    """One slurmd's node: its name, its gpuenvd (its own simulated GPUs), the directory its
    prolog keeps its records in (GPUENV_SLURM_STATE), and the environment a site gives its
    prolog and epilog."""

    def __init__(self, name: str, gpuenvd: DaemonProcess, records: Path, gpuenv: Path):
        self.name = name
        self.gpuenvd = gpuenvd
        self.records = records
        # what a site puts in the prolog's environment (slurmd gives prologs only SLURM_*)
        self.env = {
            k: v for k, v in gpuenvd.env.items() if k.startswith("GPUENV_") or k == "PYTHONPATH"
        }
        self.env.update(GPUENV=str(gpuenv), GPUENV_SLURM_STATE=str(records))
        self.env.pop("GPUENV_STATE_DIR", None)  # the daemon's journal is the daemon's


class SlurmCluster:
    """`nodes` nodes (gpunode0, gpunode1, ...): start(), submit jobs, kill and restart a
    slurmd, close(). One node keeps its files where the one-node harness always had them."""

    def __init__(
        self,
        workdir: Path,
        *,
        strict: bool = False,
        nodes: int = 1,
        accounting: bool = False,
        config: str | None = None,
    ):
        """`config`: every node's gpuenvd config (default: DaemonProcess's, this account may
        lock every GPU)."""
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # munged refuses a socket directory that is not world-executable
        gpuenv = self.dir / "gpuenv"
        gpuenv.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuenv "$@"\n')
        gpuenv.chmod(0o755)
        self.nodes: list[Node] = []
        for i in range(nodes):
            home = self.dir if nodes == 1 else self.dir / "nodes" / f"gpunode{i}"
            # each node a machine of its own: its GPUs' UUIDs differ from the others' (seed)
            gpuenvd = DaemonProcess(home / "gpuenvd", n_gpus=2, seed=i, config=config)
            self.nodes.append(Node(f"gpunode{i}", gpuenvd, home / "jobs", gpuenv))
        if nodes > 1:  # what a cluster's shared file system is: here one directory all see
            for node in self.nodes:
                node.env["GPUENV_JOBS_DIR"] = str(self.dir / "shared-jobs")
        self.gpuenvd = self.nodes[0].gpuenvd
        self.records = self.nodes[0].records
        self.node_env = self.nodes[0].env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = self.dir / "slurm.conf"
        self.strict = strict
        self.accounting = accounting  # slurmdbd on MariaDB: sacct, and AdminComment after jobs
        self.db_port = 0
        # Slurm's commands and `gpuenv job` from here: as on the first node
        self.env = {**os.environ, **self.node_env, "SLURM_CONF": str(self.conf)}

    # -- set-up ----------------------------------------------------------------------------

    def _write(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "dev", "out"):
            (d / sub).mkdir(exist_ok=True)
        (d / "munge").chmod(0o755)
        (d / "out").chmod(0o777)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        gres = []
        for i, node in enumerate(self.nodes):
            (d / "spool" / node.name).mkdir(exist_ok=True)
            devs = [2 * i, 2 * i + 1]  # each node its own two devices; slurmd numbers them 0,1
            for n in devs:
                dev = d / "dev" / f"nvidia{n}"
                if not dev.exists():  # NVIDIA's own numbers: slurmd wants character devices
                    subprocess.run(["mknod", str(dev), "c", "195", str(n)], check=True)
            gres.append(f"NodeName={node.name} Name=gpu File={d}/dev/nvidia[{devs[0]}-{devs[1]}]\n")
        (d / "gres.conf").write_text("".join(gres))
        names = [n.name for n in self.nodes]
        dbd_port = _free_port() if self.accounting else None
        self.conf.write_text(_conf(d, _free_port(), _free_port(), names, dbd_port))
        if dbd_port is not None:  # slurmdbd reads it beside SLURM_CONF; only its user may
            self.db_port = _free_port()
            dbd = d / "slurmdbd.conf"
            dbd.write_text(_dbd_conf(d, dbd_port, self.db_port))
            dbd.chmod(0o600)
        self.set_scripts(PROLOG, EPILOG)
        if len(self.nodes) > 1:
            self._replace(d / "taskprolog", self.task_prolog())

    def task_prolog(self) -> str:
        """The TaskProlog: slurmstepd runs it before each task, as the job's user, and sets
        the task's environment from its `export NAME=VALUE` lines. A job's environment is its
        submitter's (the first node's here): this gives each task its own node's simulated
        GPUs and gpuenvd, as a real node's tasks see that node's GPUs."""
        keys = ("GPUENV_SIM_STATE", "GPUENV_SIM_SEED", "GPUENV_SIM_GPUS", "GPUENV_SOCKET")
        cases = "".join(
            f"  {node.name})\n"
            + "".join(f"    echo 'export {k}={node.gpuenvd.env[k]}'\n" for k in keys)
            + "    ;;\n"
            for node in self.nodes
        )
        return f'#!/bin/bash\ncase "$SLURMD_NODENAME" in\n{cases}esac\n'

    def set_scripts(
        self, prolog: Path, epilog: Path, *, only: tuple[str, ...] = (), **extra: str
    ) -> None:
        """Every node's Prolog/Epilog (`only` those nodes', the others' the shipped ones):
        `prolog`/`epilog` run by a wrapper that gives them the site's environment of the node
        slurmd runs it for (SLURMD_NODENAME)."""
        strict = {"GPUENV_SLURM_STRICT": "1"} if self.strict else {}
        timings = self.dir / "timings.log"
        for name, mine in (("prolog", prolog), ("epilog", epilog)):
            for node in self.nodes:
                shipped = PROLOG if name == "prolog" else EPILOG
                script = mine if not only or node.name in only else shipped
                env = {**node.env, **strict, **extra}
                exports = "".join(f"export {k}='{v}'\n" for k, v in sorted(env.items()))
                # each run's start, end and exit status: benchmarks/slurm.py's times
                self._replace(
                    self.dir / f"{name}.{node.name}",
                    f"#!/bin/bash\n{exports}t0=$(date +%s.%N)\nbash {script}\nrc=$?\n"
                    f'echo "{name} $SLURM_JOB_ID $t0 $(date +%s.%N) $rc" >> {timings}\n'
                    "exit $rc\n",
                )
            self._replace(
                self.dir / name, f'#!/bin/bash\nexec {self.dir}/{name}."$SLURMD_NODENAME"\n'
            )

    @staticmethod
    def _replace(path: Path, text: str) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)  # slurmd may be running one right now

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.dir / f"{name}.out", "ab") as log:
            self.procs[name] = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=log, start_new_session=True
            )

    def start(self, timeout: float = 30.0) -> None:
        self._write()
        for node in self.nodes:
            node.gpuenvd.start()
        d = self.dir
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--socket={d}/munge/munge.socket",
                f"--key-file={d}/munge/munge.key",
                f"--pid-file={d}/munge/munged.pid",
                f"--log-file={d}/munge/munged.log",
                f"--seed-file={d}/munge/munged.seed",
            ],
        )
        self._wait(lambda: (d / "munge" / "munge.socket").exists(), 10, "munged")
        if self.accounting:
            self._start_slurmdbd()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self.start_slurmd(node.name)
        for node in self.nodes:
            self._wait(
                lambda n=node.name: self.node_state(n) in ("IDLE", "MIXED", "ALLOCATED"),  # type: ignore[misc]
                timeout,
                f"node {node.name}",
            )

    def _start_slurmdbd(self) -> None:
        """MariaDB in the temp dir (its own datadir, socket and port), then slurmdbd on it,
        and the cluster registered before slurmctld starts."""
        d = self.dir
        subprocess.run(
            [
                "mariadb-install-db",
                "--user=root",
                f"--datadir={d}/db",
                "--skip-test-db",
                "--auth-root-authentication-method=normal",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={d}/db",
                f"--socket={d}/db.sock",
                f"--port={self.db_port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={d}/db.pid",
                "--innodb-buffer-pool-size=32M",
                "--skip-log-bin",
            ],
        )
        self._wait(lambda: (d / "db.sock").exists(), 30, "mariadbd")
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(self._dbd_up, 30, "slurmdbd")
        self.cmd("sacctmgr", "-i", "add", "cluster", "gpuenvtest")

    def _dbd_up(self) -> bool:
        done = subprocess.run(
            ["sacctmgr", "-n", "list", "cluster"], env=self.env, capture_output=True, timeout=30
        )
        return done.returncode == 0

    def start_slurmd(self, node: str = NODE) -> None:
        self._spawn(self._slurmd(node), ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    def _slurmd(self, node: str) -> str:
        return "slurmd" if node == NODE else f"slurmd-{node}"

    def kill_slurmd(self, node: str = NODE) -> None:
        """SIGKILL a node's slurmd (its job steps carry on under slurmstepd) and reap it."""
        proc = self.procs.pop(self._slurmd(node))
        proc.kill()
        proc.wait(timeout=10)

    def _wait(self, ready, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{what} not ready within {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        names = ["slurmctld.log", *(f"slurmd-{n.name}.log" for n in self.nodes)]
        for name in (*names, "slurmd.out", "slurmctld.out"):
            path = self.dir / name
            if path.exists():
                out.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def close(self) -> None:
        slurmds = [self._slurmd(n.name) for n in self.nodes]
        # jobs first: a job's slurmstepd outlives slurmd (that is how a job survives a slurmd
        # restart), so a job still running would outlive the cluster
        if "slurmctld" in self.procs and all(s in self.procs for s in slurmds):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.cmd("scancel", "--partition=gpu", check=False)
                self._wait(lambda: not self.cmd("squeue", "-h", check=False), 20, "jobs to end")
        # every slurmd before slurmctld: the other order can hang slurmd on an epilog message;
        # slurmctld before slurmdbd, which takes its last records, before its database
        for name in (*slurmds, "slurmctld", "slurmdbd", "mariadbd", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for node in self.nodes:
            node.gpuenvd.close()

    # -- Slurm commands --------------------------------------------------------------------

    def cmd(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}\n{self.logs()}")
        return done.stdout.strip()

    def node(self, name: str = NODE) -> dict[str, str]:
        return _fields(self.cmd("scontrol", "show", "node", name, "-o", check=False))

    def node_state(self, name: str = NODE) -> str:
        return self.node(name).get("State", "?")

    def resume(self, name: str = NODE) -> None:
        self.cmd("scontrol", "update", f"nodename={name}", "state=resume", check=False)

    def sbatch(self, script: str, *opts: str) -> str:
        """Submit `script` (a shell body); its output goes to out/JOBID.out. Returns the id."""
        body = self.dir / "out" / f"job-{time.monotonic_ns()}.sh"
        body.write_text("#!/bin/bash\n" + script + "\n")
        return self.cmd(
            "sbatch",
            "--parsable",
            "-o",
            f"{self.dir}/out/%j.out",
            f"--chdir={self.dir}/out",
            *opts,
            str(body),
        ).split(";")[0]

    def job(self, jobid: str) -> dict[str, str]:
        return _fields(self.cmd("scontrol", "show", "job", jobid, "-o", check=False))

    def job_state(self, jobid: str) -> str:
        return self.job(jobid).get("JobState", "?")

    def wait_state(self, jobid: str, states: tuple[str, ...], timeout: float = 60) -> str:
        self._wait(lambda: self.job_state(jobid) in states, timeout, f"job {jobid} {states}")
        return self.job_state(jobid)

    def wait_done(self, jobid: str, timeout: float = 60, ended: tuple[str, ...] = ENDED) -> str:
        """The job's end state, once its epilog has run (no longer COMPLETING)."""
        state = self.wait_state(jobid, ended, timeout)
        self._wait(
            lambda: (
                "COMPLETING" not in self.job(jobid).get("JobState", "")
                and not self._completing(jobid)
            ),
            timeout,
            f"job {jobid} epilog",
        )
        return state

    def _completing(self, jobid: str) -> bool:
        out = self.cmd("squeue", "-h", "-t", "CG", "-o", "%i", check=False)
        return jobid in out.split()

    def output(self, jobid: str) -> str:
        path = self.dir / "out" / f"{jobid}.out"
        return path.read_text() if path.exists() else ""

    def wait_output(self, jobid: str, text: str, timeout: float = 30) -> str:
        self._wait(lambda: text in self.output(jobid), timeout, f"job {jobid} to print {text!r}")
        return self.output(jobid)


def started(what: str, **kwargs: Any) -> Iterator[SlurmCluster]:
    """A module fixture's body: a cluster (SlurmCluster's `kwargs`) started in a fresh temp
    dir, yielded, stopped and removed; the module skipped where it cannot start. The dir is not
    under pytest's 0700 temp root: jobs of another account write their output there."""
    import pytest

    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpuenv-slurm-")), **kwargs)
    try:
        cluster.start()
    except (RuntimeError, OSError) as err:
        cluster.close()
        pytest.skip(f"{what} could not start here: {str(err)[:300]}")
    yield cluster
    cluster.close()
    shutil.rmtree(cluster.dir, ignore_errors=True)


# -- the one-node cluster's jobs (tests/test_slurm.py, tests/test_slurm_timelimit.py) -------

# the job prints its GPUs and what `gpuenv status` says, then marks that it is running
SHOW = 'echo "GPUS=$SLURM_JOB_GPUS"; "$GPUENV" status -i "$SLURM_JOB_GPUS"; echo READY; '


def job_gpus(slurm: SlurmCluster, jobid: str) -> list[int]:
    found = re.search(r"GPUS=([0-9,]+)", slurm.wait_output(jobid, "GPUS="))
    assert found, slurm.output(jobid)
    return [int(g) for g in found.group(1).split(",")]


def assert_locked_in_job(slurm: SlurmCluster, jobid: str, sm: int) -> list[int]:
    """The job saw its GPUs locked at `sm` by the prolog (through gpuenvd), and they are now."""
    out = slurm.wait_output(jobid, "READY")
    gpus = job_gpus(slurm, jobid)
    for g in gpus:
        assert f"GPU {g}: locked (SM {sm} MHz)" in out and "via gpuenvd" in out, out
        assert slurm.gpuenvd.truth(g)[0] == (sm, sm)
    return gpus


def assert_as_before(slurm: SlurmCluster, gpus: list[int]) -> None:
    from gpuenv.daemon.client import Client

    for g in gpus:
        assert slurm.gpuenvd.truth(g) == slurm.gpuenvd.original[g], (g, slurm.logs())
    with Client(slurm.gpuenvd.socket) as c:
        held = [lease for lease in c.status()["leases"] if set(lease["gpus"]) & set(gpus)]
    assert held == []


def job_past_its_limit(slurm: SlurmCluster) -> dict[str, object]:
    """A job on one GPU that outlives its 1-minute limit (slurmctld ends it on its 30 s check,
    ~60-90 s after it started): started early, judged last."""
    jobid = slurm.sbatch(
        SHOW + "sleep 300", "--gres=gpu:1", "--time=1", "--comment", "gpuenv:sm=1410"
    )
    gpus = assert_locked_in_job(slurm, jobid, 1410)
    return {"job": jobid, "gpus": gpus, "t0": time.monotonic()}
