"""`gpuenv run` under torchrun and Slurm: each rank's GPU and results file, and
`--summary rank0`: one table for all ranks of a job.

Each rank's `gpuenv run` wraps its own process and GPU, as without the option;
at the end, instead of N tables interleaved on stderr, every rank but 0 writes
its summary (the header facts and its measurements, without per-rep windows or
traces) to a directory shared by the job, and rank 0 waits for them, at most
`GPUENV_RANKS_WAIT_S` seconds (default 60) after its own command ended, then
prints one table with a rank column and says which ranks did not report.

The directory is `$GPUENV_RANKS_DIR` (default: the temp directory) /
gpuenv-ranks-<uid>-<job>, the job being Slurm's job and step ids, or torchrun's run id,
master address and port and restart count. Ranks on other nodes reach rank 0's
only through a shared filesystem: set GPUENV_RANKS_DIR to one there. A file a
rank wrote before this job's rank 0 started (a killed job's) is not read.

The name is predictable, so the directory is trusted only when it is this user's and
private: made 0700 through `gpuenv._files.open_dir` (every component checked, no link
followed), every file read and written relative to it. One another account made first is
refused (rank 0 says so and prints its own table): no other account's summary is ever
printed as a rank's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuenv._files import UnsafePath, open_dir, read_at, replace_at
from gpuenv.backend import Backend
from gpuenv.results import Measurement
from gpuenv.run.collective import job_lines
from gpuenv.run.report import RUN_NAME, fmt_time, summary_table, tail_lines

ENV_DIR = "GPUENV_RANKS_DIR"
ENV_WAIT = "GPUENV_RANKS_WAIT_S"
WAIT_S = 60.0
POLL_S = 0.1
CLOCK_SKEW_S = 30.0  # a rank's end may be read this long before rank 0's start (other nodes)
_DROP_EXTRA = ("trace", "traces", "regions")  # big, and not in the table


def wait_time(env: Mapping[str, str]) -> float:
    """GPUENV_RANKS_WAIT_S, judged (gpuenv.validate): 'abc' is refused, not read as 60 s."""
    from gpuenv import validate

    return validate.env_number(ENV_WAIT, WAIT_S, lo=0, hi=86400, environ=env)


# -- where and what: a rank under torchrun / Slurm ---------------------------------------


def rank_of(env: Mapping[str, str]) -> int | None:
    """This process's global rank when it is one of several (torchrun RANK, Slurm SLURM_PROCID)."""
    for rank_key, size_key in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        rank, size = env.get(rank_key, "").strip(), env.get(size_key, "").strip()
        if rank.isdigit() and (not size.isdigit() or int(size) > 1):
            return int(rank)
    return None


def worker_of(
    facts: Mapping[str, Any], backend: Backend, gpus: Sequence[int]
) -> tuple[int | None, int | None]:
    """A launcher's worker's rank and NVML GPU, from the rank variables it sent ("p" line,
    gpuenv/run/region.py), by the rule a rank's own `gpuenv run` follows
    (gpuenv.devices.own_gpus: its LOCAL_RANK's CUDA device under its CUDA_VISIBLE_DEVICES).
    The GPU is None where that names not exactly one; it may be one this run does not
    sample (not in `gpus`)."""
    from gpuenv.devices import own_gpus
    from gpuenv.errors import GpuenvError

    env = {str(k): str(v) for k, v in facts.items()}
    rank = rank_of(env)
    try:
        chosen = own_gpus(backend, env).indices
    except GpuenvError:
        return rank, None
    return rank, chosen[0] if len(chosen) == 1 else None


def rank_output_path(path: str | os.PathLike[str], rank: int | None) -> Path:
    """run.jsonl -> run.rank3.jsonl for rank 3, so ranks never write one file."""
    p = Path(path)
    if rank is None:
        return p
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix or '.jsonl'}")


# -- --summary rank0 --------------------------------------------------------------------------


def job_key(env: Mapping[str, str]) -> str:
    """What names this job's directory: the same for all its ranks, different across jobs."""
    if env.get("SLURM_JOB_ID"):
        parts = ["slurm", env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID", "")]
    else:
        parts = [
            "torch",
            *(
                env.get(k, "")
                for k in (
                    "TORCHELASTIC_RUN_ID",
                    "MASTER_ADDR",
                    "MASTER_PORT",
                    "TORCHELASTIC_RESTART_COUNT",
                )
            ),
        ]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(parts))


def world_size(env: Mapping[str, str]) -> int | None:
    for key in ("WORLD_SIZE", "SLURM_NTASKS"):
        value = env.get(key, "").strip()
        if value.isdigit():
            return int(value)
    return None


def ranks_dir(env: Mapping[str, str]) -> Path:
    base = Path(env.get(ENV_DIR) or tempfile.gettempdir())
    return base / f"gpuenv-ranks-{os.geteuid()}-{job_key(env)}"


def _open_ranks_dir(directory: Path) -> int:
    """The job's directory, this user's and 0700 (UnsafePath when another account's)."""
    return open_dir(directory, create=True, mode=0o700, what="the ranks' directory")


def node_name(env: Mapping[str, str]) -> str:
    """The node a rank runs on, as its job's scheduler names it (Slurm's SLURMD_NODENAME:
    several slurmd may share a host), else the host name."""
    return env.get("SLURMD_NODENAME", "").strip() or socket.gethostname()


def publish(
    directory: Path,
    record: Mapping[str, Any],
    measurements: Sequence[Measurement],
    *,
    node: str | None = None,
) -> Path:
    """Write one rank's summary, atomically (rank 0 never reads half a file)."""
    data = dict(
        record,
        host=node or socket.gethostname(),
        ended_at=time.time(),
        measurements=[_slim(m) for m in measurements],
    )
    name = f"rank{record['rank']}.json"
    dfd = _open_ranks_dir(directory)
    try:
        replace_at(dfd, name, json.dumps(data).encode())
    finally:
        os.close(dfd)
    return directory / name


def _slim(m: Measurement) -> dict[str, Any]:
    data = m.to_dict()
    # a one-rep measurement's JSON holds its summary only as its one rep's window
    # (Measurement.json_omit): keep it, or rank 0's table shows "-" for this rank
    data.setdefault("summary_windows", data["windows"])
    data["windows"] = []
    data["extra"] = {k: v for k, v in m.extra.items() if k not in _DROP_EXTRA}
    return data


def gather(
    directory: Path, ranks: Sequence[int], *, since: float, wait_s: float
) -> dict[int, dict[str, Any]]:
    """The summaries of `ranks` found in `directory` within `wait_s` (written after `since`)."""
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_s
    dfd = _open_ranks_dir(directory)
    try:
        while True:
            for r in ranks:
                if r in found:
                    continue
                try:
                    text = read_at(dfd, f"rank{r}.json")
                except OSError:
                    continue
                data = _rank_summary(text, directory / f"rank{r}.json")
                if data is not None and data["ended_at"] >= since - CLOCK_SKEW_S:
                    found[r] = data
            if len(found) == len(ranks) or time.monotonic() >= deadline:
                return found
            time.sleep(POLL_S)
    finally:
        os.close(dfd)


def _rank_summary(text: bytes, path: Path) -> dict[str, Any] | None:
    """A rank's summary (read through the checked directory) parsed by gpuenv.reader (bounded
    depth, its measurements' schema checked), or None while it is partial or not one (it is
    waited for, and named missing at the end)."""
    from gpuenv import reader
    from gpuenv.errors import ConfigError

    what = "a rank's summary"
    try:
        data = reader.parse_json(text, what=what, path=path)
        ended = data.get("ended_at") if isinstance(data, dict) else None
        if isinstance(ended, bool) or not isinstance(ended, (int, float)) or abs(ended) > 1e300:
            return None  # also NaN and inf (a NaN compares False: abs(nan) > x is False)
        if ended != ended:
            return None
        if not isinstance(data.get("measurements", []), list):
            return None
        for i, m in enumerate(data.get("measurements", [])):
            reader.check_record(Measurement, m, what=what, path=path, prefix=f"measurements[{i}]")
    except ConfigError:
        return None
    return data


def report_ranks(
    record: Mapping[str, Any],
    measurements: Sequence[Measurement],
    env: Mapping[str, str],
    *,
    started_wall: float,
    verbose: bool = False,
) -> str:
    """Rank 0: wait for the others and return the combined table; others: publish, return ""."""
    directory = ranks_dir(env)
    rank = int(record["rank"])
    node = node_name(env)
    if rank != 0:
        publish(directory, record, measurements, node=node)
        return ""
    wait_s = wait_time(env)
    others = list(range(1, world_size(env) or 1))
    refused = ""
    try:
        found = gather(directory, others, since=started_wall, wait_s=wait_s)
    except UnsafePath as err:  # made by another account first: read nothing from it
        found, refused = {}, f"\n  ranks' summaries not read: {err}"
    else:
        for r in found:
            with contextlib.suppress(OSError):
                (directory / f"rank{r}.json").unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when empty: a straggler's file stays for no one
    runs = [(0, dict(record, host=node), list(measurements))]
    runs += [
        (r, d, [Measurement.from_dict(m) for m in d["measurements"]])
        for r, d in sorted(found.items())
    ]
    missing = [r for r in others if r not in found]
    return combined_text(runs, missing, wait_s, verbose=verbose) + refused


def combined_text(
    runs: Sequence[tuple[int, Mapping[str, Any], Sequence[Measurement]]],
    missing: Sequence[int],
    wait_s: float,
    *,
    verbose: bool = False,
) -> str:
    """One header, a line per rank (how it ended, on which node and GPUs, by UUID), one
    table with a rank column and, when the ranks ran on several nodes, a node column (the
    calls of a site grouped per rank), then the steps the ranks marked alike
    (gpuenv/run/collective.py)."""
    first = runs[0][1]
    n = len(runs) + len(missing)
    lines = [f"gpuenv run: {first['command']} on {n} ranks; {first['state']}"]
    for r, rec, _ in runs:
        host = f" ({rec['host']})" if rec.get("host") else ""
        uuids = [u for u in rec.get("uuids") or [] if isinstance(u, str) and u]
        ids = f" [{', '.join(uuids)}]" if uuids else ""
        lines.append(
            f"  rank {r}{host}: {rec['outcome']} after {fmt_time(rec['duration_s'])} "
            f"on {rec['where']}{ids}"
        )
    if missing:
        names = ", ".join(str(r) for r in missing)
        lines.append(
            f"  rank {names}: no summary within {wait_s:g} s (still running, killed, or "
            f"on another node: set {ENV_DIR} to a shared directory)"
        )
    hosts = {str(rec.get("host") or "") for _, rec, _ in runs}
    table = summary_table(
        [m for _, _, ms in runs for m in ms],
        header="\n".join(lines),
        ranks=[r for r, _, ms in runs for _ in ms],
        nodes=[str(rec.get("host") or "") for _, rec, ms in runs for _ in ms]
        if len(hosts) > 1
        else None,
        verbose=verbose,
    )
    where = {r: str(rec.get("host") or "") for r, rec, _ in runs} if len(hosts) > 1 else None
    steps = job_lines([(r, m) for r, _, ms in runs for m in ms if m.name != RUN_NAME], where)
    tails = "".join(line for _, rec, ms in runs for line in tail_lines(rec, ms))
    return "\n".join([table, *steps]) + tails


__all__ = [
    "ENV_DIR",
    "ENV_WAIT",
    "combined_text",
    "gather",
    "job_key",
    "node_name",
    "publish",
    "rank_of",
    "rank_output_path",
    "ranks_dir",
    "report_ranks",
    "wait_time",
    "worker_of",
    "world_size",
]
