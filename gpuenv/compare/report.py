"""Per measurement name: the change in median time, and what the GPU's state had to do with it.

For each name found on both sides, the repetitions of every file on a side are
pooled (per-rank files of one distributed run; each file's last run, or all of a
file's runs with `all_runs`) and compared: the ratio of medians b/a with a bootstrap
(1 - alpha) CI, and a two-sided Mann-Whitney U test. Each comparison has one outcome:
  - "faster" / "slower": at least `min_change`, p < alpha and the CI excludes no
    change (`significant`);
  - "no change": the whole CI lies within +-`min_change`;
  - "can't tell": neither; the CI is wider than the minimum change allows, and
    `reps_needed` estimates the reps per side that would tell (the CI narrows as
    1/sqrt(reps)).
With one region per side there is no CI and no test: a change under `min_change` is
"no change", a larger one is named by its direction, untested and never `significant`.
Beside it, what differed in the GPU's state (state.py) and in the environment
(files.py). A real change (faster or slower) that coincides with a state change
says so: the speed-up may belong to the GPU, not to the code. A side that pools
measurements in different lock states gets no such attribution; the measurements
under the same lock state on both sides are compared with each other instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv import stats
from gpuenv.compare.files import env_changes, expand_paths, read_side
from gpuenv.compare.state import (
    GpuState,
    attribution,
    gpu_state,
    lock_key,
    lock_label,
    normalized_ratio,
    state_changes,
)
from gpuenv.errors import ConfigError
from gpuenv.units import fmt_s

ALPHA = 0.05  # significance level of the Mann-Whitney test, and 1 - the CI's level
MIN_CHANGE = 0.01  # a change smaller than this (relative) is "no change", whatever its p
OUTCOMES = ("faster", "slower", "no change", "can't tell")
CANT_TELL = "can't tell"


@dataclass(frozen=True)
class Comparison:
    name: str
    n_a: int
    n_b: int
    median_a_s: float
    median_b_s: float
    ratio: float  # median b / median a: < 1 is faster in b
    ratio_ci: tuple[float, float]  # bootstrap CI at the (1 - alpha) level
    p_value: float
    significant: bool  # |ratio - 1| >= min_change, p < alpha and the CI excludes 1
    state_a: GpuState
    state_b: GpuState
    state_changes: tuple[str, ...]  # sentences
    normalized_ratio: float | None = None  # the same, on time at the reference clock
    note: str = ""
    outcome: str = "no change"  # one of OUTCOMES (module docstring)
    reps_needed: int | None = None  # "can't tell": about how many reps per side would tell

    @property
    def change(self) -> float:
        return self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        from gpuenv._records import to_dict

        return {**to_dict(self), "change": self.change}


@dataclass(frozen=True)
class CompareReport:
    comparisons: tuple[Comparison, ...]
    env_changes: tuple[str, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    files_a: tuple[str, ...] = ()
    files_b: tuple[str, ...] = ()
    alpha: float = ALPHA
    extra: dict[str, Any] = field(default_factory=dict)
    min_change: float = MIN_CHANGE
    notes: tuple[str, ...] = ()  # which runs were read, where a file holds several

    def regressions(self, above: float = 0.0) -> list[Comparison]:
        """Significant slowdowns larger than `above` (relative). "no change" and "can't
        tell" rows are never among them (`cant_tell` lists the latter)."""
        return [c for c in self.comparisons if c.significant and c.change > above]

    def cant_tell(self) -> list[Comparison]:
        """The rows whose interval is too wide to say "no change" or a change."""
        return [c for c in self.comparisons if c.outcome == CANT_TELL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "comparisons": [c.to_dict() for c in self.comparisons],
            "env_changes": list(self.env_changes),
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
            "files_a": list(self.files_a),
            "files_b": list(self.files_b),
            "alpha": self.alpha,
            "min_change": self.min_change,
            "notes": list(self.notes),
        }


# --- comparing -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Test:
    """Two sets of times compared: median ratio b/a, its CI, the p-value, the outcome."""

    ratio: float
    ci: tuple[float, float]
    p: float
    tested: bool  # both sides had two or more times: the test and the CI mean something
    outcome: str  # one of OUTCOMES
    significant: bool
    n: int = 0  # the fewer reps of the two sides
    reps_needed: int | None = None  # "can't tell": about how many per side would tell


def _test(
    ta: Sequence[float],
    tb: Sequence[float],
    *,
    alpha: float,
    min_change: float,
    n_boot: int,
    seed: int,
) -> _Test:
    """ "faster"/"slower" when at least min_change, p < alpha and the (1 - alpha) CI
    excludes no change (the table's star and its CI column agree); "no change" when the
    whole CI lies within +-min_change (a p-value below alpha for a tiny change included);
    else "can't tell", with the reps per side that would tell. One time per side has no
    CI: its change is "no change" under min_change, else named by direction, untested."""
    med_a, med_b = stats.median(ta), stats.median(tb)
    ratio = med_b / med_a if med_a else math.inf
    n = min(len(ta), len(tb))
    if n < 2:
        word = "faster" if ratio < 1 else "slower"
        outcome = "no change" if abs(ratio - 1.0) < min_change else word
        return _Test(ratio, (ratio, ratio), 1.0, False, outcome, False, n)
    p = stats.mann_whitney(ta, tb).p_value
    ci = stats.bootstrap_ratio_ci(ta, tb, 1.0 - alpha, n_boot=n_boot, seed=seed)
    if abs(ratio - 1.0) >= min_change and p < alpha and (ci[0] > 1.0 or ci[1] < 1.0):
        return _Test(ratio, ci, p, True, "faster" if ratio < 1 else "slower", True, n)
    if -min_change < ci[0] - 1.0 and ci[1] - 1.0 < min_change:
        return _Test(ratio, ci, p, True, "no change", False, n)
    return _Test(ratio, ci, p, True, CANT_TELL, False, n, reps_needed(ratio, ci, n, min_change))


def reps_needed(ratio: float, ci: tuple[float, float], n: int, min_change: float) -> int | None:
    """About how many reps per side would make the CI narrow enough to tell, were the
    estimate to stay where it is: the CI's half-width shrinks as 1/sqrt(reps), and must
    come under the distance from the change to the minimum change (half the minimum change
    at least, near it). None where no number would (a minimum change of 0, no change)."""
    change = abs(ratio - 1.0)
    target = max(abs(change - min_change), min_change / 2)
    half = max(ci[1] - ratio, ratio - ci[0])
    if not (target > 0 and math.isfinite(half)):
        return None
    return max(n + 1, math.ceil(n * (half / target) ** 2))


def _test_text(t: _Test, *, alpha: float, min_change: float) -> str:
    change = t.ratio - 1.0
    ci = f"{_level(alpha)} CI {t.ci[0] - 1:+.1%} .. {t.ci[1] - 1:+.1%}"
    untested = "one region per side: no significance test"
    if not t.tested:
        if t.outcome == "no change":
            return (
                f"no change ({change:+.1%}, under the {min_change:.1%} minimum change; {untested})"
            )
        return f"{t.outcome} {abs(change):.1%} ({untested})"
    if t.outcome == "no change":
        return f"no change ({change:+.1%}, {ci}: within the {min_change:.1%} minimum change)"
    if t.outcome != CANT_TELL:
        return f"{t.outcome} {abs(change):.1%} (p={t.p:.2g})"
    need = (
        f"about {t.reps_needed:,} reps per side would tell (now {t.n:,})"
        if t.reps_needed is not None
        else "no number of reps can show no change under a minimum change of 0"
    )
    return (
        f"can't tell ({change:+.1%}, p={t.p:.2g}, {ci}: wider than the {min_change:.1%} "
        f"minimum change; {need})"
    )


def _level(alpha: float) -> str:
    return f"{100 * (1 - alpha):.3g}%"


def compare_runs(
    runs_a: Sequence[Any],
    runs_b: Sequence[Any],
    *,
    alpha: float = ALPHA,
    min_change: float = MIN_CHANGE,
    n_boot: int = 2000,
) -> CompareReport:
    """Compare every measurement name present on both sides (see the module docstring)."""
    by_a = _by_name(runs_a)
    by_b = _by_name(runs_b)
    names = [n for n in by_a if n in by_b]
    comparisons = []
    for name in names:
        comparisons.append(
            _compare_one(
                name, by_a[name], by_b[name], alpha=alpha, min_change=min_change, n_boot=n_boot
            )
        )
    from gpuenv.daemon.fleet import sustained_note

    largest = max((abs(c.change) for c in comparisons if math.isfinite(c.change)), default=0.0)
    fleet = sustained_note(runs_a, runs_b, largest)
    return CompareReport(
        comparisons=tuple(comparisons),
        env_changes=tuple(env_changes(runs_a, runs_b)) + ((fleet,) if fleet else ()),
        only_a=tuple(n for n in by_a if n not in by_b),
        only_b=tuple(n for n in by_b if n not in by_a),
        alpha=alpha,
        min_change=min_change,
    )


def compare_files(
    a: str | Iterable[str], b: str | Iterable[str], *, all_runs: bool = False, **kwargs: Any
) -> CompareReport:
    """Compare the files of side a with those of side b: each file's last run, as every
    reader takes it (`all_runs`: every run of a file written with --append); the report's
    `notes` say where a file holds several runs."""
    files_a, files_b = expand_paths(a), expand_paths(b)
    runs_a, notes_a = read_side(files_a, all_runs=all_runs)
    runs_b, notes_b = read_side(files_b, all_runs=all_runs)
    report = compare_runs(runs_a, runs_b, **kwargs)
    return dataclasses.replace(
        report, files_a=tuple(files_a), files_b=tuple(files_b), notes=(*notes_a, *notes_b)
    )


def _by_name(runs: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for run in runs:
        for m in run.measurements:
            out.setdefault(m.name, []).append(m)
    return out


def _kept(name: str, ms: list[Any], side: str) -> list[float]:
    times = [t for m in ms for t in m.kept_times_s]
    if not times:
        raise ConfigError(
            f"measurement {name!r} has no kept repetitions on side {side}",
            hint="every rep was rejected there; re-measure, or compare other names",
        )
    return times


def _compare_one(
    name: str, ms_a: list[Any], ms_b: list[Any], *, alpha: float, min_change: float, n_boot: int
) -> Comparison:
    ta, tb = _kept(name, ms_a, "a"), _kept(name, ms_b, "b")
    t = _test(ta, tb, alpha=alpha, min_change=min_change, n_boot=n_boot, seed=_seed(name))
    sa, sb = gpu_state(ms_a), gpu_state(ms_b)
    changes = state_changes(sa, sb)
    norm = normalized_ratio(ms_a, ms_b)
    note = _test_text(t, alpha=alpha, min_change=min_change)
    if sa.lock_mixed or sb.lock_mixed:
        note += _like_with_like(
            ms_a, ms_b, sa, sb, alpha=alpha, min_change=min_change, n_boot=n_boot
        )
    elif t.outcome in ("faster", "slower"):
        note += attribution(t.ratio, sa, sb, changes, norm)
    return Comparison(
        name,
        len(ta),
        len(tb),
        stats.median(ta),
        stats.median(tb),
        t.ratio,
        t.ci,
        t.p,
        t.significant,
        sa,
        sb,
        tuple(changes),
        norm,
        note,
        t.outcome,
        t.reps_needed,
    )


def _seed(name: str) -> int:
    return sum(ord(c) * (i + 1) for i, c in enumerate(name)) % 2**31


def _like_with_like(
    ms_a: list[Any],
    ms_b: list[Any],
    sa: GpuState,
    sb: GpuState,
    *,
    alpha: float,
    min_change: float,
    n_boot: int,
) -> str:
    """A side pools measurements in different lock states: its median and mean clock mix
    them, so no change is put down to the GPU from them; the measurements under the same
    lock state on both sides are compared with each other instead, GPU state included."""
    mixed = [side for side, s in (("a", sa), ("b", sb)) if s.lock_mixed]
    text = (
        f"; {' and '.join(mixed)} pool{'' if len(mixed) > 1 else 's'} measurements in "
        "different lock states, so the pooled medians and clocks mix GPU states"
    )
    by_a: dict[Any, list[Any]] = {}
    by_b: dict[Any, list[Any]] = {}
    for ms, by in ((ms_a, by_a), (ms_b, by_b)):
        for m in ms:
            if m.kept_times_s:
                by.setdefault(lock_key(m), []).append(m)
    common = [k for k in by_a if k in by_b]
    if not common:
        return text + "; no lock state is on both sides to compare like with like"
    for key in common:
        ga, gb = by_a[key], by_b[key]
        ta = [x for m in ga for x in m.kept_times_s]
        tb = [x for m in gb for x in m.kept_times_s]
        t = _test(
            ta, tb, alpha=alpha, min_change=min_change, n_boot=n_boot, seed=_seed(lock_label(key))
        )
        under = f"under {lock_label(key)}" if key else "without a lock"
        text += f"; like with like, {under} (n={len(ta)} vs {len(tb)}): " + _test_text(
            t, alpha=alpha, min_change=min_change
        )
        if t.outcome in ("faster", "slower"):
            ua, ub = gpu_state(ga), gpu_state(gb)
            text += attribution(t.ratio, ua, ub, state_changes(ua, ub), normalized_ratio(ga, gb))
    return text


# --- text ------------------------------------------------------------------------------


def _fmt_state(s: GpuState) -> str:
    parts = []
    if s.sm_mhz is not None:
        parts.append(f"SM {s.sm_mhz:.0f}")
    if s.effective_mhz is not None:
        parts.append(f"eff {s.effective_mhz:.0f}")
    if s.cap_fraction is not None:
        parts.append(f"cap {s.cap_fraction:.0%}")
    if s.temp_c is not None:
        parts.append(f"{s.temp_c:.0f}C")
    if s.lock:
        parts.append(f"lock: {s.lock}")
    return " ".join(parts) or "-"


def format_report(report: CompareReport) -> str:
    """A markdown table a person reads, then the notes."""
    lines = []
    if report.files_a or report.files_b:
        lines.append(f"a: {', '.join(report.files_a)}")
        lines.append(f"b: {', '.join(report.files_b)}")
        lines += [f"note: {n}" for n in report.notes]
        lines.append("")
    if report.env_changes:
        lines.append("Environment changed between a and b:")
        lines += [f"  - {c}" for c in report.env_changes]
        lines.append("")
    if report.comparisons:
        lines.append(
            f"| measurement | a median | b median | change | {_level(report.alpha)} CI "
            "| p | GPU a | GPU b |"
        )
        lines.append("| --- | ---: | ---: | ---: | --- | ---: | --- | --- |")
        for c in report.comparisons:
            mark = " *" if c.significant else ""
            lines.append(
                f"| {c.name} | {fmt_s(c.median_a_s)} (n={c.n_a}) | {fmt_s(c.median_b_s)} "
                f"(n={c.n_b}) | {c.change:+.2%}{mark} | {c.ratio_ci[0] - 1:+.2%} .. "
                f"{c.ratio_ci[1] - 1:+.2%} | {c.p_value:.2g} | {_fmt_state(c.state_a)} | "
                f"{_fmt_state(c.state_b)} |"
            )
        lines.append("")
        lines.append(
            f"* significant: p < {report.alpha:g}, the CI excludes no change, and at "
            f"least {report.min_change:.1%}; no change: the CI within +-"
            f"{report.min_change:.1%}; else can't tell. Notes:"
        )
        for c in report.comparisons:
            lines.append(f"  - {c.name}: {c.note}")
            lines += [f"      state: {s}" for s in c.state_changes if c.note.find(s) < 0]
    else:
        lines.append("No measurement name appears on both sides.")
    if report.only_a:
        lines.append(f"Only in a: {', '.join(report.only_a)}")
    if report.only_b:
        lines.append(f"Only in b: {', '.join(report.only_b)}")
    return "\n".join(lines)


__all__ = [
    "CANT_TELL",
    "OUTCOMES",
    "CompareReport",
    "Comparison",
    "compare_files",
    "compare_runs",
    "format_report",
    "reps_needed",
]
