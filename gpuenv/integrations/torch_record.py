"""The torch adapter's records, torch-free: one timed call observed and judged (`observe`,
`record`), replicates' records merged (`merge_records`), a Compare row note (`note`), a
task's name (`task_name`) and the mark a flagged measurement's description carries
(`marked_description`), which torch's own Compare shows without gpuenv installed.

Used by gpuenv.integrations.torch_benchmark (the functions) and torch_classes (the
subclasses of torch's Timer, Measurement and Compare); imports neither, nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gpuenv.seams import BenchSession

T = TypeVar("T")


def observe(
    run: Callable[[], T],
    *,
    session: BenchSession | None = None,
    backend: Any = None,
    gpus: str | int | Sequence[str | int] | None = None,
    name: str = "torch.utils.benchmark",
) -> tuple[T, dict[str, Any]]:
    """Run `run()` under the sampler; return its result and the telemetry record
    (JSON values): {"gpus", "telemetry": [Window dicts], "findings", "verdict", "summary"}.

    Uses the session's sampler when given, else opens the backend (read-only) and
    samples `gpus` (default: all) for the duration. Its power and energy come from the
    driver's power sample after the call, waited for (at most 45 ms after its end,
    `telemetry.sampler.POWER_WAIT_S`). If NVML cannot be opened, the record says so in
    "error" and `run` still runs.
    """
    from gpuenv.judge import Evidence, read_facts

    own = None
    if session is not None:
        sampler, be, gpu_list = session.sampler, session.backend, list(session.gpus)
        facts = dict(session.facts)
    else:
        from gpuenv.backend import open_backend
        from gpuenv.devices import select_gpus
        from gpuenv.errors import BackendError
        from gpuenv.telemetry import Sampler

        try:
            be = backend if backend is not None else open_backend(readonly=True)
            gpu_list = select_gpus(be, gpus)
        except BackendError as err:
            return run(), {"name": name, "error": str(err), "note": f"no telemetry: {err}"}
        facts = read_facts(be, gpu_list)
        own = sampler = Sampler(be, gpu_list)
        sampler.start()
    try:
        t0 = sampler.mark()
        result = run()
        t1 = sampler.mark()
        # the call's power and energy from the driver's power sample after it: judged at
        # its end, a 10 ms call read the readings in force (a tenth of its energy on the
        # simulated H100); a wait of at most POWER_WAIT_S after t1 (20-45 ms)
        sampler.await_power([(t0, t1)], gpu_list)
        evidence = Evidence.sampled(sampler, [(t0, t1)], gpu_list)
    finally:
        if own is not None:
            own.stop()
            if backend is None:
                be.close()
    return result, record(evidence, t1 - t0, facts=facts, session=session, name=name)


def record(
    evidence: Any,
    seconds: float,
    *,
    facts: dict[int, Any],
    session: BenchSession | None = None,
    name: str = "torch.utils.benchmark",
) -> dict[str, Any]:
    """The judged telemetry record of one timed call (what `observe` attaches): the call is
    one rep for gpuenv.judge, under the session's policy and verdict config. Plain values
    only (and "note", one string): it unpickles and prints where gpuenv is not installed."""
    from gpuenv.judge import judge
    from gpuenv.verdict import DEFAULT_CONFIG

    policy = session.policy if session is not None else "annotate"
    if policy == "retry":
        policy = "reject"  # torch's Timer ran the reps: they cannot be re-run from here
    m = judge(
        name,
        [seconds],
        evidence,
        facts=facts,
        policy=policy,
        config=session.config if session is not None else DEFAULT_CONFIG,
    )
    rec = {
        "name": name,
        "gpus": list(evidence.gpus),
        "telemetry": [w.to_dict() for w in m.windows],
        "findings": [f.to_dict() for f in m.findings],
        "verdict": m.verdict,
        "summary": " | ".join(w.summary() for w in m.windows),
    }
    rec["note"] = note(rec)
    return rec


def task_name(task_spec: Any) -> str:
    """What names one Timer call: its label / sub_label / description, else its stmt."""
    parts = [getattr(task_spec, k, None) for k in ("label", "sub_label", "description")]
    named = [str(p) for p in parts if p]
    if named:
        return " / ".join(named)
    stmt = str(getattr(task_spec, "stmt", "") or "").strip().splitlines()
    return stmt[0] if stmt else "torch.utils.benchmark"


MARK = "[gpuenv: "


def marked_description(description: str | None, rec: dict[str, Any] | None) -> str | None:
    """The description a flagged call's Measurement carries, e.g. 'bf16 [gpuenv: annotated,
    power_cap]': torch's Compare keys its columns on the description and drops metadata, so
    this is how its table shows which cells to distrust (gpuenv or not in the process that
    prints it). An ok call, or one without telemetry, keeps its description."""
    if not rec or rec.get("verdict", "ok") == "ok" or "error" in rec:
        return description
    kinds = sorted({f["kind"] for f in rec.get("findings", [])})
    mark = MARK + ", ".join([str(rec["verdict"]), *kinds]) + "]"
    base = (description or "").split(MARK)[0].rstrip()
    return f"{base} {mark}" if base else mark


VERDICT_ORDER = ("ok", "annotated", "rejected")


def merge_records(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record from several replicates' (torch's `merge` of one task): per GPU the
    telemetry merged (gpuenv.telemetry's one merge), every finding kept with the replicate
    it came from, the worst verdict."""
    from gpuenv.telemetry import Window
    from gpuenv.telemetry.window import merge_windows

    if len(records) == 1:
        return dict(records[0])
    errors = [r["error"] for r in records if "error" in r]
    judged = [r for r in records if "error" not in r]
    name = records[0].get("name", "torch.utils.benchmark")
    if not judged:
        return {
            "name": name,
            "error": errors[0],
            "note": f"no telemetry: {errors[0]}",
            "replicates": len(records),
        }
    by_gpu: dict[int, list[Any]] = {}
    for r in judged:
        for w in r.get("telemetry", []):
            by_gpu.setdefault(int(w["gpu"]), []).append(Window.from_dict(w))
    windows = [merge_windows(sorted(ws, key=lambda w: w.t0)) for _, ws in sorted(by_gpu.items())]
    findings = [{**f, "replicate": i} for i, r in enumerate(judged) for f in r.get("findings", [])]
    out: dict[str, Any] = {
        "name": name,
        "gpus": sorted({g for r in judged for g in r.get("gpus", [])}),
        "telemetry": [w.to_dict() for w in windows],
        "findings": findings,
        "verdict": max((r.get("verdict", "ok") for r in judged), key=VERDICT_ORDER.index),
        "summary": " | ".join(w.summary() for w in windows),
        "replicates": len(records),
    }
    if errors:
        out["errors"] = errors
    out["note"] = note(out)
    return out


def note(record: dict[str, Any] | None) -> str:
    """A Compare row note: 'annotated (power_cap): GPU 0 1.2 s; SM 1380 MHz; ...'."""
    if not record:
        return "no gpuenv record"
    if "error" in record:
        return f"no telemetry: {record['error']}"
    kinds = sorted({f["kind"] for f in record.get("findings", [])})
    head = record.get("verdict", "?") + (f" ({', '.join(kinds)})" if kinds else "")
    return f"{head}: {record.get('summary', '')}"


__all__ = [
    "MARK",
    "VERDICT_ORDER",
    "marked_description",
    "merge_records",
    "note",
    "observe",
    "record",
    "task_name",
]
