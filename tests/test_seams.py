"""The joints between the doors are typed: renaming a member the harness uses on the
session, the sampler or a held lock is a mypy error, not a probe that silently stops; and
a word of a vocabulary (a finding kind, a verdict) misspelt where it is used is one too.

mypy checks `gpuenv/` as a whole in CI; here it checks copies of the modules that
implement a joint with one member renamed, beside unchanged copies (the control): the
renamed copy must fail where the implementation is handed to its user, the unchanged
copy must pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gpuenv
from gpuenv.locking import HeldLock
from gpuenv.seams import BenchSession
from gpuenv.telemetry import SampleFeed, SampleSource

api = pytest.importorskip("mypy.api", reason="needs mypy (the dev extra)")

PACKAGE = Path(gpuenv.__file__).parent
ROOT = PACKAGE.parent


def _mypy(*files: Path) -> str:
    out, err, _ = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            "--hide-error-context",
            *map(str, files),
        ]
    )
    return out + err


def _copy(module: str, dest: Path, rename: tuple[str, str] | None = None) -> Path:
    text = (PACKAGE / module).read_text()
    if rename is not None:
        old, new = rename
        text, n = re.subn(rf"\bdef {old}\(", f"def {new}(", text)
        assert n == 1, f"{module} defines {old} {n} times"
    dest.write_text(text)
    return dest


@pytest.mark.slow
def test_renaming_a_member_of_a_joint_fails_mypy(tmp_path):
    control = _copy("session.py", tmp_path / "session_as_is.py")
    session = _copy("session.py", tmp_path / "session_renamed.py", ("work_ended", "work_done"))
    sampler = _copy("telemetry/sampler.py", tmp_path / "sampler_renamed.py", ("latest", "newest"))
    lock = _copy("locking.py", tmp_path / "locking_renamed.py", ("holds", "holding"))
    out = _mypy(control, session, sampler, lock)
    assert control.name not in out, out
    # Session.bench hands the session to gpuenv.bench: no longer a BenchSession
    assert re.search(rf"{session.name}:\d+: error: .*BenchSession", out), out
    # the check under TYPE_CHECKING at the end of sampler.py: no longer a SampleSource
    assert re.search(rf"{sampler.name}:\d+: error: .*SampleSource", out), out
    # acquire returns a HeldLock: a gpuenv.clocks.Lock is none without `holding`
    assert re.search(rf"{lock.name}:\d+: error: .*HeldLock", out), out


@pytest.mark.slow
def test_renaming_what_the_harness_reads_of_a_device_fails_mypy(tmp_path):
    # the harness once probed these with getattr and a default: a renamed flush_l2 or
    # batch silently changed extra["l2"] and the tiny-call finding
    devices = (PACKAGE / "timing" / "devices.py").read_text()
    control = tmp_path / "devices_as_is.py"
    control.write_text(devices)
    renamed = tmp_path / "devices_renamed.py"
    text, n = re.subn(r"\bself\.flush_l2: ", "self.flushed_l2: ", devices)
    assert n == 1, "BackToBack sets flush_l2 once"
    renamed.write_text(text)
    out = _mypy(control, renamed)
    assert control.name not in out, out
    assert re.search(rf"{renamed.name}:\d+: error: .*Device", out), out


VOCABULARY_USE = """\
from gpuenv.results import Measurement
from gpuenv.verdict import Finding


def capped(m: Measurement) -> list[Finding]:
    if m.verdict == "rejected":  # verdict compared
        return []
    found = [f for f in m.findings if f.kind == "power_cap"]  # kind compared
    return [*found, Finding("thermal", "warning", (0,), "hot")]  # kind made
"""


@pytest.mark.slow
def test_a_misspelt_word_of_a_vocabulary_fails_mypy_where_it_is_used(tmp_path):
    # finding kinds and verdicts are Literal types (gpuenv/verdict/records.py): outside
    # the strict core too, a typo where one is made or compared is an error, not a new
    # kind nobody reports or a branch never taken
    control = tmp_path / "vocabulary_as_is.py"
    control.write_text(VOCABULARY_USE)
    typo = tmp_path / "vocabulary_misspelt.py"
    text = VOCABULARY_USE
    for word, wrong in (
        ("rejected", "rejectd"),
        ("power_cap", "powr_cap"),
        ("thermal", "thermall"),
    ):
        text = text.replace(f'"{word}"', f'"{wrong}"')
    typo.write_text(text)
    out = _mypy(control, typo)
    assert control.name not in out, out
    lines = text.splitlines()
    for where, code in (
        ("verdict compared", "comparison-overlap"),
        ("kind compared", "comparison-overlap"),
        ("kind made", "arg-type"),
    ):
        n = next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {where}"))
        assert re.search(rf"{typo.name}:{n}: error: .*\[{code}\]", out), (where, out)


def test_the_joints_are_protocols_in_the_layers_below_their_users():
    for proto in (BenchSession, SampleSource, SampleFeed, HeldLock):
        assert getattr(proto, "_is_protocol", False), proto
    assert BenchSession.__module__ == "gpuenv.seams"
    assert SampleSource.__module__ == SampleFeed.__module__ == "gpuenv.telemetry.source"
