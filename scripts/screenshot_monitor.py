#!/usr/bin/env python3
"""Make docs/monitor.png: `gpuenv monitor` at 200x50, captured from tmux.

Runs `gpuenv --sim monitor --scenario bursts` in a detached tmux session of a
fixed size (with a standing lock taken first, so the view shows one), waits so
the clock history fills and the screen shows `--until` (the lock broken by
the power cap, in a burst), captures the pane with its colours
(`tmux capture-pane -e -p`) and draws that text into a PNG with a monospace
font (Pillow; DejaVu Sans Mono). Everything runs on a private sim state file
and journal directory, and the lock is restored at the end.

    python3 scripts/screenshot_monitor.py [--seconds 85] [--size 200x50] [--out docs/monitor.png]

The home page's and the README's picture is the same view in a 100-column terminal, which
stays readable at a page's width:

    python3 scripts/screenshot_monitor.py --seconds 45 --size 100x34 \
        --out docs/monitor-100x34.png

On a real GPU (`--real`: no --sim, no scenario, no lock; nothing is written to
the GPU), `--workload` runs a command beside the monitor so its process shows:

    python3 scripts/screenshot_monitor.py --real --out docs/monitor-h100.png \
        --workload "python3 benchmarks/workloads/do_bench_load.py --load 60"
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import GPUENV, ROOT

FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu", "/Library/Fonts")
BG = (24, 26, 33)
FG = (212, 215, 221)
PALETTE = [  # the 8 ANSI colours, then their bright versions
    (40, 42, 54),
    (232, 90, 90),
    (120, 200, 120),
    (230, 190, 90),
    (100, 150, 230),
    (200, 120, 220),
    (90, 200, 210),
    (212, 215, 221),
    (90, 95, 110),
    (255, 120, 120),
    (150, 230, 150),
    (250, 215, 120),
    (130, 175, 255),
    (225, 150, 245),
    (130, 225, 235),
    (255, 255, 255),
]
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def xterm256(n: int) -> tuple[int, int, int]:
    if n < 16:
        return PALETTE[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    v = 8 + (n - 232) * 10
    return v, v, v


def parse(text: str) -> list[list[tuple[str, dict]]]:
    """Lines of (character, style) from text with SGR escapes."""
    style: dict = {"fg": None, "bg": None, "bold": False, "dim": False, "rev": False}
    lines = []
    for raw in text.split("\n"):
        cells: list[tuple[str, dict]] = []
        pos = 0
        for m in SGR.finditer(raw):
            cells += [(ch, dict(style)) for ch in raw[pos : m.start()]]
            pos = m.end()
            codes = [int(c) if c else 0 for c in m.group(1).split(";")] or [0]
            k = 0
            while k < len(codes):
                c = codes[k]
                if c == 0:
                    style = {"fg": None, "bg": None, "bold": False, "dim": False, "rev": False}
                elif c == 1:
                    style["bold"] = True
                elif c == 2:
                    style["dim"] = True
                elif c == 22:
                    style["bold"] = style["dim"] = False
                elif c == 7:
                    style["rev"] = True
                elif c == 27:
                    style["rev"] = False
                elif 30 <= c <= 37:
                    style["fg"] = PALETTE[c - 30]
                elif 90 <= c <= 97:
                    style["fg"] = PALETTE[c - 90 + 8]
                elif c == 39:
                    style["fg"] = None
                elif 40 <= c <= 47:
                    style["bg"] = PALETTE[c - 40]
                elif c == 49:
                    style["bg"] = None
                elif c in (38, 48) and k + 2 < len(codes) and codes[k + 1] == 5:
                    style["fg" if c == 38 else "bg"] = xterm256(codes[k + 2])
                    k += 2
                elif c in (38, 48) and k + 4 < len(codes) and codes[k + 1] == 2:
                    style["fg" if c == 38 else "bg"] = tuple(codes[k + 2 : k + 5])
                    k += 4
                k += 1
        cells += [(ch, dict(style)) for ch in raw[pos:]]
        lines.append(cells)
    while lines and not "".join(ch for ch, _ in lines[-1]).strip():
        lines.pop()
    return lines


def font(bold: bool, size: int):
    from PIL import ImageFont

    name = "DejaVuSansMono-Bold.ttf" if bold else "DejaVuSansMono.ttf"
    for d in FONT_DIRS:
        path = os.path.join(d, name)
        if os.path.exists(path):
            return ImageFont.truetype(path, size)
    raise SystemExit(f"no {name}: install fonts-dejavu (apt) or fonts-dejavu-core")


def render(lines: list[list[tuple[str, dict]]], width: int, out: Path, size: int = 15) -> None:
    from PIL import Image, ImageDraw

    regular, bold = font(False, size), font(True, size)
    cw = round(regular.getlength("M"))
    ch = round(size * 1.35)
    pad = 14
    img = Image.new("RGB", (pad * 2 + cw * width, pad * 2 + ch * len(lines)), BG)
    draw = ImageDraw.Draw(img)
    for y, cells in enumerate(lines):
        for x, (c, st) in enumerate(cells):
            fg = st["fg"] or FG
            bg = st["bg"]
            if st["dim"]:
                fg = tuple(int(v * 0.6 + b * 0.4) for v, b in zip(fg, BG, strict=True))
            if st["rev"]:
                fg, bg = (bg or BG), fg
            x0, y0 = pad + x * cw, pad + y * ch
            if bg:
                draw.rectangle([x0, y0, x0 + cw - 1, y0 + ch - 1], fill=bg)
            if c in "█▁▂▃▄▅▆▇":  # block elements: draw exactly, fonts leave gaps between cells
                level = 8 if c == "█" else "▁▂▃▄▅▆▇".index(c) + 1
                top = y0 + ch - 1 - round((ch - 2) * level / 8)
                draw.rectangle([x0, top, x0 + cw - 1, y0 + ch - 2], fill=fg)
            elif c == "░":  # the empty part of a bar: a quiet tint, not a dot pattern
                tint = tuple(int(v * 0.22 + b * 0.78) for v, b in zip(fg, BG, strict=True))
                draw.rectangle([x0, y0 + 2, x0 + cw - 1, y0 + ch - 3], fill=tint)
            elif c.strip():
                draw.text(
                    (x0, y0 + (ch - size) // 2), c, font=bold if st["bold"] else regular, fill=fg
                )
    img.save(out)


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=85.0, help="history before the capture")
    parser.add_argument("--interval", default="0.5", help="the monitor's -d (seconds)")
    parser.add_argument("--scenario", default="bursts")
    parser.add_argument("--lock", default="1500", help="standing lock first ('' for none)")
    parser.add_argument("--size", default="200x50", help="terminal COLSxROWS")
    parser.add_argument("--real", action="store_true", help="the real GPU (read-only)")
    parser.add_argument("--workload", default="", help="a command to run beside the monitor")
    parser.add_argument(
        "--until",
        default="NOT holding",
        help="after --seconds, wait (up to 30 s) for this text on the screen ('' for none)",
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "monitor.png"))
    return parser.parse_args()


def _capture(args: argparse.Namespace, env: dict[str, str], gpuenv: list[str], tmp: str) -> str:
    """Run the monitor in tmux (and the workload beside it); the pane's text with colours."""
    cols, rows = (int(v) for v in args.size.split("x"))
    tmux = ["tmux", "-S", f"{tmp}/tmux.sock"]
    keep = [k for k in env if k.startswith(("GPUENV_", "PYTHONPATH", "TERM", "LANG"))]
    exports = " ".join(f"{k}={shlex.quote(env[k])}" for k in keep)
    monitor = [*gpuenv, "monitor", "-d", args.interval]
    if not args.real:
        monitor += ["--scenario", args.scenario]
    cmd = " ".join(shlex.quote(c) for c in monitor)
    work = subprocess.Popen(shlex.split(args.workload), cwd=ROOT) if args.workload else None
    try:
        subprocess.run(
            [
                *tmux,
                "new-session",
                "-d",
                "-s",
                "shot",
                "-x",
                str(cols),
                "-y",
                str(rows),
                f"cd {shlex.quote(str(ROOT))} && env {exports} {cmd}; sleep 60",
            ],  # an error stays
            check=True,
            env=env,
        )
        time.sleep(args.seconds)
        until = "" if args.real else args.until
        deadline = time.monotonic() + 30
        while True:
            text = subprocess.run(
                [*tmux, "capture-pane", "-e", "-p", "-t", "shot"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            if until in SGR.sub("", text) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        subprocess.run([*tmux, "send-keys", "-t", "shot", "q"], check=False)
        time.sleep(0.5)
        return text
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)
        if work is not None:
            work.terminate()
            work.wait(timeout=30)


def main() -> int:
    args = _options()
    tmp = tempfile.mkdtemp(prefix="gpuenv-shot-")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color", LANG="C.UTF-8")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    gpuenv = list(GPUENV)
    lock = args.lock and not args.real
    if args.real:
        env["GPUENV_READONLY"] = "1"  # a screenshot never changes a real GPU
    else:
        env.update(GPUENV_SIM_STATE=f"{tmp}/sim.json", GPUENV_STATE_DIR=f"{tmp}/journal")
        gpuenv.append("--sim")
    if lock:
        subprocess.run([*gpuenv, "lock", "--sm", args.lock], env=env, check=True)
    try:
        text = _capture(args, env, gpuenv, tmp)
    finally:
        if lock:
            subprocess.run([*gpuenv, "restore"], env=env, check=False, capture_output=True)
    render(parse(text), int(args.size.split("x")[0]), Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
