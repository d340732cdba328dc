"""Fuzzing the command line: every command, flag and environment variable, with the
file system failing around it (tests/cli_fuzz_harness.py). Each bad input must end in
a sentence and a documented exit code: no traceback, no GPU setting left changed, no
file left behind. benchmarks/cli_fuzz.py runs the same cases by the thousand."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_fuzz_harness import Case, Workspace, check, generate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    w = Workspace(Path(tmp_path_factory.mktemp("cli-fuzz")))
    w.make_good_run()
    w.prepare()
    yield w


@pytest.mark.filterwarnings("ignore:.*skipped 1 unreadable line")  # the truncated input file
@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_bad_input_in_process_ends_in_a_sentence(ws: Workspace, seed: int) -> None:
    case = generate(random.Random(seed))
    outcome, found = check(ws, case, in_process=True)
    assert not found, f"{case.describe()}: {found}\n{outcome.output[-2000:]}"


# The faults a process needs, each on commands that write (a journal, results, stdout).
PROCESS_CASES = [
    Case(["status", "--json"], {}, "dev_full_stdout"),
    Case(["monitor", "--json", "-n", "2", "-d", "0.01"], {}, "dev_full_stdout"),
    Case(["doctor"], {}, "dev_full_stdout"),
    Case(["compare", "@good", "@good"], {}, "dev_full_stdout"),
    Case(["lock", "--sm", "1350", "--power-limit", "500"], {}, "fsize_limit", 700),
    Case(["lock", "--sm", "1350", "-i", "0,1"], {}, "fsize_limit", 1),
    Case(["run", "--sm", "1350", "--", "true"], {}, "fsize_limit", 300),
    Case(["run", "-o", "out.jsonl", "--", "true"], {}, "fsize_limit", 64),
    Case(["lock", "--sm", "1350"], {}, "unwritable_state"),
    Case(["run", "--sm", "1350", "--", "true"], {}, "unwritable_state"),
    Case(["status"], {}, "unwritable_sim_state"),
    Case(["plot", "@good", "-o", "@nodir"], {}, "none"),
    Case(["plot", "@binary"], {}, "none"),
]


@pytest.mark.parametrize("case", PROCESS_CASES, ids=lambda c: " ".join(c.argv[:3]) + f"-{c.fault}")
def test_file_system_faults_end_in_a_sentence(ws: Workspace, case: Case) -> None:
    outcome, found = check(ws, case, in_process=False)
    assert not found, f"{case.describe()}: {found}\n{outcome.output[-2000:]}"
    assert outcome.code != 0 or case.fault == "none", outcome.output
    assert "gpuenv: error: " in outcome.output
