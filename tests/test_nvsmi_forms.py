"""`gpuenv status --query-gpu` against real nvidia-smi output recorded on the lent H100.

tests/data/nvidia_smi/ holds what `nvidia-smi --query-gpu=FIELDS --format=csv` printed
(query-*.csv) and `nvidia-smi --help-query-gpu` (help-query-gpu.txt), recorded
read-only on an H100 SXM (driver 580). The same query on the simulated H100 must
print the same header, byte for byte, and values of the same FORM (not the same
values): numbers where nvidia-smi has numbers, its units, its hex widths, its
words (Enabled/Disabled, Yes/No, Active/Not Active) and its [N/A] where it has one.
Every field name nvidia-smi knows must be known to gpuenv (never a failed query).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuenv.status.query import FIELDS, CsvFormat, header_line, help_text, parse_fields, query_rows

DATA = Path(__file__).parent / "data" / "nvidia_smi"
RECORDED = sorted(DATA.glob("query-*.csv"))
HELP = DATA / "help-query-gpu.txt"

# Words that are one form: either of them is the same kind of answer.
_WORDS = {
    "Enabled": "<on/off>", "Disabled": "<on/off>", "Yes": "<yes/no>", "No": "<yes/no>",
    "Active": "<active>", "Not Active": "<active>", "Default": "<compute mode>",
    "Exclusive_Process": "<compute mode>", "Prohibited": "<compute mode>",
    "Exclusive_Thread": "<compute mode>",
}  # fmt: skip
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


def _recorded(path: Path) -> tuple[str, list[str]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return lines[0], lines[1:]


def _names(header: str) -> list[str]:
    return [re.sub(r" \[[^]]*\]$", "", cell.strip()) for cell in header.split(", ")]


@pytest.mark.skipif(not RECORDED, reason="no nvidia-smi recording in tests/data/nvidia_smi")
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_header_and_value_forms_match_nvidia_smi(sim, path: Path) -> None:
    header, rows = _recorded(path)
    names = _names(header)
    fields = parse_fields(",".join(names))  # every recorded name is known
    assert header_line(fields, CsvFormat()) == header
    lines, errors = query_rows(sim, [0], fields, CsvFormat())
    assert errors == []
    ours = lines[0].split(", ")
    theirs = rows[0].split(", ")
    assert len(ours) == len(theirs) == len(names)
    differ = [(n, t, o) for n, t, o in zip(names, theirs, ours, strict=True) if form(t) != form(o)]
    assert differ == [], "field, nvidia-smi, gpuenv: " + "; ".join(map(str, differ))


@pytest.mark.skipif(not RECORDED, reason="no nvidia-smi recording in tests/data/nvidia_smi")
def test_the_recording_covers_at_least_60_fields() -> None:
    names = {n for path in RECORDED for n in _names(_recorded(path)[0])}
    assert len(names) >= 60, sorted(names)


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
        assert by_name[names[0]].names[: len(names)] == tuple(names), names


def test_help_is_in_nvidia_smis_layout() -> None:
    entries = _help_entries(help_text())
    assert [names for names in entries if names[0] == "clocks.current.sm"] == [
        ["clocks.current.sm", "clocks.sm"]
    ]
    assert len(entries) == len(FIELDS)
