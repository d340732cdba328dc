"""`gpuenv status --query-gpu`: nvidia-smi's field names, aliases, units and CSV format."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.errors import ConfigError
from gpuenv.status.query import (
    FIELDS,
    CsvFormat,
    header_line,
    help_text,
    parse_fields,
    parse_format,
    query_rows,
)

pytestmark = pytest.mark.sim_gpus(2)


def rows(sim: SimBackend, fields: str, fmt: str = "csv", gpus=(0, 1)) -> list[str]:
    lines, errors = query_rows(sim, list(gpus), parse_fields(fields), parse_format(fmt))
    assert errors == []
    return lines


def test_header_names_each_field_canonically_with_its_unit() -> None:
    fields = parse_fields("index,name,clocks.sm,power.draw,temperature.gpu,utilization.gpu")
    assert header_line(fields, CsvFormat()) == (
        "index, name, clocks.current.sm [MHz], power.draw [W], temperature.gpu, utilization.gpu [%]"
    )
    # nvidia-smi 580 keeps the header's units under nounits (tests/data/nvidia_smi)
    assert header_line(fields, CsvFormat(units=False)) == header_line(fields, CsvFormat())


def test_values_carry_units_as_nvidia_smi_prints_them(sim: SimBackend) -> None:
    line = rows(sim, "index,clocks.sm,clocks.mem,power.draw,power.limit,memory.total,pstate")[0]
    index, sm, mem, power, limit, total, pstate = line.split(", ")
    assert index == "0" and sm == "345 MHz" and mem == "2619 MHz"  # idle H100
    assert re.fullmatch(r"\d+\.\d\d W", power) and limit == "700.00 W"
    assert total == "81559 MiB" and pstate == "P0"
    bare = rows(sim, "index,clocks.sm,power.limit", "csv,nounits")[1]
    assert bare == "1, 345, 700.00"


def test_aliases_read_the_same_value_as_their_canonical_name(sim: SimBackend) -> None:
    pairs = [
        ("clocks.sm", "clocks.current.sm"),
        ("clocks.gr", "clocks.current.graphics"),
        ("clocks.mem", "clocks.current.memory"),
        ("gpu_name", "name"),
        ("gpu_uuid", "uuid"),
        ("gpu_bus_id", "pci.bus_id"),
        ("clocks_throttle_reasons.active", "clocks_event_reasons.active"),
        ("gpu.power.current_limit", "enforced.power.limit"),
        ("clocks.max.gr", "clocks.max.graphics"),
    ]
    for alias, name in pairs:
        assert rows(sim, alias) == rows(sim, name), alias
        assert header_line(parse_fields(alias), CsvFormat()).split(" [")[0] == name


def test_memory_used_and_total_follow_the_processes_on_the_gpu(sim: SimBackend) -> None:
    assert rows(sim, "memory.used,memory.total", gpus=[0]) == ["0 MiB, 81559 MiB"]
    sim.open_context(0)
    used = sim.memory(0)
    assert used is not None and used.used_mib > 0
    assert rows(sim, "memory.used", "csv,nounits", gpus=[0]) == [str(used.used_mib)]


def test_reasons_as_bitmask_and_as_active_words(sim: SimBackend) -> None:
    sim.open_context(0)
    sim.run_work(0, 1980e6 * 5)  # a sustained load meets the 700 W cap
    fields = (
        "clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,"
        "clocks_event_reasons.gpu_idle,clocks_event_reasons.supported,gpuenv.reasons"
    )
    loaded, idle = rows(sim, fields)
    mask, cap, gpu_idle, supported, words = loaded.split(", ")
    assert re.fullmatch(r"0x[0-9A-F]{16}", mask) and int(mask, 16) & 0x4
    assert (cap, gpu_idle, supported) == ("Active", "Not Active", "0x00000000000001FF")
    assert "SwPowerCap" in words.split("|")
    assert idle.split(", ")[:3] == ["0x0000000000000001", "Not Active", "Active"]


def test_gpuenv_lock_fields_follow_gpuenvs_own_lock(sim: SimBackend) -> None:
    from gpuenv.clocks import local_lock as lock

    assert rows(sim, "gpuenv.lock,gpuenv.lock.sm", gpus=[0]) == ["none, [N/A]"]
    with lock(sm=1350, gpus=[0], backend=sim, supervise=False):
        sim.open_context(0)
        sim.idle(1.0)
        assert rows(sim, "gpuenv.lock,gpuenv.lock.sm,clocks.sm", gpus=[0]) == [
            "held, 1350, 1350 MHz"
        ]


def test_a_value_the_gpu_does_not_offer_reads_na(sim: SimBackend) -> None:
    sim.inject_fault(0, "not_supported", op="power_limits")
    sim.inject_fault(1, "permission", op="persistence_mode")
    assert rows(sim, "index,power.limit,persistence_mode") == [
        "0, [N/A], Enabled",
        "1, 700.00 W, [Insufficient Permissions]",
    ]


def test_a_lost_gpu_says_so_in_its_cells_and_in_the_errors(sim: SimBackend) -> None:
    sim.inject_fault(1, "gpu_lost")
    lines, errors = query_rows(sim, [0, 1], parse_fields("index,clocks.sm"), CsvFormat())
    assert lines == ["0, 345 MHz", "1, [GPU is lost]"]
    assert len(errors) == 1 and errors[0].startswith("GPU 1:")


def test_an_unknown_field_is_refused_with_nvidia_smis_sentence() -> None:
    with pytest.raises(ConfigError) as err:
        parse_fields("index,clocks.nope")
    assert str(err.value).startswith('Field "clocks.nope" is not a valid field to query.')
    assert "--help-query-gpu" in str(err.value)
    with pytest.raises(ConfigError, match="at least one field"):
        parse_fields(" ")


@pytest.mark.parametrize(
    ("text", "header", "units"),
    [
        ("csv", True, True),
        ("csv,noheader", False, True),
        ("nounits,csv", True, False),
        ("csv,noheader,nounits", False, False),
    ],
)
def test_format_options_in_any_order(text: str, header: bool, units: bool) -> None:
    assert parse_format(text) == CsvFormat(header=header, units=units)


@pytest.mark.parametrize("text", ["noheader", "csv,json", "", "tsv"])
def test_a_bad_format_is_refused_with_what_to_write(text: str) -> None:
    with pytest.raises(ConfigError, match="--format=csv"):
        parse_format(text)


def test_help_lists_every_field_and_its_aliases() -> None:
    text = help_text()
    for f in FIELDS:
        assert " or ".join(f'"{n}"' for n in f.names) in text
    # nvidia-smi's layout: names alone on their line (no unit), then the help, then a blank
    assert '\n"clocks.current.sm" or "clocks.sm"\nCurrent frequency of the SM' in text
    assert "[MHz]" not in text
    assert all(f.help for f in FIELDS)


# -- the command ----------------------------------------------------------------------


def run(*args: str):
    return CliRunner().invoke(cli, list(args), env={"GPUENV_SIM_GPUS": "2"})


def test_cli_query_gpu_as_in_the_readme() -> None:
    result = run("--sim", "status", "--query-gpu=index,clocks.sm,power.draw", "--format=csv")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "index, clocks.current.sm [MHz], power.draw [W]"
    assert [line.split(", ")[0] for line in lines[1:]] == ["0", "1"]
    quiet = run(
        "--sim", "status", "--query-gpu=index,clocks.sm", "--format=csv,noheader,nounits", "-i", "1"
    )
    assert quiet.output == "1, 345\n"


def test_cli_query_gpu_defaults_to_csv_and_refuses_mixed_outputs() -> None:
    assert run("--sim", "status", "--query-gpu=index", "-i", "0").output == "index\n0\n"
    for args, text in [
        (["--query-gpu=index", "--json"], "--json does not go with"),
        (["--format=csv"], "--format needs a query"),
        (["--query-gpu=index", "--supported-clocks"], "disagree"),
        (["--query-gpu=index", "--format=xml"], "'xml' is not a format option"),
    ]:
        result = run("--sim", "status", *args)
        assert result.exit_code == 2 and text in result.output, (args, result.output)


def test_cli_unknown_field_exits_2_with_one_line() -> None:
    result = run("--sim", "status", "--query-gpu=index,x")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        'gpuenv: error: Field "x" is not a valid field to query. '
        "'gpuenv status --help-query-gpu' lists the valid ones."
    ]


def test_cli_help_query_gpu_needs_no_gpu() -> None:
    result = CliRunner().invoke(cli, ["status", "--help-query-gpu"], env={"GPUENV_BACKEND": "x"})
    assert result.exit_code == 0
    assert result.output.startswith('List of valid properties to query for the switch "--query')
    assert '"gpuenv.lock"' in result.output


# -- against nvidia-smi itself (the device machine: scripts/device-test) ------------------

STATIC = (
    "index,name,uuid,pci.bus_id,driver_version,count,clocks.max.sm,clocks.max.memory,"
    "power.limit,power.default_limit,power.min_limit,power.max_limit,memory.total,compute_cap,"
    "clocks_event_reasons.supported,persistence_mode,mig.mode.current"
)


@pytest.mark.gpu
def test_gpu_query_matches_nvidia_smi_header_and_static_values() -> None:
    import shutil
    import subprocess

    from gpuenv.backend.nvml import NvmlBackend

    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed here")
    dynamic = (
        "clocks.sm,clocks.gr,clocks.mem,power.draw,temperature.gpu,utilization.gpu,pstate,"
        "memory.used"
    )
    aliases = "clocks_throttle_reasons.active,gpu_name,gpu.power.current_limit"
    for fields in (STATIC, dynamic, aliases):
        theirs = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        backend = NvmlBackend()
        try:
            parsed = parse_fields(fields)
            mine = query_rows(backend, range(backend.device_count()), parsed, CsvFormat())[0]
        finally:
            backend.close()
        assert header_line(parsed, CsvFormat()) == theirs[0]
        if fields == STATIC:
            assert mine == theirs[1:]


def test_cli_a_bad_field_is_refused_before_any_gpu_is_read() -> None:
    # no --sim: on this machine without a driver, opening NVML would fail first
    env = {"GPUENV_BACKEND": "nvml"}
    result = CliRunner().invoke(cli, ["status", "--query-gpu=bogus"], env=env)
    assert result.exit_code == 2
    assert 'Field "bogus" is not a valid field to query.' in result.output


# -- nvidia-smi's whole field list, -l alone, --id, -f --------------------------------------


def test_the_freest_gpu_one_liner_runs_and_free_is_what_is_left(sim: SimBackend) -> None:
    sim.workload.open_context(1)  # a CUDA context holds memory on GPU 1
    fields = "index,memory.total,memory.reserved,memory.used,memory.free"
    for line in rows(sim, fields, "csv,noheader,nounits"):
        index, total, reserved, used, free = map(int, line.split(", "))
        assert free == total - reserved - used and reserved > 0
        assert (used > 0) == (index == 1)


def test_fields_gpuenv_does_not_read_print_na_on_every_gpu_never_fail(sim: SimBackend) -> None:
    fields = "index,fan.speed,fabric.state,gom.current,retired_pages.sbe,protected_memory.total"
    assert rows(sim, fields) == [
        "0, [N/A], [N/A], [N/A], [N/A], [N/A]",
        "1, [N/A], [N/A], [N/A], [N/A], [N/A]",
    ]


def test_board_link_and_ecc_fields_read_as_nvidia_smi_writes_them(sim: SimBackend) -> None:
    fields = (
        "pci.domain,pci.bus,pci.device_id,pcie.link.gen.max,pcie.link.width.current,"
        "compute_mode,ecc.mode.current,ecc.errors.uncorrected.volatile.total,"
        "remapped_rows.pending,power.management,mig.mode.pending,clocks.video"
    )
    assert rows(sim, fields, gpus=[0]) == [
        "0x0000, 0x18, 0x233010DE, 5, 16, Default, Enabled, 0, No, Enabled, Disabled, 765 MHz"
    ]


def test_an_unreadable_detail_costs_its_cells_not_the_query(sim: SimBackend) -> None:
    sim.inject_fault(1, "gpu_lost", op="details")
    lines, errors = query_rows(
        sim, [0, 1], parse_fields("index,fan.speed,pcie.link.gen.max"), CsvFormat()
    )
    assert lines == ["0, [N/A], 5", "1, [GPU is lost], [GPU is lost]"]
    assert len(errors) == 1 and errors[0].startswith("GPU 1:")


def test_cli_l_alone_repeats_every_5_s_and_id_is_i() -> None:
    from gpuenv.cli.status import status

    ctx = status.make_context("status", ["--query-gpu=index", "-l", "--id=1"])
    assert ctx.params["loop_s"] == 5.0 and ctx.params["gpu"] == "1"
    ctx = status.make_context("status", ["-l", "2", "--query-gpu=index"])
    assert ctx.params["loop_s"] == 2.0


@pytest.mark.parametrize("value", ["-inf", "-5", "-1e9"])
def test_cli_a_negative_number_after_l_is_ls_bad_value_not_options(value: str) -> None:
    """click reads `-l -inf` as -l alone then `-i nf`: the number is -l's, judged as one."""
    result = run("--sim", "status", "-l", value)
    assert result.exit_code == 2
    assert "-l must be a finite number of seconds >= 0.01" in result.output
    assert "no GPU matches" not in result.output
    from gpuenv.cli.status import status

    ctx = status.make_context("status", ["-l", "--", "-i"], resilient_parsing=True)
    assert ctx.params["loop_s"] == 5.0 and ctx.params["gpu"] == "all"


def test_cli_filename_writes_the_output_to_a_file(tmp_path) -> None:
    out = tmp_path / "q.csv"
    result = run(
        "--sim", "status", "--query-gpu=index,memory.free", "--format=csv,noheader", "-f", str(out)
    )
    assert result.exit_code == 0 and result.output == ""
    assert out.read_text() == "0, 81079 MiB\n1, 81079 MiB\n"


def test_json_documents_carry_their_time(sim: SimBackend) -> None:
    from gpuenv.status import snapshot

    doc = snapshot(sim, [0])
    assert doc["time"] == round(sim.clock.wall(), 3)
    assert doc["timestamp"].endswith("+00:00") and "T" in doc["timestamp"]


def test_the_power_cap_counter_is_nvidia_smis_in_us(sim: SimBackend) -> None:
    """clocks_event_reasons_counters.sw_power_cap is NVML field 74 (gpuenv's "power"
    counter) in microseconds; it grows while the cap holds the clock down."""
    fields = "clocks_event_reasons_counters.sw_power_cap,clocks_event_reasons.sw_power_cap"
    assert rows(sim, fields, gpus=[0]) == ["0 us, Not Active"]
    sim.set_background_load(0, 1.0)
    sim.clock.sleep(10.0)
    counter, active = rows(sim, fields, "csv,nounits", gpus=[0])[0].split(", ")
    ns = sim.read_slow(0, energy=False).reason_ns["power"]
    assert active == "Active" and int(counter) == ns // 1000 > 1_000_000
