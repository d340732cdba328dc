"""Measurement and Run records and the JSONL store (environment metadata: gpuenv/environment.py).

Records are immutable with units in field names and round-trip through JSON.
A run file is JSON lines: a first line {"type": "run", "metadata": {...}},
then one {"type": "measurement", ...} line per measurement, appended, flushed
and fsynced as each measurement ends, so a crash loses nothing already measured.
One run per file unless the writer asked to append; a reader takes a file's last run
and says when it holds several (`load_run`, `several_runs`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar, overload

from gpuenv._files import naming
from gpuenv._records import JsonRecord, fields, from_dict, json_default, to_dict
from gpuenv.errors import ConfigError, FileError
from gpuenv.phases import BurstSchedule, Conditioned, Conditioning, FirstBurst, Wall, Warmup
from gpuenv.telemetry import Window
from gpuenv.units import fmt_s
from gpuenv.verdict import VERDICTS as VERDICTS  # its old home: gpuenv.results.VERDICTS
from gpuenv.verdict import Finding, Policy, Verdict

T = TypeVar("T")


@dataclass(frozen=True)
class Stats:
    """Statistics of the kept repetitions' times, in seconds."""

    n: int
    median_s: float | None
    mean_s: float | None
    stdev_s: float | None  # sample standard deviation; None for fewer than 2 reps
    min_s: float | None
    max_s: float | None
    iqr_s: float | None = None  # interquartile range (numpy's default method); None for 1 rep
    # the median's confidence interval (order statistics, at bench's `confidence`): the
    # headline CI, also in extra["ci_s"]; None where none was worked out (a region, a call)
    ci_s: tuple[float, float] | None = None

    @classmethod
    def of(cls, times_s: tuple[float, ...] | list[float]) -> Stats:
        xs = sorted(float(t) for t in times_s)
        n = len(xs)
        if n == 0:
            return cls(0, None, None, None, None, None, None)
        iqr = None
        if n >= 2:
            q = statistics.quantiles(xs, n=4, method="inclusive")
            iqr = q[2] - q[0]
        return cls(
            n=n,
            median_s=statistics.median(xs),
            mean_s=math.fsum(xs) / n,
            stdev_s=statistics.stdev(xs) if n >= 2 else None,
            min_s=xs[0],
            max_s=xs[-1],
            iqr_s=iqr,
        )

    @property
    def cv(self) -> float | None:
        """Coefficient of variation (stdev / mean)."""
        if self.stdev_s is None or not self.mean_s:
            return None
        return self.stdev_s / self.mean_s


@dataclass(frozen=True)
class Measurement(JsonRecord):
    """One named measurement: per-rep times and telemetry, findings, and a verdict.

    `times_s` and `windows` hold every repetition measured (windows: one per rep
    for the first measured GPU, or per rep and GPU: see `gpus`); `rejected_reps`
    are the ones the reject policy dropped, and `stats` covers the others.
    `telemetry` summarises the whole measurement per GPU.

    Attributes:
        name: what was measured.
        times_s: every repetition's time, in seconds.
        stats: the statistics of the reps kept (median, IQR, ...).
        windows: the telemetry of each rep (and GPU, in rep order then GPU order).
        findings: what the telemetry and the times showed, in words.
        verdict: "ok", "annotated" or "rejected".
        policy: the policy it was judged under: "annotate", "reject" or "retry".
        rejected_reps: the reps the reject policy dropped.
        retried_reps: the reps the retry policy measured again.
        summary_windows: one window per GPU over the whole measurement.
        gpus: the GPUs it was measured on.
        timer: what timed the reps: "host" (monotonic clock), "cuda_events", ...
        started_at: when it began, seconds since the epoch.
        extra: the harness's settings and facts (L2 flush, CI, clocks, ...), the
            records below included, under the keys files hold them in.

    What bench did before and around the reps, as records (gpuenv.phases), each None
    where the measurement holds none: `warmup`, `first_burst` (the wait before the first
    burst), `bursts` (the burst schedule), `precondition` (condition "sustained").
    """

    name: str
    times_s: tuple[float, ...]
    stats: Stats
    windows: tuple[Window, ...] = ()  # per rep (and per GPU, in rep order then GPU order)
    findings: tuple[Finding, ...] = ()
    verdict: Verdict = "ok"
    policy: Policy = "annotate"
    rejected_reps: tuple[int, ...] = ()
    retried_reps: tuple[int, ...] = ()
    summary_windows: tuple[Window, ...] = ()  # one per GPU over the whole measurement
    gpus: tuple[int, ...] = ()
    timer: str = "host"  # "host" (monotonic clock) | "cuda_events" | what the harness used
    started_at: float | None = None  # seconds since the epoch
    extra: dict[str, Any] = field(default_factory=dict)  # harness settings (warmup, L2 flush, ...)

    @classmethod
    def build(
        cls,
        name: str,
        times_s: tuple[float, ...] | list[float],
        *,
        rejected_reps: tuple[int, ...] | list[int] = (),
        **kwargs: Any,
    ) -> Measurement:
        """Compute `stats` from the reps not rejected and make the record."""
        times = tuple(float(t) for t in times_s)
        rejected = tuple(sorted(set(rejected_reps)))
        kept = [t for i, t in enumerate(times) if i not in rejected]
        return cls(name=name, times_s=times, stats=Stats.of(kept), rejected_reps=rejected, **kwargs)

    @property
    def _extra(self) -> Mapping[str, Any]:
        extra = self.extra
        return extra if isinstance(extra, Mapping) else {}  # a file may hold junk

    @property
    def conditioned(self) -> Conditioned | None:
        """The condition bench measured in ("burst", "sustained", "none"), why, and the GPUs
        its waits were for."""
        return Conditioned.from_extra(self._extra)

    @property
    def warmup(self) -> Warmup | None:
        """bench's warmup: reps, seconds, whether it settled."""
        return Warmup.from_extra(self._extra)

    @property
    def first_burst(self) -> FirstBurst | None:
        """How the first burst began (condition "burst"): the wait, the state probe."""
        return FirstBurst.from_extra(self._extra)

    @property
    def bursts(self) -> BurstSchedule | None:
        """What the burst schedule did (`BurstSchedule(rests=0)` in another condition)."""
        return BurstSchedule.from_extra(self._extra)

    @property
    def precondition(self) -> Conditioning | None:
        """What the sustained precondition did (condition "sustained")."""
        return Conditioning.from_extra(self._extra)

    @property
    def wall(self) -> Wall | None:
        """Where bench's wall time went: open, warmup, method, condition, measure, judge,
        close (`gpuenv.phases.Wall`); None in a file written before it was kept."""
        return Wall.from_extra(self._extra)

    @property
    def telemetry(self) -> Window | None:
        """The whole-measurement telemetry of the first GPU (see `summary_windows` for all)."""
        return self.summary_windows[0] if self.summary_windows else None

    @property
    def kept_times_s(self) -> tuple[float, ...]:
        return tuple(t for i, t in enumerate(self.times_s) if i not in self.rejected_reps)

    @property
    def median_s(self) -> float | None:
        return self.stats.median_s

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def summary(self) -> str:
        """A few lines a person reads: the time, the verdict, the telemetry, the findings."""
        s = self.stats
        if len(self.times_s) == 1:
            head = f"{self.name}: {fmt_s(self.times_s[0])}"
        elif s.n == 0:
            head = f"{self.name}: no reps kept of {len(self.times_s)}"
        else:
            spread = f", IQR {fmt_s(s.iqr_s)}" if s.iqr_s is not None else ""
            head = f"{self.name}: median {fmt_s(s.median_s)}{spread} over {s.n} reps"
            if self.rejected_reps:
                head += f" ({len(self.rejected_reps)} of {len(self.times_s)} rejected)"
        policy = f", policy {self.policy}" if self.policy != "annotate" else ""
        lines = [f"{head} [{self.verdict}{policy}]"]
        lines += [f"  {w.summary()}" for w in self.summary_windows]
        lines += [f"  {f}" for f in self.findings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def json_omit(self) -> str | None:
        """The field its JSON leaves out: a one-rep measurement whose `summary_windows` are
        its `windows` (each GPU's one window is its summary) writes them once, half of each
        line of a `gpuenv run` of 10,000 do_bench calls. `from_dict` puts them back."""
        one = (
            len(self.times_s) == 1
            and len(self.windows) == len(self.summary_windows)
            and all(
                a is b or a == b for a, b in zip(self.windows, self.summary_windows, strict=True)
            )
        )
        return "summary_windows" if one else None

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self, omit=self.json_omit())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        if "summary_windows" not in data and len(data.get("times_s") or ()) == 1:
            data = {**data, "summary_windows": data.get("windows") or []}
        stats = data.get("stats")
        if isinstance(stats, Mapping) and "ci_s" not in stats:
            # written before Stats held the CI: bench's is in extra["ci_s"]
            ci = (data.get("extra") or {}).get("ci_s")
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_number(x) for x in ci):
                data = {**data, "stats": {**stats, "ci_s": ci}}
        return from_dict(cls, data)


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Run(JsonRecord):
    """Environment metadata and the measurements taken in it.

    Attributes:
        metadata: the environment: GPU, driver, clocks, lock, host, library versions.
        measurements: the Measurements, in the order they ended.
    """

    metadata: dict[str, Any]
    measurements: tuple[Measurement, ...] = ()


# -- the JSONL store ---------------------------------------------------------------------


# made once (json.dumps makes one a call); records are written from their fields, in C
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default)


class ResultStore:
    """Appends a run to a JSONL file: a header line now, one line per measurement.

    Each line is written, flushed and fsynced before `append` returns, so a crash
    loses nothing already measured; `extend` writes measurements that are all ready at
    once (a `gpuenv run` ends with 10,000 of them) as one write and one fsync. One run
    per file: a file that already holds something is refused unless `append` (then
    several runs share it, each with its `run_id`; `load_runs` reads them all, `load_run`
    and every other reader the last, saying the file holds several).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        metadata: dict[str, Any],
        *,
        fsync: bool = True,
        mkdir: bool = False,
        append: bool = False,
        name: str = "output",
    ):
        """`mkdir`: create a missing directory (else a missing one is an error: gpuenv
        creates no directory it was not asked for). `append`: add this run to a file that
        holds others (else such a file is refused: one run per file). `name`: the option
        as its caller knows it (`-o`), for the error."""
        from gpuenv import validate

        self.path = validate.results_path(
            path, name, append=append, mkdir=mkdir, where="cannot write results"
        ) or Path(path)
        self.run_id = uuid.uuid4().hex
        self.fsync = fsync
        created = not self.path.exists()
        self._fh: IO[bytes] | None = None
        try:
            self._fh = open(self.path, "ab")  # noqa: SIM115
            self._write([{"type": "run", "run_id": self.run_id, "metadata": metadata}])
        except OSError as err:
            self.close()
            if created:  # leave no empty or half-written file behind
                with contextlib.suppress(OSError):
                    self.path.unlink()
            raise FileError.from_os_error(
                err, path=self.path, where="cannot write results"
            ) from err

    def append(self, measurement: Measurement) -> None:
        self.extend([measurement])

    def extend(self, measurements: Iterable[Measurement]) -> None:
        """Append measurements that are all ready now, with one fsync for all (an fsync per
        line cost 0.5-5 ms each: up to 50 s for 10,000), all of them or none."""
        self._write(
            {"type": "measurement", "run_id": self.run_id, **fields(m, m.json_omit())}
            for m in measurements
        )

    def _write(self, records: Iterable[dict[str, Any]]) -> None:
        """Whole lines or nothing: a write cut short (disk full) is cut back off. Each line is
        encoded as it is written, so 10,000 of them are never all in memory at once."""
        if self._fh is None:
            raise ConfigError(f"the result store for {self.path} is closed")
        fd = self._fh.fileno()
        size = os.fstat(fd).st_size
        wrote = False
        try:
            for record in records:
                self._fh.write((_ENCODER.encode(record) + "\n").encode())
                wrote = True
            if not wrote:
                return
            self._fh.flush()
            if self.fsync:
                os.fsync(fd)
        except BaseException as err:  # a disk that fills, or a record that cannot be encoded
            with contextlib.suppress(OSError):
                self._fh = _reopen_truncated(self._fh, self.path, size)
            if isinstance(err, OSError) and err.filename is None:  # a full disk names no file
                raise naming(err, self.path) from err
            raise

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reopen_truncated(fh: IO[bytes], path: Path, size: int) -> IO[bytes]:
    """Drop what a failed write left in `fh`'s buffer and cut the file back to `size`."""
    fd = os.dup(fh.fileno())
    with contextlib.suppress(OSError):
        fh.close()  # its flush may fail again: the dup keeps the file open
    os.ftruncate(fd, size)
    return os.fdopen(fd, "ab")


def load_runs(path: str | os.PathLike[str]) -> list[Run]:
    """Every run in a gpuenv JSONL file, in file order, read through gpuenv.reader.

    A line that is not JSON (the end of a file whose writer crashed mid-line) or of a
    record type this gpuenv does not know is skipped with a warning naming its line;
    everything before and after it still loads. A record that parses but is not what
    gpuenv writes (a NaN or string time, `windows: null`, a trace value "x") is refused:
    a ConfigError naming the file, line and field, since a number drawn or compared
    from it could not be trusted.
    """
    from gpuenv import reader

    p = Path(path)
    what = "cannot read results file"
    text = reader.read_text(
        p, what=what, max_bytes=reader.RESULTS_MAX_BYTES, noun="a results file", pipe_ok=True
    )
    runs: dict[str, tuple[dict[str, Any], list[Measurement]]] = {}
    bad: list[int] = []
    for lineno, line in enumerate(text.splitlines(), 1):  # type: ignore[union-attr]
        if not line.strip():
            continue
        try:
            record = reader.parse_json(line, what=what, path=p, line=lineno)
        except reader.BadRecord as err:
            if "not JSON" not in err.message:
                raise
            bad.append(lineno)  # a torn line: skipped, as the docstring says
            continue
        if not isinstance(record, dict):
            raise reader.BadRecord(what, p, "not a JSON object", line=lineno)
        kind = record.get("type")
        run_id = str(record.get("run_id", ""))
        if kind == "run":
            meta = record.get("metadata") or {}
            if not isinstance(meta, dict):
                raise reader.BadRecord(what, p, "not a JSON object", line=lineno, field="metadata")
            runs.setdefault(run_id, ({}, []))[0].update(meta)
        elif kind == "measurement":
            runs.setdefault(run_id, ({}, []))[1].append(_measurement(record, p, lineno))
        else:
            bad.append(lineno)
    if not runs:  # said first and alone: a line count would only hide what is wrong
        hint = "pass a .jsonl file written by gpuenv (gpuenv run -o, Results.save)"
        if bad:
            raise ConfigError(
                f"{p} is not a gpuenv results file: none of its {len(bad)} lines is a gpuenv "
                "record",
                hint=hint,
            )
        raise ConfigError(f"{p} holds no gpuenv run", hint=hint)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        warnings.warn(f"{p}: skipped {len(bad)} unreadable line(s): {shown}", stacklevel=2)
    return [Run(dict(meta, run_id=rid), tuple(ms)) for rid, (meta, ms) in runs.items()]


TRACE_SERIES = ("t_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons")
_TOGETHER = (
    ("sm_mhz_mean", "sm_mhz_min", "sm_mhz_max"),
    ("power_w_mean", "power_w_max"),
    ("temp_c_start", "temp_c_end"),
)


def _measurement(record: dict[str, Any], path: Path, lineno: int) -> Measurement:
    """A measurement line, its schema checked first (gpuenv.reader) and its traces too."""
    from gpuenv import reader

    what = "cannot read results file"
    reader.check_record(Measurement, record, what=what, path=path, line=lineno)
    extra = record.get("extra") or {}
    traces = {"trace": extra.get("trace")}
    if isinstance(extra.get("traces"), dict):
        traces.update({f"traces.{k}": v for k, v in extra["traces"].items()})
    for name, trace in traces.items():
        if trace is None:
            continue
        problem = reader.check_series(trace, TRACE_SERIES, f"extra.{name}")
        if problem is not None:
            raise reader.BadRecord(what, path, problem[1], line=lineno, field=problem[0])
    for key in ("windows", "summary_windows"):  # values a window computes together
        for i, w in enumerate(record.get(key) or []):
            for group in _TOGETHER:
                if any(w.get(k) is not None for k in group) and None in map(w.get, group):
                    missing = next(k for k in group if w.get(k) is None)
                    raise reader.BadRecord(
                        what,
                        path,
                        f"null beside {group[0]}",
                        line=lineno,
                        field=f"{key}[{i}].{missing}",
                    )
    rejected = record.get("rejected_reps") or []
    n = len(record.get("times_s") or [])
    if n == 0:
        raise reader.BadRecord(
            what,
            path,
            "no times (a measurement has one rep at least)",
            line=lineno,
            field="times_s",
        )
    for i, rep in enumerate(rejected):
        if not 0 <= rep < n:
            raise reader.BadRecord(
                what,
                path,
                f"rep {rep} is not one of the {n} reps",
                line=lineno,
                field=f"rejected_reps[{i}]",
            )
    return Measurement.from_dict(record)


def load_run(path: str | os.PathLike[str]) -> Run:
    """The last run in a gpuenv JSONL file (see `load_runs` for all of them), as every
    reader takes it (`gpuenv compare`, `gpuenv plot`); a file that holds several (written
    with --append) is said, with a warning.

    Args:
        path: a JSONL file gpuenv wrote (`gpuenv run -o`, `stable(output=)`,
            `bench(output=)`, `Results.save`).

    Returns:
        The file's last `Run`: its environment and Measurements.

    Raises:
        ConfigError: the file holds no gpuenv run; `FileError` (one) when it cannot be
            read, `BadRecord` naming the line and field of a record it cannot judge.
    """
    runs = load_runs(path)
    if len(runs) > 1:
        warnings.warn(several_runs(path, runs), stacklevel=2)
    return runs[-1]


def several_runs(path: str | os.PathLike[str], runs: Sequence[Run]) -> str:
    """The sentence a reader says when a file holds several runs and it takes the last."""
    when = runs[-1].metadata.get("time_utc")
    last = f"the last (written {when})" if when else "the last"
    return f"{os.fspath(path)} holds {len(runs)} runs (written with --append): reading {last}"


class Results(Sequence[Measurement]):
    """The measurements of a session, in order; `save(path)` writes them as a run.

    With a `store`, `add` also appends each measurement to its JSONL file at once
    (a write that fails is warned about, and the measurement stays here).
    """

    def __init__(self, metadata: dict[str, Any] | None = None, *, store: ResultStore | None = None):
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.store = store
        self._items: list[Measurement] = []
        self._store_failed = False
        self._held: set[int] = set()  # indices not final yet: not appended to `store`
        self._written = 0  # the items appended to `store` (or tried): all before the held

    def add(self, measurement: Measurement, *, held: bool = False) -> int:
        """Keep `measurement` (and append it to `store`); returns its index. `held`: not
        final yet (its energy awaits the driver's next power sample): it is appended once
        `settle` gives its final form, and those added after it wait behind it, so the file
        keeps their order."""
        self._items.append(measurement)
        index = len(self._items) - 1
        if held:
            self._held.add(index)
        self._write_ready()
        return index

    def settle(self, index: int, measurement: Measurement) -> None:
        """The final form of the measurement at `index` (added `held`): kept in its place,
        and appended to `store` with those that waited behind it."""
        self._items[index] = measurement
        self._held.discard(index)
        self._write_ready()

    @property
    def held(self) -> frozenset[int]:
        """The indices of measurements added `held` and not settled yet."""
        return frozenset(self._held)

    def _write_ready(self) -> None:
        while self._written < len(self._items) and self._written not in self._held:
            measurement = self._items[self._written]
            self._written += 1
            if self.store is None:
                continue
            try:
                self.store.append(measurement)
            except (OSError, ConfigError) as err:
                if not self._store_failed:
                    self._store_failed = True
                    warnings.warn(
                        f"could not append {measurement.name!r} to {self.store.path}: {err}; "
                        "results stay in memory (env.results.save(path) writes them)",
                        stacklevel=3,
                    )

    @overload
    def __getitem__(self, index: int) -> Measurement: ...
    @overload
    def __getitem__(self, index: slice) -> list[Measurement]: ...
    def __getitem__(self, index: int | slice) -> Measurement | list[Measurement]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def by_name(self, name: str) -> list[Measurement]:
        return [m for m in self._items if m.name == name]

    def run(self) -> Run:
        return Run(dict(self.metadata), tuple(self._items))

    def save(
        self, path: str | os.PathLike[str], *, mkdir: bool = False, append: bool = False
    ) -> Path:
        """Write this run (metadata and every measurement) to a JSONL file of its own
        (`mkdir`: create its directory when missing; `append`: add it to a file that holds
        other runs, which is refused otherwise)."""
        with ResultStore(path, self.metadata, mkdir=mkdir, append=append) as store:
            store.extend(self._items)
        return store.path

    def __str__(self) -> str:
        return "\n".join(m.summary() for m in self._items) or "(no measurements)"
