"""The `gpuenv` command as a whole: help, one-line errors with exit code 2, and start-up
that never imports torch (checked in a fresh interpreter, with a stand-in `torch`
package that records being imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def test_help_lists_the_commands() -> None:
    result = run_cli("--help")
    assert result.exit_code == 0
    for name in ("status", "doctor", "demo"):
        assert name in result.output
        assert COMMANDS[name][2] in result.output  # the one-line help from the table


def test_each_command_of_mine_has_help() -> None:
    for name in ("status", "doctor", "demo"):
        result = run_cli(name, "--help")
        assert result.exit_code == 0, result.output
        assert "-i, --gpu SEL" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = run_cli("frobnicate")
    assert result.exit_code == 2
    assert "No such command" in result.output


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (("status",), {"GPUENV_BACKEND": "tpu"}, "unknown backend 'tpu'"),
        (("--sim", "status"), {"GPUENV_SIM_GPUS": "many"}, "GPUENV_SIM_GPUS='many'"),
        (("--sim", "status", "-i", "local"), {}, "LOCAL_RANK"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    args: tuple[str, ...], env: dict[str, str], needle: str
) -> None:
    result = run_cli(*args, env=env)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("gpuenv: error: ") and needle in lines[0]
    assert ": " in lines[0][len("gpuenv: error: ") :]  # ...and says what to do


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--sim", "status", "-i", "7"), "no GPU matches '7'"),
        (("--sim", "status", "--id=7"), "no GPU matches '7'"),
        (("--sim", "doctor", "-i", "GPU-nope"), "no GPU matches 'GPU-nope'"),
    ],
)
def test_a_gpu_that_is_not_there_exits_6_as_nvidia_smi(args: tuple[str, ...], needle: str) -> None:
    result = run_cli(*args)
    assert result.exit_code == 6, result.output  # nvidia-smi: "GPU not found"
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output


# -- start-up imports, in a fresh interpreter --------------------------------------------

_PROBE = """
import json, sys
sys.argv = ["gpuenv", *json.loads(sys.argv[1])]
code = 0
if sys.argv[1:] == ["--import-only"]:
    import gpuenv
else:
    from gpuenv.cli import main
    try:
        main()
    except SystemExit as exc:
        code = exc.code or 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nvitop", "pynvml", "click"))
with open(__import__("os").environ["PROBE_OUT"], "w") as f:
    json.dump({"code": code, "modules": heavy}, f)
"""


@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    """A `torch` that leaves a mark when imported, first on the path (torch may be absent)."""
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\nopen(os.environ['TORCH_MARK'], 'w').write('imported')\n"
    )
    return tmp_path


def probe(tmp: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    out = tmp / "probe.json"
    mark = tmp / "torch-mark"
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp / "site"), str(ROOT)]),
        "PROBE_OUT": str(out),
        "TORCH_MARK": str(mark),
        "GPUENV_SIM_STATE": str(tmp / "sim.json"),
        **(env or {}),
    }
    subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(args))],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    result = json.loads(out.read_text())
    result["torch_marked"] = mark.exists()
    return result


def test_import_gpuenv_is_light(fake_torch: Path) -> None:
    r = probe(fake_torch, "--import-only")
    assert not r["torch_marked"]
    assert r["modules"] == []  # not even click or pynvml


def test_a_subpackage_reads_as_an_attribute_without_an_import_of_its_own() -> None:
    """`import gpuenv` then `gpuenv.timing.sim_kernel(...)`, as the docs write it: read
    first (before `gpuenv.bench` imported it) it was an AttributeError."""
    code = (
        "import sys, gpuenv\n"
        "assert 'gpuenv.timing' not in sys.modules\n"
        "print(gpuenv.timing.sim_kernel.__name__, 'torch' in sys.modules)\n"
        "try:\n    gpuenv.no_such_thing\nexcept AttributeError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "sim_kernel False",
        "module 'gpuenv' has no attribute 'no_such_thing'",
    ]


def test_help_imports_neither_torch_nor_nvml(fake_torch: Path) -> None:
    r = probe(fake_torch, "--help")
    assert r["code"] == 0
    assert not r["torch_marked"]
    assert [m for m in r["modules"] if not m.startswith("click")] == []


def test_status_imports_neither_torch_nor_nvitop(fake_torch: Path) -> None:
    r = probe(fake_torch, "--sim", "status", "--json")
    assert r["code"] == 0
    assert not r["torch_marked"]
    assert not any(m.startswith(("torch", "nvitop")) for m in r["modules"])
    r = probe(fake_torch, "status")  # the real backend (NVML), wherever it is there
    assert not r["torch_marked"]
    assert not any(m.startswith(("torch", "nvitop")) for m in r["modules"])


def test_doctor_and_sim_demo_do_not_import_torch(fake_torch: Path) -> None:
    for args in (("--sim", "doctor"), ("--sim", "demo", "--fast")):
        r = probe(fake_torch, *args)
        assert not r["torch_marked"], args


def test_o_is_output_in_every_command_and_help_lists_only_what_is_accepted() -> None:
    # -o was --only in monitor but --output in run and plot; run --policy listed retry,
    # which it always refuses
    for name in ("run", "plot"):
        out = run_cli(name, "--help").output
        assert "-o, --output" in out, out
    monitor = run_cli("monitor", "--help").output
    assert "--only IDX" in monitor and "-o," not in monitor
    assert run_cli("--sim", "monitor", "-1", "-o", "0").exit_code == 2
    assert run_cli("--sim", "monitor", "-1", "--only", "0").exit_code == 0
    policy = run_cli("run", "--help").output.split("\n  --policy")[1].split("\n  -")[0]
    assert "[annotate|reject]" in policy and "retry" not in policy.split("(To retry")[0]
    refused = run_cli("--sim", "run", "--policy", "retry", "--", "true")
    assert refused.exit_code == 2 and "cannot re-run a call it did not make" in refused.output


def test_run_options_are_the_options_of_gpuenv_run():
    # one list: click passes each option by name into RunOptions
    import dataclasses

    from gpuenv.cli.run import RunOptions, run

    names = {p.name for p in run.params if p.expose_value and p.name != "command"}
    assert names == {f.name for f in dataclasses.fields(RunOptions)}
