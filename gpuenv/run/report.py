"""What `gpuenv run` reports: `build_measurements` makes one `Measurement` per region
name (a rep per time it was entered), one per call of a measuring function (do_bench,
Timer, pytest-benchmark: never reps of one), plus the whole run, "(run)", all judged by
gpuenv.judge; `summary_table` is what `gpuenv run` prints: a row per region, and a row per
site of calls (how many, their verdicts, the flagged ones by name; -v: every call).
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.judge import Evidence, judge
from gpuenv.reasons import counter
from gpuenv.results import Measurement
from gpuenv.run.tracker import Region
from gpuenv.table import render as render_table
from gpuenv.telemetry import Window, merge_windows
from gpuenv.timing.decision import decision_lines
from gpuenv.units import fmt_j, fmt_s
from gpuenv.verdict import Finding, GpuFacts, Policy, VerdictConfig, severity_rank

RUN_NAME = "(run)"  # the region that is the whole command
MAX_REP_WINDOWS = 1_000  # per-rep windows stored in the results file (findings use them all)


# tools that warm up before they measure: a call that starts on an idle GPU is no warm-up
# problem of the number it returns (triton's do_bench runs ~25 ms of calls first, a torch
# Timer a hundredth of its calls or its block-size estimate); pytest-benchmark does not
WARMED_BY_TOOL = {
    "do_bench": "do_bench warms up before the reps it returns",
    "timer": "the Timer warms up before it measures",
}


def _demote_cold_start(findings: list[Finding]) -> list[Finding]:
    """A command starts with the GPU idle: for the whole run that is no finding to reject on."""
    out = []
    for f in findings:
        if f.kind == "warmup_ramp" and f.severity != "info":
            f = dataclasses.replace(
                f,
                severity="info",
                message=f"{f.message} (expected: a command starts with the GPU idle)",
            )
        out.append(f)
    return out


Worker = tuple[int | None, int | None]  # a launcher's worker's rank and NVML GPU (None: unknown)


def build_measurements(
    regions: Sequence[Region],
    run: Region,
    *,
    gpus: Sequence[int],
    facts: dict[int, GpuFacts],
    policy: Policy,
    stable_clocks: bool,
    wall_at: Any,
    extra_run: dict[str, Any] | None = None,
    workers: Mapping[int, Worker] | None = None,
) -> list[Measurement]:
    """One Measurement for the whole run, then one per region name (reps in time order) and
    one per call of a measuring function (a region with a "site": see region.py), named by
    `call_names`: calls are never reps of one measurement.

    `workers` (pid -> rank and GPU: the workers of a launcher `gpuenv run` wraps whole) makes
    each rank's regions its own measurements, with its rank in `extra["rank"]` and only its
    GPU's telemetry, listed rank by rank after the command's own.

    With regions, the policy applies to them and the whole run is only annotated;
    without, it applies to the whole run (whose idle start is not held against it).
    """
    config = VerdictConfig(stable_clocks=stable_clocks)
    workers = workers or {}
    groups, names = _grouped(regions, workers)
    out = [
        _measurement(
            RUN_NAME,
            [run],
            gpus,
            facts,
            policy if not groups else "annotate",
            config,
            wall_at,
            run_level=True,
            extra=extra_run or {},
            extra_findings=command_failed((extra_run or {}).get("returncode")),
        )
    ]
    per_site: dict[tuple[int | None, str], int] = {}
    for key, reps in groups.items():
        rank, gpu = workers.get(reps[0].pid, (None, None))
        extra: dict[str, Any] = {"pids": sorted({r.pid for r in reps})}
        if rank is not None:
            extra["rank"] = rank
        if gpu is not None and gpu not in gpus:
            extra["gpu_not_sampled"] = gpu
        name = key[1] if isinstance(key, tuple) else key
        if isinstance(key, int):  # one call
            meta = reps[0].meta or {}
            name = names[key]
            n = per_site[rank, meta["site"]] = per_site.get((rank, meta["site"]), 0) + 1
            extra.update(meta, call=n)
        incomplete = [k for k, r in enumerate(reps) if not r.complete]
        if incomplete:
            extra["incomplete_reps"] = incomplete
        why = WARMED_BY_TOOL.get(str(extra.get("kind"))) if isinstance(key, int) else None
        out.append(
            _measurement(
                name,
                reps,
                gpus if gpu is None else [gpu] if gpu in gpus else [],  # [] not sampled: no
                # other GPU's telemetry stands in for it
                facts,
                policy,
                config,
                wall_at,
                extra=extra,
                amend=functools.partial(_warmed_by_tool, why=why, extra=extra) if why else None,
            )
        )
    return out


def command_failed(returncode: Any) -> list[Finding]:
    """A command that failed (exit code not 0, or killed by a signal) makes its run's
    verdict say so: the whole run's numbers are those of a run that did not finish well."""
    if not isinstance(returncode, int) or returncode == 0:
        return []
    if returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited {returncode}"
    return [
        Finding(
            "command_failed",
            "error",
            (0,),
            f"the command {how}: the run's numbers are those of a run that failed",
            details={"returncode": returncode},
        )
    ]


def _grouped(
    regions: Sequence[Region], workers: Mapping[int, Worker]
) -> tuple[dict[Any, list[Region]], dict[int, str]]:
    """The regions grouped into measurements (a rank's name's reps, or one call keyed by
    id()), the command's own first, then rank by rank, each in time order; and each call's
    name (`call_names`, numbered within its rank)."""

    def rank(r: Region) -> int | None:
        return workers.get(r.pid, (None, None))[0]

    groups: dict[Any, list[Region]] = {}
    for r in sorted(regions, key=lambda r: r.t0):
        groups.setdefault(id(r) if is_call(r) else (rank(r), r.name), []).append(r)
    ordered = dict(
        sorted(groups.items(), key=lambda kv: (rank(kv[1][0]) is not None, rank(kv[1][0]) or 0))
    )
    calls = [reps[0] for k, reps in ordered.items() if isinstance(k, int)]
    names: dict[int, str] = {}
    for who in {rank(c) for c in calls}:
        mine = [c for c in calls if rank(c) == who]
        names.update(zip(map(id, mine), call_names(mine), strict=True))
    return ordered, names


def _warmed_by_tool(findings: list[Finding], why: str, extra: dict[str, Any]) -> list[Finding]:
    """A call of a tool that warms up before it measures: its idle start is no finding
    (the number it returned came after the warm-up), only a note in `extra`."""
    kept = [f for f in findings if f.kind != "warmup_ramp"]
    if len(kept) < len(findings):
        extra["cold_start"] = f"the call began on an idle GPU: {why}"
    return kept


def is_call(r: Region) -> bool:
    """A call of a measuring function (its own measurement), not a named region's rep."""
    return bool(r.meta and isinstance(r.meta.get("site"), str))


def call_names(calls: Sequence[Region]) -> list[str]:
    """Each call's measurement name: its own, then "(<site>)" where calls of several sites
    share it and "#k" where calls of one site do (k in time order): names a later run of
    the same command gives the same calls, so `gpuenv compare` pairs them."""
    sites: dict[str, set[str]] = {}
    for c in calls:
        sites.setdefault(c.name, set()).add(str((c.meta or {})["site"]))
    names = [
        c.name if len(sites[c.name]) == 1 else f"{c.name} ({(c.meta or {})['site']})" for c in calls
    ]
    count = Counter(names)
    seen: Counter[str] = Counter()
    out = []
    for n in names:
        seen[n] += 1
        out.append(f"{n} #{seen[n]}" if count[n] > 1 else n)
    return out


def _measurement(
    name: str,
    reps: Sequence[Region],
    gpus: Sequence[int],
    facts: dict[int, GpuFacts],
    policy: Policy,
    config: VerdictConfig,
    wall_at: Any,
    *,
    run_level: bool = False,
    extra: dict[str, Any],
    amend: Any = None,
    extra_findings: Sequence[Finding] = (),
) -> Measurement:
    times = [float((r.t1 or r.t0) - r.t0) for r in reps]
    windows = [r.windows[g] for r in reps for g in gpus if r.windows is not None]
    summary = tuple(merge_windows([w for w in windows if w.gpu == g]) for g in gpus if windows)
    keep = len(reps) <= MAX_REP_WINDOWS  # keep the file small; the findings saw every rep
    if not keep:
        extra = {**extra, "rep_windows_omitted": len(reps)}
    return judge(
        name,
        times,
        Evidence.given(windows, gpus),
        facts=facts,
        config=config,
        policy=policy,
        amend=_demote_cold_start if run_level else amend,
        extra_findings=extra_findings,
        raise_if_too_few=False,
        summary_windows=summary,
        keep_rep_windows=keep,
        timer="host",
        started_at=wall_at(reps[0].t0),
        extra=extra,
    )


# the time-under-reason counters the summary table shows (gpuenv.reasons.COUNTERS)
_TABLE_COUNTERS = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
)


def fmt_time(seconds: float | None) -> str:
    return fmt_s(seconds, "table")


def _window_cells(w: Window | None) -> list[str]:
    """SM MHz, power, energy, temp C and time under, for one window (dashes without)."""
    if w is None:
        return ["-"] * 5
    sm = "-" if w.sm_mhz_mean is None else f"{w.sm_mhz_mean:.0f}"
    if w.sm_mhz_min is not None and w.sm_mhz_max is not None and w.sm_mhz_min != w.sm_mhz_max:
        sm += f" ({w.sm_mhz_min:.0f}-{w.sm_mhz_max:.0f})"
    power = "-" if w.power_w_mean is None else f"{w.power_w_mean:.0f} W"
    temp = "-" if w.temp_c_start is None else f"{w.temp_c_start:.0f}-{w.temp_c_max:.0f}"
    under = ", ".join(
        f"{counter(k).short} {fmt_time(v)}"
        for k, v in sorted(w.reason_s.items())
        if k in _TABLE_COUNTERS and v >= 0.0005
    )
    return [sm, power, fmt_j(w.energy_j, approx=w.energy_interpolated), temp, under or "-"]


MAX_FLAGGED = 10  # flagged calls named per site without -v; the rest are counted


def summary_table(
    measurements: Sequence[Measurement],
    *,
    header: str,
    ranks: Sequence[int | None] | None = None,
    nodes: Sequence[str] | None = None,
    verbose: bool = False,
) -> str:
    """The table `gpuenv run` prints on stderr: a row per region and GPU, findings below.
    Calls of one site (a do_bench line, a Timer, a pytest test) share one row (their count,
    verdicts and median), their flagged ones named below; `verbose` adds a row per call.
    `ranks` (one per measurement; None: the launcher's own) adds a rank column: the table
    of all ranks of a job; `nodes` (one per measurement, with `ranks`) a node column: GPU 0
    of two nodes is two GPUs."""
    where = nodes if nodes is not None else [""] * len(measurements)
    multi = len({(n, g) for n, m in zip(where, measurements, strict=True) for g in m.gpus}) > 1
    cols = [
        *(["rank"] if ranks is not None else []),
        *(["node"] if nodes is not None else []),
        "region",
        *(["gpu"] if multi else []),
        "reps",
        "time",
        "SM MHz",
        "power",
        "energy",
        "temp C",
        "time under",
        "verdict",
    ]
    sites: dict[tuple[int | None, str], list[Measurement]] = {}
    for i, m in enumerate(measurements):
        site = _site(m)
        if site is not None:
            sites.setdefault((None if ranks is None else ranks[i], site), []).append(m)
    rows: list[list[str]] = []
    notes: list[str] = []
    for i, m in enumerate(measurements):
        rank = None if ranks is None else ranks[i]
        who = "" if rank is None else f"rank {rank}: "
        cell = [] if ranks is None else ["" if rank is None else str(rank)]
        cell += [] if nodes is None else [nodes[i]]
        site = _site(m)
        if site is None:
            rows += _rows(m, m.name, cell, multi)
            notes += _notes(m, who)
            continue
        calls = sites.pop((rank, site), None)
        if calls is None:
            continue  # its site's row is already in
        if len(calls) == 1:  # a site of one call: the call's own row
            rows += _rows(m, m.name, cell, multi)
            notes += _notes(m, who)
            continue
        rows += _site_rows(site, calls, cell, multi)
        if verbose:
            for c in calls:
                rows += _rows(c, "  " + c.name, cell, multi)
                notes += _notes(c, who)
        else:
            notes += _flagged(site, calls, who)
    for i, m in enumerate(measurements):  # each autotuner's decision, when gpuenv made it
        who = "" if ranks is None or ranks[i] is None else f"rank {ranks[i]}: "
        notes += [f"  {who}{line}" for line in decision_lines(m.extra.get("autotune"))]
    lines = [header, *render_table(rows, header=cols, indent="  ")]
    return "\n".join(lines + notes)


def _site(m: Measurement) -> str | None:
    site = m.extra.get("site")
    return site if isinstance(site, str) else None


def _rows(m: Measurement, name: str, rank: Sequence[str], multi: bool) -> list[list[str]]:
    """A measurement's rows: one per GPU (nothing for one that has no reps); `rank`: the
    rank and node columns' cells (none: no such columns)."""
    if m.stats.n == 0 and not m.times_s:
        return []
    if len(m.times_s) == 1:
        when = fmt_time(m.times_s[0])
    else:  # the kept reps' median; all reps' when every one was rejected
        med = m.stats.median_s if m.stats.n else statistics.median(m.times_s)
        when = f"med {fmt_time(med)}"
    returned = m.extra.get("returned_s")
    if isinstance(returned, (int, float)):
        when += f" (returned {fmt_time(returned)})"
    verdict: str = m.verdict  # the table's cell: the verdict, then the reps it rejected
    if m.rejected_reps and len(m.times_s) > 1:  # what the reject policy did, in its word
        k, n = len(m.rejected_reps), len(m.times_s)
        verdict += f" ({k} of {n} reps)" if verdict == "rejected" else f", {k} of {n} reps rejected"
    return _per_gpu(m.summary_windows, name, rank, multi, [str(len(m.times_s)), when], verdict)


def _per_gpu(
    windows: Sequence[Window],
    name: str,
    rank: Sequence[str],
    multi: bool,
    lead: list[str],
    verdict: str,
) -> list[list[str]]:
    rows = []
    for k, w in enumerate(windows or (None,)):
        top = k == 0
        row = [*(c if top else "" for c in rank), name if top else ""]
        row += [str(w.gpu) if w else "-"] if multi else []
        row += lead if top else [""] * len(lead)
        row += [*_window_cells(w), verdict if top else ""]
        rows.append(row)
    return rows


def _site_rows(
    site: str, calls: Sequence[Measurement], rank: Sequence[str], multi: bool
) -> list[list[str]]:
    """One site's row: its calls, the median of what they returned (do_bench's time, a
    Timer's median) or else of their durations, their telemetry merged (display only)."""
    returned = [
        c.extra["returned_s"] for c in calls if isinstance(c.extra.get("returned_s"), (int, float))
    ]
    if returned:
        when = f"med {fmt_time(statistics.median(returned))} returned"
    else:
        when = f"med {fmt_time(statistics.median(t for c in calls for t in c.times_s[:1]))}"
    gpus = sorted({w.gpu for c in calls for w in c.summary_windows})
    windows = [
        merge_windows([w for c in calls for w in c.summary_windows if w.gpu == g]) for g in gpus
    ]
    count = Counter(c.verdict for c in calls)
    verdict = ", ".join(f"{count[v]} {v}" for v in ("ok", "annotated", "rejected") if count[v])
    return _per_gpu(windows, site, rank, multi, [f"{len(calls)} calls", when], verdict)


def _notes(m: Measurement, who: str) -> list[str]:
    lines = []
    incomplete = m.extra.get("incomplete_reps")
    if incomplete:
        lines.append(f"  {who}{m.name}: the command ended inside {len(incomplete)} rep(s)")
    lines.extend(f"  {who}{m.name}: [{f.severity}] {f.kind}: {f.message}" for f in m.findings)
    return lines


def _flagged(site: str, calls: Sequence[Measurement], who: str) -> list[str]:
    """The calls of a site that were not ok, each named with its gravest finding (at most
    MAX_FLAGGED; the rest counted by finding)."""
    order = {"rejected": 0, "annotated": 1}
    flagged = sorted((c for c in calls if c.verdict != "ok"), key=lambda c: order[c.verdict])
    if not flagged:
        return []
    lines = [f"  {who}{site}: {len(flagged)} of {len(calls)} calls flagged"]
    for c in flagged[:MAX_FLAGGED]:
        f = max(c.findings, key=lambda f: severity_rank(f.severity), default=None)
        what = "no finding" if f is None else f"[{f.severity}] {f.kind}: {f.message}"
        more = f" (+{len(c.findings) - 1} more)" if len(c.findings) > 1 else ""
        lines.append(f"    {c.name}: {c.verdict}: {what}{more}")
    rest = flagged[MAX_FLAGGED:]
    if rest:
        kinds = Counter(f.kind for c in rest for f in c.findings)
        lines.append(
            f"    ... and {len(rest)} more ("
            + ", ".join(f"{k} {n}" for k, n in kinds.most_common())
            + "): gpuenv run -v names every call"
        )
    return lines


def run_text(
    record: Mapping[str, Any], measurements: Sequence[Measurement], *, verbose: bool = False
) -> str:
    """What `gpuenv run` prints at the end: the header, the table, then what was not measured,
    where the results are, and what --policy reject rejected. `record`: runner._record."""
    why = f" ({record['gpus_why']})" if record.get("gpus_why") else ""
    head = (
        f"gpuenv run: {record['command']} {record['outcome']} after "
        f"{fmt_time(record['duration_s'])} on {record['where']}{why}; {record['state']}"
    )
    from gpuenv.run.collective import job_lines

    ranks = [m.extra.get("rank") for m in measurements]  # a launcher's workers' (-> Worker)
    table = summary_table(
        measurements,
        header=head,
        ranks=ranks if any(r is not None for r in ranks) else None,
        verbose=verbose,
    )
    steps = job_lines(list(zip(ranks, measurements, strict=True)))
    return "\n".join([table, *steps]) + "".join(tail_lines(record, measurements))


def tail_lines(record: Mapping[str, Any], measurements: Sequence[Measurement]) -> list[str]:
    """The lines under a run's table (each starting with a newline)."""
    who = "" if record.get("rank") is None else f"rank {record['rank']}: "
    lines = []
    run_extra = measurements[0].extra if measurements else {}
    for name, n in (run_extra.get("discarded_regions") or {}).items():
        lines.append(f"\n  {who}{name}: {n} call(s) raised an error: not measured")
    unsampled = sorted(
        {
            (m.extra.get("rank", -1), m.extra["gpu_not_sampled"])
            for m in measurements
            if "gpu_not_sampled" in m.extra
        }
    )
    if unsampled:
        lines.append(
            "\n  "
            + "; ".join(f"rank {r} ran on GPU {g}" for r, g in unsampled)
            + ", which this run does not sample (-i): no telemetry in its rows"
        )
    unreached = run_extra.get("unreached_workers")
    if isinstance(unreached, dict):
        lines.append(
            f"\n  {who}{unreached.get('count')} worker(s) of '{unreached.get('launcher')}' "
            "not reached: it started them without gpuenv's environment, so none of their "
            f"regions or calls is measured here; {unreached.get('hint')}"
        )
    if record.get("output"):
        lines.append(f"\n  {who}results: {record['output']}")
    rejected = [m.name for m in measurements if m.verdict == "rejected"]
    if record.get("policy") == "reject" and rejected:
        names = ", ".join(rejected[:MAX_FLAGGED])
        if len(rejected) > MAX_FLAGGED:
            names += f" and {len(rejected) - MAX_FLAGGED} more"
        lines.append(f"\n  {who}rejected: {names} (--policy reject)")
    return lines


__all__ = [
    "MAX_FLAGGED",
    "RUN_NAME",
    "Worker",
    "build_measurements",
    "call_names",
    "fmt_time",
    "is_call",
    "run_text",
    "summary_table",
    "tail_lines",
]
