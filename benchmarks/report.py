"""docs/benchmarks.md's generated section, from the results under benchmarks/results/.

The page's part between the markers below is written by `python -m benchmarks report`,
never by hand: one section per results file. The rest of the page (the history typed
from the scripts' output in earlier sessions, on the H100 among others) is kept as it
is: it cannot be measured again here, and nothing in it is regenerated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.runner import RESULTS, ROOT

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- section:generated -->"
END = "<!-- /section:generated -->"
INTRO = """\
## Generated from benchmarks/results (`python -m benchmarks report`)

Each section below is one file of `benchmarks/results/`, written by the command it
names; this part of the page is generated from them (`python -m benchmarks report`
rewrites it; `tests/test_benchmarks.py` fails when it is stale). The sections after it
are the earlier history, typed from the scripts' output by hand: kept as it was measured,
never regenerated."""


class StaleError(Exception):
    """docs/benchmarks.md's generated section does not match the results."""


def load_results(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every results file, by name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


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


def where(result: Mapping[str, Any]) -> str:
    """One line: when, on what, from which commit (or, for figures measured before the
    runner and kept from the hand-typed page, what they were transcribed from)."""
    if result.get("transcribed"):
        return "; ".join(
            [
                result["date"].replace("T", " ").replace("+00:00", " UTC"),
                result["machine"]["text"],
                f"GPU: {result['gpu']}",
                f"kept from {result['transcribed']}",
            ]
        )
    m, c = result["machine"], result["commit"]
    sha = (c.get("sha") or "?")[:7] + (" + changes" if c.get("dirty") else "")
    parts = [
        result["date"].replace("T", " ").replace("+00:00", " UTC"),
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


def section(result: Mapping[str, Any]) -> list[str]:
    """The markdown of one results file."""
    lines = [f"### {result['title']}", "", f"`{result['command']}`: {where(result)}.", ""]
    for block in result["blocks"]:
        if "table" in block:
            t = block["table"]
            lines += [*table_lines(t["columns"], t["rows"], t.get("align")), ""]
        else:  # a report's own lines, as printed (a '#' in them is no heading)
            fence = "`" * max(3, _longest_backticks(block["text"]) + 1)
            lines += [fence + "text", block["text"], fence, ""]
    metrics = result.get("metrics") or {}
    if metrics:
        lines += ["Checked for regressions (`python -m benchmarks check`):", ""]
        rows = [
            [k, f"{v['value']:.6g} {v['unit']}".strip(), v["better"]]
            for k, v in sorted(metrics.items())
        ]
        lines += [*table_lines(["metric", "value", "better"], rows), ""]
    return lines


def generated(results: Iterable[Mapping[str, Any]]) -> str:
    """The generated section, markers included."""
    lines = [BEGIN, INTRO, ""]
    for result in results:
        lines += section(result)
    return "\n".join([*lines, END])


def render_page(page: str, results: Iterable[Mapping[str, Any]]) -> str:
    """`page` with its generated section replaced (put after the title's paragraph the
    first time)."""
    block = generated(results)
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    first = page.find("\n<!-- section:")
    if first < 0:
        return page.rstrip("\n") + "\n\n" + block + "\n"
    return page[: first + 1] + block + "\n\n" + page[first + 1 :]


def write(doc: Path = DOC, directory: Path = RESULTS) -> bool:
    """Regenerate the page; whether it changed."""
    page = doc.read_text()
    new = render_page(page, load_results(directory))
    if new != page:
        doc.write_text(new)
    return new != page


def check(doc: Path = DOC, directory: Path = RESULTS) -> None:
    """Raise StaleError when the page's generated section does not match the results."""
    page = doc.read_text()
    if render_page(page, load_results(directory)) != page:
        raise StaleError(
            f"{doc} is stale against {directory}: run `python -m benchmarks report` and "
            "commit the page with the results"
        )
