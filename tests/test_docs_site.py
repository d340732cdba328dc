"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict` (a dead
link or anchor, a page outside the nav, an API name that is gone: each fails it), its CLI
reference names every command, and a newcomer reaches every page within two clicks of the
home page. README.md stays the short door into it, its links all leading somewhere."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SECTIONS = ("tutorials", "how-to", "explanation", "operations", "reference")
# the `docs` extra of pyproject.toml, by the module each installs
SITE_MODULES = (
    "mkdocs",
    "material",
    "mkdocstrings",
    "mkdocstrings_handlers.python",
    "mkdocs_click",
    "ruff",  # the formatter mkdocstrings lays signatures out with
)


def _missing_site_modules() -> list[str]:
    missing = []
    for name in SITE_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package (mkdocstrings_handlers) is absent
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = _missing_site_modules()
    if missing:
        pytest.skip(
            f"the docs extra is not installed ({', '.join(missing)} missing): "
            "pip install -e '.[docs]' to build the site"
        )
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return out


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    # the CLI reference imports gpuenv.cli from this checkout, whatever is installed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "benchmarks" / "index.html").is_file()
    # a page per benchmark, generated with the headline page (python -m benchmarks report)
    assert (site / "benchmarks" / "startup" / "index.html").is_file()
    assert (site / "explanation" / "what-gpus-do" / "index.html").is_file()


def test_the_cli_reference_names_every_command_and_option(site: Path) -> None:
    """Generated from the click commands: each command has its section, with its options."""
    from gpuenv.cli import COMMANDS, cli

    page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f'id="gpuenv-{name}"' in page, f"gpuenv {name} is not in the CLI reference"
    import click

    ctx = click.Context(cli)
    run = cli.get_command(ctx, "run")
    assert run is not None
    for param in run.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.opts[0] in page, f"gpuenv run {param.opts[0]} is not in the reference"


def test_the_api_reference_renders_the_docstrings(site: Path) -> None:
    """mkdocstrings found each name (else the strict build fails) and wrote its docstring."""
    import gpuenv.session
    import gpuenv.timing.harness

    for page, obj in (("session", gpuenv.session.stable), ("timing", gpuenv.timing.harness.bench)):
        html = (site / "reference" / "api" / page / "index.html").read_text(encoding="utf-8")
        # the docstring's first words as plain text (the page marks `code` up)
        words = (obj.__doc__ or "").strip().replace("`", "").split()[:4]
        text = re.sub(r"<[^>]+>", "", html)
        assert words and " ".join(words) in text, f"{obj.__qualname__}'s docstring: {page}"


def test_api_signatures_are_laid_out_one_parameter_a_line(site: Path) -> None:
    """A long signature (gpuenv.bench's) is formatted, not one line of 300 columns: the
    docs extra brings the formatter mkdocstrings uses."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docs = extra["optional-dependencies"]["docs"]
    assert any(d.startswith(("ruff", "black")) for d in docs), "the docs extra has no formatter"
    html = (site / "reference" / "api" / "timing" / "index.html").read_text(encoding="utf-8")
    start = html.index(">", html.index("doc-signature")) + 1
    text = re.sub(r"<[^>]+>", "", html[start : html.index("</pre>", start)])
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].strip() == "bench(" and len(lines) > 10, lines[:3]
    assert max(len(line) for line in lines) <= 88


def _links(md: Path) -> set[Path]:
    """The pages a markdown page links to (relative .md links, anchors dropped)."""
    text = md.read_text(encoding="utf-8")
    out = set()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path = target.split("#", 1)[0]
        if path and "://" not in path and path.endswith(".md"):
            out.add((md.parent / path).resolve())
    return out


def test_every_page_is_within_two_clicks_of_the_home_page() -> None:
    """Home links each section's index; each index links every page of its section."""
    home = _links(DOCS / "index.md")
    for section in SECTIONS:
        index = (DOCS / section / "index.md").resolve()
        assert index in home, f"the home page does not link {section}/index.md"
        linked = _links(index)
        for page in sorted((DOCS / section).rglob("*.md")):
            if page.resolve() != index:
                assert page.resolve() in linked, (
                    f"{page.relative_to(ROOT)} is not linked from {section}/index.md"
                )


def test_the_readme_links_lead_somewhere() -> None:
    """README.md is read on GitHub and PyPI, outside the site: each relative link is a file."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert any(t.startswith("docs/") for t in targets), "the README links the docs"
    for target in targets:
        path = target.split("#", 1)[0]
        if path and "://" not in path:
            assert (ROOT / path).exists(), f"README.md links {target}: no such file"


def test_the_readme_stays_the_door() -> None:
    """Two screens: what gpuenv is, the quick start's two commands, a picture and links. A
    section of manual added to it belongs on a page of the site (docs/development.md, "The
    documentation site", says which)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 80, "README.md grew past two screens: move it to docs/"
    assert re.findall(r"(?m)^#{2,} (.+)$", readme) == ["Quick start", "Documentation"]
    for command in ("pip install -e . && gpuenv demo", "pip install -e '.[dev]' && pytest"):
        assert command in readme, f"the quick start lost `{command}`"
    assert re.search(r"!\[[^\]]+\]\(docs/[^)]+\.png\)", readme), "the README shows a picture"


# Pages a user reads: README.md and docs/, but the ones for whoever changes gpuenv. A
# benchmark page's generated section quotes its kept results as they were written (they may
# name an issue); its header and the notes after it are the page's own words.
NOT_USER_PAGES = ("development.md", "ARCHITECTURE.md")
# the project's own words for what a reader calls "an H100 we measured on" and "every way
# of measuring" (gpuenv.bench, stable(), the do_bench drop-in, gpuenv run, pytest, Timer)
JARGON = re.compile(r"\b(lent|doors?)\b", re.IGNORECASE)
# "#21" or "issue 11"; not gpuenv's own name of a site's second call ("bench.py:44 #2: ...")
ISSUE_REF = re.compile(r"\b[Ii]ssues?\s+(#?\d+|\")|(?<![\w`#&])#\d+\b(?![`\w:])")


def _user_text(md: Path) -> str:
    text = md.read_text(encoding="utf-8")
    if md.parent == DOCS / "benchmarks":
        from benchmarks import report

        head, _, rest = text.partition(report.BEGIN)
        return head + rest.partition(report.END)[2]  # not the results, quoted as kept
    return text


def user_pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [
        p
        for p in pages
        if str(p.relative_to(DOCS) if DOCS in p.parents else "") not in NOT_USER_PAGES
    ]


def test_user_pages_name_no_issue_numbers():
    """A reader does not have the issue tracker: "(issue 11)" or "#21" tells them nothing.
    A generated benchmark heading takes its words from the benchmark's title: fix it there."""
    found = []
    for page in user_pages():
        for k, line in enumerate(_user_text(page).splitlines(), start=1):
            if ISSUE_REF.search(line):
                found.append(f"{page.relative_to(ROOT)}:{k}: {line.strip()[:100]}")
    assert not found, "issue numbers in user pages:\n" + "\n".join(found)


def test_user_pages_use_no_jargon():
    """'The lent H100' and 'every door' are words of the people who build gpuenv; a reader
    reads 'an H100 we measured on' and 'every way of measuring' or 'entry point'."""
    found = []
    for page in user_pages():
        for k, line in enumerate(_user_text(page).splitlines(), start=1):
            if JARGON.search(line):
                found.append(f"{page.relative_to(ROOT)}:{k}: {line.strip()[:100]}")
    assert not found, "project jargon in user pages:\n" + "\n".join(found)
    assert JARGON.search("the lent H100") and JARGON.search("Every door takes")
    assert not JARGON.search("a lentil, doorstep, indoors")


PROSE_WORDS_MAX = 160  # a paragraph or a bullet a reader takes in one go (~150 words)


def prose_blocks(text: str) -> list[str]:
    """The paragraphs and list items of a markdown text: not its fenced blocks (three
    backticks or more, nested ones included), tables, headings or comments."""
    blocks: list[str] = []
    cur: list[str] = []
    fence = ""
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"(`{3,}|~{3,})", s)
        if fence:
            if (
                m
                and m.group(1)[0] == fence[0]
                and len(m.group(1)) >= len(fence)
                and s == m.group(1)
            ):
                fence = ""
            continue
        if m:
            fence = m.group(1)
        if m or not s or s[0] in "#|<" or line.startswith("    "):
            if cur:
                blocks.append(" ".join(cur))
                cur = []
            continue
        if re.match(r"\s*([-*+]|\d+\.)\s", line) and cur:
            blocks.append(" ".join(cur))
            cur = []
        cur.append(s)
    if cur:
        blocks.append(" ".join(cur))
    return blocks


def test_no_paragraph_or_bullet_runs_past_a_reader():
    """A 573-word paragraph is not read; a page says it in pieces of ~150 words at most."""
    found = []
    for page in user_pages():
        for block in prose_blocks(_user_text(page)):
            n = len(block.split())
            if n > PROSE_WORDS_MAX:
                found.append(f"{page.relative_to(ROOT)}: {n} words: {block[:80]}")
    assert not found, "paragraphs over ~150 words:\n" + "\n".join(found)


def test_the_paragraph_reader_skips_code_and_splits_bullets():
    text = "a b\nc\n\n````text\n```\nx y z\n```\n````\n- one two\n- three\n| t |\n"
    assert prose_blocks(text) == ["a b c", "- one two", "- three"]


def test_the_issue_pattern_finds_what_it_should():
    for text in ("(issue 11)", "Issue 21's attacks", "issues 18 and 22", "see #12", 'issue "x"'):
        assert ISSUE_REF.search(text), text
    for text in ("gets `#1`, `#2`", "bench.py:10 #4`", "an issue with", "&#8203;", "1 #"):
        assert not ISSUE_REF.search(text), text


def test_the_code_and_docs_cite_only_files_of_the_repository():
    """Facts about GPUs are cited from docs/explanation/what-gpus-do.md, a page of this
    repository; a docs/... path named in the code is a file that exists."""
    outside = "GPU_" + "FACTS"  # a steering file outside the repository
    missing, cited = [], []
    sources = [
        p
        for top in ("gpuenv", "benchmarks", "tests", "scripts")
        for p in sorted((ROOT / top).rglob("*.py"))
    ]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if outside in text:
            cited.append(str(path.relative_to(ROOT)))
        for target in re.findall(r"\bdocs/[\w./-]+\.md\b", text):
            if not (ROOT / target).exists():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
    for page in user_pages():
        if outside in _user_text(page):
            cited.append(str(page.relative_to(ROOT)))
    assert not cited, f"cite docs/explanation/what-gpus-do.md instead: {cited}"
    assert not missing, "the code names docs pages that do not exist:\n" + "\n".join(missing)
    assert "docs/explanation/what-gpus-do.md" in (ROOT / "gpuenv/backend/nvml.py").read_text()


PAGE_COLUMNS = 88  # what a page shows of a code block without a scrollbar
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def _fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, first body line number, body lines) of each fenced block."""
    out, lines, k = [], text.split("\n"), 0
    while k < len(lines):
        m = FENCE.match(lines[k].strip())
        if not m:
            k += 1
            continue
        fence, lang, start, body = m.group(1), m.group(2), k + 2, []
        k += 1
        while k < len(lines) and not re.fullmatch(
            re.escape(fence[0]) + f"{{{len(fence)},}}", lines[k].strip()
        ):
            body.append(lines[k])
            k += 1
        out.append((lang, start, body))
        k += 1
    return out


def _copied_lines(lang: str, body: list[str]) -> list[tuple[int, str]]:
    """The lines of a block a reader copies: all of a code block; of a console block its
    `$ ` commands and their `\\` continuations; of a pycon block its `>>> `/`... ` lines.
    Output (a text block, the other lines of console and pycon) is quoted as the program
    printed it, fitted with `...` (the test below); the site wraps any that is not
    (docs/stylesheets/extra.css)."""
    if lang == "text":
        return []
    out, going_on = [], False
    for k, line in enumerate(body):
        if lang == "console":
            if line.startswith("$ ") or going_on:
                out.append((k, line))
            going_on = (line.startswith("$ ") or going_on) and line.endswith("\\")
        elif lang == "pycon":
            if line.startswith((">>>", "...")):
                out.append((k, line))
        else:
            out.append((k, line))
    return out


def test_code_a_reader_copies_fits_the_page():
    """Every command and line of code in README.md and docs/ fits 88 columns: a longer one
    hides its end behind a scrollbar (continue a command with `\\`, put a comment on its
    own line). Output blocks are exempt: they quote what gpuenv printed, and wrap."""
    from gpuenv.table import display_width

    wide = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for lang, start, body in _fenced_blocks(page.read_text(encoding="utf-8")):
            for k, line in _copied_lines(lang, body):
                if display_width(line) > PAGE_COLUMNS:
                    wide.append(f"{page.relative_to(ROOT)}:{start + k}: {line[:70]}...")
    assert not wide, f"{len(wide)} lines wider than {PAGE_COLUMNS} columns:\n" + "\n".join(wide)


def test_every_code_block_fits_the_page():
    """Output too fits 88 columns, tables and the blocks the docs harness compares with the
    tool's output included: a page quotes what a reader needs and marks what it leaves out
    with `...` (a column dropped, a line's tail: tests/docs_harness.py reads `...` as any
    text), and a long line of prose output wraps where the page quotes it (the benchmark
    pages wrap a report's lines when generated; the demo wraps its explanations at 88)."""
    from gpuenv.table import display_width

    wide = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for _, start, body in _fenced_blocks(page.read_text(encoding="utf-8")):
            for k, line in enumerate(body):
                if display_width(line) > PAGE_COLUMNS:
                    wide.append(f"{page.relative_to(ROOT)}:{start + k}: {line[:70]}...")
    assert not wide, f"{len(wide)} lines wider than {PAGE_COLUMNS} columns:\n" + "\n".join(wide)


def test_the_width_check_reads_commands_code_and_output_apart():
    console = ["$ gpuenv --sim status \\", "    --query-gpu=" + "x" * 90, "y" * 100, "$ ok"]
    assert [k for k, _ in _copied_lines("console", console)] == [0, 1, 3]
    assert [k for k, _ in _copied_lines("pycon", [">>> f()", "z" * 100, "... g"])] == [0, 2]
    assert _copied_lines("text", ["w" * 200]) == []
    assert len(_copied_lines("python", ["a", "# b"])) == 2
    blocks = _fenced_blocks("x\n```bash\nls\n```\n````text\n```\ninner\n```\n````\n")
    assert blocks == [("bash", 3, ["ls"]), ("text", 6, ["```", "inner", "```"])]
    css = (DOCS / "stylesheets" / "extra.css").read_text()
    assert "pre-wrap" in css and ".language-text" in css and ".language-console" in css
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert "stylesheets/extra.css" in mkdocs and "pygments_lang_class: true" in mkdocs


def test_every_benchmark_page_is_in_a_group_a_reader_asks_by():
    """The nav and docs/benchmarks.md list the benchmark pages under accuracy, speed, scale
    and reliability (benchmarks/report.py's GROUPS), not by module name: a new benchmark
    with kept results takes a group there, and a group names only benchmarks that exist."""
    from benchmarks import report

    kept = set(report.by_benchmark(report.load_results()))
    grouped = [name for group in report.GROUPS for name in group.names]
    assert len(grouped) == len(set(grouped)), "a benchmark is in two groups"
    assert not kept - set(grouped), f"give these a group in report.GROUPS: {kept - set(grouped)}"
    assert not set(grouped) - kept, f"groups name benchmarks with no results: {set(grouped) - kept}"
    headings = re.findall(r"(?m)^## (\w+)$", report.DOC.read_text(encoding="utf-8"))
    assert headings == [g.title for g in report.GROUPS]
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for group in report.GROUPS:
        assert f"- {group.title}:\n" in nav, f"mkdocs.yml's nav lacks the {group.title} group"
