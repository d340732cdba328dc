"""`bench_pair(a, b)`: is b faster than a? Calls of the two, alternating, and the ratio of
each pair's medians.

Why pairs: one call's median knows the state the GPU was in during its ~0.1 s to +-0.25%,
but on an H100 that state moves from one call to the next by 0.3-4% (docs/how-to/bench.md,
"Run to run"), for a and b alike. Two runs one after the other then differ by that much
with nothing changed. Calls close in time share the state, so the ratio of a pair does not:
on the H100 the same kernel against itself read 1.000 +-0.2-0.4% per round of four pairs
where its calls moved 0.3-4% (docs/benchmarks/run_to_run.md, "what moves between calls").

    p = gpuenv.bench_pair(old, new, names=("old", "new"))
    print(p)                  # new / old: 0.982 (97.9% CI 0.979-0.985) over 10 pairs: ...
    p.ratio, p.ci, p.a, p.b   # the ratio b / a, its interval, each side's Measurements

Pair i runs a then b when i is even, b then a when it is odd (a drift within a pair falls
on each side alike). The ratio is the median of the pairs' b / a, its interval the
distribution-free interval of that median from order statistics (gpuenv.stats.median_ci:
at 10 pairs the 2nd and 9th smallest, 97.9%).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv import stats
from gpuenv import validate as v
from gpuenv.units import fmt_s

DEFAULT_PAIRS = 10


@dataclass(frozen=True)
class Pair:
    """What `bench_pair` measured: each side's Measurements in call order, the ratio b / a
    of each pair's medians, their median (`ratio`) and its interval (`ci`, covering at
    least `confidence`)."""

    names: tuple[str, str]
    a: tuple[Any, ...]
    b: tuple[Any, ...]
    ratios: tuple[float, ...]
    ratio: float
    ci: tuple[float, float]
    confidence: float
    findings: tuple[str, ...] = field(default=())  # kinds of the findings of any call

    @property
    def change(self) -> float:
        """b against a: -0.02 is b 2% faster (its time 2% lower)."""
        return self.ratio - 1.0

    @property
    def outcome(self) -> str:
        """ "faster" / "slower" (b against a) when the interval excludes 1, else "no change
        shown"."""
        lo, hi = self.ci
        return "faster" if hi < 1.0 else "slower" if lo > 1.0 else "no change shown"

    def __str__(self) -> str:
        a, b = self.names
        lo, hi = self.ci
        what = {
            "faster": f"{b} is {-self.change:.2%} faster than {a}",
            "slower": f"{b} is {self.change:.2%} slower than {a}",
            "no change shown": "no difference shown: the interval holds 1",
        }[self.outcome]
        meds = [stats.median([m.median_s for m in side]) for side in (self.a, self.b)]
        text = (
            f"{b} / {a}: {self.ratio:.4f} ({self.confidence:.1%} CI {lo:.4f}-{hi:.4f}) "
            f"over {len(self.ratios)} pairs, alternating: {what}\n"
            f"  {a}: {fmt_s(meds[0])}, {b}: {fmt_s(meds[1])} (medians of the calls)"
        )
        if self.findings:
            text += f"\n  findings in some calls: {', '.join(self.findings)} (see .a and .b)"
        return text


def pair_ratio(
    a_s: Sequence[float], b_s: Sequence[float], confidence: float = 0.95
) -> tuple[float, tuple[float, float], float]:
    """The median of the pairs' ratios b / a, its order-statistic interval and that
    interval's coverage (>= `confidence`, or less where there are too few pairs)."""
    if len(a_s) != len(b_s) or not a_s:
        raise ValueError("pair_ratio needs as many values of a as of b, at least one")
    logs = sorted(math.log(b / a) for a, b in zip(a_s, b_s, strict=True))
    lo_rank, hi_rank, coverage = stats.median_ci_ranks(len(logs), confidence)
    ci = (math.exp(logs[lo_rank - 1]), math.exp(logs[hi_rank - 1]))
    return math.exp(stats.median(logs)), ci, coverage


def min_pairs(confidence: float = 0.95) -> int:
    """The fewest pairs whose order-statistic interval reaches `confidence` (6 at 95%)."""
    n = 2
    while stats.median_ci_ranks(n, confidence)[2] < confidence:
        n += 1
    return n


def bench_pair(
    a: Callable[[], Any],
    b: Callable[[], Any],
    *,
    pairs: int = DEFAULT_PAIRS,
    names: tuple[str, str] = ("a", "b"),
    confidence: float = 0.95,
    **settings: Any,
) -> Pair:
    """Time `a` and `b` with `gpuenv.bench`, alternating, `pairs` calls of each; returns a
    `Pair` (b / a).

    Args:
        a: the baseline's work (one rep).
        b: the work compared with it.
        pairs: how many calls of each, alternating a, b, a, b, ...
        names: the two measurements' names.
        confidence: the level of the ratio's confidence interval.
        **settings: passed to every `bench` call (its BenchConfig fields, `backend=`,
            `session=`, `gpu=`, ...).

    Returns:
        A `Pair`: `ratio` (b / a), its `ci`, the `outcome` and each side's Measurements.

    Raises:
        ConfigError: an argument out of range.
    """
    v.no_arg_callable(a, "a")
    v.no_arg_callable(b, "b")
    v.number(confidence, "confidence", lo=0, hi=1, lo_open=True, hi_open=True)
    least = min_pairs(confidence)
    pairs = v.integer(
        pairs,
        "pairs",
        lo=least,
        hint=f"fewer than {least} pairs cannot give a {confidence:.0%} interval "
        f"(their widest, smallest to largest ratio, covers less); "
        f"the default is {DEFAULT_PAIRS}",
    )
    if (
        not isinstance(names, tuple | list)
        or len(names) != 2
        or not all(isinstance(n, str) and n for n in names)
    ):
        from gpuenv.errors import ConfigError

        raise ConfigError(
            f"names must be two non-empty strings, not {names!r}", hint='e.g. names=("old", "new")'
        )
    from gpuenv.timing.harness import bench

    got: dict[int, list[Any]] = {0: [], 1: []}
    fns = (a, b)
    for i in range(pairs):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            got[side].append(bench(fns[side], name=names[side], **settings))
    ratio, ci, coverage = pair_ratio(
        [m.median_s for m in got[0]], [m.median_s for m in got[1]], confidence
    )
    kinds = sorted({f.kind for side in got.values() for m in side for f in m.findings})
    return Pair(
        names=(names[0], names[1]),
        a=tuple(got[0]),
        b=tuple(got[1]),
        ratios=tuple(mb.median_s / ma.median_s for ma, mb in zip(got[0], got[1], strict=True)),
        ratio=ratio,
        ci=ci,
        confidence=coverage,
        findings=tuple(kinds),
    )
