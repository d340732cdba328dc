"""Named regions in a program that `gpuenv run` wraps.

    import gpuenv
    with gpuenv.region("train"):
        train()

    @gpuenv.region("eval")
    def evaluate(): ...

Without `gpuenv run` a region only times itself (`r.elapsed_s`). Under it, the
region's start and end reach the parent cheaply: `gpuenv run` hands the child
the write end of a pipe and names it in the environment, and each edge is one
`write()` of a short line carrying the child's CLOCK_MONOTONIC time (a
system-wide clock on Linux, so the parent compares it with its own samples).
Writes shorter than PIPE_BUF are atomic, so threads and forked workers may mark
regions at once.

The wire format, for programs in other languages (one line per edge, ASCII):

    b <pid> <id> <t> <name>\\n     region <id> of process <pid> begins at <t> s
    e <pid> <id> <t>\\n            it ends
    x <pid> <id> <t>\\n            it ended in an error: drop it (not a measurement)
    l <pid> <id> <json>\\n         optional: facts about the open region <id>, a JSON object
                                  on one line; may come any time before its end, keys merge
    p <pid> <json>\\n              optional: facts about process <pid> (its launcher's rank
                                  variables: RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES ...)

<t> is CLOCK_MONOTONIC in seconds; <id> is unique within <pid> (a library that
writes edges beside others in one process takes its own range of ids); <name>
has no newline. A reader ignores lines it does not know, so an older `gpuenv run`
reads a newer child's edges (without their "l" facts). Regions of one name are reps
of one measurement, except those whose facts carry a "site": each of those is one
call of a measuring function (do_bench, a Timer, a pytest-benchmark benchmark),
its own measurement, grouped with the other calls of its site for display only.
Other keys: "kind", "labels" (what distinguishes the call: {"size": 4096}),
"returned_s" (the time the function returned), "plot" (its perf_report point).
docs/how-to/run.md has a C example. The fd is in GPUENV_REGION_FD; GPUENV_REGION_PIPE holds
"<st_dev>:<st_ino>" of that pipe, so that a process which inherited the
variable but not the fd (a grandchild started with close_fds) does not write
into whatever file now has that number: it checks with fstat first.

The pipe is a named one (a FIFO in a private directory), and GPUENV_REGION_PATH names
it: a process that inherited the environment but not the fd (the workers of torchrun,
`python -m torch.distributed.run` or `accelerate launch`, which start them with
close_fds) opens it by that path, checks it is the same pipe, and writes there as an
heir of the fd would. Such a process first says who it is, once ("p" line: the rank
variables its launcher gave it), so the parent knows each worker's rank and GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

ENV_FD = "GPUENV_REGION_FD"
ENV_PIPE = "GPUENV_REGION_PIPE"
ENV_PATH = "GPUENV_REGION_PATH"
# what a launcher tells its workers, sent in a process's "p" line (see the module doc)
RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
)
WORKER_KEYS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID")  # one makes a worker
MAX_NAME = 200  # keeps every line far below PIPE_BUF (4096), so each write is atomic
MAX_META = 2048  # a begin edge and its facts, written at once, stay below PIPE_BUF too
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)  # made once: json.dumps
# with options builds an encoder per call, a third of a call's cost
_PLAIN: dict[tuple[Any, Any], str] = {}  # (kind, site) -> the facts of a call with no others


@dataclass(frozen=True)
class Edge:
    """One parsed line of the region protocol."""

    kind: str  # "b" (begin) | "e" (end) | "x" (end, discarded) | "l" (facts) | "p" (process)
    pid: int
    id: int  # 0 on "p"
    t: float  # CLOCK_MONOTONIC seconds (0.0 on "l" and "p")
    name: str | None  # only on "b"
    meta: dict[str, Any] | None = None  # only on "l" and "p"


def parse_line(line: str) -> Edge | None:
    """Parse one protocol line; None for a line that is not one (ignored, never fatal)."""
    parts = line.rstrip("\n").split(" ", 4)
    try:
        if parts[0] == "p" and len(parts) >= 3:  # process facts: "p <pid> <json>"
            meta = json.loads(line.rstrip("\n").split(" ", 2)[2])
            return Edge("p", int(parts[1]), 0, 0.0, None, meta) if isinstance(meta, dict) else None
        if parts[0] == "l" and len(parts) >= 4:  # its 4th field is JSON, not a time
            meta = json.loads(line.rstrip("\n").split(" ", 3)[3])
            return (
                Edge("l", int(parts[1]), int(parts[2]), 0.0, None, meta)
                if isinstance(meta, dict)
                else None
            )
        t = float(parts[3]) if len(parts) >= 4 else math.nan
        if not (math.isfinite(t) and t >= 0):  # a nan time cost the run its summary
            return None
        if parts[0] == "b" and len(parts) == 5:
            return Edge("b", int(parts[1]), int(parts[2]), t, parts[4])
        if parts[0] in ("e", "x") and len(parts) == 4:
            return Edge(parts[0], int(parts[1]), int(parts[2]), t, None)
    except ValueError:  # json.JSONDecodeError is one
        return None
    return None


def meta_line(pid: int, rid: int, meta: Mapping[str, Any]) -> str:
    """The "l" line of `meta` for region `rid`: only its "site" and "kind" when the whole
    would not fit in MAX_META (a call stays a call), "" when not even those do."""
    if (
        len(meta) == 1
        and type(meta.get("returned_s")) is float
        and math.isfinite(meta["returned_s"])
    ):  # the usual end facts: repr is JSON for a finite float, and 10x cheaper
        return f'l {pid} {rid} {{"returned_s":{meta["returned_s"]!r}}}\n'
    key = (meta.get("kind"), meta.get("site")) if len(meta) == 2 else None
    text = _PLAIN.get(key) if key is not None else None  # a plain call: the same every time
    if text is not None:
        return f"l {pid} {rid} {text}\n"
    for facts in (meta, {k: meta[k] for k in ("site", "kind") if k in meta}):
        try:
            text = _ENCODER.encode(facts)
        except (TypeError, ValueError):
            continue
        if len(text) <= MAX_META:
            if key is not None and facts is meta and len(_PLAIN) < 1024:
                _PLAIN[key] = text
            return f"l {pid} {rid} {text}\n"
    return ""


def pipe_identity(fd: int) -> str:
    st = os.fstat(fd)
    return f"{st.st_dev}:{st.st_ino}"


def process_line(pid: int, env: Mapping[str, str]) -> str:
    """The "p" line of a launcher's worker (its rank variables), "" for any other process."""
    if not any(env.get(k, "").strip() for k in WORKER_KEYS):
        return ""
    facts = {k: env[k] for k in RANK_VARS if k in env}
    return f"p {pid} {_ENCODER.encode(facts)}\n"


class _Channel:
    """The write end this process uses, found once per process (fork-aware)."""

    def __init__(self) -> None:
        self._pid = -1
        self._fd: int | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def fd(self) -> int | None:
        pid = os.getpid()
        if pid != self._pid:
            with self._lock:
                if pid != self._pid:
                    self._fd = _find_fd()
                    self._ids = itertools.count(1)
                    self._pid = pid
                    hello = process_line(pid, os.environ) if self._fd is not None else ""
                    if hello:
                        self._write(hello.encode())
        return self._fd

    def next_id(self) -> int:
        # the channel first: finding it for this process restarts the ids, and an id drawn
        # before that (the first region of a fresh or forked process) came back again as
        # its next region's (outer and inner both id 1, their edges paired wrongly)
        self.fd()
        return next(self._ids)

    def send(self, data: bytes) -> None:
        if self.fd() is not None:
            self._write(data)

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
        except OSError:  # the parent went away (EPIPE) or the fd was closed: stop trying
            self._fd = None

    def reset(self) -> None:
        """Look the fd up again on next use (tests change the environment)."""
        self._pid = -1


def _find_fd() -> int | None:
    """The inherited write end, else the named pipe opened by its path (a launcher's worker
    started with close_fds), else None."""
    raw = os.environ.get(ENV_FD)
    if raw:
        try:
            fd = int(raw)
            if _is_our_pipe(os.fstat(fd)):
                return fd
        except (ValueError, OSError):
            pass
    return _open_path()


def _is_our_pipe(st: os.stat_result) -> bool:
    if not stat.S_ISFIFO(st.st_mode):
        return False
    want = os.environ.get(ENV_PIPE)
    return not want or want == f"{st.st_dev}:{st.st_ino}"  # else: a number reused


def _open_path() -> int | None:
    path = os.environ.get(ENV_PATH)
    if not path or not os.environ.get(ENV_PIPE):
        return None  # a path is trusted only with the identity to check it against
    try:
        # O_NONBLOCK: fails (ENXIO) at once when no gpuenv reads it, never waits for one
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _is_our_pipe(os.fstat(fd)):
            os.close(fd)
            return None
        os.set_blocking(fd, True)  # as the inherited fd: a full pipe waits, loses nothing
    except OSError:
        os.close(fd)
        return None
    return fd


_CHANNEL = _Channel()


def active() -> bool:
    """True when region marks reach a `gpuenv run` parent."""
    return _CHANNEL.fd() is not None


class region(contextlib.ContextDecorator):  # lower case: used like a function, gpuenv.region("x")
    """Mark a named region; `gpuenv run` summarises the GPU's telemetry per region.

    A context manager and a decorator. Regions may nest and repeat (a region
    entered 100 times is one row with 100 repetitions in the summary). Costs
    one `write()` per edge under `gpuenv run`, two clock reads otherwise.

    Args:
        name: the region's name, as the summary's row shows it.
        discard_on_error: a region left by an exception is dropped from the summary
            (without it, it is kept and marked as ended by an error).
        meta: facts sent with the region's begin (what a wrapped call site was
            called with, say), kept with its measurement.

    Raises:
        ConfigError: an empty name.
    """

    def __init__(
        self,
        name: str,
        *,
        discard_on_error: bool = False,
        meta: Mapping[str, Any] | None = None,
    ):
        name = str(name).replace("\n", " ").replace("\r", " ").strip()
        if not name:
            from gpuenv.errors import ConfigError

            raise ConfigError("a region needs a name", hint='use gpuenv.region("train")')
        self.name = name[:MAX_NAME]
        self.t0: float | None = None
        self.t1: float | None = None
        self._id = 0
        self.discard_on_error = discard_on_error  # an exception ends it with "x", not "e"
        # facts sent with the begin edge ("l" line: see the module doc); `end_meta`, set
        # while the region runs, goes with the end edge
        self.meta = meta
        self.end_meta: dict[str, Any] | None = None

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from enter to exit (None until the region ends)."""
        if self.t0 is None or self.t1 is None:
            return None
        return self.t1 - self.t0

    def __enter__(self) -> region:
        self._id = _CHANNEL.next_id()
        self.t1 = None
        pid = os.getpid()
        facts = meta_line(pid, self._id, self.meta) if self.meta else ""
        self.t0 = time.monotonic()
        # one write: the begin edge and its facts arrive together (atomic below PIPE_BUF)
        _CHANNEL.send(f"b {pid} {self._id} {self.t0:.9f} {self.name}\n{facts}".encode())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.t1 = time.monotonic()
        kind = "x" if exc_type is not None and self.discard_on_error else "e"
        pid = os.getpid()
        facts = meta_line(pid, self._id, self.end_meta) if self.end_meta else ""
        _CHANNEL.send(f"{facts}{kind} {pid} {self._id} {self.t1:.9f}\n".encode())

    def _recreate_cm(self) -> region:
        # As a decorator, each call gets a fresh region (recursion and threads stay apart).
        return region(self.name, discard_on_error=self.discard_on_error, meta=self.meta)


__all__ = [
    "ENV_FD",
    "ENV_PATH",
    "ENV_PIPE",
    "RANK_VARS",
    "WORKER_KEYS",
    "Edge",
    "active",
    "meta_line",
    "parse_line",
    "pipe_identity",
    "process_line",
    "region",
]
