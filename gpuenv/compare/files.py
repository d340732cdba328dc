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


def load_side(paths: Sequence[str | os.PathLike[str]]) -> list[Any]:
    """Every run in every file of one side."""
    from gpuenv.results import load_runs

    runs = []
    for p in paths:
        runs += load_runs(p)
    return runs


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


__all__ = ["env_changes", "expand_paths", "load_side"]
