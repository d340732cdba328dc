"""The one table renderer: rows of text cells in columns, aligned by display width.

Every table gpuenv prints (`gpuenv status`, `gpuenv demo`, `gpuenv run`'s summary,
`gpuenv doctor`'s findings) goes through `render`, so they line up the same way. A
column's width is what a terminal shows, not `len()`: a wide character (CJK, most
emoji; Unicode East Asian Width W or F) takes two columns, a combining mark, a
variation selector or a zero-width joiner none (a GPU or region name may hold any).
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Collection, Sequence

# General categories that take no column of their own: nonspacing and enclosing marks
# (combining accents, variation selectors) and format characters (zero-width joiner).
_ZERO_WIDTH_CATEGORIES = frozenset({"Mn", "Me", "Cf"})


@functools.lru_cache(maxsize=4096)  # the monitor measures its glyphs hundreds of times a frame
def char_width(ch: str) -> int:
    """Columns one character takes on a terminal: 0, 1 or 2."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in _ZERO_WIDTH_CATEGORIES:
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


# Characters of one column each that views draw hundreds of a frame (printable ASCII, arrows,
# box drawing, blocks, shapes): str.translate drops them in C, the rest is looked up. Made on
# the first text that is not ASCII (a command that prints none does not pay for it).
_ONE_COLUMN: dict[int, None] = {}
_ONE_COLUMN_RANGES = (
    (0x20, 0x7F),
    (0xA0, 0x100),
    (0x2010, 0x2070),
    (0x2190, 0x2200),
    (0x2260, 0x2270),
    (0x2500, 0x2600),
    (0x2700, 0x2780),
)


def display_width(text: str) -> int:
    """Columns `text` takes on a terminal (`len()` counts characters, not columns)."""
    if text.isascii():  # the common case, without a look-up a character
        return len(text)
    if not _ONE_COLUMN:
        _ONE_COLUMN.update(
            (cp, None)
            for lo, hi in _ONE_COLUMN_RANGES
            for cp in range(lo, hi)
            if char_width(chr(cp)) == 1
        )
    rest = text.translate(_ONE_COLUMN)
    return len(text) - len(rest) + sum(map(char_width, rest))


def cut(text: str, width: int) -> str:
    """The longest start of `text` that takes at most `width` display columns (a wide
    character that would straddle the edge is left out whole)."""
    if text.isascii():
        return text[: max(0, width)]
    used = 0
    for k, ch in enumerate(text):
        used += char_width(ch)
        if used > width:
            return text[:k]
    return text


def pad(text: str, width: int, *, right: bool = False) -> str:
    """`text` padded with spaces to `width` display columns (aligned right if `right`)."""
    fill = " " * max(0, width - display_width(text))
    return fill + text if right else text + fill


def render(
    rows: Sequence[Sequence[str]],
    *,
    header: Sequence[str] | None = None,
    right: Collection[int] = (),
    sep: str = "  ",
    indent: str = "",
) -> list[str]:
    """The table's lines: `header` (if any) then `rows`, each column as wide as its widest
    cell, cells of the columns in `right` aligned right (numbers), the others left;
    `indent` before and nothing trailing after each line."""
    lines = [list(header), *map(list, rows)] if header is not None else [list(r) for r in rows]
    if not lines:
        return []
    n = len(lines[0])
    if any(len(cells) != n for cells in lines):
        raise ValueError(f"every row of a table has {n} cells: {lines}")
    widths = [max(display_width(cells[i]) for cells in lines) for i in range(n)]

    def line(cells: list[str]) -> str:
        padded = (pad(c, widths[i], right=i in right) for i, c in enumerate(cells))
        return (indent + sep.join(padded)).rstrip()

    return [line(cells) for cells in lines]


__all__ = ["char_width", "cut", "display_width", "pad", "render"]
