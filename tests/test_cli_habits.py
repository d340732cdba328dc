"""The habits of nvidia-smi and nvitop users: one --interval, -i everywhere, nvitop's letters,
and `gpuenv status --supported-clocks`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.devices import select_recorded
from gpuenv.errors import ConfigError
from gpuenv.results import Measurement, Results
from gpuenv.status.clocks import format_supported, runs, supported_clocks, supported_reads
from gpuenv.timebase import VirtualClock


def command(name: str):
    return cli.get_command(None, name)  # type: ignore[arg-type]


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env={"GPUENV_SIM_GPUS": "2", **(env or {})})


# -- one name for the sampling period -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "old"),
    [
        ("run", ["--", "true"], "--period"),
        ("daemon", [], "--sample-period"),
        ("monitor", [], "-d"),
    ],
)
def test_interval_and_its_old_spelling_set_the_same_value(name, args, old) -> None:
    cmd = command(name)
    new = cmd.make_context(name, ["--interval", "0.05", *args])
    assert new.params["interval"] == 0.05
    was = cmd.make_context(name, [old, "0.07", *args])
    assert was.params["interval"] == 0.07


@pytest.mark.parametrize("name", ["run", "daemon", "monitor", "status"])
def test_help_shows_interval_in_seconds_and_hides_the_old_spellings(name) -> None:
    text = run(name, "--help").output
    assert "--interval SEC" in text
    assert "--period" not in text and "--sample-period" not in text


def test_run_refuses_a_bad_interval_by_its_new_name_whichever_spelling() -> None:
    for flag in ("--interval", "--period"):
        result = run("--sim", "run", flag, "0", "--", "true")
        assert result.exit_code == 2
        assert "--interval must be a finite number of seconds >= 0.01" in result.output


# -- monitor's letters mean what they mean in nvitop -----------------------------------------


def test_monitor_n_counts_and_1_is_once() -> None:
    cmd = command("monitor")
    assert cmd.make_context("monitor", ["-n", "3"]).params["count"] == 3
    assert cmd.make_context("monitor", ["-1"]).params["once"] is True
    result = run("--sim", "monitor", "--json", "-n", "2", "-d", "0.01")
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 2 * 2  # 2 ticks x 2 GPUs


def test_monitor_speaks_nvitops_letters_c_g_u_and_U_and_only() -> None:
    # nvitop's -o is --only; gpuenv's -o is --output in every command: --only keeps the word
    cmd = command("monitor")
    params = cmd.make_context(
        "monitor", ["--only", "1", "--only", "0", "-c", "-u", "ann", "-U"]
    ).params
    assert params["only"] == ("1", "0") and params["only_compute"] is True
    assert params["users"] == ("ann",) and params["ascii_only"] is True
    assert cmd.make_context("monitor", ["-g", "--pid", "7"]).params["pids"] == (7,)
    shown = run("--sim", "monitor", "--once", "--only", "1", "--no-color")
    assert shown.exit_code == 0, shown.output
    assert "GPU 1" in shown.output and "GPU 0" not in shown.output
    both = run("--sim", "monitor", "--once", "--only", "1", "-i", "0")
    assert both.exit_code == 2 and "-i and --only both choose GPUs" in both.output
    assert run("--sim", "monitor", "--once", "-c", "-g").exit_code == 2


def test_monitor_ascii_is_asked_or_automatic_never_a_traceback(tmp_path) -> None:
    """-U writes ASCII; so does an output that is not UTF-8 (PYTHONIOENCODING=ascii), which
    died of a UnicodeEncodeError before."""
    import os
    import subprocess
    import sys

    asked = run("--sim", "monitor", "--once", "-U", "--no-color")
    assert asked.exit_code == 0 and asked.output.isascii() and "#" in asked.output
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "GPUENV_BACKEND": "sim"}
    out = subprocess.run(
        [sys.executable, "-m", "gpuenv", "monitor", "--once"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert b"Traceback" not in out.stderr and out.stdout.isascii() and b"board" in out.stdout


# -- -i on every command that takes a GPU ----------------------------------------------------


def test_every_command_that_takes_a_gpu_takes_i() -> None:
    for name in (
        "status",
        "doctor",
        "demo",
        "lock",
        "restore",
        "monitor",
        "run",
        "calibrate",
        "check",
        "plot",
    ):
        assert "-i, --gpu SEL" in run(name, "--help").output, name


def _recorded(sim: SimBackend) -> list[dict[str, object]]:
    return [
        {"index": i, "uuid": sim.device_info(i).uuid, "pci_bus_id": sim.device_info(i).pci_bus_id}
        for i in range(sim.device_count())
    ]


def test_select_recorded_by_index_uuid_prefix_pci_and_all() -> None:
    sim = SimBackend(n_gpus=3, clock=VirtualClock())
    gpus = _recorded(sim)
    assert select_recorded(gpus, "1") == [1]
    assert select_recorded(gpus, sim.device_info(2).uuid[:12]) == [2]
    assert select_recorded(gpus, str(gpus[1]["pci_bus_id"]).split(":", 1)[1]) == [1]
    assert select_recorded(gpus, "all") == [0, 1, 2]
    assert select_recorded(gpus, "2,0,2") == [2, 0]
    with pytest.raises(ConfigError, match="this run has no GPU 5: it recorded GPU 0, 1, 2"):
        select_recorded(gpus, "5")
    with pytest.raises(ConfigError, match="no GPU cuda:0"):
        select_recorded(gpus, "cuda:0")  # CUDA's numbering belongs to the machine that ran it


@pytest.mark.parametrize("damaged", [[{"uuid": "GPU-x"}], [{"index": "zero"}], ["0"]])
def test_a_damaged_list_of_recorded_gpus_is_a_sentence(damaged) -> None:
    with pytest.raises(ConfigError, match="list of GPUs is damaged"):
        select_recorded(damaged, "0")


def _run_file(tmp_path, sim: SimBackend):
    results = Results({"gpus": _recorded(sim)})
    results.add(Measurement.build("x", [1.0]))
    return results.save(tmp_path / "run.jsonl")


def test_plot_i_names_one_gpu_of_the_run(tmp_path) -> None:
    from gpuenv.plot import recorded_gpu
    from gpuenv.results import load_run

    sim = SimBackend(n_gpus=2, clock=VirtualClock())
    loaded = load_run(_run_file(tmp_path, sim))
    assert recorded_gpu(loaded, sim.device_info(1).uuid) == 1
    assert recorded_gpu(loaded, "0") == 0
    with pytest.raises(ConfigError, match="names 2 GPUs and a plot draws one"):
        recorded_gpu(loaded, "all")


def test_plot_cli_refuses_several_gpus_in_one_line(tmp_path) -> None:
    path = _run_file(tmp_path, SimBackend(n_gpus=2, clock=VirtualClock()))
    result = CliRunner().invoke(cli, ["plot", str(path), "-i", "0,1"], obj={})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "gpuenv: error: -i 0,1 names 2 GPUs and a plot draws one: name one: -i 0"
    ]


# -- gpuenv status --supported-clocks -------------------------------------------------------


def test_supported_clocks_are_what_the_backend_lists() -> None:
    sim = SimBackend(n_gpus=2, clock=VirtualClock())
    doc = supported_clocks(sim, [1])
    limits = sim.clock_limits(1)
    (g,) = doc["gpus"]
    assert g["index"] == 1 and g["uuid"] == sim.device_info(1).uuid and g["error"] is None
    assert [c["memory_mhz"] for c in g["clocks"]] == list(limits.supported_mem_mhz)
    assert g["clocks"][0]["graphics_mhz"] == list(limits.supported_sm_mhz[2619])
    reads, errors = supported_reads(sim, [0, 1])
    assert errors == [] and len(reads) == 2 * 2 * 110  # 2 GPUs x 2 memory clocks x 110
    assert format_supported(doc).splitlines()[1] == (
        "  memory 2619 MHz: graphics 1980-345 MHz in 15 MHz steps (110 clocks)"
    )


def test_runs_write_uneven_clocks_one_by_one() -> None:
    assert runs([1980, 1965, 1950, 1400, 1000, 900, 800]) == [
        "1980-1950 MHz in 15 MHz steps (3 clocks)",
        "1400 MHz",
        "1000-800 MHz in 100 MHz steps (3 clocks)",
    ]
    assert runs([2619]) == ["2619 MHz"] and runs([]) == []


def test_supported_clocks_of_a_lost_gpu_say_why() -> None:
    sim = SimBackend(n_gpus=2, clock=VirtualClock())
    sim.inject_fault(0, "gpu_lost")
    doc = supported_clocks(sim, [0, 1])
    assert doc["gpus"][0]["error"] and doc["gpus"][1]["clocks"]
    assert format_supported(doc).startswith("GPU 0: ")


def test_cli_supported_clocks_as_table_json_and_csv() -> None:
    table = run("--sim", "status", "--supported-clocks", "-i", "0")
    assert table.exit_code == 0, table.output
    assert "memory 1593 MHz: graphics 1980-345 MHz" in table.output
    doc = json.loads(run("--sim", "status", "--supported-clocks", "--json").output)
    assert [g["index"] for g in doc["gpus"]] == [0, 1]
    csv = run("--sim", "status", "--supported-clocks", "--format=csv", "-i", "1").output
    lines = csv.splitlines()
    assert lines[0] == "gpu_uuid, memory [MHz], graphics [MHz]" and len(lines) == 1 + 220
    assert lines[1].endswith(", 2619 MHz, 1980 MHz") and lines[-1].endswith(", 1593 MHz, 345 MHz")


def test_cli_query_supported_clocks_as_nvidia_smi() -> None:
    out = run(
        "--sim", "status", "--query-supported-clocks=gr", "--format=csv,noheader,nounits", "-i", "0"
    ).output
    clocks = [int(x) for x in out.split()]
    assert clocks == list(range(1980, 344, -15)) * 2  # per memory clock (2619, 1593), descending
    head = run("--sim", "status", "--query-supported-clocks=mem,gr", "-i", "0").output
    assert head.splitlines()[:2] == ["memory [MHz], graphics [MHz]", "2619 MHz, 1980 MHz"]
    bad = run("--sim", "status", "--query-supported-clocks=mem,sm")
    assert bad.exit_code == 2 and 'Field "sm" is not a valid field to query.' in bad.output
    assert "--help-query-supported-clocks" in bad.output


def test_lock_validates_against_the_same_supported_clocks() -> None:
    sim = SimBackend(clock=VirtualClock())
    listed = supported_clocks(sim, [0])["gpus"][0]["clocks"][0]["graphics_mhz"]
    from gpuenv.clocks import local_lock as lock

    with lock(sm=listed[10], gpus=[0], backend=sim, supervise=False):
        assert sim.truth(0).locked_sm == (listed[10], listed[10])
