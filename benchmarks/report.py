"""The benchmark pages of the docs, generated from the results under benchmarks/results/.

`python -m benchmarks report` writes, never by hand:

- docs/benchmarks.md, the headline page: each benchmark, its goal (its module's title),
  the latest value of each kind of machine it ran on (the metric its module names as
  `HEADLINE`, else the first it kept), and a link to its own page;
- docs/benchmarks/<name>.md, one page per benchmark: its goal and command, then one
  section per results file (where and when, its tables and printed lines, the metrics a
  later run is checked against). What follows the generated section on such a page
  (notes and history typed by hand at the time, kept as measured) is left as it is;
- the benchmark pages' part of mkdocs.yml's nav, between its two marker comments.

Both the headline page and the nav list the benchmarks by what a reader asks (`GROUPS`:
accuracy, speed, scale, reliability), not by module name; a benchmark in no group is
listed after the groups (tests/test_docs_site.py fails when one of the suite's is).

docs/benchmarks/history.md holds the hand-typed history that belongs to no single
benchmark; nothing here writes it. `tests/test_benchmarks.py` fails when a generated page
or the nav is stale against the results.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.runner import RESULTS, ROOT, title

BEGIN = "<!-- section:generated -->"
END = "<!-- /section:generated -->"
NAV_BEGIN = "# begin: the benchmark pages, written by `python -m benchmarks report`"
NAV_END = "# end: the benchmark pages"
CODE_WIDTH = 88  # a code block's widest line on a page (tests/test_docs_site.py checks)
HEADLINE_LIMIT = 300  # lines of the headline page: more belongs on the benchmarks' own pages


@dataclass(frozen=True)
class Group:
    """Benchmarks that answer one question a reader asks, under one heading."""

    title: str  # the nav's section and the headline page's heading
    asks: str  # the question, one sentence under the heading
    names: tuple[str, ...]


GROUPS = (
    Group(
        "Accuracy",
        "Does a number mean what it says: the same cold and hot, run to run, across tools, "
        "and does every warning point at what moved it?",
        (
            "autotune_rank",
            "autotune_tutorial",
            "call_levels",
            "ci_gate",
            "collective",
            "detection",
            "dropin",
            "dropin_mlp",
            "energy_sim",
            "hot_wait",
            "inductor_rank",
            "inductor_waits",
            "levels",
            "models_side",
            "node_concurrent",
            "node_shared",
            "one_meaning",
            "power_lag",
            "rank_tiny",
            "repro",
            "run_to_run",
            "session_leak",
            "session_wait",
            "sim_fidelity",
            "tiny",
            "warnings_moved",
        ),
    ),
    Group(
        "Speed",
        "What does gpuenv cost: time to a number, and the overhead of each way of "
        "measuring, of telemetry, of the monitor and of the command line?",
        (
            "autoregions",
            "calibrate_sim",
            "dropin_host",
            "inductor_calls",
            "monitor",
            "monitor_frames",
            "nvml_costs",
            "perf_report",
            "plot_big",
            "pytest_plugin",
            "rank_cost",
            "rank_hot",
            "run_overhead",
            "sampler_gc",
            "sampler_overhead",
            "session_trace",
            "speed",
            "startup",
        ),
    ),
    Group(
        "Scale",
        "Does it stay flat with many GPUs, clients, jobs and nodes: gpuenvd under load, "
        "launchers, Slurm?",
        (
            "daemon",
            "daemon_memory",
            "daemon_mixed",
            "daemon_race",
            "launcher",
            "scale",
            "slurm",
            "slurm_nodes",
        ),
    ),
    Group(
        "Reliability",
        "Are the GPUs always put back, and does bad or hostile input get a clear answer?",
        ("attacks", "chaos", "cli_fuzz", "inputs", "journal_faults", "seam_figures"),
    ),
)


def grouped_names(names: Iterable[str]) -> list[tuple[Group | None, list[str]]]:
    """`names` by group, in `GROUPS`' order (groups with none left out), then the names in
    no group (None), each list in the order given."""
    names = list(names)
    out: list[tuple[Group | None, list[str]]] = []
    for group in GROUPS:
        mine = [n for n in names if n in group.names]
        if mine:
            out.append((group, mine))
    rest = [n for n in names if not any(n in g.names for g in GROUPS)]
    return [*out, (None, rest)] if rest else out


HEADLINE_INTRO = """\
# Benchmark figures

Every figure of these pages was measured by a module of the benchmark suite
(`benchmarks/`, `python -m benchmarks list`) on the machine and date given with it. GPU
figures come from the H100s and H200s we measured on, read-only (`GPUENV_READONLY=1`:
nothing on them was ever locked or reset); simulator figures from a 2-core CPU machine
with no GPU. Ratios are measured side by side in one run.

This page is generated from `benchmarks/results/` by `python -m benchmarks report`, as is
each benchmark's own page (its tables, and the notes kept from when it ran). Below,
grouped by what a reader asks (accuracy, speed, scale, reliability): each benchmark, what
it asks, and the latest value it kept on each kind of machine (the first metric that
`python -m benchmarks check` holds a later run to).

What these figures say about GPUs themselves is told in
[What a GPU does](explanation/what-gpus-do.md); the history typed by hand before the suite
existed is [kept as measured](benchmarks/history.md).
"""


class StaleError(Exception):
    """A generated benchmark page, or the nav, does not match the results."""


@dataclass(frozen=True)
class Site:
    """Where the generated files go: the docs folder and mkdocs.yml."""

    docs: Path = ROOT / "docs"
    mkdocs: Path = ROOT / "mkdocs.yml"
    modules: Path = ROOT / "benchmarks"  # a benchmark's goal is its module's title

    @property
    def headline(self) -> Path:
        return self.docs / "benchmarks.md"

    @property
    def pages(self) -> Path:
        return self.docs / "benchmarks"


SITE = Site()
DOC = SITE.headline


def load_results(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every results file, by name (each given its file's name, `file`, to head its section)."""
    out = []
    for path in sorted(directory.glob("*.json")):
        result = json.loads(path.read_text())
        result["file"] = path.stem
        out.append(result)
    return out


def _key(result: Mapping[str, Any]) -> str:
    """What names a result on its page: its file's name (several files share a key)."""
    return str(result.get("file") or result.get("key") or result["name"])


def _escape(cell: object) -> str:
    text = str(cell).replace("\n", " ")
    return text if "\\|" in text else text.replace("|", "\\|")


_SEPARATOR = {"left": "---", "right": "---:", "center": ":---:"}


def table_lines(
    columns: list[str], rows: Iterable[list[str]], align: list[str] | None = None
) -> list[str]:
    """A markdown table (`align`: each column's "left", "right" or "center")."""
    seps = [_SEPARATOR.get(a, "---") for a in align or ["left"] * len(columns)]
    out = ["| " + " | ".join(_escape(c) for c in columns) + " |", "| " + " | ".join(seps) + " |"]
    out += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in rows]
    return out


def _when(result: Mapping[str, Any]) -> str:
    return str(result["date"]).replace("T", " ").replace("+00:00", " UTC")


def where(result: Mapping[str, Any]) -> str:
    """One line: when, on what, from which commit (or, for figures measured before the
    runner and kept from the hand-typed page, what they were transcribed from)."""
    if result.get("transcribed"):
        return "; ".join(
            [
                _when(result),
                result["machine"]["text"],
                f"GPU: {result['gpu']}",
                f"kept from {result['transcribed']}",
            ]
        )
    m, c = result["machine"], result["commit"]
    sha = (c.get("sha") or "?")[:7] + (" + changes" if c.get("dirty") else "")
    parts = [
        _when(result),
        f"{m['cores']}-core CPU ({m['cpu']})",
        f"GPU: {result['gpu']}",
        f"commit {sha}",
        f"{result['wall_s']:g} s",
    ]
    if m.get("load_1_5_15"):
        parts.insert(2, "load average {} / {} / {}".format(*m["load_1_5_15"]))
    if result.get("quick"):
        parts.append("--quick sizes")
    if result.get("exit_code"):
        parts.append(f"exit status {result['exit_code']}")
    return "; ".join(parts)


def _longest_backticks(text: str) -> int:
    """The longest run of backticks in `text` (a fence around it must be longer)."""
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def section(result: Mapping[str, Any], goal: str | None = None) -> list[str]:
    """The markdown of one results file: a heading named by its file, its own title where
    it says more than the benchmark's goal, where and when, its blocks and metrics."""
    lines = [f"## {_key(result)}: {_machine(result)}, {_when(result)[:10]}", ""]
    if result["title"] != goal:
        lines += [result["title"], ""]
    lines += [f"`{result['command']}`: {where(result)}.", ""]
    for block in result["blocks"]:
        if "table" in block:
            t = block["table"]
            lines += [*table_lines(t["columns"], t["rows"], t.get("align")), ""]
        else:  # a report's own lines, as printed (a '#' in them is no heading)
            fence = "`" * max(3, _longest_backticks(block["text"]) + 1)
            lines += [fence + "text", "\n".join(_wrapped(block["text"])), fence, ""]
    metrics = result.get("metrics") or {}
    if metrics:
        lines += ["Checked for regressions (`python -m benchmarks check`):", ""]
        rows = [
            [k, f"{v['value']:.6g} {v['unit']}".strip(), v["better"]]
            for k, v in sorted(metrics.items())
        ]
        lines += [*table_lines(["metric", "value", "better"], rows), ""]
    return lines


def _wrapped(text: str) -> list[str]:
    """A report's printed lines, each longer than `CODE_WIDTH` wrapped at its spaces (the
    rest of it indented two more spaces than its start), so a page's code blocks fit."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= CODE_WIDTH:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(
            line,
            CODE_WIDTH,
            initial_indent="",
            subsequent_indent=lead + "  ",
            break_long_words=False,
            break_on_hyphens=False,
            drop_whitespace=True,
        ) or [line]
    return out


def _machine(result: Mapping[str, Any]) -> str:
    """The GPU a result ran on, shortly: its name, or "simulated H100"."""
    gpu = str(result.get("gpu") or "none").split(" (")[0].removeprefix("simulated ")
    if result.get("sim"):
        return f"simulated {gpu}"
    return "no GPU" if gpu.startswith("none") else gpu


def headline_metric(name: str, site: Site = SITE) -> str | None:
    """The metric a benchmark's module names as its headline (`HEADLINE = "metric"` at
    module level, read from the source), or None: the page then shows the first one."""
    module = site.modules / f"{name}.py"
    if not module.is_file():
        return None
    for node in ast.parse(module.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "HEADLINE" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def goal(name: str, results: list[Mapping[str, Any]], site: Site = SITE) -> str:
    """What a benchmark asks: its module's title now (a benchmark gone from the suite:
    its newest result's title)."""
    module = site.modules / f"{name}.py"
    if module.is_file():
        return title(ast.get_docstring(ast.parse(module.read_text())), name)
    return str(max(results, key=lambda r: str(r["date"]))["title"])


def by_benchmark(results: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The results of each benchmark, newest first; the benchmarks by name."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        out.setdefault(str(r["name"]), []).append(r)
    return {
        k: sorted(v, key=lambda r: str(r["date"]), reverse=True) for k, v in sorted(out.items())
    }


def page(name: str, results: list[Mapping[str, Any]], kept: str = "", site: Site = SITE) -> str:
    """A benchmark's own page: the generated part, then `kept` (what followed it by hand)."""
    what = goal(name, results, site)
    lines = [
        f"# {name}",
        "",
        what,
        "",
        f"Run it as `python -m benchmarks.{name}` (`--sim` on the simulated GPU, `--quick`",
        "for smaller sizes); each section below is one file of `benchmarks/results/`, newest",
        "first. Back to [all the benchmark figures](../benchmarks.md).",
        "",
        BEGIN,
    ]
    for result in results:
        lines += section(result, what)
    text = "\n".join([*lines, END]) + "\n"
    return text + (kept if kept.strip() else "")


def _headline_value(result: Mapping[str, Any], prefer: str | None = None) -> str:
    """One metric of a result: `prefer` where it has it, else the first it kept."""
    metrics = result.get("metrics") or {}
    if not metrics:
        return "tables only (no metric kept)"
    k = prefer if prefer in metrics else next(iter(metrics))
    v = metrics[k]
    value = 0.0 if abs(v["value"]) < 5e-5 else v["value"]  # a float's dust reads as 0
    return f"{k} = {value:.4g} {v['unit']}".strip()


def headline(grouped: Mapping[str, list[Mapping[str, Any]]], site: Site = SITE) -> str:
    """The headline page: each benchmark's goal, the latest value per kind of machine (a
    GPU, the simulated one), and a link to its page."""
    lines = [HEADLINE_INTRO]
    for group, names in grouped_names(grouped):
        if group is not None:
            lines += [f"## {group.title}", "", group.asks, ""]
        elif len(lines) > 1:
            lines += ["## Other", ""]
        lines += _headline_entries({n: grouped[n] for n in names}, site)
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _headline_entries(grouped: Mapping[str, list[Mapping[str, Any]]], site: Site) -> list[str]:
    """Each benchmark's line on the headline page, and one line per kind of machine."""
    lines: list[str] = []
    for name, results in grouped.items():
        lines.append(f"- [**{name}**](benchmarks/{name}.md): {goal(name, results, site)}")
        prefer = headline_metric(name, site)
        seen: set[str] = set()
        for r in results:  # newest first: the latest of each machine
            machine = _machine(r)
            if machine in seen:
                continue
            seen.add(machine)
            anchor = _anchor(f"{_key(r)}: {machine}, {_when(r)[:10]}")
            lines.append(
                f"    - [{machine}, {_when(r)[:10]}](benchmarks/{name}.md#{anchor}): "
                f"{_headline_value(r, prefer)}"
            )
    return lines


def _anchor(heading: str) -> str:
    """The id mkdocs' toc gives a heading (its default slugify: lower case, words joined
    by '-', punctuation dropped)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def nav(grouped: Mapping[str, list[Mapping[str, Any]]], indent: str) -> list[str]:
    """mkdocs.yml's nav lines for the benchmark pages: a section per group, then the
    benchmarks in no group."""
    out = []
    for group, names in grouped_names(grouped):
        inner = indent
        if group is not None:
            out.append(f"{indent}- {group.title}:")
            inner = indent + "    "
        out += [f"{inner}- {name}: benchmarks/{name}.md" for name in names]
    return out


def _kept_tail(text: str) -> str:
    """What follows a page's generated section (hand-typed notes): kept as it is."""
    return text.split(END, 1)[1].lstrip("\n") if END in text else ""


def _with_nav(mkdocs: str, grouped: Mapping[str, list[Mapping[str, Any]]]) -> str:
    lines = mkdocs.split("\n")
    try:
        start = next(k for k, line in enumerate(lines) if line.strip() == NAV_BEGIN)
        end = next(k for k, line in enumerate(lines) if line.strip() == NAV_END)
    except StopIteration:
        raise StaleError(f"mkdocs.yml has no '{NAV_BEGIN}' ... '{NAV_END}' lines") from None
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    return "\n".join([*lines[: start + 1], *nav(grouped, indent), *lines[end:]])


def render(results: Iterable[Mapping[str, Any]], site: Site = SITE) -> dict[Path, str]:
    """Every generated file's text, by path (pages of benchmarks with no results left: "")."""
    grouped = by_benchmark(results)
    out: dict[Path, str] = {site.headline: headline(grouped, site)}
    for name, rs in grouped.items():
        path = site.pages / f"{name}.md"
        old = path.read_text() if path.is_file() else ""
        out[path] = page(name, rs, _kept_tail(old), site)
    for path in sorted(site.pages.glob("*.md")) if site.pages.is_dir() else []:
        if path not in out and BEGIN in path.read_text():
            out[path] = ""  # a generated page whose results are gone
    out[site.mkdocs] = _with_nav(site.mkdocs.read_text(), grouped)
    return out


def _current(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def write(site: Site = SITE, directory: Path = RESULTS) -> list[Path]:
    """Regenerate the pages and the nav; the files that changed."""
    changed = []
    for path, text in render(load_results(directory), site).items():
        if not text:
            if path.is_file():
                path.unlink()
                changed.append(path)
        elif _current(path) != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    return changed


def check(site: Site = SITE, directory: Path = RESULTS) -> None:
    """Raise StaleError when a generated file does not match the results."""
    stale = [
        str(path)
        for path, text in render(load_results(directory), site).items()
        if (_current(path) or "") != text
    ]
    if stale:
        raise StaleError(
            f"stale against {directory}: {', '.join(stale)}: run `python -m benchmarks "
            "report` and commit the pages with the results"
        )
