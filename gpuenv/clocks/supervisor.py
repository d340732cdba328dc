"""A watchdog process that puts a GPU back when the process that locked it dies.

`with gpuenv.lock(...)` restores in `finally`, but SIGKILL, an interpreter crash
or the OOM killer skip `finally`. So a lock owned by a process starts this
watchdog first (`python -m gpuenv.clocks.supervisor`), in a new session so that a
terminal's Ctrl-C or hang-up does not reach it before it has restored.

The watchdog learns of its owner's death two ways, whichever comes first:
  - a pipe whose write end only the owner holds: the kernel closes it when the
    owner dies in any way, so the read end sees EOF at once;
  - a pidfd for the owner (Linux 5.3+), which becomes readable when it exits,
    even if a forked child still holds the pipe (polling the pid every 50 ms
    where pidfds are missing).
On the owner's death it releases the owner's journal records (restoring the
original state where no other owner shares the lock) and exits. When the owner
releases normally it writes "R" into the pipe and the watchdog exits without
touching anything.

The watchdog opens the backend the owner used, from `backend_spec()`: NVML, or
the simulated GPU with the same state file. An in-memory simulated GPU cannot
be reached from another process, so it gets no watchdog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.backend import Backend, backend_from_spec
from gpuenv.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.clocks.journal import Journal

READY = b"ready\n"
RELEASED = b"R"
POLL_S = 0.05  # pid polling period where no pidfd is available


def backend_spec(backend: Backend) -> dict[str, Any] | None:
    """How another process opens the same GPUs, or None when it cannot."""
    if backend.readonly:
        return None
    return backend.spec()


def open_spec(spec: dict[str, Any]) -> Backend:
    """Open the backend `backend_spec()` described."""
    return backend_from_spec(spec)


class Watchdog:
    """The owner's handle on its watchdog process."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int):
        self.proc = proc
        self.pid = proc.pid
        self._write_fd: int | None = write_fd

    @classmethod
    def start(
        cls,
        spec: dict[str, Any],
        *,
        token: str,
        state_dir: str | os.PathLike[str],
        owner_pid: int | None = None,
        owner_start: float | None = None,
        ready_timeout_s: float = 20.0,
        uuids: list[str] | None = None,
    ) -> Watchdog:
        """Spawn the watchdog and wait until it watches (its imports and backend are ready)."""
        import gpuenv

        owner_pid = os.getpid() if owner_pid is None else owner_pid
        read_fd, write_fd = os.pipe()  # both O_CLOEXEC: an exec'd child never holds the write end
        package_root = str(Path(gpuenv.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable,
            "-m",
            "gpuenv.clocks.supervisor",
            "--owner-pid",
            str(owner_pid),
            "--token",
            token,
            "--state-dir",
            str(state_dir),
            "--backend",
            json.dumps(spec),
        ]
        if owner_start is not None:
            cmd += ["--owner-start", repr(owner_start)]
        if uuids:
            cmd += ["--gpus", ",".join(uuids)]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=read_fd,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal must not kill it first
                close_fds=True,
            )
        except OSError as err:
            os.close(write_fd)
            raise GpuenvError(f"could not start the lock watchdog ({err})") from err
        finally:
            os.close(read_fd)
        dog = cls(proc, write_fd)
        try:
            dog._wait_ready(ready_timeout_s)
        except BaseException:
            dog.stop()
            raise
        return dog

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        # the wall clock, not the GPU's: this waits for a real process on a real pipe
        deadline = time.monotonic() + timeout_s
        got = b""
        while not got.endswith(READY):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise GpuenvError(
                    f"the lock watchdog (pid {self.pid}) did not start within {timeout_s:.0f} s",
                    hint="nothing was changed; retry, or pass supervise=False to lock without one",
                )
            chunk = os.read(fd, 64)
            if not chunk:
                code = self.proc.wait()
                raise GpuenvError(
                    f"the lock watchdog exited with code {code} before it was ready",
                    hint="nothing was changed; run 'python -m gpuenv.clocks.supervisor --help' "
                    "to check that gpuenv imports in a fresh interpreter",
                )
            got += chunk
        self.proc.stdout.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 2.0) -> None:
        """Tell the watchdog the owner released normally; it exits touching nothing."""
        if self._write_fd is not None:
            with contextlib.suppress(OSError):  # it already exited
                os.write(self._write_fd, RELEASED)
            os.close(self._write_fd)
            self._write_fd = None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()


# -- the watchdog process ------------------------------------------------------------


def _wait_for_owner_death(owner_pid: int, owner_start: float | None) -> bool:
    """Block until the owner dies (True) or releases normally (False)."""
    from gpuenv.clocks.journal import process_alive

    def alive() -> bool:
        return process_alive(owner_pid, owner_start)

    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(owner_pid)
    except (AttributeError, OSError):
        pidfd = None
    if not alive():  # died before we watched (or the pid already belongs to someone else)
        return True
    watch = [0] + ([pidfd] if pidfd is not None else [])
    timeout = None if pidfd is not None else POLL_S
    while True:
        readable = select.select(watch, [], [], timeout)[0]
        if pidfd is not None and pidfd in readable:
            return True
        if 0 in readable:
            data = os.read(0, 64)
            if RELEASED in data:
                return False
            if not data:  # EOF: the owner's write end is closed
                if not alive():
                    return True
                watch.remove(0)  # closed while alive (a forked child exec'd?): watch the pid only
                timeout = None if pidfd is not None else POLL_S
        if pidfd is None and not alive():
            return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuenv.clocks.supervisor",
        description="gpuenv's lock watchdog: restores the GPU when the owner process dies. "
        "Started by gpuenv.lock(); not meant to be run by hand.",
    )
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--owner-start", type=float, default=None)
    parser.add_argument("--token", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--backend", required=True, help="JSON from backend_spec()")
    parser.add_argument("--gpus", default="", help="UUIDs the owner locked, comma-separated")
    args = parser.parse_args(argv)

    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)

    # Import and open everything before saying ready, so the restore itself is quick.
    from gpuenv.clocks.journal import Journal
    from gpuenv.clocks.restoring import JournalNotUpdated, release_owner

    journal = Journal(args.state_dir)
    backend = open_spec(json.loads(args.backend))
    with contextlib.suppress(OSError):  # the owner stopped listening: watch anyway
        os.write(1, READY)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)

    try:
        if not _wait_for_owner_death(args.owner_pid, args.owner_start):
            return 0
        recorded = _recorded(journal, args.token)
        try:
            done = release_owner(backend, journal, args.token)
        except JournalNotUpdated as err:  # restored; only the record could not be cleared
            done = [*err.done, str(err)]
        except GpuenvError as err:
            print(
                f"gpuenv watchdog: owner pid {args.owner_pid} ended; restoring failed: {err}; "
                "run 'gpuenv restore'",
                file=sys.stderr,
                flush=True,
            )
            return 1
        lost = _not_put_back(backend, journal, [u for u in args.gpus.split(",") if u], recorded)
        for line in [*done, *lost]:
            print(
                f"gpuenv watchdog: owner pid {args.owner_pid} ended; {line}",
                file=sys.stderr,
                flush=True,
            )
        return 1 if lost else 0
    finally:
        backend.close()


def _recorded(journal: Journal, token: str) -> set[str]:
    """The GPUs whose good record names the owner (release_owner puts those back)."""
    try:
        good, _ = journal.scan()
    except GpuenvError:
        return set()
    return {e.uuid for e in good if e.owner(token) is not None}


def _not_put_back(
    backend: Backend, journal: Journal, uuids: list[str], recorded: set[str]
) -> list[str]:
    """The owner's GPUs the release could not put back (a damaged record, or none left but a
    changed state), each with what it shows and what 'restore --defaults' would do: the
    watchdog used to restore the others and say nothing of these."""
    from gpuenv.clocks.restoring import indices_by_uuid, not_put_back, unrecorded_changes

    try:
        good, damaged = journal.scan()
        indices = indices_by_uuid(backend)
    except GpuenvError:
        return []
    why = {d.uuid: f"its journal record is damaged ({d.why})" for d in damaged}
    kept = {e.uuid for e in good}  # shared with an owner still alive: not the owner's to undo
    lines = []
    for uuid in uuids:
        index = indices.get(uuid)
        if index is None or uuid in kept or (uuid in recorded and uuid not in why):
            continue
        seen = unrecorded_changes(backend, index)
        if uuid in why or seen:
            lines.append(
                not_put_back(backend, index, why.get(uuid, "no journal record is left"), seen)
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())
