"""The files of one side of a comparison, and what differs in their environment."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from typing import Any

from gpuenv.errors import ConfigError

ENV_KEYS = ("driver_version", "torch_version", "cuda_version", "backend")
GPU_KEYS = ("name", "power_limit_w", "persistence", "app_sm_mhz", "max_sm_mhz")


def expand_paths(spec: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files named by one side: paths, comma-separated lists, globs, or directories
    (every *.jsonl inside). Raises ConfigError when a name matches nothing."""
    items: list[str] = []
    if isinstance(spec, (str, os.PathLike)):
        items = [p for p in str(spec).split(",") if p.strip()]
    else:
        for s in spec:
            items += [p for p in str(s).split(",") if p.strip()]
    out: list[str] = []
    for item in items:
        item = item.strip()
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "*.jsonl")))
        elif any(ch in item for ch in "*?["):
            found = sorted(glob.glob(item))
        else:
            found = [item] if os.path.exists(item) else []
        if not found:
            raise ConfigError(
                f"no results file matches {item!r}",
                hint="pass .jsonl files written by gpuenv (a comma-separated list, a glob "
                "or a directory for several per side)",
            )
        out += [f for f in found if f not in out]
    if not out:
        raise ConfigError("no results files given", hint="pass at least one .jsonl file per side")
    return out


def load_side(paths: Sequence[str | os.PathLike[str]], *, all_runs: bool = False) -> list[Any]:
    """The runs of one side: each file's last run (as `gpuenv.load_run` reads it), or with
    `all_runs` every run of every file."""
    return read_side(paths, all_runs=all_runs)[0]


def read_side(
    paths: Sequence[str | os.PathLike[str]], *, all_runs: bool = False
) -> tuple[list[Any], list[str]]:
    """`load_side`'s runs, and a sentence for each file that holds several runs (written
    with --append): which of them were read."""
    from gpuenv.results import load_runs, several_runs

    runs, notes = [], []
    for p in paths:
        found = load_runs(p)
        if len(found) > 1:
            notes.append(
                f"{os.fspath(p)} holds {len(found)} runs (written with --append): all pooled"
                if all_runs
                else several_runs(p, found) + "; --all-runs pools them"
            )
        runs += found if all_runs else found[-1:]
    return runs, notes


def env_changes(runs_a: Sequence[Any], runs_b: Sequence[Any]) -> list[str]:
    def values(runs: Sequence[Any], key: str) -> set[str]:
        return {str(r.metadata.get(key)) for r in runs if r.metadata.get(key) is not None}

    def gpu_values(runs: Sequence[Any], key: str) -> set[str]:
        return {
            str(g.get(key))
            for r in runs
            for g in (r.metadata.get("gpus") or [])
            if isinstance(g, dict) and g.get(key) is not None
        }

    out = []
    for key in ENV_KEYS:
        va, vb = values(runs_a, key), values(runs_b, key)
        if va and vb and va != vb:
            out.append(f"{key}: {', '.join(sorted(va))} -> {', '.join(sorted(vb))}")
    for key in GPU_KEYS:
        va, vb = gpu_values(runs_a, key), gpu_values(runs_b, key)
        if va and vb and va != vb:
            label = "GPU model" if key == "name" else f"GPU {key}"
            out.append(f"{label}: {', '.join(sorted(va))} -> {', '.join(sorted(vb))}")
    return out


__all__ = ["env_changes", "expand_paths", "load_side", "read_side"]
