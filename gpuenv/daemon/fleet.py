"""The fleet view: each GPU's sustained SM clock (what `gpuenv calibrate` found a sustained
heavy load holds at the GPU's power cap), as one gauge per GPU on gpuenvd's metrics.

The same model of GPU differs from card to card (cooling, the part itself): across a fleet,
gpuenv's Prometheus rules (`gpuenv ops show rules`) record each model's median and alert on
a GPU more than a few percent below it, and `gpuenv compare` says when two runs came from GPUs whose
sustained clocks differ by more than the change it reports (results record the clock).
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuenv.errors import GpuenvError

# dcgm-exporter's per-GPU labels, as the other gpuenv families carry them (daemon/metrics.py)
LABELS = ["gpu", "UUID", "pci_bus_id", "modelName", "Hostname"]


def fleet_metrics(server: Any, hostname: str) -> Any:
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
