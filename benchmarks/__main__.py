"""`python -m benchmarks`: the suite's commands.

    python -m benchmarks list                 the benchmarks, and which have kept results
    python -m benchmarks report [--check]     regenerate docs/benchmarks.md, the pages
                                              docs/benchmarks/<name>.md and their nav
                                              (--check: exit 1 if one is stale)
    python -m benchmarks check NEW.json [KEPT.json] [--tolerance 0.10] [--any-gpu]
                                              exit 1 on a regression of a metric against
                                              the kept results (default: benchmarks/
                                              results/<NEW's key>.json: its name, part
                                              and -sim)

A benchmark itself runs as `python -m benchmarks.<name> [--quick] [--sim] [--out PATH]`.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from benchmarks import regress, report
from benchmarks.runner import RESULTS, ROOT, title

# Exit statuses: 0 fine, 1 stale page or regression, 2 input that could not be judged.


def _list() -> int:
    kept = {p.stem for p in RESULTS.glob("*.json")}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        name = path.stem
        if name.startswith("_") or name in ("runner", "report", "regress", "checkout"):
            continue
        doc = title(ast.get_docstring(ast.parse(path.read_text())), name)
        have = sorted(k for k in kept if k == name or k.startswith(name + "-"))
        print(f"{name:<18} {doc}" + (f"  [results: {', '.join(have)}]" if have else ""))
    return 0


def _report(check: bool) -> int:
    if check:
        try:
            report.check()
        except report.StaleError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"{report.DOC}, the benchmark pages and the nav are up to date")
        return 0
    changed = report.write()
    for path in changed:
        print(f"{path.relative_to(ROOT)}: rewritten")
    if not changed:
        print(f"{report.DOC.relative_to(ROOT)} and the benchmark pages: already up to date")
    return 0


def _check(new_path: Path, kept_path: Path | None, tolerance: float, any_gpu: bool) -> int:
    try:
        new = json.loads(new_path.read_text())
        kept_path = kept_path or RESULTS / f"{new.get('key') or new['name']}.json"
        kept = json.loads(kept_path.read_text())
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"cannot read the results to compare: {e}", file=sys.stderr)
        return 2
    verdicts, problems = regress.compare(kept, new, tolerance=tolerance, any_gpu=any_gpu)
    print(f"{new_path} against {kept_path} (tolerance {tolerance:.0%}):")
    for v in verdicts:
        print(v.line())
    for p in problems:
        print(f"  cannot compare: {p}")
    if problems:
        return 2
    return 1 if regress.failed(verdicts, problems) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the benchmarks")
    rep = sub.add_parser("report", help="regenerate the benchmark pages from the results")
    rep.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    chk = sub.add_parser("check", help="a new results file against the kept one")
    chk.add_argument("new", type=Path)
    chk.add_argument("kept", type=Path, nargs="?")
    chk.add_argument("--tolerance", type=float, default=regress.TOLERANCE)
    chk.add_argument("--any-gpu", action="store_true", help="compare results of other GPUs")
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list()
    if args.command == "report":
        return _report(args.check)
    return _check(args.new, args.kept, args.tolerance, args.any_gpu)


if __name__ == "__main__":
    sys.exit(main())
