"""Compare two sets of runs: what changed in the numbers, and was the GPU in the same state.

    report = compare_files(["a.jsonl"], ["b-rank0.jsonl", "b-rank1.jsonl"])
    print(format_report(report))

For each measurement name found on both sides, the repetitions of every file on
a side are pooled (per-rank files of one distributed run, repeated runs) and
compared: the ratio of medians b/a with a bootstrap CI, and a two-sided
Mann-Whitney U test. Beside it, what differed in the GPU's state while each
side ran (mean SM clock, effective clock, time under the power cap,
temperature, lock) and in the environment (GPU model, driver, power limit,
torch and CUDA versions). A significant change that coincides with a state
change says so: the speed-up may belong to the GPU, not to the code.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv import stats
from gpuenv.backend import REASON_SW_POWER_CAP
from gpuenv.errors import ConfigError
from gpuenv.units import fmt_s

ALPHA = 0.05  # significance level of the Mann-Whitney test
MIN_CHANGE = 0.01  # a significant change smaller than this (relative) is reported as noise
CLOCK_REL = 0.02  # mean SM clocks further apart than this are a state change
CAP_FRACTION = 0.10  # time under the power cap differing by more than this (of the run)
TEMP_C = 5.0  # mean temperatures further apart than this
ENV_KEYS = ("driver_version", "torch_version", "cuda_version", "backend")
GPU_KEYS = ("name", "power_limit_w", "persistence", "app_sm_mhz", "max_sm_mhz")


@dataclass(frozen=True)
class GpuState:
    """What one side's GPU did during one measurement name (pooled over its records)."""

    sm_mhz: float | None  # time-weighted mean of NVML's SM clock
    effective_mhz: float | None  # median of the `_sleep` probes (gpuenv.bench only)
    cap_fraction: float | None  # fraction of the measured time under the SW power cap
    temp_c: float | None  # mean of the measurements' mean temperatures
    temp_c_max: float | None
    lock: str | None  # "1350-1350 MHz held", "... NOT held", None: no lock asked
    verdicts: tuple[str, ...]
    findings: tuple[str, ...]  # kinds


@dataclass(frozen=True)
class Comparison:
    name: str
    n_a: int
    n_b: int
    median_a_s: float
    median_b_s: float
    ratio: float  # median b / median a: < 1 is faster in b
    ratio_ci: tuple[float, float]
    p_value: float
    significant: bool  # p < alpha and |ratio - 1| >= min_change
    state_a: GpuState
    state_b: GpuState
    state_changes: tuple[str, ...]  # sentences
    normalized_ratio: float | None = None  # the same, on time at the reference clock
    note: str = ""

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

    def regressions(self, above: float = 0.0) -> list[Comparison]:
        """Significant slowdowns larger than `above` (relative)."""
        return [c for c in self.comparisons if c.significant and c.change > above]

    def to_dict(self) -> dict[str, Any]:
        return {
            "comparisons": [c.to_dict() for c in self.comparisons],
            "env_changes": list(self.env_changes),
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
            "files_a": list(self.files_a),
            "files_b": list(self.files_b),
            "alpha": self.alpha,
        }


# --- loading ---------------------------------------------------------------------------


def expand_paths(spec: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files named by one side: paths, comma-separated lists, globs, or directories
    (every *.jsonl inside). Raises ConfigError when a name matches nothing."""
    items: list[str] = []
    if isinstance(spec, (str, os.PathLike)):
        items = [p for p in str(spec).split(",") if p.strip()]
    else:
        for s in spec:
            items += [p for p in str(s).split(",") if p.strip()]
    out: list[str] = []
    for item in items:
        item = item.strip()
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "*.jsonl")))
        elif any(ch in item for ch in "*?["):
            found = sorted(glob.glob(item))
        else:
            found = [item] if os.path.exists(item) else []
        if not found:
            raise ConfigError(
                f"no results file matches {item!r}",
                hint="pass .jsonl files written by gpuenv (a comma-separated list, a glob "
                "or a directory for several per side)",
            )
        out += [f for f in found if f not in out]
    if not out:
        raise ConfigError("no results files given", hint="pass at least one .jsonl file per side")
    return out


def load_side(paths: Sequence[str | os.PathLike[str]]) -> list[Any]:
    """Every run in every file of one side."""
    from gpuenv.results import load_runs

    runs = []
    for p in paths:
        runs += load_runs(p)
    return runs


# --- comparing -------------------------------------------------------------------------


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
            _compare_one(name, by_a[name], by_b[name], alpha=alpha, min_change=min_change,
                         n_boot=n_boot)
        )
    return CompareReport(
        comparisons=tuple(comparisons),
        env_changes=tuple(_env_changes(runs_a, runs_b)),
        only_a=tuple(n for n in by_a if n not in by_b),
        only_b=tuple(n for n in by_b if n not in by_a),
        alpha=alpha,
    )


def compare_files(
    a: str | Iterable[str], b: str | Iterable[str], **kwargs: Any
) -> CompareReport:
    files_a, files_b = expand_paths(a), expand_paths(b)
    report = compare_runs(load_side(files_a), load_side(files_b), **kwargs)
    return CompareReport(
        report.comparisons, report.env_changes, report.only_a, report.only_b,
        tuple(files_a), tuple(files_b), report.alpha,
    )


def _by_name(runs: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for run in runs:
        for m in run.measurements:
            out.setdefault(m.name, []).append(m)
    return out


def _compare_one(
    name: str, ms_a: list[Any], ms_b: list[Any], *, alpha: float, min_change: float, n_boot: int
) -> Comparison:
    ta = [t for m in ms_a for t in m.kept_times_s]
    tb = [t for m in ms_b for t in m.kept_times_s]
    if not ta or not tb:
        side = "a" if not ta else "b"
        raise ConfigError(
            f"measurement {name!r} has no kept repetitions on side {side}",
            hint="every rep was rejected there; re-measure, or compare other names",
        )
    med_a, med_b = stats.median(ta), stats.median(tb)
    ratio = med_b / med_a if med_a else math.inf
    if len(ta) >= 2 and len(tb) >= 2:
        mw = stats.mann_whitney(ta, tb)
        p = mw.p_value
        ci = stats.bootstrap_ratio_ci(ta, tb, n_boot=n_boot, seed=_seed(name))
    else:
        p, ci = 1.0, (ratio, ratio)  # one region each: no test is possible
    significant = p < alpha and abs(ratio - 1.0) >= min_change
    sa, sb = _state(ms_a), _state(ms_b)
    changes = _state_changes(sa, sb)
    norm = _normalized_ratio(ms_a, ms_b)
    note = _note(ratio, significant, p, sa, sb, changes, norm, len(ta), len(tb))
    return Comparison(name, len(ta), len(tb), med_a, med_b, ratio, ci, p, significant, sa, sb,
                      tuple(changes), norm, note)


def _seed(name: str) -> int:
    return sum(ord(c) * (i + 1) for i, c in enumerate(name)) % 2**31


def _state(ms: list[Any]) -> GpuState:
    windows = [w for m in ms for w in (m.summary_windows or m.windows)]
    weighted = [(w.sm_mhz_mean, w.duration_s) for w in windows if w.sm_mhz_mean is not None]
    sm = None
    if weighted:
        total = sum(d for _, d in weighted)
        sm = (sum(v * d for v, d in weighted) / total if total > 0
              else stats.median([v for v, _ in weighted]))
    eff = [m.extra.get("rep_clock_mhz_median") for m in ms]
    eff_v = [float(e) for e in eff if e]
    dur = sum(w.duration_s for w in windows)
    cap = None
    if windows and dur > 0:
        if any("power" in w.reason_s for w in windows):
            cap = min(1.0, sum(w.reason_s.get("power", 0.0) for w in windows) / dur)
        else:  # no counters: the share of windows that saw the cap bit
            cap = sum(w.duration_s for w in windows if w.reasons & REASON_SW_POWER_CAP) / dur
    temps = [(w.temp_c_start + w.temp_c_end) / 2 for w in windows
             if w.temp_c_start is not None and w.temp_c_end is not None]
    tmax = [w.temp_c_max for w in windows if w.temp_c_max is not None]
    locks = {(w.lock_range_mhz, w.lock_held) for w in windows if w.lock_range_mhz is not None}
    lock = None
    if locks:
        ranges = sorted({r for r, _ in locks if r is not None})
        held = all(h is not False for _, h in locks)
        lock = ", ".join(f"{lo}-{hi} MHz" for lo, hi in ranges) + (" held" if held else " NOT held")
    return GpuState(
        sm_mhz=sm,
        effective_mhz=stats.median(eff_v) if eff_v else None,
        cap_fraction=cap,
        temp_c=sum(temps) / len(temps) if temps else None,
        temp_c_max=max(tmax) if tmax else None,
        lock=lock,
        verdicts=tuple(sorted({m.verdict for m in ms})),
        findings=tuple(sorted({f.kind for m in ms for f in m.findings})),
    )


def _state_changes(a: GpuState, b: GpuState) -> list[str]:
    out = []
    for label, va, vb in (("mean SM clock", a.sm_mhz, b.sm_mhz),
                          ("effective SM clock", a.effective_mhz, b.effective_mhz)):
        if va and vb and abs(vb / va - 1) > CLOCK_REL:
            out.append(f"{label} {va:.0f} -> {vb:.0f} MHz ({vb / va - 1:+.1%})")
    if a.cap_fraction is not None and b.cap_fraction is not None and \
            abs(a.cap_fraction - b.cap_fraction) > CAP_FRACTION:
        out.append(f"time under the power cap {a.cap_fraction:.0%} -> {b.cap_fraction:.0%}")
    if a.temp_c is not None and b.temp_c is not None and abs(a.temp_c - b.temp_c) > TEMP_C:
        out.append(f"temperature {a.temp_c:.0f} -> {b.temp_c:.0f} C")
    if a.lock != b.lock:
        out.append(f"clock lock {a.lock or 'none'} -> {b.lock or 'none'}")
    if a.verdicts != b.verdicts:
        out.append(f"verdict {'/'.join(a.verdicts)} -> {'/'.join(b.verdicts)}")
    new = sorted(set(b.findings) - set(a.findings))
    gone = sorted(set(a.findings) - set(b.findings))
    if new:
        out.append("new findings: " + ", ".join(new))
    if gone:
        out.append("findings gone: " + ", ".join(gone))
    return out


def _normalized_ratio(ms_a: list[Any], ms_b: list[Any]) -> float | None:
    na = [m.extra.get("time_at_ref_clock_s") for m in ms_a]
    nb = [m.extra.get("time_at_ref_clock_s") for m in ms_b]
    if not all(na) or not all(nb):
        return None
    return stats.median([float(x) for x in nb]) / stats.median([float(x) for x in na])


def _note(ratio: float, significant: bool, p: float, a: GpuState, b: GpuState,
          changes: list[str], norm: float | None, n_a: int, n_b: int) -> str:
    if n_a < 2 or n_b < 2:
        verdict = f"{_word(ratio)} {abs(ratio - 1):.1%} (one region per side: no significance test)"
    elif not significant:
        return f"no significant change (p={p:.2g})"
    else:
        verdict = f"{_word(ratio)} {abs(ratio - 1):.1%} (p={p:.2g})"
    clock_moved = [c for c in changes if "clock" in c or "power cap" in c or "temperature" in c]
    if not clock_moved:
        return verdict
    # does the clock explain it? time ~ 1 / clock for compute-bound work
    clock_a = a.effective_mhz or a.sm_mhz
    clock_b = b.effective_mhz or b.sm_mhz
    text = f"{verdict}, but it coincides with a GPU state change ({'; '.join(clock_moved)})"
    if clock_a and clock_b and (clock_b > clock_a) == (ratio < 1):
        text += ": the GPU, not the code, may explain it"
    if norm is not None:
        text += f"; at the reference clock the change is {norm - 1:+.1%}"
    return text


def _word(ratio: float) -> str:
    return "faster" if ratio < 1 else "slower"


def _env_changes(runs_a: Sequence[Any], runs_b: Sequence[Any]) -> list[str]:
    def values(runs: Sequence[Any], key: str) -> set[str]:
        return {str(r.metadata.get(key)) for r in runs if r.metadata.get(key) is not None}

    def gpu_values(runs: Sequence[Any], key: str) -> set[str]:
        return {str(g.get(key)) for r in runs for g in (r.metadata.get("gpus") or [])
                if isinstance(g, dict) and g.get(key) is not None}

    out = []
    for key in ENV_KEYS:
        va, vb = values(runs_a, key), values(runs_b, key)
        if va and vb and va != vb:
            out.append(f"{key}: {', '.join(sorted(va))} -> {', '.join(sorted(vb))}")
    for key in GPU_KEYS:
        va, vb = gpu_values(runs_a, key), gpu_values(runs_b, key)
        if va and vb and va != vb:
            label = "GPU model" if key == "name" else f"GPU {key}"
            out.append(f"{label}: {', '.join(sorted(va))} -> {', '.join(sorted(vb))}")
    return out


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
        parts.append(f"lock {s.lock}")
    return " ".join(parts) or "-"


def format_report(report: CompareReport) -> str:
    """A markdown table a person reads, then the notes."""
    lines = []
    if report.files_a or report.files_b:
        lines.append(f"a: {', '.join(report.files_a)}")
        lines.append(f"b: {', '.join(report.files_b)}")
        lines.append("")
    if report.env_changes:
        lines.append("Environment changed between a and b:")
        lines += [f"  - {c}" for c in report.env_changes]
        lines.append("")
    if report.comparisons:
        lines.append("| measurement | a median | b median | change | 95% CI | p | GPU a | GPU b |")
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
        lines.append(f"* significant at p < {report.alpha:g}. Notes:")
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
    "CompareReport",
    "Comparison",
    "GpuState",
    "compare_files",
    "compare_runs",
    "expand_paths",
    "format_report",
    "load_side",
]
