"""Styled text for `gpuenv monitor`: lines of (text, style) segments, glyphs, bars,
sparklines and graphs, clipping at word boundaries, and printing (plain or ANSI)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuenv.table import cut, display_width

Segment = tuple[str, str]  # (text, style); styles: "" bold dim title ok warn bad sel bar
Line = list[Segment]


@dataclass
class Glyphs:
    bar_full: str = "█"
    bar_empty: str = "░"
    spark: str = "▁▂▃▄▅▆▇█"
    levels: str = " ▁▂▃▄▅▆▇█"  # a graph cell from empty to full
    sep: str = "·"
    sel: str = "▶"
    yes: str = "✓"
    no: str = "✗"
    more: str = "…"
    arrows: str = "←→"
    ascii: bool = False  # the ASCII set: the view then writes nothing but ASCII

    @classmethod
    def for_output(cls, encoding: str | None, *, ascii_only: bool = False) -> Glyphs:
        """The glyphs for an output written in `encoding` under this process's locale:
        ASCII when asked, when the encoding is not UTF-8, or when the locale is not
        (LANG=C: Python's UTF-8 mode then writes UTF-8 that a C terminal cannot show)."""
        if ascii_only or not _locale_is_utf8():
            return cls.for_encoding("ascii")
        return cls.for_encoding(encoding)

    @classmethod
    def for_encoding(cls, encoding: str | None, *, ascii_only: bool = False) -> Glyphs:
        """Unicode glyphs for a UTF encoding, ASCII for any other (or `ascii_only`)."""
        utf = (encoding or "").lower().replace("-", "") in ("utf8", "utf16", "utf32")
        if utf and not ascii_only:
            return cls()
        return cls(
            bar_full="#",
            bar_empty=".",
            spark="_.-=^",
            levels=" ..--==##",
            sep="|",
            sel=">",
            yes="ok",
            no="NO",
            more="~",
            arrows="<>",
            ascii=True,
        )


def _locale_is_utf8() -> bool:
    """Whether the C library's character set (LC_CTYPE from the environment) is UTF-8."""
    import locale

    try:
        locale.setlocale(locale.LC_CTYPE, "")
        codeset = locale.nl_langinfo(locale.CODESET)
    except (locale.Error, AttributeError, ValueError):
        return True  # no way to tell (not POSIX): the encoding alone decides
    return codeset.lower().replace("-", "") == "utf8"


def width_of(line: Line) -> int:
    """Display columns the line takes (a wide character two, gpuenv.table)."""
    return sum(display_width(t) for t, _ in line)


def bar(frac: float | None, width: int, g: Glyphs) -> str:
    if width <= 0:
        return ""
    if frac is None:
        return " " * width
    n = round(max(0.0, min(1.0, frac)) * width)
    return g.bar_full * n + g.bar_empty * (width - n)


def _buckets(values: Sequence[float], width: int) -> list[float]:
    """`values` in `width` cells: means of buckets when there are more values than cells."""
    if len(values) <= width:
        return list(values)
    step = len(values) / width
    parts = [
        values[int(k * step) : max(int(k * step) + 1, int((k + 1) * step))] for k in range(width)
    ]
    return [sum(b) / len(b) for b in parts]


def sparkline(values: Sequence[float], width: int, lo: float, hi: float, g: Glyphs) -> str:
    """`values` in `width` cells (means of buckets when there are more values than cells),
    scaled from `lo` (lowest glyph) to `hi` (highest); a flat line sits mid-height."""
    if width <= 0 or not values:
        return ""
    values = _buckets(values, width)
    levels = len(g.spark)
    if hi <= lo:
        return g.spark[levels // 2] * len(values)
    span = hi - lo
    return "".join(g.spark[min(levels - 1, max(0, int((v - lo) / span * levels)))] for v in values)


def graph(
    values: Sequence[float], width: int, rows: int, lo: float, hi: float, g: Glyphs
) -> list[str]:
    """`values` as a filled graph `rows` high (top row first), one value a column, right-aligned.

    `lo` is the bottom edge (drawn one step high) and `hi` the top; a flat line sits
    halfway up the bottom row.
    """
    if width <= 0 or rows <= 0:
        return []
    values = _buckets(values, width)
    steps = len(g.levels) - 1
    total = rows * steps
    if hi <= lo:
        heights = [steps // 2] * len(values)
    else:
        heights = [max(1, min(total, round((v - lo) / (hi - lo) * total))) for v in values]
    pad = " " * (width - len(values))
    levels, empty, full = g.levels, g.levels[0], g.levels[steps]
    out = []
    for r in range(rows - 1, -1, -1):  # each row, its cells by comparison (no min/max a cell)
        base = r * steps
        top = base + steps
        out.append(
            pad
            + "".join(
                [empty if h <= base else full if h >= top else levels[h - base] for h in heights]
            )
        )
    return out


def clip(line: Line, width: int, more: str = "…") -> Line:
    """`line` in `width` display columns. A longer one ends at a word boundary with `more`
    (a word is cut only when it alone is wider than the line)."""
    if width_of(line) <= width:
        return line
    if width <= display_width(more):
        return [(cut(more, width), "dim")] if width > 0 else []
    full = "".join(t for t, _ in line)
    limit = len(cut(full, width - display_width(more)))  # characters that fit
    at = full.rfind(" ", 0, limit + 1)
    # no dangling separator ("power cap ·…") before the ellipsis
    keep = len(full[:at].rstrip(" ·|:,")) if at > 0 and full[:at].strip(" ·|:,") else limit
    out: Line = []
    used = 0
    for text, style in line:
        if used >= keep:
            break
        text = text[: keep - used]
        out.append((text, style))
        used += len(text)
    return [*out, (more, "dim")]


def plain(lines: Iterable[Line]) -> str:
    return "\n".join("".join(t for t, _ in line).rstrip() for line in lines) + "\n"


_ANSI = {
    "": "",
    "bold": "1",
    "dim": "2",
    "title": "1;36",
    "ok": "32",
    "warn": "33",
    "bad": "1;31",
    "sel": "7",
    "bar": "34",
}


def ansi(lines: Iterable[Line]) -> str:
    out = []
    for line in lines:
        parts = []
        for text, style in line:
            code = _ANSI.get(style, "")
            parts.append(f"\x1b[{code}m{text}\x1b[0m" if code and text.strip() else text)
        out.append("".join(parts).rstrip())
    return "\n".join(out) + "\n"


__all__ = [
    "Glyphs",
    "Line",
    "Segment",
    "ansi",
    "bar",
    "clip",
    "graph",
    "plain",
    "sparkline",
    "width_of",
]
