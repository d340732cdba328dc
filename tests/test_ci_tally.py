""".ci/tally.py: one closing line for .ci/run's two stages, a test counted once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _xml(path: Path, cases: dict[str, str]) -> Path:
    body = {"passed": "", "skipped": "<skipped/>", "failed": "<failure/>"}
    path.write_text(
        "<testsuites><testsuite>"
        + "".join(
            f'<testcase classname="t" name="{n}">{body[o]}</testcase>' for n, o in cases.items()
        )
        + "</testsuite></testsuites>"
    )
    return path


def _tally(*paths: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ROOT / ".ci" / "tally.py"), *map(str, paths)]
    return subprocess.run(argv, capture_output=True, text=True)


def test_a_test_stage_two_ran_again_counts_once_with_its_new_outcome(tmp_path: Path) -> None:
    one = _xml(tmp_path / "1.xml", {"a": "passed", "b": "skipped", "c": "skipped"})
    two = _xml(tmp_path / "2.xml", {"b": "passed", "c": "skipped"})
    done = _tally(one, two)
    assert (done.returncode, done.stdout) == (0, "ci: 2 passed, 0 failed, 1 skipped\n")
    # no stage 2 (nothing was skipped): stage 1 alone
    assert _tally(one, tmp_path / "none.xml").stdout == "ci: 1 passed, 0 failed, 2 skipped\n"


def test_a_failure_in_either_stage_fails_the_tally(tmp_path: Path) -> None:
    one = _xml(tmp_path / "1.xml", {"a": "passed", "b": "skipped"})
    two = _xml(tmp_path / "2.xml", {"b": "failed"})
    done = _tally(one, two)
    assert (done.returncode, done.stdout) == (1, "ci: 1 passed, 1 failed, 0 skipped\n")
