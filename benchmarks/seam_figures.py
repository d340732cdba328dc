"""Figures for the backend seam (nothing above it knows what GPU it talks to), at two revisions.

    python -m benchmarks.seam_figures [--before REV] [--after REV]

Counts, in the modules above gpuenv/backend/, the tests of a backend's name and
the getattr() reach-arounds (the same AST check as tests/test_backend.py), and
lists the size of every module in gpuenv/backend/ and of doctor, with the
longest function. Reads the files with `git show`, so it needs no checkout of
either revision. Prints markdown for its page, docs/benchmarks/seam_figures.md.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_backend import seam_violations  # noqa: E402  (the one definition of a leak)

from benchmarks import runner  # noqa: E402


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def files(rev: str) -> dict[str, str]:
    names = git("ls-tree", "-r", "--name-only", rev, "gpuenv").split()
    return {n: git("show", f"{rev}:{n}") for n in names if n.endswith(".py")}


def longest_function(source: str) -> tuple[str, int]:
    best = ("-", 0)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
            if n > best[1]:
                best = (node.name, n)
    return best


def figures(rev: str) -> dict[str, object]:
    tree = files(rev)
    leaks = [
        v
        for path, text in tree.items()
        if not path.startswith("gpuenv/backend/")
        for v in seam_violations(text, path)
    ]
    sizes = {
        path: (text.count("\n"), *longest_function(text))
        for path, text in sorted(tree.items())
        if path.startswith("gpuenv/backend/") or path.startswith("gpuenv/doctor")
    }
    return {
        "name_tests": sum("tests a backend's name" in v for v in leaks),
        "reach_arounds": sum("getattr" in v for v in leaks),
        "imports": sum("imports" in v for v in leaks),
        "sizes": sizes,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", default="ee581ef", help="revision before the seam work")
    parser.add_argument("--after", default="HEAD")


def run(args: argparse.Namespace) -> None:
    before, after = figures(args.before), figures(args.after)
    print(f"| above gpuenv/backend/ | before ({args.before}) | after ({args.after}) |")
    print("| --- | ---: | ---: |")
    for key, words in (
        ("name_tests", 'tests of a backend\'s name (`.name == "sim"`...)'),
        ("reach_arounds", '`getattr(backend, "clock"/"run_work"/"_state"...)`'),
        ("imports", "imports of pynvml or of the NVML backend module"),
    ):
        print(f"| {words} | {before[key]} | {after[key]} |")
    print()
    print("| module | lines before | longest function before | lines after | longest after |")
    print("| --- | ---: | --- | ---: | --- |")
    b_sizes, a_sizes = before["sizes"], after["sizes"]
    assert isinstance(b_sizes, dict) and isinstance(a_sizes, dict)
    for path in sorted(set(b_sizes) | set(a_sizes)):
        b, a = b_sizes.get(path), a_sizes.get(path)
        cells = [f"{x[0]} | {x[1]} ({x[2]})" if x else "- | -" for x in (b, a)]
        print(f"| {path.removeprefix('gpuenv/')} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    sys.exit(runner.main("seam_figures", __doc__, add_arguments, run, gpu=False))
