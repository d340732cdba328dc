"""What `gpuenv run` reports: `build_measurements` makes one `Measurement` per region
name (a rep per time it was entered) plus the whole run, "(run)", judged by
gpuenv.judge; `summary_table` is what `gpuenv run` prints.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.judge import Evidence, judge
from gpuenv.reasons import counter
from gpuenv.results import Measurement
from gpuenv.run.tracker import Region
from gpuenv.table import render as render_table
from gpuenv.telemetry import Window, merge_windows
from gpuenv.units import fmt_j, fmt_s
from gpuenv.verdict import Finding, GpuFacts, VerdictConfig

RUN_NAME = "(run)"  # the region that is the whole command
MAX_REP_WINDOWS = 1_000  # per-rep windows stored in the results file (findings use them all)


def _demote_cold_start(findings: list[Finding]) -> list[Finding]:
    """A command starts with the GPU idle: for the whole run that is no finding to reject on."""
    out = []
    for f in findings:
        if f.kind == "warmup_ramp" and f.severity != "info":
            f = dataclasses.replace(
                f,
                severity="info",
                message=f.message + " (expected: a command starts with the GPU idle)",
            )
        out.append(f)
    return out


def build_measurements(
    regions: Sequence[Region],
    run: Region,
    *,
    gpus: Sequence[int],
    facts: dict[int, GpuFacts],
    policy: str,
    stable_clocks: bool,
    wall_at: Any,
    extra_run: dict[str, Any] | None = None,
) -> list[Measurement]:
    """One Measurement for the whole run, then one per region name (reps in time order).

    With regions, the policy applies to them and the whole run is only annotated;
    without, it applies to the whole run (whose idle start is not held against it).
    """
    config = VerdictConfig(stable_clocks=stable_clocks)
    by_name: dict[str, list[Region]] = {}
    for r in sorted(regions, key=lambda r: r.t0):
        by_name.setdefault(r.name, []).append(r)
    out = [
        _measurement(
            RUN_NAME,
            [run],
            gpus,
            facts,
            policy if not by_name else "annotate",
            config,
            wall_at,
            run_level=True,
            extra=extra_run or {},
        )
    ]
    for name, reps in by_name.items():
        extra: dict[str, Any] = {"pids": sorted({r.pid for r in reps})}
        incomplete = [k for k, r in enumerate(reps) if not r.complete]
        if incomplete:
            extra["incomplete_reps"] = incomplete
        out.append(_measurement(name, reps, gpus, facts, policy, config, wall_at, extra=extra))
    return out


def _measurement(
    name: str,
    reps: Sequence[Region],
    gpus: Sequence[int],
    facts: dict[int, GpuFacts],
    policy: str,
    config: VerdictConfig,
    wall_at: Any,
    *,
    run_level: bool = False,
    extra: dict[str, Any],
) -> Measurement:
    times = [float((r.t1 or r.t0) - r.t0) for r in reps]
    windows = [r.windows[g] for r in reps for g in gpus if r.windows is not None]
    summary = tuple(merge_windows([w for w in windows if w.gpu == g]) for g in gpus if windows)
    keep = len(reps) <= MAX_REP_WINDOWS  # keep the file small; the findings saw every rep
    if not keep:
        extra = {**extra, "rep_windows_omitted": len(reps)}
    return judge(
        name, times, Evidence.given(windows, gpus), facts=facts, config=config, policy=policy,
        amend=_demote_cold_start if run_level else None, raise_if_too_few=False,
        summary_windows=summary, keep_rep_windows=keep, timer="host",
        started_at=wall_at(reps[0].t0), extra=extra,
    )  # fmt: skip


# the time-under-reason counters the summary table shows (gpuenv.reasons.COUNTERS)
_TABLE_COUNTERS = ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
                   "reliability")


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


def summary_table(
    measurements: Sequence[Measurement], *, header: str, ranks: Sequence[int] | None = None
) -> str:
    """The table `gpuenv run` prints on stderr: a row per region and GPU, findings below.
    `ranks` (one per measurement) adds a rank column: the table of all ranks of a job."""
    multi = len({g for m in measurements for g in m.gpus}) > 1
    cols = [
        *(["rank"] if ranks is not None else []),
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
    rows: list[list[str]] = []
    notes: list[str] = []
    for i, m in enumerate(measurements):
        if m.stats.n == 0 and not m.times_s:
            continue
        rank = [] if ranks is None else [str(ranks[i])]
        who = f"rank {ranks[i]}: {m.name}" if ranks is not None else m.name
        if len(m.times_s) == 1:
            when = fmt_time(m.times_s[0])
        else:  # the kept reps' median; all reps' when every one was rejected
            med = m.stats.median_s if m.stats.n else statistics.median(m.times_s)
            when = f"med {fmt_time(med)}"
        windows: Sequence[Window | None] = m.summary_windows or (None,)
        for k, w in enumerate(windows):
            name = m.name if k == 0 else ""
            row = [
                *(rank if k == 0 else [""] * len(rank)),
                name,
                *([str(w.gpu) if w else "-"] if multi else []),
                str(len(m.times_s)) if k == 0 else "",
                when if k == 0 else "",
            ]
            row += _window_cells(w)
            row.append(
                m.verdict
                + (
                    f" ({len(m.rejected_reps)} reps)"
                    if m.rejected_reps and len(m.times_s) > 1
                    else ""
                )
                if k == 0
                else ""
            )
            rows.append(row)
        incomplete = m.extra.get("incomplete_reps")
        if incomplete:
            notes.append(f"  {who}: the command ended inside {len(incomplete)} rep(s)")
        notes.extend(f"  {who}: [{f.severity}] {f.kind}: {f.message}" for f in m.findings)
    lines = [header, *render_table(rows, header=cols, indent="  ")]
    return "\n".join(lines + notes)


def run_text(record: Mapping[str, Any], measurements: Sequence[Measurement]) -> str:
    """What `gpuenv run` prints at the end: the header, the table, then what was not measured,
    where the results are, and what --policy reject rejected. `record`: runner._record."""
    head = (
        f"gpuenv run: '{record['command']}' {record['outcome']} after "
        f"{fmt_time(record['duration_s'])} on {record['where']}; {record['state']}"
    )
    return summary_table(measurements, header=head) + "".join(tail_lines(record, measurements))


def tail_lines(record: Mapping[str, Any], measurements: Sequence[Measurement]) -> list[str]:
    """The lines under a run's table (each starting with a newline)."""
    who = "" if record.get("rank") is None else f"rank {record['rank']}: "
    lines = []
    run_extra = measurements[0].extra if measurements else {}
    for name, n in (run_extra.get("discarded_regions") or {}).items():
        lines.append(f"\n  {who}{name}: {n} call(s) raised an error: not measured")
    if record.get("output"):
        lines.append(f"\n  {who}results: {record['output']}")
    rejected = [m.name for m in measurements if m.verdict == "rejected"]
    if record.get("policy") == "reject" and rejected:
        lines.append(f"\n  {who}rejected: {', '.join(rejected)} (--policy reject)")
    return lines


__all__ = [
    "RUN_NAME",
    "build_measurements",
    "fmt_time",
    "run_text",
    "summary_table",
    "tail_lines",
]
