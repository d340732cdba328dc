"""Each batch job's GPUs from its prolog to its epilog: what gpuenvd saw while the job ran.

The Slurm prolog calls `job_begin` (job id, user, GPUs, what the job asked and whether the
lock was taken); the epilog calls `job_end`, which returns the report and keeps it on disk
(`<state dir>/jobs/JOBID.json`, the newest KEEP_JOBS kept). `gpuenv job JOBID` asks for it
with `job_report`, while the job runs or after.

A job outlives the sampler's rings (13 minutes at 25 ms), so its telemetry is taken in
chunks of CHUNK_S: each chunk's Window per GPU and SM-clock histogram are folded in as it
closes, and `merge_windows` joins them at the end. The daemon keeps the record; whoever reads
it judges it (daemon/jobreport.py, with the one judge's `verdict.assess`: a job is one region
of its GPUs), so the daemon stays below the measurement core.

A job can outlive gpuenvd too: the daemon may be killed or restarted while a job runs. Each
open job is also a file (`<state dir>/jobs/open/JOBID.json`: who, which GPUs, the lock), so
the next daemon takes it up again (`resume`) and the epilog still gets its report. The
telemetry before the restart was in the dead daemon's memory: the report says from when it
covers the job (`telemetry_from`, `restarts`), and its reader names the loss.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.backend import Backend, DeviceInfo
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.telemetry import Sampler
from gpuenv.telemetry.window import Window, merge_windows
from gpuenv.timebase import REAL_CLOCK, Clock, Timer

if TYPE_CHECKING:
    from gpuenv.daemon.serverview import Server

log = logging.getLogger("gpuenv.daemon")

CHUNK_S = 60.0  # well inside the sampler's rings at any sample period the daemon allows
KEEP_JOBS = 2000  # finished reports kept on disk (~3 KB each)
MAX_OPEN = 256  # jobs open at once: more than a node's GPUs can hold
HIST_MHZ = 15  # SM-clock histogram bins: the clock step of the H100, H200, A100, L40S, B200
JOB_ID = re.compile(r"^[0-9][0-9_.A-Za-z-]{0,63}$")  # Slurm: 123, 123_4 (array), 123+1 (het)


def check_job_id(value: Any) -> str:
    if not isinstance(value, str) or not JOB_ID.match(value):
        raise ConfigError(
            f"{value!r:.40} is not a job id", hint="pass Slurm's SLURM_JOB_ID, e.g. 1234"
        )
    return value


@dataclass
class _Gpu:
    """One GPU of an open job: its chunks so far."""

    windows: list[Window] = field(default_factory=list)
    hist: Counter[int] = field(default_factory=Counter)


@dataclass
class _Job:
    job: str
    user: str
    gpus: list[int]
    asked: str | None
    lock: str  # "locked" | "not asked" | "not locked: <why>"
    started: float  # wall time
    t0: float  # sampler time of the current chunk's start
    per_gpu: dict[int, _Gpu] = field(default_factory=dict)
    telemetry_from: float | None = None  # wall time: gpuenvd's last restart; None: the start
    restarts: int = 0  # daemons that took the job up again after the one before died


class JobBook:
    """Open jobs in memory, finished ones on disk; chunks close every `chunk_s` of `clock`
    (the daemon's: a thread on real time; on virtual time, the clock's timer, as the
    sampler's ticks). Its times (a job's start and end) are the clock's wall."""

    def __init__(
        self,
        backend: Backend,
        infos: list[DeviceInfo],
        sampler: Sampler,
        lock_range: Any,
        directory: Path | None,
        *,
        chunk_s: float = CHUNK_S,
        keep: int = KEEP_JOBS,
        clock: Clock = REAL_CLOCK,
    ):
        self.backend = backend
        self.infos = infos
        self.sampler = sampler
        self.lock_range = lock_range  # LeaseManager.lock_range: GPU -> locked SM range
        self.dir = directory
        self.chunk_s = chunk_s
        self.keep = keep
        self._open: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: Timer | None = None
        self.clock = clock

    # -- what the prolog and epilog call --------------------------------------------------

    def begin(self, job: str, user: str, gpus: list[int], asked: str | None, lock: str) -> None:
        job = check_job_id(job)
        t0 = self.sampler.mark()
        with self._lock:
            # Slurm gives a job its GPUs alone: a job still open on them lost its epilog
            # (slurmd killed while the job ended: Slurm does not run it again)
            stale = [j for j in self._open.values() if j.job != job and set(j.gpus) & set(gpus)]
            for old in stale:
                del self._open[old.job]
            dropped = None
            if job not in self._open and len(self._open) >= MAX_OPEN:
                dropped = min(self._open.values(), key=lambda j: j.started).job
                log.warning("job %s: more than %d jobs open, dropping %s", job, MAX_OPEN, dropped)
                del self._open[dropped]
            record = _Job(
                job, user, list(gpus), asked, lock, self.clock.wall(), t0, {g: _Gpu() for g in gpus}
            )
            self._open[job] = record
            self._start_thread()
        self._keep_open(record)
        if dropped is not None:
            self._forget_open(dropped)
        log.info("job %s of %s began on GPUs %s (%s)", job, user, gpus, lock)
        for old in stale:
            self._chunk(old)
            report = self._report(old, ended=self.clock.wall())
            report["ended_by"] = f"job {job}'s prolog on its GPUs: its epilog never came"
            self._save(report)
            self._forget_open(old.job)
            log.warning("job %s: closed at job %s's start on its GPUs (no epilog)", old.job, job)

    def _start_thread(self) -> None:
        """The chunk thread (on virtual time, the clock's timer), once a job is open (called
        holding self._lock)."""
        if self._thread is not None or self._timer is not None or self._stop.is_set():
            return
        if self.clock.virtual:
            call_every = self.clock.call_every  # type: ignore[attr-defined]
            self._timer = call_every(self.chunk_s, self._close_chunks)
            return
        self._thread = threading.Thread(target=self._run, name="gpuenvd-jobs", daemon=True)
        self._thread.start()

    def end(self, job: str) -> dict[str, Any]:
        """Close the job: its report, kept on disk. A job never begun: ConfigError."""
        job = check_job_id(job)
        with self._lock:
            record = self._open.pop(job, None)
        if record is None:
            raise ConfigError(
                f"no job {job} is open on this node",
                hint="its prolog did not run, or its report was already closed",
            )
        self._chunk(record)
        report = self._report(record, ended=self.clock.wall())
        self._save(report)
        self._forget_open(job)
        log.info("job %s of %s ended (%s)", job, record.user, record.lock)
        return report

    def resume(self) -> list[str]:
        """At daemon start: take up again the jobs a daemon before this one had open (it was
        killed, or its node restarted, mid-job), so that their epilogs still get a report.
        Their telemetry until now died with that daemon: each is marked as covered from now
        on. Returns the jobs taken up."""
        folder = self._open_dir()
        if folder is None or not folder.is_dir():
            return []
        now, taken = self.clock.wall(), []
        for path in sorted(folder.glob("*.json")):
            record = self._read_open(path)
            if record is None:
                continue
            record.telemetry_from, record.restarts = now, record.restarts + 1
            record.t0 = self.sampler.mark()
            with self._lock:
                if record.job in self._open:
                    continue
                self._open[record.job] = record
                self._start_thread()
            self._keep_open(record)
            taken.append(record.job)
            log.warning(
                "job %s of %s on GPUs %s: taken up again after gpuenvd restarted; its "
                "telemetry for the %.1f s before is lost",
                record.job,
                record.user,
                record.gpus,
                now - record.started,
            )
        return taken

    def report(self, job: str) -> dict[str, Any]:
        """A running job's report so far, or a finished job's from disk."""
        job = check_job_id(job)
        with self._lock:
            record = self._open.get(job)
        if record is not None:
            self._chunk(record)
            return self._report(record, ended=None)
        path = self._path(job)
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                data: dict[str, Any] = json.loads(path.read_text())
                return data
        raise ConfigError(
            f"gpuenvd has no report of job {job}",
            hint="it ran on another node, did not use GPUs, or is older than the "
            f"last {self.keep} jobs kept",
        )

    def running(self) -> list[tuple[int, str, str]]:
        """(GPU, job, user) of every open job: the metrics' job info series."""
        with self._lock:
            return [(g, j.job, j.user) for j in self._open.values() for g in j.gpus]

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()

    # -- chunks ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.chunk_s):
            self._close_chunks()

    def _close_chunks(self) -> None:
        with self._lock:
            jobs = list(self._open.values())
        for record in jobs:
            try:
                self._chunk(record)
            except GpuenvError as err:  # a GPU lost mid-job: the next chunk may read
                log.warning("job %s: telemetry chunk failed: %s", record.job, err)

    def _chunk(self, record: _Job) -> None:
        t1 = self.sampler.mark()
        with self._lock:
            t0, record.t0 = record.t0, t1
        if t1 <= t0:
            return
        for g in record.gpus:
            w = self.sampler.window(t0, t1, g, lock_range=self.lock_range(g))
            # the job's own processes are no "other process"
            w = w.without_others(lambda p: _of_job(p, record.job, record.user))
            hist = Counter(
                int(round(s.sm_mhz / HIST_MHZ) * HIST_MHZ)
                for s in self.sampler.samples(t0, t1, g)
                if s.sm_mhz is not None
            )
            with self._lock:
                record.per_gpu[g].windows.append(w)
                record.per_gpu[g].hist.update(hist)

    # -- the report -----------------------------------------------------------------------

    def _report(self, record: _Job, ended: float | None) -> dict[str, Any]:
        """The record as JSON; judging it is the reader's (daemon/jobreport.py, a door)."""
        with self._lock:
            merged = {g: merge_windows(p.windows) for g, p in record.per_gpu.items() if p.windows}
            hists = {g: dict(p.hist) for g, p in record.per_gpu.items()}
        gpus = []
        for g in record.gpus:
            info, w = self.infos[g], merged.get(g)
            hist = {str(k): n for k, n in sorted(hists.get(g, {}).items())}
            window = w.to_dict() if w is not None else None
            gpus.append(
                {"gpu": g, "uuid": info.uuid, "name": info.name, "window": window, "sm_hist": hist}
            )
        return {**_facts(record), "ended": ended, "gpus_report": gpus}

    def _path(self, job: str) -> Path | None:
        return None if self.dir is None else self.dir / f"{job}.json"

    # -- open jobs on disk: what the next daemon takes up ----------------------------------

    def _open_dir(self) -> Path | None:
        return None if self.dir is None else self.dir / "open"

    def _keep_open(self, record: _Job) -> None:
        folder = self._open_dir()
        if folder is None:
            return
        from gpuenv._files import replaced

        kept = _facts(record)
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            with replaced(folder / f"{record.job}.json") as fh:
                json.dump(kept, fh, separators=(",", ":"))
        except OSError as err:  # the job is still recorded in memory: only a restart loses it
            log.warning("job %s: could not keep it open in %s: %s", record.job, folder, err)

    def _forget_open(self, job: str) -> None:
        folder = self._open_dir()
        if folder is not None:
            with contextlib.suppress(OSError):
                os.unlink(folder / f"{job}.json")

    def _read_open(self, path: Path) -> _Job | None:
        """An open job a daemon before this one kept, or None (logged) where it is not one."""
        try:
            data = json.loads(path.read_text())
            job = check_job_id(data["job"])
            gpus = [int(g) for g in data["gpus"]]
            if path.stem != job or not gpus or not set(gpus) <= set(range(len(self.infos))):
                raise ValueError(f"GPUs {gpus} of job {job} are not this node's")
            return _Job(
                job,
                str(data["user"]),
                gpus,
                None if data.get("asked") is None else str(data["asked"]),
                str(data["lock"]),
                float(data["started"]),
                0.0,
                {g: _Gpu() for g in gpus},
                restarts=int(data.get("restarts") or 0),
            )
        except (OSError, ValueError, KeyError, TypeError, ConfigError) as err:
            log.warning("open job %s not taken up (%s): %s", path.name, type(err).__name__, err)
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def _save(self, report: dict[str, Any]) -> None:
        if self.dir is None:
            return
        from gpuenv._files import replaced

        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            with replaced(self.dir / f"{report['job']}.json") as fh:
                json.dump(report, fh, separators=(",", ":"))
            self._prune()
        except OSError as err:  # a full disk loses a report, never the epilog
            log.warning("job %s: could not keep its report in %s: %s", report["job"], self.dir, err)

    def _prune(self) -> None:
        assert self.dir is not None
        files = [e for e in os.scandir(self.dir) if e.name.endswith(".json") and e.is_file()]
        if len(files) <= self.keep:
            return
        files.sort(key=lambda e: e.stat().st_mtime)
        for entry in files[: len(files) - self.keep]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _of_job(pid: int, job: str, user: str) -> bool:
    """Whether process `pid` runs in Slurm job `job`: its environment says so where gpuenvd
    may read it (root with CAP_SYS_PTRACE); else (the shipped unit drops that capability)
    whether the job's user owns it. Gone or unknown: False, so it stays reported."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return f"SLURM_JOB_ID={job}".encode() in fh.read(1 << 20).split(b"\0")
    except OSError:
        pass
    try:
        import pwd

        return os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam(user).pw_uid
    except (OSError, KeyError):
        return False


def job_ops() -> tuple[Any, Any, Any]:
    """The protocol's job ops, as methods of daemon.ops.Operations (`self.jobs` a JobBook)."""
    from gpuenv.errors import PermissionDenied

    def admin(self: Any, conn: Any, what: str) -> None:
        if not self.auth.is_admin(conn.peer):
            raise PermissionDenied(
                f"{conn.peer.describe()} may not {what}: only an admin (the Slurm prolog and "
                "epilog run as root) records jobs",
                hint="run it from the prolog/epilog as root; 'gpuenv job JOBID' reads a report",
            )

    def op_job_begin(
        self: Any,
        conn: Any,
        job: str,
        user: str | None,
        gpus: Any,
        asked: str | None,
        lock: str | None,
    ) -> dict[str, Any]:
        """`job_begin` (admin only: the Slurm prolog): the job's GPUs are its from now on.

        Records the job id, its user (None reads "?"), its GPUs (the protocol's GPU
        selection), what it asked for (`asked`) and the lock taken for it (None: "not
        asked"); telemetry counts for the job from this call. Returns the job id and the
        GPU indices recorded. A peer that is not an admin gets PermissionDenied.
        """
        admin(self, conn, "begin a job")
        indices = self._gpus(gpus)
        self.jobs.begin(job, user or "?", indices, asked, lock or "not asked")
        return {"job": job, "gpus": indices}

    def op_job_end(self: Any, conn: Any, job: str) -> dict[str, Any]:
        """`job_end` (admin only: the Slurm epilog): close the job's record.

        Returns `{"report": ...}`, the job's report, which is also kept on disk for
        `job_report` later. A job never begun on this node: ConfigError; a peer that is not
        an admin: PermissionDenied.
        """
        admin(self, conn, "end a job")
        return {"report": self.jobs.end(job)}

    def op_job_report(self: Any, conn: Any, job: str) -> dict[str, Any]:
        """`job_report` (any peer; `gpuenv job JOBID`): a job's report as `{"report": ...}`.

        A running job's report so far, or a finished job's from disk; no report of it on
        this node: ConfigError.
        """
        return {"report": self.jobs.report(job)}

    return op_job_begin, op_job_end, op_job_report


def job_metrics(server: Server) -> Any:
    """`gpuenv_gpu_job{UUID, jobid, user} 1` per GPU of a running job: one info series to join
    on UUID (`* on(UUID) group_left(jobid, user)`), so no other series carries a job label."""
    from prometheus_client.core import GaugeMetricFamily

    ops = getattr(server, "ops", None)
    if ops is None:
        return
    fam = GaugeMetricFamily(
        "gpuenv_gpu_job",
        "1 for each GPU and the batch job that holds it (Slurm prolog to epilog); join on UUID",
        labels=["UUID", "jobid", "user"],
    )
    uuids = {info.index: info.uuid for info in server.infos}
    for gpu, job, user in ops.jobs.running():
        fam.add_metric([uuids.get(gpu, str(gpu)), job, user], 1.0)
    yield fam


def _facts(record: _Job) -> dict[str, Any]:
    """A job's own facts, as its report and its open file on disk both hold them."""
    return {
        "job": record.job,
        "user": record.user,
        "gpus": record.gpus,
        "asked": record.asked,
        "lock": record.lock,
        "started": record.started,
        "telemetry_from": record.telemetry_from,
        "restarts": record.restarts,
    }
