"""What `gpuenv check` found: one record per GPU and phase, the node's, the table, the JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuenv.table import render
from gpuenv.units import fmt_s


@dataclass(frozen=True)
class PhaseResult:
    """One GPU in one phase (alone, or all at once): its kernels' median time per call, and
    the telemetry of the second half of its sustained matmul (`window_s` long)."""

    gpu: int
    times_s: dict[str, float]  # kernel (kernels.KERNELS) -> median seconds per call
    sustained_s: float | None  # the matmul's time per call over the window
    sm_mhz: float | None  # mean SM clock while busy over the window
    sm_mhz_min: float | None
    power_w: float | None
    temp_c_max: float | None
    power_cap_s: float  # time under the SW power cap in the window
    thermal_s: float  # time under thermal slowdown in the window
    window_s: float
    other_pids: tuple[int, ...] = ()

    @property
    def cap_share(self) -> float:
        return self.power_cap_s / self.window_s if self.window_s > 0 else 0.0


@dataclass(frozen=True)
class GpuCheck:
    """One GPU: its phases, its rank (1: fastest sustained matmul alone), what it is slower
    in than the others (empty: not named) and the telemetry that explains it."""

    gpu: int
    uuid: str
    name: str
    power_limit_w: float | None
    alone: PhaseResult
    together: PhaseResult | None
    rank: int
    slower: tuple[str, ...] = ()
    why: tuple[str, ...] = ()

    @property
    def named(self) -> bool:
        return bool(self.slower)


@dataclass(frozen=True)
class NodeCheck:
    gpus: tuple[GpuCheck, ...]
    sustain_s: float  # sustained matmul per GPU and phase (its second half is the window)
    seconds: float  # what the check took (virtual seconds on a simulated GPU's copy)
    tolerance: dict[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def named(self) -> list[int]:
        return [g.gpu for g in self.gpus if g.named]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["named"] = self.named
        for g, rec in zip(self.gpus, data["gpus"], strict=True):
            rec["named"] = g.named
        return data


def _ms(s: float | None) -> str:
    return "-" if s is None else fmt_s(s, "table")


def _mhz(p: PhaseResult | None) -> str:
    return "-" if p is None or p.sm_mhz is None else f"{p.sm_mhz:.0f}"


def report_text(report: NodeCheck) -> str:
    """The table (a row per GPU, fastest first) and, under it, each named GPU with why."""
    names = sorted({g.name for g in report.gpus})
    together = any(g.together is not None for g in report.gpus)
    head = (
        f"gpuenv check: {len(report.gpus)} GPU(s) ({', '.join(names)}), "
        f"{report.sustain_s:.1f} s of sustained matmul each, alone"
        + (" then all at once" if together else "")
        + f"; {report.seconds:.1f} s{report.note}"
    )
    cols = ["rank", "gpu", "matmul", "copy", "tiny", "sustained", "SM MHz", "power", "temp C"]
    cols += ["power cap", "verdict"]
    rows = []
    for g in sorted(report.gpus, key=lambda g: g.rank):
        a, t = g.alone, g.together
        limit = f" / {g.power_limit_w:.0f} W" if g.power_limit_w else ""
        rows.append(
            [
                str(g.rank),
                str(g.gpu),
                *(_ms(a.times_s.get(k)) for k in ("heavy", "copy", "tiny")),
                _ms(a.sustained_s) + (f" / {_ms(t.sustained_s)}" if t else ""),
                _mhz(a) + (f" / {_mhz(t)}" if t else ""),
                ("-" if a.power_w is None else f"{a.power_w:.0f}") + (limit or " W"),
                "-" if a.temp_c_max is None else f"{a.temp_c_max:.0f}",
                f"{100 * a.cap_share:.0f}%",
                "slower" if g.named else "ok",
            ]
        )
    lines = [head, *render(rows, header=cols, indent="  ")]
    if together:
        lines.append("  sustained and SM MHz: alone / all at once; the rest alone")
    for g in report.gpus:
        if g.named:
            lines.append(f"  GPU {g.gpu} is slower than the others:")
            lines += [f"    - {s}" for s in g.slower]
            lines.append("    why: " + "; ".join(g.why))
    if not report.named:
        lines.append("  no GPU is slower than the others")
    return "\n".join(lines)


__all__ = ["GpuCheck", "NodeCheck", "PhaseResult", "report_text"]
