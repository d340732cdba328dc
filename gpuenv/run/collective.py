"""The job seen as one thing: regions that several ranks mark alike (same name, same number
of steps) are one kind of collective step, and the summary gives each kind a row.

In a data-parallel step every rank waits for the others in the collective (an all-reduce),
so every rank's step takes the same time, and the times alone cannot say which GPU set it.
What gpuenv measures, per rank and without a change to the training code beyond
`gpuenv.region()`: each step's time (the region's edges), and over the rank's steps its
GPU's state from NVML (the clock while busy, the time under the power cap and under a
thermal limit from the driver's violation counters, power, temperature).

What it infers, and says it infers:

- the GPU that held the step back is the one whose clock, while busy, was lowest: with the
  same work on every rank (data parallel) and compute-bound work, a rank's own share of a
  step takes time in inverse proportion to its clock. It is named only when its clock is
  more than `SLOWER_REL` (the threshold `gpuenv check` uses) below every other GPU's: one
  that stands apart, not the low end of GPUs that differ a little each;
- what it cost the others: their own share took `f_slow / f_them` of the slowest rank's,
  so they waited in the collective for the rest. With the slowest rank's share at most the
  step, that wait is at most `step * (1 - f_slow / f_them)` a step: an upper bound, exact
  only for a step that is all compute-bound work (an all-reduce's own transfer, and a clock
  that rises while a rank waits, make the real wait shorter).

NVML's utilization does not tell waiting from working (an NCCL kernel spins on the GPU
while it waits, and counts as busy), so it is not used.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuenv.results import Measurement
from gpuenv.table import render as render_table
from gpuenv.telemetry import Window
from gpuenv.units import fmt_s

SLOWER_REL = 0.02  # a GPU's busy clock this far below every other's names it


@dataclass(frozen=True)
class RankGpu:
    """One rank's GPU over its steps of one kind (from its measurement's summary window)."""

    rank: int
    gpu: int
    sm_mhz: float  # the time-weighted clock while the GPU was busy (not GpuIdle)
    power_cap_s: float  # time under the SW power cap (the driver's violation counter)
    thermal_s: float  # time under a thermal limit (SW or HW)
    steps_s: float  # the rank's steps' total time
    temp_c_max: float | None
    node: str = ""  # the rank's node, where the job's ranks ran on several
    other_pids: tuple[int, ...] = ()  # processes on its GPU that were not the job's

    @property
    def where(self) -> str:
        """'rank 3', or 'rank 3, gpunode1' where the ranks ran on several nodes."""
        return f"rank {self.rank}, {self.node}" if self.node else f"rank {self.rank}"

    @property
    def capped_frac(self) -> float:
        return self.power_cap_s / self.steps_s if self.steps_s > 0 else 0.0

    @property
    def thermal_frac(self) -> float:
        return self.thermal_s / self.steps_s if self.steps_s > 0 else 0.0


@dataclass(frozen=True)
class CollectiveStep:
    """One kind of step marked alike by several ranks: what was measured and what inferred."""

    name: str
    ranks: tuple[int, ...]
    steps: int
    step_s: float  # the median of every rank's step times
    spread_s: float  # the median over steps of (slowest rank's time - fastest rank's)
    spread_max_s: float
    gpus: tuple[RankGpu, ...]  # the ranks whose GPU was sampled busy in its steps
    idle_ranks: tuple[int, ...]  # the ranks whose GPU was sampled, idle through its steps
    slowest: RankGpu | None  # the GPU named (None: none more than SLOWER_REL below the rest)
    others_mhz: float | None  # the median busy clock of the other ranks' GPUs
    wait_s: float | None  # inferred: the others' wait for it, at most, a step (their median)

    @property
    def wait_frac(self) -> float | None:
        return None if self.wait_s is None or self.step_s <= 0 else self.wait_s / self.step_s


def fmt_time(seconds: float) -> str:
    return fmt_s(seconds, "table")


def collective_steps(
    pairs: Sequence[tuple[int, Measurement]], nodes: Mapping[int, str] | None = None
) -> list[CollectiveStep]:
    """The kinds of step several ranks marked alike, from (rank, measurement) pairs of the
    ranks' regions (the caller leaves out each rank's whole run, "(run)"; calls of a
    measuring function are no steps). Ranks that marked a name a different number of
    times form their own kind. `nodes`: each rank's node, where they ran on several."""
    groups: dict[tuple[str, int], dict[int, Measurement]] = {}
    for rank, m in pairs:
        if isinstance(m.extra.get("site"), str) or not m.times_s:
            continue
        groups.setdefault((m.name, len(m.times_s)), {}).setdefault(rank, m)
    return [
        _step(name, n, ranks, nodes or {})
        for (name, n), ranks in sorted(groups.items())
        if len(ranks) > 1
    ]


def _step(
    name: str, n: int, by_rank: dict[int, Measurement], nodes: Mapping[int, str]
) -> CollectiveStep:
    ranks = tuple(sorted(by_rank))
    spreads = [
        max(by_rank[r].times_s[k] for r in ranks) - min(by_rank[r].times_s[k] for r in ranks)
        for k in range(n)
    ]
    gpus = tuple(g for r in ranks if (g := _rank_gpu(r, by_rank[r], nodes.get(r, ""))) is not None)
    idle = tuple(r for r in ranks if _idle(by_rank[r]))
    step_s = statistics.median(t for r in ranks for t in by_rank[r].times_s)
    slowest, others_mhz, wait_s = _held_back(gpus, step_s)
    return CollectiveStep(
        name=name,
        ranks=ranks,
        steps=n,
        step_s=step_s,
        spread_s=statistics.median(spreads),
        spread_max_s=max(spreads),
        gpus=gpus,
        idle_ranks=idle,
        slowest=slowest,
        others_mhz=others_mhz,
        wait_s=wait_s,
    )


def _idle(m: Measurement) -> bool:
    """One GPU sampled through the rank's steps, never busy (no work of the steps on it)."""
    ws = m.summary_windows
    return len(ws) == 1 and ws[0].sm_mhz_mean is not None and ws[0].sm_mhz_busy_mean is None


def _rank_gpu(rank: int, m: Measurement, node: str = "") -> RankGpu | None:
    """A rank's GPU over its steps: exactly one GPU's window with a busy clock, else None."""
    if len(m.summary_windows) != 1:
        return None
    w: Window = m.summary_windows[0]
    mhz = w.sm_mhz_busy_mean
    if mhz is None:
        return None
    return RankGpu(
        rank=rank,
        gpu=w.gpu,
        sm_mhz=mhz,
        power_cap_s=w.reason_s.get("power", 0.0),
        thermal_s=w.reason_s.get("thermal", 0.0),
        steps_s=sum(m.times_s),
        temp_c_max=w.temp_c_max,
        node=node,
        other_pids=tuple(w.other_pids),
    )


def _held_back(
    gpus: Sequence[RankGpu], step_s: float
) -> tuple[RankGpu | None, float | None, float | None]:
    """The GPU with the lowest busy clock, when it is more than SLOWER_REL below every
    other's; the others' median clock; their inferred wait for it, at most, a step."""
    if len(gpus) < 2:
        return None, None, None
    low = min(gpus, key=lambda g: g.sm_mhz)
    others = [g.sm_mhz for g in gpus if g is not low]
    median = statistics.median(others)
    if low.sm_mhz >= min(others) * (1 - SLOWER_REL):
        return None, median, None
    wait = statistics.median(step_s * (1 - low.sm_mhz / f) for f in others)
    return low, median, wait


def _pct(frac: float) -> str:
    return f"{100 * frac:.0f}%"


def state_words(g: RankGpu) -> str:
    """What a GPU's state was over its steps: 'capped 40% of the steps at 1380 MHz'."""
    parts = []
    if g.capped_frac >= 0.005:
        parts.append(f"power-capped {_pct(g.capped_frac)} of its steps' time")
    if g.thermal_frac >= 0.005:
        parts.append(f"thermally limited {_pct(g.thermal_frac)}")
    where = ", ".join(parts) or "no power cap or thermal limit counted"
    hot = "" if g.temp_c_max is None else f", up to {g.temp_c_max:.0f} C"
    return f"{g.sm_mhz:.0f} MHz while busy, {where}{hot}{_beside(g)}"


def _beside(g: RankGpu) -> str:
    """', beside another process (pid 4242)' where one that is not the job's shared it."""
    if not g.other_pids:
        return ""
    pids = ", ".join(map(str, g.other_pids))
    return f", beside another process (pid {pids})"


def collective_lines(steps: Sequence[CollectiveStep]) -> list[str]:
    """The summary's rows for the job's collective steps (a table), and a sentence per kind
    that names the GPU that held it back, or says none did."""
    if not steps:
        return []
    cols = ["step", "ranks", "steps", "time", "spread", "slowest GPU", "its SM MHz", "others"]
    rows = []
    for s in steps:
        low = s.slowest
        rows.append(
            [
                s.name,
                str(len(s.ranks)),
                str(s.steps),
                f"med {fmt_time(s.step_s)}",
                f"{fmt_time(s.spread_s)} (max {fmt_time(s.spread_max_s)})",
                "-" if low is None else f"{low.gpu} ({low.where})",
                "-" if low is None else f"{low.sm_mhz:.0f}",
                "-" if s.others_mhz is None else f"{s.others_mhz:.0f}",
            ]
        )
    lines = ["", "  the ranks' steps (regions every rank marked alike):"]
    lines += render_table(rows, header=cols, indent="  ")
    for s in steps:
        lines.append("  " + step_sentence(s))
    return lines


def step_sentence(s: CollectiveStep) -> str:
    """The finding of one kind of step, measured and inferred said apart."""
    low = s.slowest
    if len(s.gpus) < 2 and s.idle_ranks:
        return f"{s.name}: the ranks' GPUs were idle through their steps: none held them back"
    if len(s.gpus) < 2:
        return (
            f"{s.name}: fewer than 2 ranks' GPUs sampled busy: which GPU held the step back "
            "is not known"
        )
    if low is None:
        lo, hi = min(g.sm_mhz for g in s.gpus), max(g.sm_mhz for g in s.gpus)
        held = f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"
        shared = [g for g in s.gpus if g.other_pids]
        return (
            f"{s.name}: no GPU held the step back by its clock: the ranks' GPUs held "
            f"{held} MHz while busy, none more than {_pct(SLOWER_REL)} below all the others"
            + "".join(
                f"; GPU {g.gpu} ({g.where}) ran{_beside(g)}, which takes a share of it "
                "at the same clock: its rank may have held the step back unseen"
                for g in shared
            )
        )
    wait = (
        ""
        if s.wait_s is None or s.wait_frac is None
        else f"; the others waited for it in the collective up to {fmt_time(s.wait_s)} of "
        f"each {fmt_time(s.step_s)} step ({_pct(s.wait_frac)}; inferred from the clocks: "
        "same work per rank, compute-bound)"
    )
    return (
        f"{s.name}: GPU {low.gpu} ({low.where}) held the step back: {state_words(low)} "
        f"(the others {s.others_mhz:.0f} MHz){wait}"
    )


def job_lines(
    pairs: Sequence[tuple[int | None, Measurement]], nodes: Mapping[int, str] | None = None
) -> list[str]:
    """The collective lines of a job's regions, each with its rank (None: not a rank's, as
    a wrapped launcher's whole run: left out); `nodes`: each rank's node, where several."""
    return collective_lines(collective_steps([(r, m) for r, m in pairs if r is not None], nodes))


__all__ = [
    "SLOWER_REL",
    "CollectiveStep",
    "RankGpu",
    "collective_lines",
    "collective_steps",
    "job_lines",
    "state_words",
    "step_sentence",
]
