"""Every fenced code block of README.md and docs/**/*.md runs on the simulated GPU as a user
would run it, in order, file by file, or is marked with why not (issue 23 item 6, issue 20's
"every code block that can run is run by a test"). The conventions are in
tests/docs_harness.py's docstring; the README keeps them under "Examples in these docs".
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import docs_harness as dx
import pytest

FILES = dx.markdown_files()


def _ids(path: Path) -> str:
    return str(path.relative_to(dx.ROOT))


def test_every_block_is_run_output_a_file_or_marked_with_a_reason() -> None:
    errors, counts = [], dx.tally([])
    for path in FILES:
        for block in dx.blocks(path):
            try:
                counts += dx.tally([block])
            except dx.ConventionError as err:
                errors.append(str(err))
    assert not errors, "\n".join(errors)
    assert counts["run"] > 0  # the docs have examples, and they are found


@pytest.mark.parametrize("path", FILES, ids=_ids)
def test_the_examples_run_on_the_simulated_gpu(path: Path) -> None:
    result = dx.run_file(path)
    assert not result.failures, "\n".join(str(f) for f in result.failures)
    if result.skipped:
        pytest.skip(f"the other blocks ran; not run here: {'; '.join(result.skipped)}")


# -- the harness itself, on markdown written here ---------------------------------------------


def _md(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_a_block_in_no_convention_or_with_an_empty_reason_is_refused(tmp_path: Path) -> None:
    page = _md(
        tmp_path,
        "```\nbare\n```\n\n```yaml\na: 1\n```\n\n<!-- not run: -->\n```bash\n"
        "x\n```\n<!-- not run: needs Slurm -->\n```yaml\nb: 2\n```\n"
        "    ```text\n    indented output\n    ```\n",
    )
    found = dx.blocks(page, tmp_path)
    assert [(b.line, b.lang) for b in found] == [
        (1, ""),
        (5, "yaml"),
        (10, "bash"),
        (14, "yaml"),
        (17, "text"),
    ]
    for bad in found[:3]:
        with pytest.raises(dx.ConventionError, match=rf"^page.md:{bad.line}: "):
            bad.kind()
    assert dx.tally(found[3:]) == {"not run: needs Slurm": 1, "output": 1}
    assert found[4].text == "indented output\n"
    with pytest.raises(dx.ConventionError, match="never closed"):
        dx.blocks(_md(tmp_path, "```python\nprint(1)\n"), tmp_path)


def test_console_commands_their_continuations_and_the_failures_they_show() -> None:
    block = dx.Block("p.md", 1, "console", "$ a \\\n  --b\nout\n$ c\ngpuenv: error: no\n$ d\n")
    assert dx.commands(block) == [
        dx.Command("a \\\n  --b"),
        dx.Command("c", fails=True),
        dx.Command("d"),
    ]
    shown = dx.Block("p.md", 1, "console", '$ x; echo "exit $?"\nexit 1\n$ y\nexit 2\n')
    assert dx.commands(shown) == [
        dx.Command('x; echo "exit $?"', exit_line="exit 1"),
        dx.Command("y"),
    ]
    # a continued command is one command to bash, as a reader's shell runs it
    cont = dx.Block("p.md", 1, "bash", "echo a \\\n    b\n")
    (joined,) = dx.commands(cont)
    done = subprocess.run(["bash", "-c", joined.text], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "a b\n")
    bash = dx.Block("p.md", 1, "bash", "# a comment\nx && y   # why\n\nz\n")
    assert [c.text for c in dx.commands(bash)] == ["x && y   # why", "z"]
    pycon = dx.Block("p.md", 1, "pycon", ">>> def f():\n...     return 1\n...\n>>> f()\n1\n")
    assert dx.python_source(pycon) == "def f():\n    return 1\n\nf()\n"


def test_each_failure_names_its_line_and_a_file_block_is_there_for_the_next(
    tmp_path: Path,
) -> None:
    page = _md(
        tmp_path,
        (
            "<!-- file: hello.py -->\n```python\nprint('hi')\n```\n"  # 2: written, not run
            "```console\n$ python hello.py\nhi\n```\n"  # 5: runs it
            "```console\n$ python -c 'raise SystemExit(3)'\n```\n"  # 9: exits 3
            "```console\n$ true\ngpuenv: error: shown failing\n```\n"  # 12: should fail
            "```python\nraise ValueError('boom')\n```\n"  # 16: traceback
            "```console\n$ sleep 30 > /dev/null 2>&1 &\n```\n"  # 19: leaves a process
            '```console\n$ (exit 2); echo "exit $?"\nexit 1\n```\n'  # 22: not the exit shown
        ),
    )
    result = dx.run_file(page, tmp_path)
    where = [f.where for f in result.failures]
    assert where == ["page.md:9", "page.md:12", "page.md:16", "page.md:19", "page.md:22"], (
        result.failures
    )
    assert "exited 3" in result.failures[0].what
    assert "should fail" in result.failures[1].what
    assert "ValueError: boom" in result.failures[2].what
    assert "left running: " in result.failures[3].what and "sleep 30" in result.failures[3].what
    assert "should print `exit 1` as shown" in result.failures[4].what


def test_a_lock_an_example_leaves_fails_its_file_and_each_file_starts_fresh(
    tmp_path: Path,
) -> None:
    page = _md(
        tmp_path,
        "As root:\n\n<!-- as root: locks -->\n```console\n$ gpuenv --sim lock --sm 1350\n```\n",
    )
    first = dx.run_file(page, tmp_path)
    assert len(first.failures) == 1 and "left a lock" in first.failures[0].what, first.failures
    # a fresh state dir: the lock above is gone, so the same file fails the same way again
    again = dx.run_file(page, tmp_path)
    assert [f.what for f in again.failures] == [f.what for f in first.failures]


def test_a_block_that_needs_a_missing_module_is_skipped_by_name(tmp_path: Path) -> None:
    # the README's test command runs on a machine with nothing else installed: a block that
    # needs torch is not run there (and its file's test skips naming it), where it runs
    page = _md(
        tmp_path,
        "<!-- needs: no_such_module_gpuenv -->\n```python\nraise SystemExit(4)\n```\n"
        "<!-- needs: json, no_such_module_gpuenv -->\n```console\n$ false\n```\n"
        "<!-- needs: json -->\n```python\nimport json\nraise SystemExit(5)\n```\n"
        "<!-- needs: -->\n```python\nprint(1)\n```\n",
    )
    result = dx.run_file(page, tmp_path)
    assert [f.where for f in result.failures] == ["page.md:10", "page.md:15"], result.failures
    assert "exited 5" in result.failures[0].what
    assert "write `<!-- needs: MODULE -->`" in result.failures[1].what
    assert result.skipped == [
        "page.md:2 (needs no_such_module_gpuenv)",
        "page.md:6 (needs no_such_module_gpuenv)",
    ]


def test_a_block_gets_the_simulated_gpu_only_as_its_page_shows_it(tmp_path: Path) -> None:
    # a reader's shell has no GPUENV_BACKEND: a page that does not say `--sim` or export it
    # fails here as it fails for the reader; an `export` line carries to the later blocks
    page = _md(
        tmp_path,
        "```python\nimport os\nassert 'GPUENV_BACKEND' not in os.environ\n```\n"  # 1: passes
        "```console\n$ gpuenv status\n```\n"  # 5: no GPU, no --sim: fails
        "```console\n$ gpuenv --sim status\n$ export GPUENV_BACKEND=sim X=1\n```\n"  # 8
        "```python\nimport gpuenv.backend as b\nb.open_backend().device_info(0)\n```\n"  # 12
        '```bash\ntest "$GPUENV_BACKEND$X" = sim1\n```\n',  # 16
    )
    result = dx.run_file(page, tmp_path)
    assert [f.where for f in result.failures] == ["page.md:5"], result.failures
    assert dx.exported("export A=1 B='two words'  # why") == {"A": "1", "B": "two words"}
    assert dx.exported("export A=1 && rm -rf x") == {}
    assert dx.exported("echo export A=1") == {}


def test_shown_output_is_compared_words_exactly_and_numbers_within_a_named_tolerance() -> None:
    exact, loose = dx.TOLERANCES["exact"], dx.TOLERANCES["run-to-run"]
    printed = "step    20    med 30.05 ms  1350    519 W\n  step: slower 9.5% (p=1.6e-06)\n"
    assert (
        dx.drift(
            "step 20 med 30.05 ms 1350 519 W\n  step: slower 9.5% (p=1.6e-06)\n", printed, exact
        )
        is None
    )  # (a column's spaces may move)
    shown = "step    20    med 29.99 ms  1350    519 W\n  step: slower 9.6% (p=8.2e-07)\n"
    assert "shows 29.99 where it printed 30.05" in (dx.drift(shown, printed, exact) or "")
    assert dx.drift(shown, printed, loose) is None
    words = shown.replace("slower", "faster")
    assert "-  step: faster" in (dx.drift(words, printed, loose) or "")
    assert "+  step: slower" in (dx.drift(words, printed, loose) or "")
    # `...` elides lines (a line of its own) or text (within a line)
    assert dx.drift("...\n  step: slower ... (p=...)\n", printed, exact) is None
    assert dx.drift("step ...\n", printed, exact) is not None  # (a line, not two)
    assert dx.drift("", "", exact) is None and dx.drift("", "x\n", exact) is not None


def test_a_marked_block_is_checked_against_what_its_command_printed(tmp_path: Path) -> None:
    page = _md(
        tmp_path,
        (
            "```console\n$ echo 'took 10.0 ms'\n```\n"  # 1
            "<!-- output: run-to-run -->\n```text\ntook 12 ms\n```\n"  # 5: within 2x
            "<!-- output: exact -->\n```text\ntook 12 ms\n```\n"  # 9: drift
            "```python\nprint('a'); print('b 3')\n```\n"  # 12
            "<!-- output: exact -->\n```text\na\nb 3\n```\n"  # 16
            "<!-- output: exact -->\n```console\n$ echo one\none\n$ echo two\nthree\n"
            "$ echo four\n```\n"  # 21: the second command's output drifted; the third shows none
            "<!-- output: exact -->\n```pycon\n>>> print(1 + 1)\n2\n>>> x = 3\n>>> x * 2\n7\n"
            ">>> 'ok'\n'ok'\n```\n"  # 29: 6 is not 7
            "<!-- output: bold -->\n```text\nx\n```\n"  # 39: no such tolerance
        ),
    )
    result = dx.run_file(page, tmp_path)
    assert [f.where for f in result.failures] == [
        "page.md:9",
        "page.md:21",
        "page.md:29",
        "page.md:39",
    ], result.failures
    assert "shows 12 where it printed 10" in result.failures[0].what
    assert "`echo two`" in result.failures[1].what and "+two" in result.failures[1].what
    assert "shows 7 where it printed 6" in result.failures[2].what
    assert "names no tolerance: use one of exact, run-to-run" in result.failures[3].what
