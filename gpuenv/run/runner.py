"""`gpuenv run -- <cmd>`: lock if asked, sample the whole run, summarise per region.

    gpuenv run --sm 1350 --policy reject -o run.jsonl -- python bench.py

The command runs with its stdin, stdout and stderr untouched, in gpuenv's own
process group (so a terminal's Ctrl-C reaches it directly, and job control
works). gpuenv forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
sent to gpuenv alone; a signal the terminal sent to the whole foreground group
(Ctrl-C, Ctrl-\\, hang-up) already reached the command, so it is not sent
twice. gpuenv then exits with the command's exit status (see `exit_status`).

Regions: a Python command's do_bench, torch Timer and pytest-benchmark calls are
regions by themselves (autoregions.py); NVTX ranges with --regions nvtx (nvtx.py);
others the command marks with `gpuenv.region("name")` (see run/region.py);
their edges come back over an inherited pipe with the child's CLOCK_MONOTONIC
times, which the sampler's clock shares. The whole run is always one more
region, "(run)". At the end every region name (one rep per time it was entered)
and every automatic call gets a `Measurement` (report.py), and the run goes to the
JSONL results file with the trace for `gpuenv plot`; perf_report grids: perfgrid.py.
The parent's side of regions: tracker.py (pairing edges, windows), report.py (the table).
The sampler is a thread here: the command is the benchmark, in a process of its own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, get_args

from gpuenv.backend import Backend
from gpuenv.errors import CommandNotFound as CommandNotFound  # defined in gpuenv.errors
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.judge import read_facts
from gpuenv.progress import Progress
from gpuenv.results import Measurement
from gpuenv.run.autoregions import child_env
from gpuenv.run.perfgrid import grids, write_grids
from gpuenv.run.ranks import rank_of
from gpuenv.run.region import ENV_PATH, WORKER_KEYS
from gpuenv.run.report import RUN_NAME, Worker, build_measurements, run_text
from gpuenv.run.tracker import (
    FLUSH_S,
    MAX_REGION_LIST,
    Region,
    RegionPipe,
    RegionReader,
    RegionTracker,
    Summariser,
)
from gpuenv.telemetry import Sampler
from gpuenv.verdict import GpuFacts

if TYPE_CHECKING:
    import psutil

    from gpuenv.clocks.request import LockRequest
    from gpuenv.locking import HeldLock
    from gpuenv.results import ResultStore

RunPolicy = Literal["annotate", "reject"]  # retry cannot re-run a command's regions
RUN_POLICIES: tuple[RunPolicy, ...] = get_args(RunPolicy)
SUMMARIES = ("each", "rank0")  # each rank prints its table / rank 0 prints all ranks' in one
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
FROM_TERMINAL = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
SI_KERNEL = 0x80  # si_code of a signal the kernel (the tty driver) sent to a process group
SETTLE_S = 0.5  # a flush covers regions that ended this long ago: their samples are in


def check_run_policy(policy: str) -> RunPolicy:
    """annotate or reject; retry is refused with the reason."""
    if policy not in RUN_POLICIES and policy != "retry":
        raise ConfigError(
            f"--policy {policy}: not a policy of 'gpuenv run'", hint="use annotate or reject"
        )
    if policy not in RUN_POLICIES:
        raise ConfigError(
            f"--policy {policy} does not apply to 'gpuenv run': gpuenv cannot re-run a call "
            "it did not make (the command's do_bench, Timer and pytest-benchmark calls and "
            "its regions are the command's own)",
            hint="use --policy reject to fail the run on a rejected region, or "
            "policy='retry' inside the program (gpuenv.bench, gpuenv.stable)",
        )
    return next(known for known in RUN_POLICIES if known == policy)


def resolve_command(argv: Sequence[str]) -> str:
    """The executable `argv[0]` names; CommandNotFound before anything is locked."""
    if not argv:
        raise ConfigError("no command to run", hint="gpuenv run [options] -- python bench.py")
    exe = argv[0]
    if "/" in exe:
        if not os.path.exists(exe):
            raise CommandNotFound(exe)
        if os.path.isdir(exe) or not os.access(exe, os.X_OK):
            raise CommandNotFound(exe, exit_code=126, why="permission denied (not executable)")
        return exe
    found = shutil.which(exe)
    if found is None:
        raise CommandNotFound(exe)
    return found


@functools.lru_cache(maxsize=1)
def _setpriv() -> str | None:
    """util-linux's setpriv, when it can set a parent-death signal (2.33+)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        help_text = subprocess.run([path, "--help"], capture_output=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if b"--pdeathsig" in help_text else None


def dies_with_us(exe: str, argv: Sequence[str]) -> tuple[str, list[str]]:
    """(executable, argv) for posix_spawn, so that the command gets SIGKILL if gpuenv dies
    (PR_SET_PDEATHSIG, set by setpriv just before it execs the command): a SIGKILLed
    `gpuenv run` must not leave its command running unlocked and unobserved. posix_spawn
    cannot call prctl itself; without setpriv the command is spawned as it is."""
    setpriv = _setpriv()
    if setpriv is None:
        return exe, list(argv)
    return setpriv, ["setpriv", "--pdeathsig", "KILL", "--", exe, *argv[1:]]


# -- running the command -----------------------------------------------------------------


@contextlib.contextmanager
def _signals_blocked(sigs: Sequence[int]) -> Iterator[set[int]]:
    """Block `sigs` in this thread (and threads it starts); yields the mask before."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield set(old)
    finally:
        waited = set(sigs)
        while waited and signal.sigtimedwait(waited, 0) is not None:
            pass  # drop what arrived after the command ended: nothing to forward it to
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass
class RunResult:
    returncode: int  # the command's: >= 0 an exit code, < 0 killed by that signal
    measurements: list[Measurement]
    output: Path | None
    duration_s: float
    forwarded: list[int] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return any(m.verdict == "rejected" for m in self.measurements)

    def exit_status(self, policy: str) -> int:
        """The command's exit code; 1 when it succeeded but --policy reject rejected a region;
        128+N when a signal N killed it (the CLI re-raises the common ones instead)."""
        if self.returncode < 0:
            return 128 - self.returncode
        if self.returncode == 0 and policy == "reject" and self.rejected:
            return 1
        return self.returncode


class Runner:
    """One `gpuenv run`: everything between parsing the options and printing the table."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        backend: Backend,
        gpus: Sequence[int],
        gpus_why: str = "",
        lock: LockRequest | None = None,
        force: bool = False,
        policy: str = "annotate",
        output: str | os.PathLike[str] | None = None,
        append: bool = False,
        period: float | None = None,
        stderr: IO[str] | None = None,
        quiet: bool = False,
        auto_regions: Sequence[str] = (),
        summary: str = "each",
        nvtx: bool = False,
        verbose: bool = False,
        autotune: bool = False,
    ):
        checked = check_run_policy(policy)
        if backend.clock.virtual:
            raise ConfigError("gpuenv run needs real time: the command's regions carry its clock")
        self.argv = list(argv)
        self.exe = resolve_command(self.argv)
        self.backend = backend
        self.gpus = list(gpus)
        self.gpus_why = gpus_why  # why these GPUs (gpuenv.devices.choose_gpus), for the header
        self.lock_request = lock
        self.force = force
        self.policy = checked
        self.output = Path(output) if output is not None else None
        self.append = append  # to an output file holding other runs (else refused)
        self.period = period
        self.stderr = stderr if stderr is not None else sys.stderr
        self.quiet = quiet
        self.verbose = verbose  # a row per call, every perf_report grid in full
        self.auto_regions = tuple(auto_regions)
        self.autotune = autotune  # the command's autotuners choose with gpuenv.rank
        if summary not in SUMMARIES:
            raise ConfigError(f"--summary {summary}: use one of {', '.join(SUMMARIES)}")
        self.summary = summary
        self.unreached: set[int] = set()  # launcher workers not reached (see _Family)
        self.nvtx_lib = None
        if nvtx:  # built and checked now, before anything is locked
            from gpuenv.run import nvtx as nvtx_mod

            self.nvtx_lib = nvtx_mod.build()
            nvtx_mod.child_env(dict(os.environ), self.nvtx_lib)

    def run(self) -> RunResult:
        lock: HeldLock | None = None
        if self.lock_request is not None:
            from gpuenv.locking import acquire

            lock = acquire(
                request=self.lock_request,
                gpus=self.gpus,
                backend=self.backend,
                force=self.force,
                supervise=True,
                command="gpuenv run: " + shlex.join(self.argv),
            )
        try:
            for note in lock.notes if lock else []:
                print(f"gpuenv: {note}", file=self.stderr)
            return self._run_locked(lock)
        finally:
            if lock is not None:
                lock.release()

    def _lock_ranges(self, lock: HeldLock | None) -> dict[int, tuple[int, int]]:
        from gpuenv.locking import lock_ranges

        return {} if lock is None else lock_ranges(lock, self.backend)

    def _run_locked(self, lock: HeldLock | None) -> RunResult:
        ranges = self._lock_ranges(lock)
        store = self._store(lock)
        # a thread unless GPUENV_SAMPLER says: the command is another process already
        mode = None if os.environ.get("GPUENV_SAMPLER", "").strip() else "thread"
        sampler = Sampler(
            self.backend,
            self.gpus,
            period=self.period,
            lock_ranges=ranges,
            own_pids=[os.getpid()],
            mode=mode,
        )
        tracker = RegionTracker()
        summariser = Summariser(sampler, self.gpus)
        forwarded: list[int] = []
        run, status, t_end, facts = self._command(sampler, tracker, summariser, ranges, forwarded)
        t_start = run.t0
        # thousands of regions take seconds to judge and write: a terminal is told so
        with Progress(
            f"gpuenv run: judging {len(tracker.finished) + 1:,} regions",
            stream=self.stderr,
            show=False if self.quiet else None,
        ):
            try:
                run.t1 = t_end
                tracker.close_all(t_end)
                # the last regions' power and energy from the driver's power sample after
                # them: one wait, at most POWER_WAIT_S
                open_spans = [(r.t0, r.t1 or t_end) for r in tracker.finished if r.windows is None]
                sampler.await_power([(run.t0, t_end), *open_spans], self.gpus)
                summariser.flush(t_end, [run, *tracker.finished], final=True)
            finally:
                sampler.stop()
            wall0 = time.time() - time.monotonic()
            extra_run = self._run_extra(status, t_start, summariser, tracker, forwarded)
            measurements = build_measurements(
                tracker.finished,
                run,
                workers=self._workers(tracker),
                gpus=self.gpus,
                facts=facts,
                policy=self.policy,
                stable_clocks=lock is not None,
                wall_at=lambda t: wall0 + t,
                extra_run=extra_run,
            )
            if store is not None:
                with store:
                    store.extend(measurements)
        result = RunResult(status, measurements, self.output, t_end - t_start, forwarded)
        self._report(result, lock, started_wall=wall0 + t_start)
        return result

    def _command(
        self,
        sampler: Sampler,
        tracker: RegionTracker,
        summariser: Summariser,
        ranges: dict[int, tuple[int, int]],
        forwarded: list[int],
    ) -> tuple[Region, int, float, dict[int, GpuFacts]]:
        """Spawn the command with the region pipe, start sampling, wait for it to end
        (forwarding signals into `forwarded`). Returns the "(run)" region (t0: the start),
        the command's status, the end, and the GPUs' facts; the sampler still runs unless
        this raised."""
        pipe = RegionPipe()
        env = self._child_env(pipe)
        family = _Family()
        reader = RegionReader(pipe.r_fd, tracker, sampler)
        try:
            with _signals_blocked([*FORWARDED, signal.SIGCHLD]) as old_mask:
                # Threads started now inherit the blocked mask: signals come only to sigtimedwait.
                sampler.start()
                reader.start()
                t_start = sampler.mark()
                try:
                    pid = os.posix_spawn(
                        *dies_with_us(self.exe, self.argv),
                        env,
                        setsigmask=old_mask,
                        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                    )
                except OSError as err:
                    raise CommandNotFound(
                        self.argv[0],
                        exit_code=127 if isinstance(err, FileNotFoundError) else 126,
                        why=err.strerror or "cannot run",
                    ) from err
                finally:
                    pipe.close_writer()  # the command holds its end now
                sampler.own_pids.add(pid)
                facts = read_facts(self.backend, self.gpus, ranges)  # while the command starts
                run = Region(RUN_NAME, pid, t_start)
                status = self._wait(pid, forwarded, family, sampler, summariser, tracker, run)
                t_end = sampler.mark()
        except BaseException:
            sampler.stop()
            raise
        finally:
            reader.stop()
            pipe.close()
        self.unreached = family.unreached
        return run, status, t_end, facts

    def _workers(self, tracker: RegionTracker) -> dict[int, Worker]:
        """The rank and GPU of each launcher worker that said who it is ("p" line), when this
        `gpuenv run` wraps the launcher whole (a rank's own `gpuenv run` is that rank)."""
        if rank_of(os.environ) is not None:
            return {}
        from gpuenv.run.ranks import worker_of

        with tracker.lock:
            procs = dict(tracker.procs)
        return {pid: worker_of(f, self.backend, self.gpus) for pid, f in procs.items()}

    def _report(self, result: RunResult, lock: HeldLock | None, *, started_wall: float) -> None:
        """Print the summary: this run's table, or under --summary rank0 all ranks' at rank 0."""
        rank = rank_of(os.environ)
        record = self._record(result, lock, rank)
        if self.summary == "rank0" and rank is not None:
            from gpuenv.run.ranks import report_ranks

            text = report_ranks(
                record,
                result.measurements,
                os.environ,
                started_wall=started_wall,
                verbose=self.verbose,
            )
        else:
            text = run_text(record, result.measurements, verbose=self.verbose)
        # perf_report tables' verdicts: the CSVs always, the grids with the table
        grid_lines = write_grids(grids(result.measurements), rank=rank, verbose=self.verbose)
        if text and not self.quiet:
            print("\n".join([text, *grid_lines]), file=self.stderr)

    def _child_env(self, pipe: RegionPipe) -> dict[str, str]:
        """The command's environment: the region pipe, automatic regions, NVTX's injection."""
        env = dict(os.environ)
        env.update(pipe.env())
        child_env(env, self.auto_regions, autotune=self.autotune)
        if self.nvtx_lib is not None:
            env["NVTX_INJECTION64_PATH"] = str(self.nvtx_lib)
        return env

    def _store(self, lock: HeldLock | None) -> ResultStore | None:
        """The results file's store (None without -o), its metadata written first."""
        from gpuenv.environment import environment_metadata
        from gpuenv.results import ResultStore

        if self.output is None:
            return None
        meta = environment_metadata(
            self.backend,
            self.gpus,
            extra={
                "tool": "gpuenv run",
                "command": self.argv,
                "policy": self.policy,
                "rank": rank_of(os.environ),
                "gpus_why": self.gpus_why,
                "lock": lock.plan.lines() if lock is not None else None,
                "auto_regions": list(self.auto_regions),
                "autotune": "rank" if self.autotune else None,
                "nvtx_regions": self.nvtx_lib is not None,
            },
        )
        return ResultStore(self.output, meta, append=self.append, name="-o")

    def _run_extra(
        self,
        status: int,
        t_start: float,
        summariser: Summariser,
        tracker: RegionTracker,
        forwarded: list[int],
    ) -> dict[str, Any]:
        """What the "(run)" measurement carries: the command, traces, region spans."""
        traces = summariser.log.traces(t_start)
        extra_run: dict[str, Any] = {
            "command": self.argv,
            "returncode": status,
            "t0_monotonic": t_start,
            # what `gpuenv plot` draws: the first GPU's trace, and every GPU's under "traces"
            "trace": traces[self.gpus[0]],
            "regions": [
                {
                    "name": r.name,
                    "pid": r.pid,
                    "t0_s": round(r.t0 - t_start, 6),
                    "t1_s": round((r.t1 or r.t0) - t_start, 6),
                    "complete": r.complete,
                }
                for r in sorted(tracker.finished, key=lambda r: r.t0)[:MAX_REGION_LIST]
            ],
            "forwarded_signals": [signal.Signals(s).name for s in forwarded],
        }
        if len(self.gpus) > 1:
            extra_run["traces"] = {str(g): t for g, t in traces.items()}
        if tracker.ignored:
            extra_run["ignored_edges"] = tracker.ignored
        if tracker.discarded:
            extra_run["discarded_regions"] = dict(tracker.discarded)
        if self.unreached:
            launcher = launcher_name(self.argv)
            extra_run["unreached_workers"] = {
                "count": len(self.unreached),
                "launcher": launcher,
                "pids": sorted(self.unreached),
                "hint": wrap_hint(launcher),
            }
        return extra_run

    def _wait(
        self,
        pid: int,
        forwarded: list[int],
        family: _Family,
        sampler: Sampler,
        summariser: Summariser,
        tracker: RegionTracker,
        run: Region,
    ) -> int:
        """Wait for the command, forwarding signals; returns its status (waitstatus_to_exitcode)."""
        waited = {*FORWARDED, signal.SIGCHLD}
        next_flush = time.monotonic() + FLUSH_S
        next_family = time.monotonic() + 0.25  # a short command costs no process-tree walk
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return os.waitstatus_to_exitcode(status)
            now = time.monotonic()
            if now >= next_family:
                sampler.own_pids.update(family.of(pid))  # its workers are not "other processes"
                next_family = now + 0.25
            if now >= next_flush:
                with tracker.lock:
                    regions = [run, *tracker.finished, *tracker.open.values()]
                try:
                    summariser.flush(now - SETTLE_S, regions)
                except Exception as err:  # never lose the command over a summary
                    print(f"gpuenv: warning: summarising regions failed: {err}", file=self.stderr)
                next_flush = now + FLUSH_S
            info = signal.sigtimedwait(waited, 0.25)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            sig = info.si_signo
            if sig in FROM_TERMINAL and info.si_code == SI_KERNEL:
                continue  # the terminal sent it to the whole foreground group: the command has it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                forwarded.append(sig)

    def _record(self, result: RunResult, lock: HeldLock | None, rank: int | None) -> dict[str, Any]:
        """What the summary says about this run besides its measurements (report.run_text)."""
        from gpuenv.devices import describe

        cmd = shlex.join(self.argv)
        if result.returncode < 0:
            how = f"was killed by {signal.Signals(-result.returncode).name}"
        else:
            how = f"exited with {result.returncode}"
        if lock is not None:
            from gpuenv.clocks import describe_target

            targets = sorted({describe_target(gp.applied) for gp in lock.plan.gpus})
            state = "locked " + "; ".join(targets)
        else:
            state = self._found_lock()
        return {
            "rank": rank,
            "command": cmd if len(cmd) <= 60 else cmd[:57] + "...",
            "outcome": how,
            "duration_s": result.duration_s,
            "where": ", ".join(describe(self.backend, g) for g in self.gpus),
            "uuids": [self._uuid(g) for g in self.gpus],  # GPU 0 of two nodes: two GPUs
            "gpus_why": self.gpus_why,
            "state": state,
            "output": None if result.output is None else str(result.output),
            "policy": self.policy,
        }

    def _found_lock(self) -> str:
        """The clocks' state where this run took no lock of its own: the lock another owner
        holds on its GPUs (root's standing lock, a gpuenvd lease), with its range and owner,
        as 'gpuenv status' says it; "clocks not locked" where there is none."""
        from gpuenv.clocks import lock_status
        from gpuenv.locking import lock_view

        found: dict[str, list[int]] = {}
        for g in self.gpus:
            text = "clocks not locked"
            try:
                view = lock_view(self.backend, g)  # a gpuenvd serving the GPU is the authority
                if view is not None:
                    text = str(view["text"]) if view["state"] == "locked" else text
                else:
                    st = lock_status(self.backend, g)
                    text = f"clocks {st.describe()}" if st.locked else text
            except (GpuenvError, OSError) as err:
                text = f"lock state unknown ({err})"
            found.setdefault(text, []).append(g)
        if len(found) == 1:
            return next(iter(found))
        return "; ".join(
            f"GPU {', '.join(str(g) for g in gpus)}: {text}" for text, gpus in found.items()
        )

    def _uuid(self, index: int) -> str:
        try:
            return self.backend.device_info(index).uuid
        except GpuenvError:
            return ""


class _Family:
    """The command's descendants, remembered once seen (workers that exit early still count),
    and those of them gpuenv cannot reach: a launcher's workers (rank variables in their
    environment) started without the region pipe's path (an environment cleared)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.unreached: set[int] = set()

    def of(self, pid: int) -> set[int]:
        import psutil

        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(pid).children(recursive=True):
                if p.pid not in self.seen:
                    self.seen.add(p.pid)
                    self._check(p)
        return self.seen

    def _check(self, p: psutil.Process) -> None:
        import psutil

        try:
            env = p.environ()  # as it was at exec: /proc/<pid>/environ
        except psutil.Error:
            return
        if ENV_PATH not in env and any(env.get(k, "").strip() for k in WORKER_KEYS):
            self.unreached.add(p.pid)


def launcher_name(argv: Sequence[str]) -> str:
    """What the command is called: 'torchrun', 'python -m torch.distributed.run',
    'python launch.py' ..."""
    name = os.path.basename(argv[0]) if argv else "?"
    if name.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        return f"{name} -m {argv[2]}"
    if name.startswith("python") and len(argv) > 1 and not argv[1].startswith("-"):
        return f"{name} {os.path.basename(argv[1])}"
    return name


def wrap_hint(launcher: str) -> str:
    """The form that reaches every worker: gpuenv run started as each worker's command."""
    if launcher == "torchrun" or launcher.endswith("torch.distributed.run"):
        return (
            f"wrap each worker instead: {launcher} ... --no-python gpuenv run "
            "--summary rank0 -- python script.py"
        )
    if launcher == "accelerate":
        return (
            "wrap each worker instead: accelerate launch ... --no_python gpuenv run "
            "--summary rank0 -- python script.py"
        )
    return (
        "start gpuenv run as each worker's command instead (torchrun: "
        "torchrun ... --no-python gpuenv run --summary rank0 -- python script.py)"
    )


__all__ = [
    "RUN_NAME",
    "CommandNotFound",
    "RunResult",
    "Runner",
    "check_run_policy",
    "launcher_name",
    "resolve_command",
    "wrap_hint",
]
