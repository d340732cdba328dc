"""A job's report: its GPUs' merged telemetry judged by the one judge, and the words for it
(`render` for `gpuenv job JOBID`, `verdict` for the one line the epilog appends).

The report is plain JSON (it is kept on disk and sent over the socket): per GPU the Window
(time under each clock-event reason, SM clock, power, energy, temperature, other processes,
whether the lock held), the SM-clock histogram and its quantiles, and the findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuenv.backend import Backend
from gpuenv.reasons import COUNTER_NAMES
from gpuenv.telemetry.window import Window
from gpuenv.units import fmt_j, fmt_s
from gpuenv.verdict.records import Finding

# a job starts idle and its clocks rise: that is no finding about the job's numbers
NOT_FOR_JOBS = ("warmup_ramp", "clock_drift")
QUANTILES = (0.05, 0.5, 0.95)


def quantiles(hist: Mapping[Any, int]) -> dict[str, float] | None:
    """p5/p50/p95 of a histogram {mhz: samples}."""
    items = sorted((float(k), n) for k, n in hist.items() if n > 0)
    total = sum(n for _, n in items)
    if not total:
        return None
    out, seen, it = {}, 0, iter(items)
    value, count = next(it)
    for q in QUANTILES:
        while seen + count < q * total:
            seen += count
            value, count = next(it)
        out[f"p{round(q * 100)}"] = value
    return out


def judge_job(backend: Backend | None, report: dict[str, Any]) -> dict[str, Any]:
    """`report` (gpuenvd's record, daemon/jobs.py) with each GPU's findings, SM-clock
    quantiles, the worst severity (`judged`) and the one-line `verdict`. `backend` gives the
    GPUs' facts (maximum clock, thresholds, power limit); None: judged without them."""
    from gpuenv.judge import read_facts
    from gpuenv.verdict import assess

    worst = "ok"
    gpus = []
    for entry in report["gpus_report"]:
        entry = dict(entry)
        g, w = entry["gpu"], entry["window"]
        findings = []
        if w is not None:
            window = Window.from_dict(w)
            lock = {g: window.lock_range_mhz} if window.lock_range_mhz else None
            facts = read_facts(backend, [g], lock) if backend is not None else None
            findings = [f for f in assess([window], facts=facts) if f.kind not in NOT_FOR_JOBS]
        findings += lost_to_restart(report, g)
        for f in findings:
            if f.severity in ("warning", "error") and worst != "error":
                worst = f.severity
        entry["findings"] = [f.to_dict() for f in findings]
        entry["sm_quantiles"] = quantiles(entry.get("sm_hist") or {})
        gpus.append(entry)
    out = {**report, "gpus_report": gpus, "judged": worst}
    out["verdict"] = verdict(out)
    return out


def lost_to_restart(report: dict[str, Any], g: int) -> list[Finding]:
    """A `telemetry_gap` on GPU `g` where gpuenvd restarted while the job ran (it was killed,
    or stopped and started): the telemetry before the restart died with the daemon."""
    since = report.get("telemetry_from")
    if since is None:
        return []
    lost = max(0.0, since - report["started"])
    return [
        Finding(
            "telemetry_gap",
            "warning",
            (0,),
            f"gpuenvd restarted while job {report['job']} ran: GPU {g}'s telemetry of its first "
            f"{fmt_s(lost, 'short')} died with the daemon before it: the GPU's state then is "
            "unverified",
            g,
            {"lost_s": round(lost, 3), "restarts": report.get("restarts", 1)},
        )
    ]


def verdict(report: dict[str, Any]) -> str:
    """One line: the job, its GPUs, the lock, the clock it ran at, and what is wrong, if any."""
    gpus = ",".join(str(g) for g in report["gpus"])
    parts = [f"gpuenv: job {report['job']} GPUs {gpus}: {report['lock']}"]
    held = [e["window"]["lock_held"] for e in report["gpus_report"] if e["window"]]
    if any(h is False for h in held):
        parts.append("lock NOT held")
    elif held and all(h for h in held):
        parts.append("lock held")
    p50 = [e["sm_quantiles"]["p50"] for e in report["gpus_report"] if e["sm_quantiles"]]
    if p50:
        lo, hi = min(p50), max(p50)
        parts.append(f"SM p50 {lo:.0f} MHz" if lo == hi else f"SM p50 {lo:.0f}-{hi:.0f} MHz")
    energy = [
        e["window"]["energy_j"]
        for e in report["gpus_report"]
        if e["window"] and e["window"]["energy_j"] is not None
    ]
    if energy:
        parts.append(fmt_j(sum(energy)))
    found = [
        f"GPU {f['gpu']} {f['kind']}"
        for e in report["gpus_report"]
        for f in e["findings"]
        if f["severity"] != "info"
    ]
    parts.append(("check: " + ", ".join(found)) if found else report["judged"])
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    """What `gpuenv job JOBID` prints."""
    state = "running" if report.get("ended") is None else "ended"
    took = (report.get("ended") or 0) - report["started"] if report.get("ended") else None
    lines = [
        f"job {report['job']} of {report['user']} ({state}"
        + (f", {fmt_s(took, 'short')}" if took is not None else "")
        + f"): {report['lock']}"
        + (f" (asked {report['asked']})" if report.get("asked") else ""),
    ]
    for e in report["gpus_report"]:
        lines.append(f"  GPU {e['gpu']} {e['name']} {e['uuid']}")
        w = e["window"]
        if w is None:
            lines.append("    no telemetry")
            continue
        lines.append("    " + Window.from_dict(w).summary())
        q = e["sm_quantiles"]
        if q:
            lines.append(
                "    SM clock p5/p50/p95: " + "/".join(f"{v:.0f}" for v in q.values()) + " MHz"
            )
        timed = [(k, v) for k, v in (w.get("reason_s") or {}).items() if v > 0]
        if timed:
            order = list(COUNTER_NAMES)
            timed.sort(key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
            under = ", ".join(f"{k} {fmt_s(v, 'short')}" for k, v in timed)
            lines.append("    time under: " + under)
        for f in e["findings"]:
            lines.append(f"    [{f['severity']}] {f['kind']}: {f['message']}")
    lines.append(report["verdict"])
    return "\n".join(lines)


def publish(
    report: dict[str, Any], node: str, restored: str, directory: Any | None
) -> tuple[str, str | None]:
    """The epilog's last word for its node: the judged `report` into the shared jobs
    directory (where there is one) and its line into the job's AdminComment. Returns the
    line and which of Slurm's records kept it (None: neither, as without slurmdbd)."""
    from gpuenv.daemon import jobnodes

    if directory is not None:
        jobnodes.publish_ended(directory, report["job"], node, report, restored)
    line = jobnodes.admin_line(node, report, restored)
    return line, jobnodes.set_admin_comment(report["job"], node, line, directory=directory)


def render_nodes(gathered: dict[str, Any]) -> str:
    """What `gpuenv job JOBID` prints from the shared jobs directory: each node's report,
    and each node that did not report, with why."""
    from gpuenv.daemon.jobnodes import RESTORED

    job, entries, missing = gathered["job"], gathered["entries"], gathered["missing"]
    nodes = gathered["nodes"] or sorted(entries)
    state = f" ({gathered['job_state']})" if gathered.get("job_state") else ""
    lines = [f"job {job} on {len(nodes)} node{'s' if len(nodes) != 1 else ''}{state}"]
    for node in nodes:
        entry = entries.get(node) or {}
        if node in missing:
            lines.append(f"node {node}: did not report: {missing[node]}")
            if entry:
                gpus = ",".join(str(g) for g in entry.get("gpus", []))
                lines.append(f"  at its prolog: GPUs {gpus}, {entry.get('lock')}")
            continue
        lines.append(f"node {node}: {RESTORED.get(entry.get('restored', ''), '?')}")
        lines.extend("  " + line for line in render(entry["report"]).splitlines())
    done = len(nodes) - len(missing)
    tail = f"gpuenv: job {job}: {done} of {len(nodes)} nodes reported"
    if missing:
        tail += "; did not: " + ", ".join(f"{n} ({why})" for n, why in missing.items())
    lines.append(tail)
    return "\n".join(lines)
