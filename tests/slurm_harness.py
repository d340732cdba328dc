"""A real one-node Slurm for tests and benchmarks/slurm.py: munged, slurmctld and slurmd
on 127.0.0.1, everything in a temp dir (no systemd), two simulated GPUs declared in gres.conf
(character devices the harness makes), gpuenvd serving them (sim backend, its socket in the
temp dir), and the Slurm prolog and epilog gpuenv ships (gpuenv/ops/slurm/) as the node's
Prolog and Epilog.

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
import time
from pathlib import Path

from daemon_harness import DaemonProcess

from gpuenv import ops

PROLOG = ops.packaged("prolog")  # the copies `gpuenv ops install prolog epilog` installs
EPILOG = ops.packaged("epilog")
NODE = "gpunode0"
ENDED = ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "NODE_FAIL")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "srun", "mknod")


def unavailable() -> str | None:
    """Why a Slurm cannot be started here, or None when it can."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; .ci/run does)"
    if os.geteuid() != 0:
        return "slurmd runs prologs as root and makes device files: needs root (CI runs as root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(d: Path, ctld_port: int, slurmd_port: int) -> str:
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
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
KillWait=2
MinJobAge=300
Prolog={d}/prolog
Epilog={d}/epilog
PrologFlags=Alloc
NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:2 \
State=UNKNOWN
PartitionName=gpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _fields(line: str) -> dict[str, str]:
    """scontrol's one-line KEY=VALUE list; a value may hold spaces (Reason, Comment)."""
    return dict(
        f.split("=", 1) for f in re.split(r"\s+(?=[A-Za-z][A-Za-z:/_]*=)", line.strip()) if "=" in f
    )


class SlurmCluster:
    """One node: start(), submit jobs, kill and restart slurmd, close()."""

    def __init__(self, workdir: Path, *, strict: bool = False):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # munged refuses a socket directory that is not world-executable
        self.gpuenvd = DaemonProcess(self.dir / "gpuenvd", n_gpus=2)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = self.dir / "slurm.conf"
        self.records = self.dir / "jobs"  # GPUENV_SLURM_STATE: the prolog's job records
        self.strict = strict
        gpuenv = self.dir / "gpuenv"
        gpuenv.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuenv "$@"\n')
        gpuenv.chmod(0o755)
        # what a site puts in the prolog's environment (slurmd gives prologs only SLURM_*)
        self.node_env = {
            k: v
            for k, v in self.gpuenvd.env.items()
            if k.startswith("GPUENV_") or k == "PYTHONPATH"
        }
        self.node_env.update(GPUENV=str(gpuenv), GPUENV_SLURM_STATE=str(self.records))
        self.node_env.pop("GPUENV_STATE_DIR", None)  # the daemon's journal is the daemon's
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
        for n in range(2):
            dev = d / "dev" / f"nvidia{n}"
            if not dev.exists():  # NVIDIA's own numbers: slurmd wants character devices
                subprocess.run(["mknod", str(dev), "c", "195", str(n)], check=True)
        (d / "gres.conf").write_text(f"Name=gpu File={d}/dev/nvidia[0-1]\n")
        self.conf.write_text(_conf(d, _free_port(), _free_port()))
        self.set_scripts(PROLOG, EPILOG)

    def set_scripts(self, prolog: Path, epilog: Path, **extra: str) -> None:
        """The node's Prolog/Epilog: wrappers giving `prolog`/`epilog` the site's environment."""
        env = {**self.node_env, **({"GPUENV_SLURM_STRICT": "1"} if self.strict else {}), **extra}
        exports = "".join(f"export {k}='{v}'\n" for k, v in sorted(env.items()))
        for name, script in (("prolog", prolog), ("epilog", epilog)):
            path = self.dir / name
            tmp = path.with_suffix(".tmp")
            # each run's start, end and exit status: benchmarks/slurm.py's prolog/epilog times
            tmp.write_text(
                f"#!/bin/bash\n{exports}t0=$(date +%s.%N)\nbash {script}\nrc=$?\n"
                f'echo "{name} $SLURM_JOB_ID $t0 $(date +%s.%N) $rc" >> {self.dir}/timings.log\n'
                "exit $rc\n"
            )
            tmp.chmod(0o755)
            tmp.replace(path)  # slurmd may be running one right now

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.dir / f"{name}.out", "ab") as log:
            self.procs[name] = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=log, start_new_session=True
            )

    def start(self, timeout: float = 30.0) -> None:
        self._write()
        self.gpuenvd.start()
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
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self.start_slurmd()
        self._wait(lambda: self.node_state() in ("IDLE", "MIXED", "ALLOCATED"), timeout, "node")

    def start_slurmd(self) -> None:
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])

    def kill_slurmd(self) -> None:
        """SIGKILL slurmd (its job steps carry on under slurmstepd) and reap it."""
        proc = self.procs.pop("slurmd")
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
        for name in ("slurmctld.log", "slurmd.log", "slurmd.out", "slurmctld.out"):
            path = self.dir / name
            if path.exists():
                out.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def close(self) -> None:
        # jobs first: a job's slurmstepd outlives slurmd (that is how a job survives a slurmd
        # restart), so a job still running would outlive the cluster
        if "slurmctld" in self.procs and "slurmd" in self.procs:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.cmd("scancel", "--partition=gpu", check=False)
                self._wait(lambda: not self.cmd("squeue", "-h", check=False), 20, "jobs to end")
        # slurmd before slurmctld: the other order can hang slurmd on an epilog message
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.gpuenvd.close()

    # -- Slurm commands --------------------------------------------------------------------

    def cmd(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}\n{self.logs()}")
        return done.stdout.strip()

    def node(self) -> dict[str, str]:
        return _fields(self.cmd("scontrol", "show", "node", NODE, "-o", check=False))

    def node_state(self) -> str:
        return self.node().get("State", "?")

    def resume(self) -> None:
        self.cmd("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)

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
