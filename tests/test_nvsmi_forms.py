"""`gpuenv status --query-gpu` against real nvidia-smi output recorded on the lent H100.

tests/data/nvidia_smi/ holds what `nvidia-smi --query-gpu=FIELD --format=csv[,nounits]`
printed for each of the 239 names of its help (query-fields.tsv) and `nvidia-smi
--help-query-gpu` (help-query-gpu.txt), recorded read-only on the lent H100 SXM (driver
580.159.04, idle) by the lead (README there). The same query on the simulated H100 must
print the same header, byte for byte, and values of the same FORM (not the same
values): numbers where nvidia-smi has numbers, its units, its hex widths, its
words (Enabled/Disabled, Yes/No, Active/Not Active) and its [N/A] where it has one.
Every field name nvidia-smi knows must be known to gpuenv (never a failed query).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from gpuenv.status.query import FIELDS, CsvFormat, header_line, help_text, parse_fields, query_rows

DATA = Path(__file__).parent / "data" / "nvidia_smi"
RECORDED = DATA / "query-fields.tsv"  # field, rc, header, value, header_nounits, value_nounits
HELP = DATA / "help-query-gpu.txt"

# Words that are one form: either of them is the same kind of answer.
_WORDS = {
    "Enabled": "<on/off>",
    "Disabled": "<on/off>",
    "Yes": "<yes/no>",
    "No": "<yes/no>",
    "Active": "<active>",
    "Not Active": "<active>",
    "Default": "<compute mode>",
    "Exclusive_Process": "<compute mode>",
    "Prohibited": "<compute mode>",
    "Exclusive_Thread": "<compute mode>",
}
_UUID = re.compile(r"\b(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_HEX = re.compile(r"\b0x([0-9A-Fa-f]+)\b")


def form(value: str) -> str:
    """What kind of value `value` is: digits become 9, hex digits X (its width kept),
    UUIDs and the words of one kind one token; brackets, units and other words stay."""
    value = value.strip()
    if value in _WORDS:
        return _WORDS[value]
    value = _UUID.sub("<uuid>", value)
    value = _HEX.sub(lambda m: "0x" + "X" * len(m.group(1)), value)
    return re.sub(r"\d+", "9", value)


def test_form_keeps_what_a_parser_relies_on_and_drops_the_values() -> None:
    assert form("1980 MHz") == form("345 MHz") == "9 MHz"
    assert form("71.35 W") == "9.9 W" != form("71 W")
    assert form("0x0000000000000001") == form("0x00000000000000FF") != form("0x01")
    assert form("[N/A]") == "[N/A]" != form("0")
    assert form("Enabled") == form("Disabled") != form("Yes")
    assert form("GPU-2615239f-194f-4035-87cf-ee9bdf57ce51") == "<uuid>"
    assert form("2026/11/24 18:42:52.865") == "9/9/9 9:9:9.9"


def _recorded() -> list[dict[str, str]]:
    with RECORDED.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


# nvidia-smi answers these on an H100 where gpuenv prints [N/A]: not read (yet), each for
# a reason. Everything else must have nvidia-smi's form.
NOT_READ = {
    # values gpuenv has no reader for: vGPU, addressing, inforom check, recovery, GSP, C2C,
    # confidential computing, SRAM ECC detail, row-remapper histogram, platform
    "addressing_mode",
    "inforom.checksum_validation",
    "gpu_recovery_action",
    "gsp.mode.current",
    "gsp.mode.default",
    "c2c.mode",
    "protected_memory.total",
    "protected_memory.used",
    "protected_memory.free",
    "remapped_rows.correctable_inactive",
    "remapped_rows.uncorrectable_inactive",
    *(f"remapped_rows.histogram.{k}" for k in ("max", "high", "partial", "low", "none")),
    *(
        f"ecc.errors.uncorrected.{c}.sram.{k}"
        for c in ("volatile", "aggregate")
        for k in ("parity", "secded")
    ),
    *(
        f"ecc.errors.uncorrected.aggregate.sram.{k}"
        for k in ("thresholdExceeded", "l2", "sm", "mcu", "pcie", "other")
    ),
    # PCI class codes (nvmlDeviceGetPciInfoExt; on the H100 0x3 / 0x2): not read yet
    "pci.baseClass",
    "pci.subClass",
    "platform.chassis_serial_number",
    "platform.slot_number",
    "platform.tray_index",
    "platform.host_id",
    "platform.peer_type",
    "platform.module_id",
    "platform.gpu_fabric_guid",
    # NVML's field ids for these counters changed between headers and answer unrelated
    # values on driver 580 (measured on an H100); sw_power_cap and sync_boost (ids 74, 76) are read
    *(
        f"clocks_event_reasons_counters.{k}"
        for k in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
    ),
    # nvidia-smi writes a bare N/A when the GPU has no fabric; gpuenv does not ask
    "fabric.state",
    "fabric.status",
    "fabric.cliqueId",
    "fabric.clusterUuid",
    *(
        f"fabric.health.{k}"
        for k in (
            "summary",
            "bandwidth",
            "route_recovery_in_progress",
            "route_unhealthy",
            "access_timeout_recovery",
            "incorrect_configuration",
            "partition_assigned",
        )
    ),
}


@pytest.mark.skipif(not RECORDED.exists(), reason="no nvidia-smi recording in tests/data")
def test_headers_and_value_forms_match_nvidia_smi(sim) -> None:
    """Per field: the header with and without units exactly, the value's form (csv and
    nounits), for every field nvidia-smi answered on the H100, [N/A] ones included."""
    compared, differ = set(), []
    for row in _recorded():
        name = row["field"]
        fields = parse_fields(name)  # every recorded name is known
        for fmt, head, value in (
            (CsvFormat(), "header", "value"),
            (CsvFormat(units=False), "header_nounits", "value_nounits"),
        ):
            assert header_line(fields, fmt) == row[head], name
            lines, errors = query_rows(sim, [0], fields, fmt)
            assert errors == [] and len(lines) == 1
            canonical = fields[0].name
            if canonical in NOT_READ:
                assert lines[0] == "[N/A]", name  # known, never a failed query
            elif form(lines[0]) != form(row[value]):
                differ.append((name, row[value], lines[0]))
            else:
                compared.add(canonical)
    assert differ == [], "field, nvidia-smi, gpuenv: " + "; ".join(map(str, differ))
    assert len(compared) >= 60, len(compared)


@pytest.mark.skipif(not RECORDED.exists(), reason="no nvidia-smi recording in tests/data")
def test_not_read_lists_only_fields_nvidia_smi_answers() -> None:
    """An exception is kept only while nvidia-smi gives what gpuenv does not."""
    values = {parse_fields(r["field"])[0].name: r["value"] for r in _recorded()}
    na = sorted(n for n in NOT_READ if values.get(n) == "[N/A]")
    assert na == [], f"nvidia-smi says [N/A] too: take these off NOT_READ: {na}"


def _help_entries(text: str) -> list[list[str]]:
    """Each field's names from --help-query-gpu: lines like `"a" or "b"`."""
    out = []
    for line in text.splitlines():
        if re.fullmatch(r'"[^"]+"( or "[^"]+")*', line.strip()):
            out.append(re.findall(r'"([^"]+)"', line))
    return out


@pytest.mark.skipif(not HELP.exists(), reason="no nvidia-smi --help-query-gpu recording")
def test_every_field_nvidia_smi_lists_is_known_with_the_same_names() -> None:
    by_name = {n: f for f in FIELDS for n in f.names}
    entries = _help_entries(HELP.read_text())
    assert len(entries) > 100
    unknown = [names[0] for names in entries if names[0] not in by_name]
    assert unknown == [], f"nvidia-smi fields gpuenv does not know: {unknown}"
    for names in entries:  # aliases: the ones nvidia-smi lists, canonical first
        names = list(dict.fromkeys(names))  # '"clocks.max.sm" or "clocks.max.sm"'
        assert by_name[names[0]].names[: len(names)] == tuple(names), names


def test_help_is_in_nvidia_smis_layout() -> None:
    entries = _help_entries(help_text())
    assert [names for names in entries if names[0] == "clocks.current.sm"] == [
        ["clocks.current.sm", "clocks.sm"]
    ]
    assert len(entries) == len(FIELDS)


@pytest.mark.gpu
def test_on_a_real_gpu_gpuenv_and_nvidia_smi_agree_field_by_field() -> None:
    """The device machine (scripts/device-test): for every field nvidia-smi 580 lists,
    the same header and the same form of value from both tools, read-only."""
    import shutil
    import subprocess

    from gpuenv.backend.nvml import NvmlBackend

    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed here")
    names = [names[0] for names in _help_entries(help_text()) if not names[0].startswith("gpuenv.")]
    backend = NvmlBackend()
    differ = []
    try:
        for name in names:
            done = subprocess.run(
                [smi, f"--query-gpu={name}", "--format=csv", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.returncode != 0:  # a name this driver does not know
                continue
            head, value = done.stdout.splitlines()[:2]
            fields = parse_fields(name)
            mine = query_rows(backend, [0], fields, CsvFormat())[0][0]
            if header_line(fields, CsvFormat()) != head or (
                fields[0].name not in NOT_READ and form(mine) != form(value)
            ):
                differ.append((name, head, value, mine))
    finally:
        backend.close()
    assert differ == [], differ
