"""gpuenv from this checkout, in a fresh process: for the scripts that time or show it.

`GPUENV` runs what the `gpuenv` console script runs, so the figures hold whether or
not the package is installed; `checkout_env` puts this checkout first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "import sys; sys.argv[0] = 'gpuenv'; from gpuenv.cli import main; main()"
GPUENV = (sys.executable, "-c", ENTRY)


def checkout_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """`base` (default: this process's environment) and `extra`, with ROOT first on
    PYTHONPATH."""
    env = {**(os.environ if base is None else base), **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def finish_within(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str] | None:
    """A started process's stdout and stderr, or None when it ran past `timeout_s` (then it
    is killed and reaped: a hung process costs one figure, not the benchmark)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    return out, err


def add_tree_argument(parser: argparse.ArgumentParser) -> None:
    """--tree DIR (repeatable): also measure the gpuenv of another checkout, side by side."""
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        default=[],
        help="also measure the daemon of this checkout (repeatable)",
    )


def trees(args: argparse.Namespace) -> list[tuple[str, Path | None]]:
    """This tree (None), then each --tree, by the name a table shows."""
    return [("this tree", None), *((str(t), t.resolve()) for t in args.tree)]
