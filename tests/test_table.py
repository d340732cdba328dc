"""The one table renderer: columns line up by what a terminal shows, for a wide (CJK) name
and an emoji name too, in the renderer itself and in the tables gpuenv prints with it."""

from __future__ import annotations

import pytest

from gpuenv.table import cut, display_width, render

WIDE = "显卡测试"  # four CJK characters: eight columns
EMOJI = "🚀 rocket"  # an emoji (two columns), a space and six letters: nine columns


def column_starts(line: str, cells: list[str]) -> list[int]:
    """The display column each cell starts at in `line` (cells found left to right)."""
    starts, at = [], 0
    for cell in cells:
        at = line.index(cell, at) if cell else at
        starts.append(display_width(line[:at]))
        at += len(cell)
    return starts


def start_col(line: str, text: str) -> int:
    """The display column `text` starts at in `line`."""
    return display_width(line[: line.index(text)])


def end_col(line: str, text: str) -> int:
    """The display column just after `text` in `line`."""
    return start_col(line, text) + display_width(text)


def test_display_width_counts_columns_not_characters():
    assert display_width("abc") == 3
    assert display_width(WIDE) == 8
    assert display_width(EMOJI) == 9
    assert display_width("ｇｐｕ") == 6  # fullwidth letters (F)
    assert display_width("e\u0301") == 1  # e + combining acute accent
    assert display_width("👩\u200d🔬") == 4  # two emoji joined by a zero-width joiner


@pytest.mark.parametrize(
    ("text", "width", "kept"),
    [
        ("abcdef", 3, "abc"),
        ("山田太郎", 4, "山田"),
        ("山田太郎", 5, "山田"),
        ("a山b", 2, "a"),
        ("🚀 go", 3, "🚀 "),
        ("e\u0301x", 1, "e\u0301"),
        ("abc", 0, ""),
        ("abc", -1, ""),
    ],
)
def test_cut_keeps_the_start_that_fits_in_display_columns(text, width, kept):
    assert cut(text, width) == kept
    assert display_width(cut(text, width)) <= max(0, width)


def test_columns_align_by_display_width_with_wide_and_emoji_names():
    header = ["name", "time", "verdict"]
    rows = [[WIDE, "1.00 ms", "ok"], [EMOJI, "12.00 ms", "rejected"], ["gemm", "3 us", "ok"]]
    lines = render(rows, header=header, right={1})
    starts = [
        column_starts(line, cells) for line, cells in zip(lines, [header, *rows], strict=True)
    ]
    assert len({(s[0], s[2]) for s in starts}) == 1, lines  # the left-aligned columns
    # the right-aligned column ends in the same display column on every line
    ends = {end_col(line, cells[1]) for line, cells in zip(lines, [header, *rows], strict=True)}
    assert len(ends) == 1, lines
    assert all(line == line.rstrip() for line in lines)


def test_indent_and_a_table_without_header_or_rows():
    assert render([["a", "b"]], indent="  ") == ["  a  b"]
    assert render([]) == []
    with pytest.raises(ValueError, match="cells"):
        render([["a", "b"], ["c"]])


@pytest.mark.sim_gpus(2)
def test_status_table_aligns_a_wide_gpu_name(sim):
    from gpuenv.status import format_table, snapshot

    snap = snapshot(sim, [0, 1])
    snap["gpus"][0]["name"] = f"{WIDE} {EMOJI}"
    header, *rows = format_table(snap).splitlines()[1:4]
    uuids = [snap["gpus"][i]["uuid"] for i in (0, 1)]
    positions = {
        start_col(line, u) for line, u in zip([header, *rows], ["UUID", *uuids], strict=True)
    }
    assert len(positions) == 1, [header, *rows]


def test_run_summary_aligns_wide_region_names():
    from gpuenv.results import Measurement
    from gpuenv.run.report import summary_table

    ms = [Measurement.build(name, [0.002]) for name in (WIDE, EMOJI, "step")]
    lines = summary_table(ms, header="gpuenv run: x").splitlines()
    table = [line for line in lines if line.strip().startswith(("region", WIDE, EMOJI, "step"))]
    assert len(table) == 4
    # the time column ("time" over "2.00 ms") starts at one display column on every line
    times = {start_col(line, "time" if i == 0 else "2.00 ms") for i, line in enumerate(table)}
    assert len(times) == 1, table


def test_demo_table_aligns_a_wide_way():
    from gpuenv.demo.measure import Row, Taken, format_table

    taken = Taken(time_s=0.001, sm_mhz=1980.0)
    lines = format_table([Row(WIDE, taken, taken), Row("burst", taken, taken)])
    # "cold" is right-aligned over the times: it ends where they end
    cold = {end_col(line, "cold" if i == 0 else "1.000 ms") for i, line in enumerate(lines)}
    assert len(cold) == 1, lines
