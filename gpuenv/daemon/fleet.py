"""The fleet view: each GPU's sustained SM clock (what `gpuenv calibrate` found a sustained
heavy load holds at the GPU's power cap), as one gauge per GPU on gpuenvd's metrics.

The same model of GPU differs from card to card (cooling, the part itself): across a fleet,
gpuenv's Prometheus rules (`gpuenv ops show rules`) record each model's median and alert on
a GPU more than a few percent below it, and `gpuenv compare` says when two runs came from GPUs whose
sustained clocks differ by more than the change it reports (results record the clock).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

from gpuenv.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.daemon.serverview import Server

# dcgm-exporter's per-GPU labels, as the other gpuenv families carry them (daemon/metrics.py)
LABELS = ["gpu", "UUID", "pci_bus_id", "modelName", "Hostname"]


def fleet_metrics(server: Server, hostname: str) -> Any:
    """`gpuenv_gpu_sustained_sm_mhz` per calibrated GPU (none for a GPU never calibrated)."""
    from prometheus_client.core import GaugeMetricFamily

    from gpuenv.clocks.calibration_store import load_calibration

    fam = GaugeMetricFamily(
        "gpuenv_gpu_sustained_sm_mhz",
        "SM clock a sustained heavy load holds on this GPU at its power cap ('gpuenv "
        "calibrate'); compare GPUs of one modelName",
        labels=LABELS,
    )
    state_dir = server.leases.journal.path  # where root's `gpuenv calibrate` kept it
    for dev in server.infos:
        cal = None
        with contextlib.suppress(GpuenvError, OSError):
            cal = load_calibration(dev.uuid, state_dir=state_dir)
        if cal is not None:
            labels = [str(dev.index), dev.uuid, dev.pci_bus_id, dev.name, hostname]
            fam.add_metric(labels, float(cal.sustained_mhz))
    yield fam


def check_metrics(server: Server, hostname: str) -> Any:
    """Root's last `gpuenv check` (gpuenv.check.store), per GPU that has one: each kernel's
    median time per call and the sustained matmul's clock, alone and all at once, whether
    the check named the GPU, its rank, and when it ran."""
    from prometheus_client.core import GaugeMetricFamily

    from gpuenv.clocks.calibration_store import read_kept_check

    def gauge(name: str, doc: str, *extra: str) -> Any:
        return GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])

    seconds = gauge(
        "gpuenv_check_seconds",
        "gpuenv check: a kernel's median time per call ('sustained': the matmul held)",
        "kernel",
        "phase",
    )
    mhz = gauge("gpuenv_check_sm_mhz", "gpuenv check: SM clock under the sustained matmul", "phase")
    named = gauge("gpuenv_check_named", "1 where gpuenv check named the GPU slower than the others")
    rank = gauge("gpuenv_check_rank", "gpuenv check's rank of the GPU (1: fastest sustained)")
    when = gauge("gpuenv_check_timestamp_seconds", "When gpuenv check ran (epoch)")
    state_dir = server.leases.journal.path  # where root's `gpuenv check` kept it
    for dev in server.infos:
        kept = None
        with contextlib.suppress(GpuenvError, OSError):
            kept = read_kept_check(dev.uuid, state_dir=state_dir)
        figures = _check_figures(kept) if kept is not None else None
        if figures is None:  # none kept, or not as gpuenv.check.store writes it: no gauge
            continue
        labels = [str(dev.index), dev.uuid, dev.pci_bus_id, dev.name, hostname]
        times, clocks, is_named, at_rank, at = figures
        for (kernel, phase), t in sorted(times.items()):
            seconds.add_metric([*labels, kernel, phase], t)
        for phase, f in sorted(clocks.items()):
            mhz.add_metric([*labels, phase], f)
        named.add_metric(labels, 1.0 if is_named else 0.0)
        rank.add_metric(labels, at_rank)
        when.add_metric(labels, at)
    yield from (seconds, mhz, named, rank, when)


def _check_figures(
    kept: dict[str, Any],
) -> tuple[dict[tuple[str, str], float], dict[str, float], bool, float, float] | None:
    """From a kept check (gpuenv.check.store: {"measured_at", "check": GpuCheck as JSON}):
    each (kernel, phase)'s time, each phase's clock, named, rank, when; None if malformed."""

    def num(x: Any) -> float | None:
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        return float(x) if ok else None

    g, at = kept.get("check"), num(kept.get("measured_at"))
    if not isinstance(g, dict) or at is None or num(g.get("rank")) is None:
        return None
    times: dict[tuple[str, str], float] = {}
    clocks: dict[str, float] = {}
    for phase in ("alone", "together"):
        p = g.get(phase)
        if not isinstance(p, dict):
            continue
        per = p.get("times_s")
        per = per if isinstance(per, dict) else {}
        for kernel, t in [*per.items(), ("sustained", p.get("sustained_s"))]:
            if (v := num(t)) is not None:
                times[str(kernel), phase] = v
        if (f := num(p.get("sm_mhz"))) is not None:
            clocks[phase] = f
    return times, clocks, bool(g.get("slower")), float(g["rank"]), at


def sustained_note(runs_a: Any, runs_b: Any, largest_change: float) -> str | None:
    """A sentence when the two sides' GPUs have sustained clocks (run metadata) that differ by
    more than `largest_change` (relative, the largest change compare reports), else None."""

    def clocks(runs: Any) -> list[float]:
        return [
            float(g["sustained_sm_mhz"])
            for r in runs
            for g in (r.metadata.get("gpus") or [])
            if isinstance(g, dict) and g.get("sustained_sm_mhz")
        ]

    a, b = clocks(runs_a), clocks(runs_b)
    if not a or not b:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    diff = mb / ma - 1.0
    if abs(diff) <= abs(largest_change):
        return None
    return (
        f"GPU sustained clock: {ma:.0f} -> {mb:.0f} MHz ({diff:+.1%}), more than the "
        f"largest change reported ({largest_change:+.1%}): the GPUs differ by more than "
        "the code does ('gpuenv calibrate' on each; lock one clock both hold)"
    )
