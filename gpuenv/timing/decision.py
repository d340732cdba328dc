"""An autotuner's choice on the record: `Decision`, what a results file keeps of a
ranking (`Measurement.extra["autotune"]`, through `decision_record`), and the lines
`gpuenv run` prints under its table for it (`decision_lines`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuenv.units import fmt_s

if TYPE_CHECKING:
    from gpuenv.timing.rank import Ranking

MAX_RECORD_CHARS = 1800  # what a gpuenv run region's facts carry (run/region.py MAX_META)


@dataclass(frozen=True)
class Decision:
    """An autotune decision as a results file keeps it, `Measurement.extra["autotune"]`:
    the record's one writer is `decision_record`, its one reader `Decision.read`.

    `kernel`, `key`; `winner` and `tied` (indices into `configs`); `configs`, each (name,
    median_s, margin against the winner, outcome, rounds), in the order given; `state` (the
    GPU's, in words), `rounds`, `wall_s`, `tolerance` (the tie band), `method` (how the
    calls timed, in words: `Ranking.method`; "" in a record from before it was kept)."""

    kernel: str
    key: tuple[str, ...]
    winner: int
    tied: tuple[int, ...]
    configs: tuple[tuple[str, float, float, str, int], ...]
    state: str
    rounds: int
    wall_s: float
    tolerance: float
    method: str = ""

    def to_extra(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "key": list(self.key),
            "winner": self.winner,
            "tied": list(self.tied),
            "configs": [list(c) for c in self.configs],
            "state": self.state,
            "rounds": self.rounds,
            "wall_s": self.wall_s,
            "tolerance": self.tolerance,
            "method": self.method,
        }

    @classmethod
    def read(cls, got: object) -> Decision | None:
        """The record `got` holds (None: no record, or one of the wrong shape: a file may
        hold anything)."""
        if not isinstance(got, Mapping):
            return None
        try:
            configs = tuple(
                (str(n), float(t), float(m), str(o), int(k)) for n, t, m, o, k in got["configs"]
            )
            decision = cls(
                str(got["kernel"]),
                tuple(str(k) for k in got.get("key") or ()),
                int(got["winner"]),
                tuple(int(i) for i in got["tied"]),
                configs,
                str(got["state"]),
                int(got["rounds"]),
                float(got["wall_s"]),
                float(got.get("tolerance", 0.0)),
                str(got.get("method") or ""),
            )
        except (KeyError, TypeError, ValueError):
            return None
        ok = all(0 <= i < len(configs) for i in (decision.winner, *decision.tied))
        return decision if ok else None

    def lines(self) -> list[str]:
        """The lines under gpuenv run's table."""
        names = [c[0] for c in self.configs]
        if not names:
            return []
        winner = names[self.winner]
        tied = [names[i] for i in self.tied if names[i] != winner]
        key = " ".join(self.key) or "(no key)"
        head = f"autotune {self.kernel} {key}: {winner} chosen by gpuenv.rank"
        head += f", tied with {', '.join(tied)}" if tied else ""
        head += f" ({self.rounds} round{'s' * (self.rounds != 1)}, {self.wall_s:.2f} s)"
        width = max(len(n) for n in names)
        lines = [head]
        from gpuenv.timing.rank import ended

        for name, median_s, margin, outcome, rounds in sorted(self.configs, key=lambda c: c[2]):
            lines.append(
                f"  {name:<{width}}  {fmt_s(median_s):>9}  x{margin:.4f}  {ended(outcome, rounds)}"
            )
        lines.append(f"  state: {self.state}")
        if self.method:
            lines.append(f"  timed: {self.method}")
        return lines


def decision_record(kernel: str, key: list[str], r: Ranking) -> dict[str, Any]:
    """An autotune decision as `Measurement.extra["autotune"]` holds it (`Decision`), made
    to fit a region's facts (under MAX_RECORD_CHARS): long names are cut, then dropped."""
    import json

    def build(width: int) -> Decision:
        names = [n if len(n) <= width else n[: width - 3] + "..." for n in r.order]
        return Decision(
            kernel[:width],
            tuple(k[:width] for k in key),
            r.order.index(r.winner),
            tuple(r.order.index(n) for n in r.tied),
            tuple(
                (name, float(f"{c.median_s:.5g}"), round(c.margin, 5), c.outcome, c.rounds)
                for name, c in zip(names, (r[n] for n in r.order), strict=True)
            ),
            str(r.state),
            r.rounds,
            round(r.wall_s, 4),
            r.tolerance,
            r.method,
        )

    for width in (120, 60, 30, 12):
        record = build(width).to_extra()
        if len(json.dumps(record)) <= MAX_RECORD_CHARS:
            return record
    return {**build(12).to_extra(), "configs": [], "state": ""}


def decision_lines(record: object) -> list[str]:
    """A decision record (`decision_record`) as the lines under gpuenv run's table; none
    for a record of the wrong shape."""
    decision = Decision.read(record)
    return decision.lines() if decision is not None else []


__all__ = ["MAX_RECORD_CHARS", "Decision", "decision_lines", "decision_record"]
