"""The regression check: a new results file against the kept one, metric by metric.

Meant for the lent H100 (CI has no GPU): run a benchmark there with `--out new.json`,
then `python -m benchmarks check new.json` compares it with
benchmarks/results/<its name>.json. A metric more than `tolerance` (default 10%) worse
than the kept value, and worse by more than its `slack`, is a regression. A gate never
passes on what it could not judge: results from another GPU, a kept metric the new run
lacks, or no metric in common fail too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TOLERANCE = 0.10


@dataclass(frozen=True)
class Verdict:
    metric: str
    kept: float | None
    new: float | None
    change: float | None  # new / kept - 1
    status: str  # "ok" | "better" | "regression" | "missing"

    def line(self) -> str:
        if self.status == "missing":
            return f"  {self.metric}: missing from the new results"
        change = "" if self.change is None else f" ({self.change:+.1%})"
        return f"  {self.metric}: {self.kept:.6g} -> {self.new:.6g}{change}: {self.status}"


def compare_metric(
    name: str, kept: Mapping[str, Any], new: Mapping[str, Any] | None, tolerance: float
) -> Verdict:
    """One metric's verdict."""
    if new is None:
        return Verdict(name, kept["value"], None, None, "missing")
    k, n = float(kept["value"]), float(new["value"])
    change = n / k - 1 if k else None
    worse = n - k if kept.get("better", "lower") == "lower" else k - n  # > 0: worse
    limit = abs(k) * tolerance + float(kept.get("slack", 0.0))
    if worse > limit:
        status = "regression"
    elif worse < -limit:
        status = "better"
    else:
        status = "ok"
    return Verdict(name, k, n, change, status)


def compare(
    kept: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    tolerance: float = TOLERANCE,
    any_gpu: bool = False,
) -> tuple[list[Verdict], list[str]]:
    """Each kept metric's verdict, and the reasons the two cannot be compared (empty when
    they can)."""
    problems = []
    if kept.get("name") != new.get("name"):
        problems.append(f"different benchmarks: {kept.get('name')} and {new.get('name')}")
    if not any_gpu and kept.get("gpu") != new.get("gpu"):
        problems.append(
            f"different GPUs: kept {kept.get('gpu')!r}, new {new.get('gpu')!r} "
            "(--any-gpu to compare anyway)"
        )
    kept_m, new_m = kept.get("metrics") or {}, new.get("metrics") or {}
    if not set(kept_m) & set(new_m):
        problems.append("no metric in common: nothing to judge")
    verdicts = [compare_metric(k, v, new_m.get(k), tolerance) for k, v in sorted(kept_m.items())]
    return verdicts, problems


def failed(verdicts: list[Verdict], problems: list[str]) -> bool:
    return bool(problems) or any(v.status in ("regression", "missing") for v in verdicts)
