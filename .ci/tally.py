"""Print one closing line for .ci/run's two pytest stages, read from their JUnit XML files.

A test that stage 1 skipped and stage 2 ran again counts once, with stage 2's outcome.
Usage: python3 .ci/tally.py STAGE1.xml [STAGE2.xml]  (a missing file is a stage not run)
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(path: Path) -> dict[str, str]:
    """Each test case's outcome ('passed', 'failed', 'skipped') by its class and name."""
    if not path.is_file():
        return {}
    out = {}
    for case in ET.parse(path).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[key] = (
            "failed"
            if kinds & {"failure", "error"}
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
    return out


def main(argv: list[str]) -> int:
    merged: dict[str, str] = {}
    for arg in argv:
        merged.update(outcomes(Path(arg)))
    counts = {k: sum(v == k for v in merged.values()) for k in ("passed", "failed", "skipped")}
    print(f"ci: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
